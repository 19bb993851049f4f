"""The README's demo runs end to end (shortened) and leaves summaries."""
import importlib.util
import os

import tensorflow as tf

_DEMO = os.path.join(os.path.dirname(__file__), '..', 'examples',
                     'digits_demo.py')


def _load_demo():
  spec = importlib.util.spec_from_file_location('digits_demo', _DEMO)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


class DemoTest(tf.test.TestCase):

  def test_demo_trains_above_90_percent_and_writes_summaries(self):
    model_dir = self.get_temp_dir()
    # main() returns 1 unless held-out accuracy is above 0.9.
    self.assertEqual(0, _load_demo().main(
        ['--steps', '400', '--model_dir', model_dir]))
    self.assertTrue(
        any(name.startswith('events.out.tfevents')
            for name in os.listdir(model_dir)), os.listdir(model_dir))


if __name__ == '__main__':
  tf.test.main()

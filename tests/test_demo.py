"""The README's demo runs end to end (shortened), leaves summaries and a
SavedModel that serves on one CPU."""
import contextlib
import glob
import importlib.util
import io
import os

import tensorflow as tf

_DEMO = os.path.join(os.path.dirname(__file__), '..', 'examples',
                     'digits_demo.py')


def _load_demo():
  spec = importlib.util.spec_from_file_location('digits_demo', _DEMO)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _summary_tags(folder):
  tags = set()
  for path in glob.glob(os.path.join(folder, 'events.out.tfevents*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(value.tag for value in event.summary.value)
  return tags


class DemoTest(tf.test.TestCase):

  def test_demo_trains_above_90_percent_and_writes_summaries(self):
    model_dir = self.get_temp_dir()
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      # main() returns 1 unless held-out accuracy is above 0.9.
      self.assertEqual(0, _load_demo().main(
          ['--steps', '400', '--model_dir', model_dir]))
    lines = output.getvalue().splitlines()
    # A line every 250 steps and one for the last step.
    self.assertEqual(['step   250', 'step   400'],
                     [line[:10] for line in lines if line.startswith('step')])
    self.assertTrue([line for line in lines if 'reloaded on 1 CPU' in line],
                    lines)
    self.assertTrue(glob.glob(os.path.join(model_dir, 'export', '*',
                                           'saved_model.pb')))
    # The training loss is 'loss' in TensorBoard, as the evaluation's.
    train_tags = _summary_tags(model_dir)
    self.assertIn('loss', train_tags)
    self.assertNotIn('loss_1', train_tags)
    self.assertIn('loss', _summary_tags(os.path.join(model_dir, 'eval')))


if __name__ == '__main__':
  tf.test.main()

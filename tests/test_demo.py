"""The README's demo runs end to end (shortened), leaves summaries and a
SavedModel that serves on one CPU."""
import contextlib
import glob
import importlib.util
import io
import os

import numpy as np
import tensorflow as tf

import replicate

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
    self._check_as_one_device(model_dir)

  def _check_as_one_device(self, model_dir):
    # An accuracy threshold passes with a tower dropped or one shard's
    # metrics: the demo's checkpoint must evaluate and predict on its 4
    # towers as on one device. Batches of 50 split 13/13/12/12 (uneven);
    # 11 predictions in batches of 4 end with a batch of 3 rows.
    demo = _load_demo()
    _, x_test, _, y_test = demo.load_digits()
    params = {'hidden_units': [128, 64], 'learning_rate': 3e-3}
    results = []
    for devices in (None, 4):
      model_fn = demo.model_fn
      if devices:
        model_fn = replicate.replicate_model_fn(
            model_fn, devices=replicate.testing.virtual_cpu_devices(devices))
      estimator = tf.compat.v1.estimator.Estimator(
          model_fn, model_dir=model_dir, params=params,
          config=tf.compat.v1.estimator.RunConfig(
              session_config=replicate.testing.virtual_cpu_config(4)))
      metrics = estimator.evaluate(
          demo.eval_input_fn(x_test, y_test, 50), name=str(devices))
      predictions = list(estimator.predict(
          lambda: tf.compat.v1.data.Dataset.from_tensor_slices(
              {'pixels': x_test[:11]}).batch(4)))
      results.append((metrics, predictions))
    (want, want_predictions), (got, got_predictions) = results
    for key in ('accuracy', 'loss'):
      self.assertAllClose(want[key], got[key], rtol=1e-5, msg=key)
    self.assertLen(got_predictions, 11)
    self.assertAllEqual([p['class'] for p in want_predictions],
                        [p['class'] for p in got_predictions])
    self.assertAllClose(
        np.array([p['probabilities'] for p in want_predictions]),
        np.array([p['probabilities'] for p in got_predictions]), rtol=1e-5,
        atol=1e-7)


if __name__ == '__main__':
  tf.test.main()

"""Missing and repeated tower devices are errors, as users meet them.

Through a real `tf.estimator.Estimator`: with the default `RunConfig`, the
Estimator puts its own session config (`allow_soft_placement: true`) in place
before `model_fn` runs; that is not the user's wish for soft placement, so a
tower on a device the session lacks must fail, in every spelling of the
device, instead of silently training both towers on CPU:0.
"""
import tempfile

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1

_CPU1_SPELLINGS = ('/cpu:1', 'CPU:1', '/device:CPU:1', '/device:cpu:1',
                   '/job:localhost/replica:0/task:0/device:CPU:1',
                   '/job:localhost/device:CPU:1')


def _input_fn():
  features, labels = mt.data(batch_size=8)
  return tf.data.Dataset.from_tensors((features, labels)).repeat()


def _estimator(devices, config=None):
  return tf1.estimator.Estimator(
      replicate.replicate_model_fn(mt.mlp_model_fn, devices=devices),
      model_dir=tempfile.mkdtemp(), config=config)


def _num_gpus():
  return len(tf.config.experimental.list_physical_devices('GPU'))


class MissingDeviceTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(*_CPU1_SPELLINGS)
  def test_missing_cpu_with_default_run_config_raises(self, cpu1):
    # Before: a WARNING "Soft placement was asked for in session_config" (or
    # no check at all for /job:localhost/...), and both towers on CPU:0.
    estimator = _estimator(['/cpu:0', cpu1])
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'Device /.*CPU:1 does not exist: the session has 1 CPU device\(s\)'
        r'.*CPU:0.*device_count=\{"CPU": 2\}'):
      estimator.train(_input_fn, steps=1)

  def test_missing_cpu_with_no_config_at_all_raises(self):
    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(mt.mlp_model_fn,
                                     devices=['/cpu:0', '/cpu:1']),
        model_dir=tempfile.mkdtemp())
    with self.assertRaisesRegex(errors.InvalidArgumentError, 'CPU:1'):
      estimator.train(_input_fn, steps=1)

  @parameterized.parameters('/device:TPU:0', '/job:localhost/device:TPU:0')
  def test_missing_tpu_raises(self, tpu):
    estimator = _estimator(['/cpu:0', tpu])
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'Device /.*TPU:0 does not exist: the session has no TPU device 0.*'
        r'CPU:0'):
      estimator.train(_input_fn, steps=1)

  def test_missing_gpu_says_no_gpu_is_visible(self):
    gpu = '/gpu:{}'.format(_num_gpus())
    estimator = _estimator(['/cpu:0', gpu])
    expected = ('no GPU is visible to this process' if not _num_gpus() else
                'this process sees only')
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'GPU:{} does not exist: {}'.format(
                                    _num_gpus(), expected)) as caught:
      estimator.train(_input_fn, steps=1)
    self.assertNotIn('device_count', str(caught.exception))

  def test_device_count_of_users_config_is_honoured(self):
    config = tf1.estimator.RunConfig(
        session_config=tf1.ConfigProto(device_count={'CPU': 2}))
    estimator = _estimator(['/cpu:0', '/job:localhost/device:CPU:1'], config)
    estimator.train(_input_fn, steps=2)
    self.assertEqual(2, estimator.get_variable_value('global_step'))

  def test_explicit_soft_placement_only_warns(self):
    config = tf1.estimator.RunConfig(
        session_config=tf1.ConfigProto(allow_soft_placement=True))
    estimator = _estimator(['/cpu:0', '/cpu:1'], config)
    with self.assertLogs(level='WARNING') as logs:
      estimator.train(_input_fn, steps=1)
    self.assertIn('Soft placement was asked for', '\n'.join(logs.output))
    self.assertEqual(1, estimator.get_variable_value('global_step'))

  def test_eval_with_default_config_raises_too(self):
    estimator = _estimator(['/cpu:0', '/cpu:1'])
    with self.assertRaisesRegex(errors.InvalidArgumentError, 'CPU:1'):
      estimator.evaluate(_input_fn, steps=1)


class DuplicateDeviceTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(
      ('/cpu:1', '/job:localhost/replica:0/task:0/device:CPU:1'),
      ('/cpu:0', '/device:CPU:0'),
      ('CPU:1', '/job:localhost/device:cpu:1'),
      ('/gpu:0', '/job:localhost/replica:0/task:0/device:GPU:0'),
      ('/device:TPU:0', '/job:localhost/device:TPU:0'),
      ('/cpu', '/cpu:0'))
  def test_same_device_twice_in_two_spellings(self, first, second):
    # Before: /cpu:1 and /job:localhost/.../CPU:1 were two towers on one
    # device.
    for make in (lambda d: replicate.replicate_model_fn(mt.mlp_model_fn,
                                                        devices=d),
                 replicate.MirroredStrategy):
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'is listed twice.*both are /job:localhost/replica:0/task:0/'
          r'device:.*name the same device more than once'):
        make(['/cpu:2', first, second])

  def test_devices_of_other_tasks_are_not_duplicates(self):
    replicate.replicate_model_fn(
        mt.mlp_model_fn,
        devices=['/job:worker/task:0/cpu:0', '/job:worker/task:1/cpu:0'])

  def test_device_without_type(self):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'names no device type'):
      replicate.replicate_model_fn(mt.mlp_model_fn,
                                   devices=['/job:worker/task:0'])


class TowersRunOnTheirDevicesTest(tf.test.TestCase):

  def test_fully_qualified_local_spelling_places_towers(self):
    features, labels = mt.data(batch_size=8)
    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      config = tf1.estimator.RunConfig(
          session_config=tf1.ConfigProto(device_count={'CPU': 2}))
      fn = replicate.replicate_model_fn(
          mt.mlp_model_fn,
          devices=['/cpu:0', '/job:localhost/replica:0/task:0/device:CPU:1'])
      spec = fn({'x': tf.constant(features['x'])}, tf.constant(labels),
                mt.TRAIN, params={}, config=config)
      matmuls = [op.device for op in graph.get_operations()
                 if op.type == 'MatMul' and 'gradients' not in op.name]
      self.assertTrue(any(d.endswith('device:CPU:1') for d in matmuls),
                      matmuls)
      with tf1.Session(config=config.session_config) as sess:
        sess.run(tf1.global_variables_initializer())
        self.assertTrue(np.isfinite(sess.run(spec.loss)))


if __name__ == '__main__':
  tf.test.main()

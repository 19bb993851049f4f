"""Missing and repeated tower devices are errors, as users meet them.

Through a real `tf.estimator.Estimator`: with the default `RunConfig`, the
Estimator puts its own session config (`allow_soft_placement: true`) in place
before `model_fn` runs, so a tower on a device the session lacks (in every
spelling of the device) runs elsewhere after one warning saying where, and
trains as one device would; where the session does not allow soft placement
it is an error.
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


def _no_soft_placement(**kwargs):
  """A user's RunConfig whose session does not allow soft placement."""
  return tf1.estimator.RunConfig(session_config=tf1.ConfigProto(**kwargs))


def _warnings(logs):
  return [r.getMessage() for r in logs.records
          if 'do not exist in this session' in r.getMessage()]


class MissingDeviceTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(*_CPU1_SPELLINGS)
  def test_missing_cpu_without_soft_placement_raises(self, cpu1):
    # Before issue 33 this was the error with the default RunConfig too.
    estimator = _estimator(['/cpu:0', cpu1], _no_soft_placement())
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'Device /.*CPU:1 does not exist: the session has 1 CPU device\(s\), '
        r'and session_config does not allow soft placement.*CPU:0.*'
        r'device_count=\{"CPU": 2\}.*allow_soft_placement=True'):
      estimator.train(_input_fn, steps=1)

  @parameterized.parameters(*_CPU1_SPELLINGS)
  def test_missing_cpu_with_default_run_config_warns_and_trains(self, cpu1):
    # The Estimator's default session config allows soft placement: one
    # warning names the device and where its tower runs, then training.
    # Before: InvalidArgumentError 'Device ... does not exist'.
    for estimator in (_estimator(['/cpu:0', cpu1]),
                      _estimator(['/cpu:0', cpu1], tf1.estimator.RunConfig())):
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        estimator.train(_input_fn, steps=1)
      warnings = _warnings(logs)
      self.assertLen(warnings, 1)
      self.assertRegex(warnings[0], r'Device\(s\) /.*CPU:1 do not exist '
                       r'.*will run the towers of /.*CPU:1 on CPU:0')
      self.assertEqual(1, estimator.get_variable_value('global_step'))

  @parameterized.parameters('/device:TPU:0', '/job:localhost/device:TPU:0')
  def test_missing_tpu(self, tpu):
    estimator = _estimator(['/cpu:0', tpu], _no_soft_placement())
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'Device /.*TPU:0 does not exist: the session has no TPU device 0.*'
        r'CPU:0'):
      estimator.train(_input_fn, steps=1)
    estimator = _estimator(['/cpu:0', tpu])
    with self.assertLogs('tensorflow', level='WARNING') as logs:
      estimator.train(_input_fn, steps=1)
    self.assertRegex(_warnings(logs)[0], r'/.*TPU:0 do not exist .*the '
                     r'session has no TPU device 0')

  def test_missing_gpu_says_no_gpu_is_visible(self):
    gpu = '/gpu:{}'.format(_num_gpus())
    estimator = _estimator(['/cpu:0', gpu], _no_soft_placement())
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
    with self.assertLogs('tensorflow', level='WARNING') as logs:
      estimator.train(_input_fn, steps=1)
    self.assertRegex(_warnings(logs)[0], 'session_config allows soft '
                     'placement')
    self.assertEqual(1, estimator.get_variable_value('global_step'))

  def test_eval_without_soft_placement_raises_too(self):
    estimator = _estimator(['/cpu:0', '/cpu:1'], _no_soft_placement())
    with self.assertRaisesRegex(errors.InvalidArgumentError, 'CPU:1'):
      estimator.evaluate(_input_fn, steps=1)


class GpuNamesOnCpuTest(tf.test.TestCase):
  """contrib's own tests: devices=['/gpu:0', '/gpu:1'], trained on the CPU."""

  def _gpus(self):
    # '/gpu:0', '/gpu:1' on a machine without GPUs: GPUs this one lacks.
    return ['/gpu:{}'.format(i) for i in range(_num_gpus(), _num_gpus() + 2)]

  def _train_and_evaluate(self, model_fn, config=None):
    estimator = tf1.estimator.Estimator(model_fn, model_dir=tempfile.mkdtemp(),
                                        config=config)
    estimator.train(_input_fn, steps=3)
    metrics = estimator.evaluate(_input_fn, steps=2)
    weights = {name: estimator.get_variable_value(name)
               for name in ('hidden/kernel', 'hidden/bias', 'logits/kernel',
                            'logits/bias')}
    return weights, metrics

  def test_default_run_config_trains_as_one_device(self):
    # Before: InvalidArgumentError 'Device /device:GPU:0 does not exist'.
    replicated = replicate.replicate_model_fn(
        mt.mlp_model_fn, loss_reduction=tf1.losses.Reduction.MEAN,
        devices=self._gpus())
    with self.assertLogs('tensorflow', level='WARNING') as logs:
      weights, metrics = self._train_and_evaluate(replicated)
    # One warning for the train and the evaluate graphs of one model_fn.
    warnings = _warnings(logs)
    self.assertLen(warnings, 1)
    self.assertRegex(
        warnings[0],
        r'Device\(s\) /device:GPU:{0}, /device:GPU:{1} do not exist in this '
        r'session .*will run the towers of /device:GPU:{0}, /device:GPU:{1} '
        r'on {2}'.format(_num_gpus(), _num_gpus() + 1,
                         'GPU:0' if _num_gpus() else 'CPU:0'))
    # The unreplicated model on the same global batches of 8: two towers of
    # 4 rows, MEAN of the tower losses = the mean over the 8 rows.
    expected_weights, expected_metrics = self._train_and_evaluate(
        mt.mlp_model_fn)
    for name, value in expected_weights.items():
      self.assertAllClose(value, weights[name], rtol=1e-6, atol=1e-7)
    for key in ('accuracy', 'mean_probability', 'loss', 'global_step'):
      self.assertAllClose(expected_metrics[key], metrics[key], rtol=1e-6)

  def test_without_soft_placement_is_an_error(self):
    replicated = replicate.replicate_model_fn(mt.mlp_model_fn,
                                              devices=self._gpus())
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'Device /device:GPU:{} does not exist: .*session_config does not '
        r'allow soft placement.*Missing too: /device:GPU:{}'.format(
            _num_gpus(), _num_gpus() + 1)):
      self._train_and_evaluate(replicated, _no_soft_placement())


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
          r'is listed twice.*both are /replica:0/task:0/'
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

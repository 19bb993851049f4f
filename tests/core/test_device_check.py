"""Tests for the one device parser (device_util) and validation (device_check)."""
import json
import os
import tempfile

from absl.testing import parameterized
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import device_check
from replicate.core import device_util
from replicate.towers import device_setter

_CPU1 = '/job:localhost/replica:0/task:0/device:CPU:1'


class ParserTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters('/cpu:1', 'CPU:1', 'cpu:1', '/device:CPU:1',
                            '/device:cpu:1', _CPU1, '/job:localhost/cpu:1',
                            tf1.DeviceSpec(device_type='CPU', device_index=1))
  def test_every_spelling_has_one_canonical_form(self, spelling):
    self.assertEqual(_CPU1, device_util.canonicalize(spelling))

  def test_normalize_keeps_only_the_given_parts(self):
    self.assertEqual('/device:CPU:1', device_util.normalize('/cpu:1'))
    self.assertEqual('/job:worker/task:1/device:GPU:0',
                     device_util.normalize('/job:worker/task:1/gpu:0'))
    # device_setter's callers get the same parser's answer.
    self.assertEqual('/device:GPU:0', device_setter.canonical_device('GPU:0'))
    with self.assertRaisesRegex(errors.InvalidArgumentError, 'no device type'):
      device_setter.canonical_device('/job:worker')

  def test_is_local(self):
    self.assertTrue(device_util.is_local('/cpu:1'))
    self.assertTrue(device_util.is_local(_CPU1))
    self.assertFalse(device_util.is_local('/job:worker/task:0/cpu:0'))

  def test_parse_errors(self):
    with self.assertRaisesRegex(errors.InvalidTypeError, 'got 3 of type int'):
      device_util.parse(3)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                "Cannot parse device '/gpu:zero'"):
      device_util.parse('/gpu:zero')


class CheckDeviceListTest(parameterized.TestCase, tf.test.TestCase):

  def test_returns_normalized_devices_in_order(self):
    self.assertEqual(['/device:CPU:1', '/job:localhost/device:CPU:0'],
                     device_check.check_device_list(
                         ['/cpu:1', '/job:localhost/cpu:0']))

  @parameterized.parameters(('/cpu:1', _CPU1), ('/gpu:0', 'GPU:0'),
                            ('/device:TPU:0', '/job:localhost/device:TPU:0'))
  def test_duplicates_in_any_spelling(self, first, second):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'listed twice.*both are /job:localhost'):
      device_check.check_device_list([first, second])

  def test_bad_lists(self):
    with self.assertRaisesRegex(errors.InvalidTypeError, 'must be a list'):
      device_check.check_device_list('/cpu:0')
    with self.assertRaisesRegex(errors.InvalidArgumentError, 'is empty'):
      device_check.check_device_list([])
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'Devices must be strings'):
      device_check.check_device_list([0])


class SessionDevicesTest(tf.test.TestCase):

  def test_device_count(self):
    devices = device_check.session_devices(
        tf1.ConfigProto(device_count={'CPU': 3}))
    self.assertIn(device_util.canonicalize('/cpu:2'), devices)
    self.assertNotIn(device_util.canonicalize('/cpu:3'), devices)
    self.assertNotIn(device_util.canonicalize('/cpu:1'),
                     device_check.session_devices(None))

  def test_check_devices_exist(self):
    device_check.check_devices_exist(
        ['/cpu:0', _CPU1], tf1.ConfigProto(device_count={'CPU': 2}))
    # Devices of other tasks are the cluster checks' business.
    device_check.check_devices_exist(['/job:worker/task:3/cpu:7'])
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'Device /job:localhost/replica:0/task:0/device:CPU:1 does not exist'
        r'.*The session\'s devices are CPU:0'):
      device_check.check_devices_exist([_CPU1])
    with self.assertLogs(level='WARNING') as logs:
      device_check.check_devices_exist([_CPU1],
                                       soft_placement_requested=True)
    self.assertIn('Soft placement was asked for', '\n'.join(logs.output))


class SoftPlacementRequestedTest(tf.test.TestCase):

  def test_estimator_default_is_not_a_request(self):
    config = tf1.estimator.RunConfig()
    self.assertFalse(device_check.soft_placement_requested(config))
    # What the Estimator hands model_fn: its default session config.
    estimator = tf1.estimator.Estimator(lambda features: None,
                                        model_dir=tempfile.mkdtemp(),
                                        config=config)
    self.assertTrue(estimator.config.session_config.allow_soft_placement)
    self.assertFalse(device_check.soft_placement_requested(estimator.config))

  def test_users_own_config_is_a_request(self):
    config = tf1.estimator.RunConfig(
        session_config=tf1.ConfigProto(allow_soft_placement=True))
    self.assertTrue(device_check.soft_placement_requested(config))
    estimator = tf1.estimator.Estimator(lambda features: None,
                                        model_dir=tempfile.mkdtemp(),
                                        config=config)
    self.assertTrue(device_check.soft_placement_requested(estimator.config))
    self.assertFalse(device_check.soft_placement_requested(
        tf1.estimator.RunConfig(session_config=tf1.ConfigProto())))
    self.assertFalse(device_check.soft_placement_requested(None))

  def test_distributed_default_is_not_a_request(self):
    tf_config = {'cluster': {'ps': ['127.0.0.1:1'], 'chief': ['127.0.0.1:2'],
                             'worker': ['127.0.0.1:3']},
                 'task': {'type': 'worker', 'index': 0}}
    old = os.environ.get('TF_CONFIG')
    os.environ['TF_CONFIG'] = json.dumps(tf_config)
    try:
      config = tf1.estimator.RunConfig()
    finally:
      if old is None:
        del os.environ['TF_CONFIG']
      else:
        os.environ['TF_CONFIG'] = old
    self.assertTrue(config.session_config.allow_soft_placement)
    self.assertFalse(device_check.soft_placement_requested(config))


if __name__ == '__main__':
  tf.test.main()

"""Tests for the one device parser (device_util) and validation (device_check)."""
import tempfile

from absl.testing import parameterized
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import device_check
from replicate.core import device_util
from replicate.towers import device_setter

# TF's graph-mode canonical form: no job. `/job:localhost` is this process,
# so its spellings are the same device.
_CPU1 = '/replica:0/task:0/device:CPU:1'
_LOCALHOST_CPU1 = '/job:localhost/replica:0/task:0/device:CPU:1'


class ParserTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters('/cpu:1', 'CPU:1', 'cpu:1', '/device:CPU:1',
                            '/device:cpu:1', _CPU1, _LOCALHOST_CPU1,
                            '/job:localhost/cpu:1',
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
    self.assertTrue(device_util.is_local(_LOCALHOST_CPU1))
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

  @parameterized.parameters(('/cpu:1', _LOCALHOST_CPU1), ('/gpu:0', 'GPU:0'),
                            ('/device:TPU:0', '/job:localhost/device:TPU:0'))
  def test_duplicates_in_any_spelling(self, first, second):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'listed twice.*both are /replica:0/task:0/'):
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
    # Without soft placement (TF's default session, or a config without it):
    # an error naming the device, the session's devices and both ways out.
    for config in (None, tf1.ConfigProto()):
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'Device /replica:0/task:0/device:CPU:1 does not '
          r'exist: the session has 1 CPU device\(s\), and session_config '
          r'does not allow soft placement.*The session\'s devices are '
          r'CPU:0.*device_count=\{"CPU": 2\}.*allow_soft_placement=True'):
        device_check.check_devices_exist([_CPU1], config)


class SoftPlacementTest(tf.test.TestCase):

  def _warnings(self, *calls):
    with self.assertLogs('tensorflow', level='WARNING') as logs:
      tf1.logging.warning('marker')  # assertLogs needs one record at least
      for call in calls:
        call()
    return [r.getMessage() for r in logs.records[1:]]

  def test_soft_placement_warns_where_the_towers_run(self):
    config = tf1.ConfigProto(allow_soft_placement=True)
    gpus = ['/gpu:{}'.format(i) for i in range(_num_gpus(), _num_gpus() + 2)]
    fallback = 'GPU:0' if _num_gpus() else 'CPU:0'
    warnings = self._warnings(
        lambda: device_check.check_devices_exist(gpus, config))
    self.assertLen(warnings, 1)
    self.assertRegex(
        warnings[0],
        r'Device\(s\) /device:GPU:{0}, /device:GPU:{1} do not exist in this '
        r'session .*session_config allows soft placement.*will run the '
        r'towers of /device:GPU:{0}, /device:GPU:{1} on {2}.*'
        r'allow_soft_placement=False'.format(_num_gpus(), _num_gpus() + 1,
                                             fallback))

  def test_warns_once_per_warned_set(self):
    config = tf1.ConfigProto(allow_soft_placement=True)
    warned = set()
    check = lambda: device_check.check_devices_exist([_CPU1], config, warned)
    self.assertLen(self._warnings(check, check, check), 1)
    # Another set (another replicate_model_fn) warns again; None every time.
    self.assertLen(self._warnings(
        check,
        lambda: device_check.check_devices_exist([_CPU1], config, set()),
        lambda: device_check.check_devices_exist([_CPU1], config),
        lambda: device_check.check_devices_exist([_CPU1], config)), 3)

  def test_estimator_default_session_config_allows_soft_placement(self):
    # What the Estimator hands model_fn when the user gave no session_config.
    estimator = tf1.estimator.Estimator(lambda features: None,
                                        model_dir=tempfile.mkdtemp())
    session_config = estimator.config.session_config
    self.assertTrue(session_config.allow_soft_placement)
    self.assertLen(self._warnings(
        lambda: device_check.check_devices_exist([_CPU1], session_config)), 1)


def _num_gpus():
  return len(tf.config.experimental.list_physical_devices('GPU'))


if __name__ == '__main__':
  tf.test.main()

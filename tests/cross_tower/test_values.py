"""Tests for device_util, values and reduce_util."""
import collections

from absl.testing import parameterized
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import reduce_util
from replicate.cross_tower import values

# TF's graph-mode canonical form: no job (`/job:localhost` is this process).
_CPU0 = '/replica:0/task:0/device:CPU:0'
_CPU1 = '/replica:0/task:0/device:CPU:1'


class DeviceUtilTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters('/cpu:0', '/device:CPU:0', 'CPU:0', 'cpu:0', '',
                            _CPU0, '/job:localhost/device:CPU:0',
                            '/job:localhost/replica:0/task:0/device:CPU:0')
  def test_spellings_of_cpu0(self, spelling):
    self.assertEqual(device_util.canonicalize(spelling), _CPU0)

  def test_gpu_and_worker(self):
    self.assertEqual(device_util.canonicalize('/gpu:1'),
                     '/replica:0/task:0/device:GPU:1')
    self.assertEqual(device_util.canonicalize('/job:worker/task:1'),
                     '/job:worker/replica:0/task:1/device:CPU:0')

  def test_default_fills_missing_parts(self):
    self.assertEqual(
        device_util.canonicalize('/gpu:0', default='/job:worker/task:3'),
        '/job:worker/replica:0/task:3/device:GPU:0')
    # The device's own parts win over the default's.
    self.assertEqual(
        device_util.canonicalize('/job:ps/task:0',
                                 default='/job:worker/task:3'),
        '/job:ps/replica:0/task:0/device:CPU:0')

  def test_worker_and_type(self):
    self.assertEqual(device_util.worker_of('/job:worker/task:2/gpu:1'),
                     '/job:worker/replica:0/task:2')
    self.assertEqual(device_util.worker_of('/job:localhost/cpu:1'),
                     '/replica:0/task:0')
    self.assertEqual(device_util.device_type_of('/gpu:1'), 'GPU')
    self.assertIsNone(device_util.resolve(''))
    self.assertEqual(device_util.resolve('/cpu:1'), _CPU1)

  def test_bad_devices(self):
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'device must be a device string.*got 3'):
      device_util.canonicalize(3)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                "Cannot parse device '/foo:bar': it is not a valid device"):
      device_util.canonicalize('/foo:bar')


class ReduceOpTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(
      (reduce_util.ReduceOp.SUM, reduce_util.ReduceOp.SUM),
      (reduce_util.ReduceOp.MEAN, reduce_util.ReduceOp.MEAN),
      (tf.VariableAggregation.SUM, reduce_util.ReduceOp.SUM),
      (tf.VariableAggregation.MEAN, reduce_util.ReduceOp.MEAN),
      (tf.distribute.ReduceOp.SUM, reduce_util.ReduceOp.SUM),
      (tf.distribute.ReduceOp.MEAN, reduce_util.ReduceOp.MEAN))
  def test_conversion(self, given, expected):
    self.assertIs(reduce_util.as_reduce_op(given), expected)

  def test_exported(self):
    self.assertIs(replicate.ReduceOp, reduce_util.ReduceOp)

  @parameterized.parameters(tf.VariableAggregation.NONE,
                            tf.VariableAggregation.ONLY_FIRST_REPLICA)
  def test_other_aggregations(self, aggregation):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'only SUM and MEAN combine'):
      reduce_util.as_reduce_op(aggregation)

  @parameterized.parameters('sum', None, 1)
  def test_other_types(self, bad):
    with self.assertRaisesRegex(ValueError,
                                'must be replicate.ReduceOp.SUM / MEAN'):
      reduce_util.as_reduce_op(bad)


class ValuesTest(tf.test.TestCase):

  def test_keys_canonicalized(self):
    v = values.PerDevice({'/cpu:0': 'a', '/device:CPU:1': 'b'})
    self.assertEqual(v.devices, (_CPU0, _CPU1))
    self.assertEqual(v.get('CPU:1'), 'b')
    self.assertEqual(v.get(_CPU0), 'a')
    self.assertEqual(v.values, ('a', 'b'))
    self.assertEqual(v.primary_device, _CPU0)
    self.assertTrue(v.on_device('/cpu:1'))
    self.assertFalse(v.on_device('/cpu:2'))
    self.assertIs(replicate.PerReplica, replicate.PerDevice)
    self.assertIn('PerDevice({', repr(v))

  def test_get_uses_device_scope(self):
    v = values.PerDevice({'/cpu:0': 'a', '/cpu:1': 'b'})
    m = values.Mirrored({'/cpu:0': 'a', '/cpu:1': 'a1'})
    with tf.Graph().as_default():
      with tf.device('/cpu:1'):
        self.assertEqual(v.get(), 'b')
        self.assertEqual(m.get(), 'a1')
      with tf.device('/job:localhost/task:0'):
        with tf.device('/device:CPU:0'):
          self.assertEqual(v.get(), 'a')  # merged scopes name CPU:0
      # Outside any device scope: Mirrored gives its primary value.
      self.assertEqual(m.get(), 'a')
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'outside any tf.device scope.*pass the '
                                  'device'):
        v.get()
      with tf.device('/cpu:2'):
        with self.assertRaisesRegex(errors.InvalidArgumentError,
                                    'Device .*CPU:2 is not one of the devices'):
          v.get()

  def test_mirrored_stands_for_its_copy_as_a_tensor(self):
    with tf.Graph().as_default():
      copies = {}
      for i, d in enumerate(['/cpu:0', '/cpu:1']):
        with tf.device(d):
          copies[d] = tf.constant([float(i + 1)])
      m = values.Mirrored(copies)
      doubled = m * 2  # the primary copy, outside any device scope
      with tf.device('/cpu:1'):
        local = tf.identity(m)
        self.assertEqual(m.device, copies['/cpu:1'].device)
      with tf.device('/cpu:3'):  # no copy there: any copy will do
        elsewhere = m + 0
      self.assertEqual((m.dtype, m.shape.as_list()), (tf.float32, [1]))
      with tf.control_dependencies([m]):
        after = tf.constant(0)
      self.assertIn(copies['/cpu:0'].op, after.op.control_inputs)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as s:
        self.assertAllEqual(s.run([m, doubled, local, elsewhere]),
                            [[1.], [2.], [2.], [1.]])
      # A PerDevice has no one value to stand for.
      with self.assertRaises((TypeError, ValueError)):
        tf.convert_to_tensor(values.PerDevice(copies))

  def test_bad_construction(self):
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'built from a {device: value} dict'):
      values.Mirrored(['/cpu:0'])
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'needs at least one device'):
      values.PerDevice({})
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'name the same device'):
      values.PerDevice({'/cpu:0': 1, '/device:CPU:0': 2})

  def test_get_devices_from(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:1'):
        t = tf.constant(1.)
        var = tf1.get_variable('v', [], use_resource=False)
      unplaced = tf.constant(2.)
      self.assertEqual(values.get_devices_from('/cpu:1'), (_CPU1,))
      self.assertEqual(values.get_devices_from(['/cpu:0', 'CPU:1', 'cpu:0']),
                       (_CPU0, _CPU1))
      self.assertEqual(values.get_devices_from(
          values.Mirrored({'/cpu:1': 1})), (_CPU1,))
      self.assertEqual(values.get_devices_from(var), (_CPU1,))
      self.assertEqual(values.get_devices_from(t), (_CPU1,))
      # TF's phrase first, then what is wrong.
      for bad, message in [(None, 'destinations is None'),
                           ('', 'destinations is an empty string'),
                           ([], 'destinations is an empty list'),
                           ((), 'destinations is an empty tuple'),
                           (unplaced, 'The tensor Const_1:0 has no device')]:
        message = 'destinations can not be empty: ' + message
        with self.assertRaisesRegex(errors.InvalidArgumentError, message):
          values.get_devices_from(bad)
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'must hold device strings, got 3'):
        values.get_devices_from(['/cpu:0', 3])
      with self.assertRaisesRegex(
          errors.InvalidTypeError, 'destinations must be one of a '
          '`DistributedValues` object, a tf.Variable object, or a device '
          'string'):
        values.get_devices_from(3.5)

  def test_destination_strings_take_the_device_scope(self):
    # Between-graph code builds in its worker's scope and names '/cpu:0':
    # as contrib's device_util.resolve, the string takes what it leaves out
    # (job, task) from the scope; the parts it gives are its own; outside a
    # scope, it is this process's device (no job, TF's graph-mode form).
    worker1 = '/job:worker/replica:0/task:1'
    worker0_cpu0 = '/job:worker/replica:0/task:0/device:CPU:0'
    with tf.Graph().as_default():
      self.assertEqual(values.get_devices_from('/cpu:0'), (_CPU0,))
      with tf.device(worker1):
        self.assertEqual(values.get_devices_from('/device:CPU:0'),
                         (worker1 + '/device:CPU:0',))
        self.assertEqual(
            values.get_devices_from([worker0_cpu0, '/cpu:1', 'CPU:1']),
            (worker0_cpu0, worker1 + '/device:CPU:1'))
        # A job without a task takes the scope's task (1), as contrib's.
        self.assertEqual(values.get_devices_from('/job:worker/cpu:2'),
                         (worker1 + '/device:CPU:2',))
        self.assertEqual(values.get_devices_from(_CPU1),
                         ('/job:worker' + _CPU1,))
      with tf.device(worker0_cpu0):
        a = tf.constant([1., 2.])
      with tf.device(worker1 + '/device:CPU:0'):
        b = tf.constant([3., 5.])
      with tf.device(worker1):
        total = replicate.ReductionToOneDeviceCrossTowerOps().reduce(
            replicate.ReduceOp.SUM,
            values.PerDevice({worker0_cpu0: a, worker1 + '/cpu:0': b}),
            destinations='/cpu:0')
      self.assertEqual(total.devices, (worker1 + '/device:CPU:0',))
      self.assertEqual(device_util.canonicalize(total.get().device),
                       worker1 + '/device:CPU:0')

  def test_as_per_device(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:1'):
        t = tf.constant(1.)
      pd = values.as_per_device(t)
      self.assertIsInstance(pd, values.PerDevice)
      self.assertEqual(pd.devices, (_CPU1,))
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'The value Const_1:0 has no device'):
        values.as_per_device(tf.constant(2.))
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'Expected a PerDevice/Mirrored value'):
        values.as_per_device([t])

  def test_select_device_and_regroup(self):
    grouped = values.regroup({'/cpu:0': {'a': 1, 'b': [2]},
                              '/cpu:1': {'a': 3, 'b': [4]}})
    self.assertIsInstance(grouped['a'], values.PerDevice)
    self.assertEqual(grouped['b'][0].values, (2, 4))
    self.assertEqual(values.select_device('/cpu:1', grouped),
                     {'a': 3, 'b': [4]})
    mirrored = values.regroup({'/cpu:0': 5, '/cpu:1': 6},
                              wrap_class=values.Mirrored)
    self.assertIsInstance(mirrored, values.Mirrored)
    # As contrib's: the same object on every device (one device included)
    # comes back as it is.
    self.assertEqual(('a', 1), values.regroup({'/cpu:0': ('a', 1)}))
    shared = object()
    self.assertIs(shared, values.regroup({'/cpu:0': shared,
                                          '/cpu:1': shared}))
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'regroup needs at least one device'):
      values.regroup({})
    # Different structures: an AssertionError, as contrib's, and a
    # ValueError, as before.
    for error in (ValueError, AssertionError):
      with self.assertRaisesRegex(error, 'different structures'):
        values.regroup({'/cpu:0': [1], '/cpu:1': [1, 2]})
      # Dicts with as many keys, but other ones.
      with self.assertRaisesRegex(error, 'different structures'):
        values.regroup({'/cpu:0': {'a': 1, 'b': 2},
                        '/cpu:1': {'a': 3, 'c': 4}})

  def test_select_replica_and_tensor_likeness(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        a = tf.constant(1.0)
      with tf.device('/cpu:1'):
        b = tf.constant(2.0)
      per = values.PerDevice({'/cpu:0': a, '/cpu:1': b})
      self.assertTrue(per.is_tensor_like)
      self.assertFalse(values.PerDevice({'/cpu:0': 1, '/cpu:1': a})
                       .is_tensor_like)
      # Replica 1's share: the value on the second device; plain leaves kept.
      self.assertEqual({'x': b, 'n': 3},
                       values.select_replica(1, {'x': per, 'n': 3}))
    strategy = replicate.MirroredStrategy(['/cpu:0', '/cpu:1'])
    with tf.Graph().as_default(), strategy.scope():
      mirrored = tf1.get_variable('m', [])
      on_read = tf1.get_variable(
          'r', [], synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM)
    self.assertIsInstance(mirrored, replicate.values.MirroredVariable)
    self.assertIsInstance(on_read, replicate.values.SyncOnReadVariable)
    self.assertIs(replicate.values.ReplicaLocalVariable,
                  replicate.values.SyncOnReadVariable)

  def test_regroup_keeps_each_containers_type(self):
    # A list stays a list, an OrderedDict keeps its type and order, and a
    # namedtuple from one device matches a tuple of the same length from
    # another (TF's regroup), rebuilt as the first device's type.
    merged = values.regroup({'/cpu:0': [1, 'same'], '/cpu:1': [2, 'same']})
    self.assertIsInstance(merged, list)
    self.assertEqual((1, 2), merged[0].values)
    self.assertEqual('same', merged[1])
    merged = values.regroup(
        {'/cpu:0': collections.OrderedDict([('z', 1), ('a', 'same')]),
         '/cpu:1': collections.OrderedDict([('z', 2), ('a', 'same')])})
    self.assertIsInstance(merged, collections.OrderedDict)
    self.assertEqual(['z', 'a'], list(merged))
    self.assertEqual((1, 2), merged['z'].values)
    point = collections.namedtuple('Point', ['a', 'b'])
    merged = values.regroup({'/cpu:0': point(1, 'same'),
                             '/cpu:1': (2, 'same')})
    self.assertIsInstance(merged, point)
    self.assertEqual((1, 2), merged.a.values)
    self.assertEqual('same', merged.b)

  def test_regroup_rebuilds_namedtuples_without_their_checks(self):
    # An EstimatorSpec's constructor refuses a PerDevice train_op; contrib
    # rebuilds namedtuples with _make, which does not check.
    with tf.Graph().as_default():
      specs = [tf1.estimator.EstimatorSpec(
          tf1.estimator.ModeKeys.TRAIN, loss=tf.constant(float(i)),
          train_op=tf.no_op()) for i in range(2)]
      grouped = values.regroup({'/cpu:0': specs[0], '/cpu:1': specs[1]})
    self.assertIsInstance(grouped, tf1.estimator.EstimatorSpec)
    self.assertIsInstance(grouped.loss, values.PerDevice)
    self.assertEqual((specs[0].loss, specs[1].loss), grouped.loss.values)
    self.assertIsInstance(grouped.train_op, values.PerDevice)
    self.assertEqual(specs[0].mode, grouped.mode)


if __name__ == '__main__':
  tf.test.main()

"""Tests for the CrossTowerOps API, reduction to one device and all-reduce."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import cross_tower_ops
from replicate import device_util
from replicate import errors
from replicate import testing
from replicate import values
from replicate._compat import tf1
from replicate.reduce_util import ReduceOp

import ctops_testlib as lib

_DEVICES = testing.virtual_cpu_devices(4)
_CANONICAL = [device_util.canonicalize(d) for d in _DEVICES]


def _session():
  return tf1.Session(config=testing.virtual_cpu_config(4))


class ReductionToOneDeviceTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.product(
      reduce_op=[ReduceOp.SUM, ReduceOp.MEAN, tf.VariableAggregation.MEAN],
      dtype=[tf.float16, tf.float32, tf.float64],
      reduce_to_device=[None, '/cpu:3'])
  def test_numerics_and_placement(self, reduce_op, dtype, reduce_to_device):
    mean = reduce_op in (ReduceOp.MEAN, tf.VariableAggregation.MEAN)
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(_DEVICES[:3], lib.SMALL_SHAPES, dtype)
      ops = replicate.ReductionToOneDeviceCrossTowerOps(
          reduce_to_device=reduce_to_device)
      destinations = ['/cpu:1', '/cpu:2']
      results = ops.batch_reduce(reduce_op, [(v, destinations) for v in inputs])
      single = ops.reduce(reduce_op, inputs[1], '/cpu:0')
      with _session() as sess:
        got, got_single = sess.run(([r.values for r in results],
                                    single.values))
    for result, column, value in zip(results, arrays, got):
      self.assertIsInstance(result, values.Mirrored)
      self.assertEqual(result.devices, tuple(_CANONICAL[1:3]))
      for device, tensor in zip(result.devices, result.values):
        self.assertEqual(device_util.canonicalize(tensor.device), device)
        self.assertEqual(tensor.dtype, dtype)
      for v in value:
        # e.g. three towers: SUM = a0 + a1 + a2, MEAN = SUM / 3.
        self.assertAllClose(v, lib.expected(column, mean),
                            atol=lib.tolerance(dtype))
    self.assertEqual(single.devices, (_CANONICAL[0],))
    self.assertAllClose(got_single[0], lib.expected(arrays[1], mean),
                        atol=lib.tolerance(dtype))

  def test_large_tensor(self):
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(_DEVICES, [(1000, 129)], tf.float32)
      result = replicate.ReductionToOneDeviceCrossTowerOps().reduce(
          ReduceOp.MEAN, inputs[0], _DEVICES)
      with _session() as sess:
        got = sess.run(result.values)
    for g in got:
      self.assertAllClose(g, lib.expected(arrays[0], mean=True))

  def test_accumulation_fn_and_reduce_to_device(self):
    calls = []

    def accumulate(tensors):
      calls.append(len(tensors))
      return tf.add_n(tensors)

    with tf.Graph().as_default():
      inputs, _ = lib.make_inputs(_DEVICES[:2], [(2,)], tf.float32)
      ops = replicate.ReductionToOneDeviceCrossTowerOps(
          reduce_to_device='/cpu:3', accumulation_fn=accumulate)
      self.assertEqual(ops.reduce_to_device, _CANONICAL[3])
      result = ops.reduce(ReduceOp.SUM, inputs[0], '/cpu:0')
      add = result.values[0].op.inputs[0].op
      self.assertEqual(device_util.canonicalize(add.device), _CANONICAL[3])
    self.assertEqual(calls, [2])

  def test_single_tensor_stands_for_one_device(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:2'):
        t = tf.constant([1., 2.])
      result = replicate.ReductionToOneDeviceCrossTowerOps().reduce(
          ReduceOp.MEAN, t, ['/cpu:0', '/cpu:1'])
      with _session() as sess:
        got = sess.run(result.values)
    self.assertAllClose(got, [[1., 2.], [1., 2.]])  # mean of one value

  def test_destinations_forms(self):
    with tf.Graph().as_default():
      inputs, _ = lib.make_inputs(_DEVICES[:2], [(2,)], tf.float32)
      with tf.device('/cpu:3'):
        var = tf1.get_variable('v', [2], use_resource=True)
      ops = replicate.ReductionToOneDeviceCrossTowerOps()
      self.assertEqual(ops.reduce(ReduceOp.SUM, inputs[0], var).devices,
                       (_CANONICAL[3],))
      self.assertEqual(ops.reduce(ReduceOp.SUM, inputs[0], inputs[0]).devices,
                       tuple(_CANONICAL[:2]))

  def test_broadcast(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        t = tf.constant([1., 2., 3.])
      ops = replicate.ReductionToOneDeviceCrossTowerOps()
      result = ops.broadcast(t, _DEVICES)
      from_numpy = ops.broadcast(np.float32(4.), '/cpu:1')
      with _session() as sess:
        got, got_numpy = sess.run((result.values, from_numpy.values))
    self.assertEqual(result.devices, tuple(_CANONICAL))
    for d, v in zip(_CANONICAL, result.values):
      self.assertEqual(device_util.canonicalize(v.device), d)
    self.assertAllEqual(got, [[1., 2., 3.]] * 4)
    self.assertEqual(got_numpy, (4.,))

  @parameterized.parameters(ReduceOp.SUM, ReduceOp.MEAN)
  def test_sparse_concatenated_not_densified(self, reduce_op):
    with tf.Graph().as_default():
      index = {}
      for i, d in enumerate(_DEVICES[:2]):
        with tf.device(d):
          index[d] = tf.IndexedSlices(
              tf.constant([[1., 2.], [3., 4.]]) * (i + 1),
              tf.constant([0, 2], dtype=tf.int64) + i,
              tf.constant([4, 2], dtype=tf.int64))
      result = replicate.ReductionToOneDeviceCrossTowerOps().reduce(
          reduce_op, values.PerDevice(index), _DEVICES[2:])
      for d, v in zip(_CANONICAL[2:], result.values):
        self.assertIsInstance(v, tf.IndexedSlices)
        self.assertEqual(device_util.canonicalize(v.values.device), d)
        self.assertEqual(device_util.canonicalize(v.indices.device), d)
      with _session() as sess:
        got = sess.run(result.values[0])
        dense = sess.run(tf.convert_to_tensor(result.values[1]))
    scale = 0.5 if reduce_op == ReduceOp.MEAN else 1.
    # Rows [1,2],[3,4] at 0, 2 from tower 0; [2,4],[6,8] at 1, 3 from tower 1.
    self.assertAllEqual(got.indices, [0, 2, 1, 3])
    self.assertAllClose(got.values,
                        scale * np.array([[1., 2.], [3., 4.], [2., 4.],
                                          [6., 8.]]))
    self.assertAllEqual(got.dense_shape, [4, 2])
    self.assertAllClose(dense, scale * np.array([[1., 2.], [2., 4.], [3., 4.],
                                                 [6., 8.]]))

  def test_dense_and_sparse_mixed_become_sparse(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        dense = tf.constant([[1.], [2.]])
      with tf.device('/cpu:1'):
        sparse = tf.IndexedSlices(tf.constant([[5.]]), tf.constant([1]),
                                  tf.constant([2, 1]))
      result = replicate.ReductionToOneDeviceCrossTowerOps().reduce(
          ReduceOp.SUM, values.PerDevice({'/cpu:0': dense, '/cpu:1': sparse}),
          '/cpu:0')
      self.assertIsInstance(result.values[0], tf.IndexedSlices)
      with _session() as sess:
        got = sess.run(tf.convert_to_tensor(result.values[0]))
    self.assertAllClose(got, [[1.], [7.]])  # row 1: 2 + 5

  def test_bad_inputs(self):
    ops = replicate.ReductionToOneDeviceCrossTowerOps()
    with tf.Graph().as_default():
      inputs, _ = lib.make_inputs(_DEVICES[:2], [(2,)], tf.float32)
      ints, _ = lib.make_inputs(_DEVICES[:2], [(2,)], tf.int32)
      with tf.device('/cpu:0'):
        a = tf.constant(1.)
      with tf.device('/cpu:1'):
        b = tf.constant(1., dtype=tf.float64)
      with self.assertRaisesRegex(ValueError, 'only SUM and MEAN combine'):
        ops.reduce(tf.VariableAggregation.ONLY_FIRST_REPLICA, inputs[0],
                   '/cpu:0')
      with self.assertRaisesRegex(ValueError, 'must be replicate.ReduceOp'):
        ops.reduce('sum', inputs[0], '/cpu:0')
      with self.assertRaisesRegex(ValueError, 'destinations is None'):
        ops.reduce(ReduceOp.SUM, inputs[0], None)
      with self.assertRaisesRegex(ValueError, 'destinations is an empty list'):
        ops.reduce(ReduceOp.SUM, inputs[0], [])
      with self.assertRaisesRegex(ValueError, 'destinations is an empty'):
        ops.batch_reduce(ReduceOp.SUM, [(inputs[0], ())])
      with self.assertRaisesRegex(ValueError, 'destinations is None'):
        ops.broadcast(a, None)
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'Expected a PerDevice/Mirrored value'):
        ops.reduce(ReduceOp.SUM, [a], '/cpu:0')
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'different dtypes \\(float32, float64\\)'):
        ops.reduce(ReduceOp.SUM, values.PerDevice({'/cpu:0': a, '/cpu:1': b}),
                   '/cpu:0')
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'Cannot take the MEAN of int32 values'):
        ops.reduce(ReduceOp.MEAN, ints[0], '/cpu:0')
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'value_destination_pairs is empty'):
        ops.batch_reduce(ReduceOp.SUM, [])
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'must be a list of \\(per_device_value'):
        ops.batch_reduce(ReduceOp.SUM, inputs[0])
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'must be a \\(per_device_value, '
                                  'destinations\\) pair'):
        ops.batch_reduce(ReduceOp.SUM, [(inputs[0],)])
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'broadcast needs a tensor'):
        ops.broadcast(object(), '/cpu:0')
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'accumulation_fn must be callable'):
      replicate.ReductionToOneDeviceCrossTowerOps(accumulation_fn=3)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'is not a valid device string'):
      replicate.ReductionToOneDeviceCrossTowerOps(reduce_to_device='/x:y')

  def test_sum_of_integers_allowed(self):
    with tf.Graph().as_default():
      ints, arrays = lib.make_inputs(_DEVICES[:2], [(3,)], tf.int32)
      result = replicate.ReductionToOneDeviceCrossTowerOps().reduce(
          ReduceOp.SUM, ints[0], '/cpu:0')
      with _session() as sess:
        self.assertAllEqual(sess.run(result.values[0]),
                            lib.expected(arrays[0], mean=False))


if __name__ == '__main__':
  tf.test.main()

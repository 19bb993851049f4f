"""Tests for the CrossTowerOps API, reduction to one device and all-reduce."""
import unittest
from unittest import mock

from absl.testing import parameterized
import ctops_testlib as lib
import numpy as np
import tensorflow as tf

import replicate
from replicate import _compat
from replicate import cross_tower_ops
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import values

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

  @parameterized.named_parameters(
      ('to_one_device', replicate.ReductionToOneDeviceCrossTowerOps),
      ('all_reduce', lambda: replicate.AllReduceCrossTowerOps(
          'hierarchical_copy', num_packs=0)))
  def test_no_destinations_reduce_onto_the_values_devices(self, make_ops):
    # contrib's reduce(..., destinations=None) and (value, None) pairs of
    # batch_reduce: the result is mirrored on the value's own devices.
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(_DEVICES[:3], [(2, 3), (4,)],
                                       tf.float32)
      ops = make_ops()
      single = ops.reduce(ReduceOp.SUM, inputs[0])
      pairs = ops.batch_reduce(ReduceOp.MEAN, [(v, None) for v in inputs])
      with _session() as sess:
        got_single, got_pairs = sess.run(
            (single.values, [r.values for r in pairs]))
    self.assertEqual(tuple(_CANONICAL[:3]), single.devices)
    for value in got_single:
      # SUM over three devices: a0 + a1 + a2, on each of them.
      self.assertAllClose(lib.expected(arrays[0], mean=False), value)
    for result, column, value in zip(pairs, arrays, got_pairs):
      self.assertEqual(tuple(_CANONICAL[:3]), result.devices)
      for v in value:
        self.assertAllClose(lib.expected(column, mean=True), v)

  def test_sum_of_integers_allowed(self):
    with tf.Graph().as_default():
      ints, arrays = lib.make_inputs(_DEVICES[:2], [(3,)], tf.int32)
      result = replicate.ReductionToOneDeviceCrossTowerOps().reduce(
          ReduceOp.SUM, ints[0], '/cpu:0')
      with _session() as sess:
        self.assertAllEqual(sess.run(result.values[0]),
                            lib.expected(arrays[0], mean=False))


# Packing knobs of AllReduceCrossTowerOps, by name.
_PACKINGS = {
    'no_packing': dict(num_packs=0),
    'one_pack': dict(num_packs=1),
    'three_packs': dict(num_packs=3),
    'small_tensors': dict(num_packs=0, agg_small_grads_max_bytes=64,
                          agg_small_grads_max_group=2),
    # As in TF (and contrib's tests): a group of 0 turns grouping off.
    'no_groups': dict(num_packs=1, agg_small_grads_max_bytes=64,
                      agg_small_grads_max_group=0),
}


def _op_types(graph, op_type):
  return [op for op in graph.get_operations() if op.type == op_type]


class AllReduceCrossTowerOpsTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.product(
      packing=sorted(_PACKINGS),
      reduce_op=[ReduceOp.SUM, ReduceOp.MEAN],
      dtype=[tf.float16, tf.float32, tf.float64])
  def test_hierarchical_copy_numerics_and_placement(self, packing, reduce_op,
                                                    dtype):
    mean = reduce_op == ReduceOp.MEAN
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(_DEVICES, lib.SMALL_SHAPES, dtype)
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy',
                                             **_PACKINGS[packing])
      results = ops.batch_reduce(reduce_op, [(v, v) for v in inputs])
      for result, (shape, value) in zip(results, zip(lib.SMALL_SHAPES,
                                                     inputs)):
        self.assertIsInstance(result, values.Mirrored)
        self.assertEqual(result.devices, value.devices)
        for device, tensor in zip(result.devices, result.values):
          self.assertEqual(device_util.canonicalize(tensor.device), device)
          self.assertEqual(tensor.shape, shape)
          self.assertEqual(tensor.dtype, dtype)
      with _session() as sess:
        got = sess.run([r.values for r in results])
    for column, per_device in zip(arrays, got):
      for v in per_device:
        # 4 towers: SUM = a0 + a1 + a2 + a3, MEAN = SUM / 4.
        self.assertAllClose(v, lib.expected(column, mean),
                            atol=lib.tolerance(dtype))

  @parameterized.parameters(
      ('hierarchical_copy', dict(num_packs=2)),
      ('hierarchical_copy', dict(num_packs=0, agg_small_grads_max_bytes=100)))
  def test_large_and_mixed_shapes(self, alg, knobs):
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(_DEVICES[:3], lib.SHAPES, tf.float32)
      ops = replicate.AllReduceCrossTowerOps(alg, **knobs)
      results = ops.batch_reduce(ReduceOp.MEAN, [(v, v) for v in inputs])
      with _session() as sess:
        got = sess.run([r.values for r in results])
    for column, per_device in zip(arrays, got):
      for v in per_device:
        self.assertAllClose(v, lib.expected(column, mean=True), atol=1e-5)

  def test_reduce_single_value_and_one_device(self):
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(_DEVICES[:2], [(3,)], tf.float32)
      one, one_arrays = lib.make_inputs(_DEVICES[2:3], [(3,)], tf.float32)
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy')
      result = ops.reduce(ReduceOp.SUM, inputs[0], _DEVICES[:2])
      single = ops.reduce(ReduceOp.MEAN, one[0], _DEVICES[2])
      self.assertEqual(device_util.canonicalize(single.values[0].device),
                       _CANONICAL[2])
      with _session() as sess:
        got, got_single = sess.run((result.values, single.values))
    for v in got:
      self.assertAllClose(v, lib.expected(arrays[0], mean=False))
    self.assertAllClose(got_single[0], one_arrays[0][0])  # mean of one

  def test_sparse_falls_back_with_one_warning(self):
    with tf.Graph().as_default():
      dense, dense_arrays = lib.make_inputs(_DEVICES[:2], [(3,)], tf.float32)
      sparse = []
      for k in range(2):
        index = {}
        for i, d in enumerate(_DEVICES[:2]):
          with tf.device(d):
            index[d] = tf.IndexedSlices(tf.constant([[float(i + k)]]),
                                        tf.constant([i]), tf.constant([2, 1]))
        sparse.append(values.PerDevice(index))
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy', num_packs=1)
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        results = ops.batch_reduce(
            ReduceOp.SUM, [(sparse[0], sparse[0]), (dense[0], dense[0]),
                           (sparse[1], sparse[1])])
      self.assertLen(logs.records, 1)
      self.assertRegex(logs.output[0], '2 of 3 values are reduced to one '
                       'device instead of all-reduced: IndexedSlices are not '
                       'all-reduced')
      self.assertIsInstance(results[0].values[0], tf.IndexedSlices)
      self.assertIsInstance(results[1].values[0], tf.Tensor)
      with _session() as sess:
        got = sess.run([tf.convert_to_tensor(results[0].values[1]),
                        tf.convert_to_tensor(results[2].values[0]),
                        results[1].values[1]])
    self.assertAllClose(got[0], [[0.], [1.]])  # row i holds i (k = 0)
    self.assertAllClose(got[1], [[1.], [2.]])  # row i holds i + 1 (k = 1)
    self.assertAllClose(got[2], lib.expected(dense_arrays[0], mean=False))

  def test_other_destinations_fall_back_with_one_warning(self):
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(_DEVICES[:2], [(3,), (2,)], tf.float32)
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy')
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        results = ops.batch_reduce(
            ReduceOp.SUM, [(inputs[0], '/cpu:3'), (inputs[1], _DEVICES[1:])])
      self.assertLen(logs.records, 1)
      self.assertRegex(logs.output[0], 'destinations differ from the devices '
                       'of the values')
      self.assertEqual(results[0].devices, (_CANONICAL[3],))
      self.assertEqual(
          device_util.canonicalize(results[0].values[0].device), _CANONICAL[3])
      with _session() as sess:
        got = sess.run([r.values for r in results])
    self.assertAllClose(got[0][0], lib.expected(arrays[0], mean=False))
    self.assertAllClose(got[1][0], lib.expected(arrays[1], mean=False))

  @parameterized.parameters((0, 2), (1, 1), (3, 3))
  def test_nccl_graph_one_op_per_device(self, num_packs, nccl_per_device):
    gpus = ['/device:GPU:0', '/device:GPU:1']
    with tf.Graph().as_default() as graph:
      inputs, _ = lib.make_inputs(gpus, [(3,), (5,)], tf.float32)
      ops = replicate.AllReduceCrossTowerOps(
          cross_tower_ops.AllReduceAlgorithm.NCCL, num_packs=num_packs)
      results = ops.batch_reduce(ReduceOp.MEAN, [(v, v) for v in inputs])
      nccl = _op_types(graph, 'NcclAllReduce')
      # Two values of 3 + 5 elements: unpacked, 2 all-reduces; one pack, 1;
      # three packs of the 8 elements, 3. Each all-reduce: one op per GPU.
      self.assertLen(nccl, nccl_per_device * len(gpus))
      self.assertEqual(
          sorted(set(device_util.canonicalize(op.device) for op in nccl)),
          [device_util.canonicalize(g) for g in gpus])
      for result in results:
        for d, t in zip(result.devices, result.values):
          self.assertEqual(device_util.canonicalize(t.device), d)

  @unittest.skipIf(len(_compat.local_gpu_devices()) < 2,
                   'NCCL numerics need 2+ visible GPUs.')
  def test_nccl_numerics_on_gpus(self):
    gpus = _compat.local_gpu_devices()
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(gpus, lib.SHAPES, tf.float32)
      ops = replicate.AllReduceCrossTowerOps('nccl', num_packs=2)
      results = ops.batch_reduce(ReduceOp.MEAN, [(v, v) for v in inputs])
      with tf1.Session() as sess:
        got = sess.run([r.values for r in results])
    for column, per_device in zip(arrays, got):
      for v in per_device:
        self.assertAllClose(v, lib.expected(column, mean=True), atol=1e-5)

  def test_nccl_of_one_value_is_the_value_on_any_device(self):
    # Nothing to all-reduce: like TF, the value comes back (on its device),
    # even on a CPU.
    with tf.Graph().as_default():
      one, arrays = lib.make_inputs(_DEVICES[1:2], [(3,)], tf.float32)
      result = replicate.AllReduceCrossTowerOps('nccl').reduce(
          ReduceOp.MEAN, one[0], _DEVICES[1])
      self.assertEqual(device_util.canonicalize(result.values[0].device),
                       _CANONICAL[1])
      with _session() as sess:
        got = sess.run(result.values[0])
    self.assertAllClose(got, arrays[0][0])

  def test_shapes_that_differ_between_devices(self):
    with tf.Graph().as_default():
      per_device = {}
      for d, n in zip(_DEVICES[:2], (2, 3)):
        with tf.device(d):
          per_device[d] = tf.zeros([n])
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'value 0 of the batch has shapes \(2,\), \(3,\) on '):
        replicate.AllReduceCrossTowerOps('hierarchical_copy').reduce(
            ReduceOp.SUM, values.PerDevice(per_device), _DEVICES[:2])

  def test_nccl_on_cpus_is_an_error(self):
    with tf.Graph().as_default():
      inputs, _ = lib.make_inputs(_DEVICES[:2], [(3,)], tf.float32)
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'NCCL all-reduce runs on GPUs only, got '
                                  '.*CPU:0'):
        replicate.AllReduceCrossTowerOps('nccl').reduce(
            ReduceOp.SUM, inputs[0], inputs[0])

  def test_constructor_errors(self):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                "Unknown all_reduce_alg 'ring'; use one of "
                                "'nccl', 'hierarchical_copy'"):
      replicate.AllReduceCrossTowerOps('ring')
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'num_packs must be an integer >= 0, got -1'):
      replicate.AllReduceCrossTowerOps('nccl', num_packs=-1)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'agg_small_grads_max_bytes must be an integer'):
      replicate.AllReduceCrossTowerOps(agg_small_grads_max_bytes=-5)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'agg_small_grads_max_group must be an integer '
                                '>= 0, got -1'):
      replicate.AllReduceCrossTowerOps(agg_small_grads_max_group=-1)
    self.assertEqual(
        replicate.AllReduceCrossTowerOps('hierarchical_copy').all_reduce_alg,
        cross_tower_ops.AllReduceAlgorithm.HIERARCHICAL_COPY)


# Links of a DGX-1: two fully linked quads, and GPU i linked to GPU i + 4.
_DGX1_LINKS = [[1, 2, 3, 4], [0, 2, 3, 5], [0, 1, 3, 6], [0, 1, 2, 7],
               [0, 5, 6, 7], [1, 4, 6, 7], [2, 4, 5, 7], [3, 4, 5, 6]]


def _local_gpus(links):
  return [('/device:GPU:%d' % i, 'GPU', l) for i, l in enumerate(links)] + [
      ('/device:CPU:0', 'CPU', [])]


class ChooseTheBestTest(tf.test.TestCase):

  def test_cpus_reduce_to_one_device(self):
    self.assertIsInstance(replicate.choose_the_best(_DEVICES),
                          replicate.ReductionToOneDeviceCrossTowerOps)
    self.assertIsInstance(
        replicate.choose_the_best(['/cpu:0', '/gpu:0']),
        replicate.ReductionToOneDeviceCrossTowerOps)

  @unittest.skipIf(_compat.local_gpu_devices(), 'GPUs are visible here.')
  def test_invisible_gpus_reduce_to_one_device_with_warning(self):
    with self.assertLogs('tensorflow', level='WARNING') as logs:
      ops = replicate.choose_the_best(['/gpu:0', '/gpu:1'])
    self.assertIsInstance(ops, replicate.ReductionToOneDeviceCrossTowerOps)
    self.assertRegex(logs.output[0], 'GPU:0, .*GPU:1 are not visible')

  def test_topology(self):
    gpus8 = [device_util.canonicalize('/gpu:%d' % i) for i in range(8)]
    chosen = cross_tower_ops.choose_for(gpus8, _local_gpus(_DGX1_LINKS))
    self.assertEqual(chosen.all_reduce_alg,
                     cross_tower_ops.AllReduceAlgorithm.HIERARCHICAL_COPY)
    # Only part of the DGX-1, or no links: NCCL.
    chosen = cross_tower_ops.choose_for(gpus8[:2], _local_gpus(_DGX1_LINKS))
    self.assertEqual(chosen.all_reduce_alg,
                     cross_tower_ops.AllReduceAlgorithm.NCCL)
    chosen = cross_tower_ops.choose_for(gpus8[:2], _local_gpus([[], []]))
    self.assertEqual(chosen.all_reduce_alg,
                     cross_tower_ops.AllReduceAlgorithm.NCCL)

  def test_has_dgx1_like_links(self):
    self.assertTrue(cross_tower_ops.has_dgx1_like_links(_DGX1_LINKS))
    self.assertFalse(cross_tower_ops.has_dgx1_like_links(_DGX1_LINKS[:4]))
    broken = [list(l) for l in _DGX1_LINKS]
    broken[5].remove(1)  # GPU 5 loses its link to GPU 1
    self.assertFalse(cross_tower_ops.has_dgx1_like_links(broken))
    full = [[j for j in range(8) if j != i] for i in range(8)]
    self.assertTrue(cross_tower_ops.has_dgx1_like_links(full))

  def test_a_visible_cpu_among_the_devices_reduces_to_one_device(self):
    # GPU 0 and CPU 0, both visible: not all GPUs, so reduction to one
    # device (NCCL would refuse the CPU).
    devices = [device_util.canonicalize(d) for d in ('/gpu:0', '/cpu:0')]
    chosen = cross_tower_ops.choose_for(devices, _local_gpus([[]]))
    self.assertIsInstance(chosen, replicate.ReductionToOneDeviceCrossTowerOps)

  def test_topology_does_not_depend_on_the_listing_order(self):
    # The same DGX-1, its devices listed from GPU 7 down to GPU 0 (and the
    # CPU first): still hierarchical copy, links read by device index.
    gpus8 = [device_util.canonicalize('/gpu:%d' % i) for i in range(8)]
    local = list(reversed(_local_gpus(_DGX1_LINKS)))
    chosen = cross_tower_ops.choose_for(gpus8, local)
    self.assertEqual(cross_tower_ops.AllReduceAlgorithm.HIERARCHICAL_COPY,
                     chosen.all_reduce_alg)

  def test_all_reduce_choices_keep_the_tuning(self):
    tuning = replicate.Tuning(pack_max_bytes=0)
    gpus8 = [device_util.canonicalize('/gpu:%d' % i) for i in range(8)]
    # Hierarchical copy (all 8 GPUs of a DGX-1) and NCCL (2 of them).
    for devices in (gpus8, gpus8[:2]):
      chosen = cross_tower_ops.choose_for(devices, _local_gpus(_DGX1_LINKS),
                                          tuning)
      self.assertIsInstance(chosen, replicate.AllReduceCrossTowerOps)
      self.assertIs(tuning, chosen.tuning)

  def test_cpus_are_chosen_for_without_listing_the_local_devices(self):
    # Listing the local devices creates every GPU's device (and its memory
    # pool); a request for CPUs alone does not need it.
    with mock.patch.object(_compat, 'local_device_attributes',
                           side_effect=AssertionError('listed devices')):
      chosen = replicate.choose_the_best(['/cpu:0', '/cpu:1'])
    self.assertIsInstance(chosen, replicate.ReductionToOneDeviceCrossTowerOps)

  def test_errors(self):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'destinations is None'):
      replicate.choose_the_best(None)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'destinations is an empty list'):
      replicate.choose_the_best([])


if __name__ == '__main__':
  tf.test.main()

"""ReductionToOneDeviceCrossTowerOps.batch_reduce packs small values
(replicate/cross_tower/packed_reduction.py): same results, fewer ops."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import testing
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import tuning
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import values

_DEVICES = testing.virtual_cpu_devices(4)
_CANONICAL = [device_util.canonicalize(d) for d in _DEVICES]
_DESTINATIONS = ['/cpu:1', '/cpu:2']


def _session():
  return tf1.Session(config=testing.virtual_cpu_config(4))


def _per_device(arrays, devices=_DEVICES):
  index = {}
  for device, array in zip(devices, arrays):
    with tf.device(device):
      index[device] = tf.constant(array)
  return values.PerDevice(index)


def _mixed_arrays(rng):
  """Per value, one array per device: what packs and what does not.

  18 values of [64, 64] (16 KB each: one group; a pack of 16, since 16 of
  them exceed Tuning.pack_small_bytes, 64 KB, and one of 2), 20 of [6] (480
  bytes in all: one pack), a scalar (rank 0: alone) and a [300, 300]
  float32 value (360 KB, above Tuning.pack_max_bytes: alone). Small
  integers: every sum is exact.
  """
  shapes = [(64, 64)] * 18 + [(6,)] * 20 + [(), (300, 300)]
  return [[rng.randint(-8, 8, size=s).astype(np.float32) for _ in _DEVICES]
          for s in shapes]


def _count(graph, op_type):
  return sum(op.type == op_type for op in graph.get_operations())


class PackedBatchReduceTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.product(reduce_op=[ReduceOp.SUM, ReduceOp.MEAN],
                         reduce_to_device=[None, '/cpu:3'])
  def test_same_results_as_one_by_one(self, reduce_op, reduce_to_device):
    arrays = _mixed_arrays(np.random.RandomState(0))
    ops = replicate.ReductionToOneDeviceCrossTowerOps(
        reduce_to_device=reduce_to_device)
    with tf.Graph().as_default():
      inputs = [_per_device(a) for a in arrays]
      # A sparse value in the batch is reduced on its own.
      with tf.device(_DEVICES[0]):
        sparse = tf.IndexedSlices(tf.constant([[1., 2.]]), tf.constant([1]),
                                  tf.constant([3, 2]))
      with tf.device(_DEVICES[1]):
        dense = tf.constant([[0., 0.], [5., 5.], [1., 1.]])
      sparse_value = values.PerDevice({_DEVICES[0]: sparse,
                                       _DEVICES[1]: dense})
      packed = ops.batch_reduce(
          reduce_op, [(v, _DESTINATIONS) for v in inputs] +
          [(sparse_value, _DESTINATIONS)])
      alone = [ops.reduce(reduce_op, v, _DESTINATIONS) for v in inputs]
      with _session() as sess:
        got_packed, got_alone, got_sparse = sess.run((
            [r.values for r in packed[:-1]], [r.values for r in alone],
            tf.convert_to_tensor(packed[-1].values[0])))
    for result in packed:
      self.assertIsInstance(result, values.Mirrored)
      self.assertEqual(result.devices, tuple(_CANONICAL[1:3]))
      for device, tensor in zip(result.devices, result.values):
        self.assertEqual(device_util.canonicalize(tensor.device), device)
    count = len(_DEVICES)
    for column, by_pack, by_value in zip(arrays, got_packed, got_alone):
      # SUM = a0 + a1 + a2 + a3; MEAN = SUM / 4 (exact for these integers).
      total = np.sum(np.stack(column), axis=0)
      want = total / count if reduce_op == ReduceOp.MEAN else total
      for on_destination, alone_value in zip(by_pack, by_value):
        self.assertAllEqual(want, on_destination)
        self.assertAllEqual(alone_value, on_destination)
    # Rows of the sparse value: row 1 = [1, 2] + [5, 5], row 2 = [1, 1].
    want_sparse = np.array([[0., 0.], [6., 7.], [1., 1.]])
    if reduce_op == ReduceOp.MEAN:
      want_sparse /= 2
    self.assertAllEqual(want_sparse, got_sparse)

  def test_ops_per_pack(self):
    arrays = _mixed_arrays(np.random.RandomState(1))
    graph = tf.Graph()
    with graph.as_default():
      inputs = [_per_device(a) for a in arrays]
      before = len(graph.get_operations())
      replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, [(v, _DESTINATIONS) for v in inputs])
    new_ops = graph.get_operations()[before:]
    by_type = {}
    for op in new_ops:
      by_type.setdefault(op.type, []).append(op)
    # Packs: 16 + 2 values of [64, 64] and 20 of [6]: 3 packs, each a
    # ConcatV2 on each of the 4 devices, one add_n and a split on each of the
    # 2 destinations; the scalar and the large value: an add_n each, and an
    # identity per destination.
    self.assertLen(by_type['ConcatV2'], 3 * 4)
    self.assertNotIn('DynamicStitch', by_type)
    self.assertLen(by_type['AddN'], 3 + 2)
    self.assertLen(by_type['SplitV'], 3 * 2)
    self.assertEqual([16, 16, 2, 2, 20, 20], [op.get_attr('num_split')
                                              for op in by_type['SplitV']])
    self.assertLen(by_type['Identity'], 2 * 2)
    self.assertEqual(
        sorted(_CANONICAL * 3),
        sorted(device_util.canonicalize(op.device)
               for op in by_type['ConcatV2']))
    # Sums run on the first destination; splits on each destination.
    self.assertEqual({_CANONICAL[1]}, set(
        device_util.canonicalize(op.device) for op in by_type['AddN']))
    self.assertEqual(sorted(_CANONICAL[1:3] * 3), sorted(
        device_util.canonicalize(op.device) for op in by_type['SplitV']))

  @parameterized.named_parameters(
      ('two_cpus', 'cpu', 2), ('eight_cpus', 'cpu', 8),
      ('eight_gpus', 'gpu', 8))
  def test_packs_keep_their_size_on_every_device_kind(self, kind,
                                                      num_devices):
    # 40 values of [64, 64] (16 KB each): packs of Tuning.pack_max_group (16)
    # values, since 16 already exceed pack_small_bytes (64 KB): 16 + 16 + 8,
    # 3 packs whatever the number or kind of devices, each one ConcatV2 per
    # device and one add_n (graph only: no GPU is needed to build).
    rng = np.random.RandomState(3)
    devices = ['/{}:{}'.format(kind, i) for i in range(num_devices)]
    graph = tf.Graph()
    with graph.as_default():
      inputs = [_per_device(
          [rng.randint(-3, 4, size=(64, 64)).astype(np.float32)
           for _ in devices], devices) for _ in range(40)]
      replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, [(v, [devices[0]]) for v in inputs])
    self.assertEqual(3 * num_devices, _count(graph, 'ConcatV2'))
    self.assertEqual(0, _count(graph, 'DynamicStitch'))
    self.assertEqual(3, _count(graph, 'AddN'))

  def test_packing_off(self):
    arrays = _mixed_arrays(np.random.RandomState(2))
    graph = tf.Graph()
    with graph.as_default(), tuning.tuning_scope(
        tuning.Tuning(pack_max_bytes=0)):
      inputs = [_per_device(a) for a in arrays]
      replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, [(v, _DESTINATIONS) for v in inputs])
    # One add_n per value (40), nothing concatenated.
    self.assertEqual(40, _count(graph, 'AddN'))
    self.assertEqual(0, _count(graph, 'ConcatV2'))
    self.assertEqual(0, _count(graph, 'DynamicStitch'))

  def test_groups_need_the_same_devices_destinations_and_dtype(self):
    rng = np.random.RandomState(3)
    graph = tf.Graph()
    with graph.as_default():
      def value(devices, dtype=np.float32):
        return _per_device(
            [rng.randint(-8, 8, size=(2, 2)).astype(dtype) for _ in devices],
            devices)

      pairs = [
          (value(_DEVICES), _DESTINATIONS),
          (value(_DEVICES[:2]), _DESTINATIONS),  # other source devices
          (value(_DEVICES), ['/cpu:3']),  # other destinations
          (value(_DEVICES, np.float64), _DESTINATIONS),  # other dtype
          (value(_DEVICES), _DESTINATIONS),  # packs with the first
      ]
      results = replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, pairs)
      with _session() as sess:
        got = sess.run([r.values[0] for r in results])
    # One pack (values 0 and 4, 8 elements: a ConcatV2 per device); values
    # 1, 2 and 3 alone: 4 add_n.
    self.assertEqual(4, _count(graph, 'AddN'))
    self.assertEqual(4, _count(graph, 'ConcatV2'))
    with tf1.Session(graph=graph, config=testing.virtual_cpu_config(4)) as s:
      want = s.run([tf.add_n(list(v.values)) for v, _ in pairs])
    for w, g in zip(want, got):
      self.assertAllEqual(w, g)

  def test_an_entry_of_unknown_shape_is_reduced_alone(self):
    # A copy of a gradient from a while loop may have lost its static shape
    # on one device: that value is reduced alone (no error), the others pack.
    rng = np.random.RandomState(4)
    arrays = [[rng.randint(-8, 8, size=(2, 2)).astype(np.float32)
               for _ in _DEVICES] for _ in range(3)]
    graph = tf.Graph()
    with graph.as_default():
      pairs = [(_per_device(a), _DESTINATIONS) for a in arrays]
      with tf.device(_DEVICES[1]):
        unknown = tf1.placeholder_with_default(arrays[1][1], shape=None)
      tensors = list(pairs[1][0].values)
      tensors[1] = unknown
      pairs[1] = (values.PerDevice(dict(zip(_DEVICES, tensors))),
                  _DESTINATIONS)
      results = replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, pairs)
      with _session() as sess:
        got = sess.run([r.values[0] for r in results])
    # Values 0 and 2 in one pack (one add_n), value 1 alone (one add_n).
    self.assertEqual(2, _count(graph, 'AddN'))
    self.assertEqual(len(_DEVICES), _count(graph, 'ConcatV2'))
    for want, g in zip(arrays, got):
      self.assertAllEqual(np.sum(want, axis=0), g)



class PackedPlacementTest(tf.test.TestCase):
  """Where a pack's ops run, and what a pack may hold."""

  def test_packed_sums_run_on_reduce_to_device(self):
    # Three [2, 3] values on /cpu:0 and /cpu:1 (one pack), destinations
    # /cpu:1 and /cpu:2, reduce_to_device /cpu:3: the pack's one AddN runs
    # on /cpu:3, as each value's sum reduced alone would.
    with tf.Graph().as_default() as graph:
      pairs = []
      for k in range(3):
        # Value k on device i: 100 k + 10 i + [0..5].
        pairs.append((_per_device(
            [(100. * k + 10. * i + np.arange(6, dtype=np.float32))
             .reshape(2, 3) for i in range(2)]), _DESTINATIONS))
      results = replicate.ReductionToOneDeviceCrossTowerOps(
          reduce_to_device='/cpu:3').batch_reduce(ReduceOp.MEAN, pairs)
      add_n = [op for op in graph.get_operations() if op.type == 'AddN']
      self.assertLen(add_n, 1)
      self.assertEqual(_CANONICAL[3], device_util.canonicalize(add_n[0].device))
      with _session() as sess:
        got = sess.run([r.values for r in results])
    for k, per_destination in enumerate(got):
      # MEAN of the two devices: 100 k + 5 + [0..5].
      want = (100. * k + 5. + np.arange(6, dtype=np.float32)).reshape(2, 3)
      for g in per_destination:
        self.assertAllEqual(want, g)

  def test_each_concatenation_runs_where_its_tensors_are(self):
    # Two [2, 2] values whose devices come in the order /cpu:1, /cpu:0:
    # each device's concatenation runs on that device.
    with tf.Graph().as_default() as graph:
      pairs = []
      for k in range(2):
        pairs.append((_per_device(
            [np.full((2, 2), 10. * k + i, np.float32) for i in (1, 0)],
            [_DEVICES[1], _DEVICES[0]]), ['/cpu:2']))
      results = replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, pairs)
      concats = [op for op in graph.get_operations() if op.type == 'ConcatV2']
      self.assertLen(concats, 2)
      for op in concats:
        for t in op.inputs[:-1]:  # the last input is the axis
          self.assertEqual(device_util.canonicalize(op.device),
                           device_util.canonicalize(t.device))
      with _session() as sess:
        got = sess.run([r.values[0] for r in results])
    # Value k: (10 k + 1) + (10 k + 0) = 20 k + 1.
    for k, g in enumerate(got):
      self.assertAllEqual(np.full((2, 2), 20. * k + 1.), g)

  def test_entries_of_other_shapes_are_not_packed(self):
    # Value 0: [2, 3] on /cpu:0 but [3, 3] on /cpu:1; value 1: [2, 3] and
    # [1, 3]. Each device's concatenation would have 4 rows, so a pack
    # would add up rows of different values; reduced alone, value 0 is an
    # error naming its shapes.
    def rows(n, base):
      return base + np.arange(3 * n, dtype=np.float32).reshape(n, 3)

    with tf.Graph().as_default():
      pairs = [(_per_device([rows(2, 0.), rows(3, 100.)]), ['/cpu:0']),
               (_per_device([rows(2, 10.), rows(1, 200.)]), ['/cpu:0'])]
      with self.assertRaisesRegex((ValueError, tf.errors.InvalidArgumentError),
                                  r'\[2, ?3\]'):
        replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
            ReduceOp.SUM, pairs)

  def test_a_value_of_exactly_pack_max_bytes_is_packed(self):
    # Three [4, 4] float32 values: 64 bytes each, pack_max_bytes=64 ("at
    # most"): one pack, one AddN.
    with tf.Graph().as_default() as graph, tuning.tuning_scope(
        tuning.Tuning(pack_max_bytes=64)):
      pairs = [(_per_device([np.full((4, 4), 10. * k + i, np.float32)
                             for i in range(2)]), ['/cpu:1'])
               for k in range(3)]
      results = replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, pairs)
      self.assertEqual(1, _count(graph, 'AddN'))
      with _session() as sess:
        got = sess.run([r.values[0] for r in results])
    # Value k: (10 k) + (10 k + 1) = 20 k + 1.
    for k, g in enumerate(got):
      self.assertAllEqual(np.full((4, 4), 20. * k + 1.), g)


class NotPackedTest(tf.test.TestCase):
  """What batch_reduce must not pack (values on one device, values with an
  IndexedSlices entry of known shape), and the Tuning field that bounds a
  pack of small values."""

  def test_values_on_one_device_are_not_packed(self):
    # Three [2, 2] values, each on /cpu:0 only, reduced onto /cpu:1: nothing
    # to sum, so nothing is concatenated or split; each value arrives as it
    # is (value k: 10 k + [[0, 1], [2, 3]]).
    graph = tf.Graph()
    with graph.as_default():
      pairs = []
      for k in range(3):
        with tf.device(_DEVICES[0]):
          t = tf.constant(10. * k + np.arange(4, dtype=np.float32)
                          .reshape(2, 2))
        pairs.append((values.PerDevice({_DEVICES[0]: t}), ['/cpu:1']))
      results = replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, pairs)
      self.assertEqual(0, _count(graph, 'ConcatV2'))
      self.assertEqual(0, _count(graph, 'SplitV'))
      with _session() as sess:
        got = sess.run([r.values[0] for r in results])
    for k, g in enumerate(got):
      self.assertAllEqual(10. * k + np.arange(4.).reshape(2, 2), g)

  def test_values_with_a_sparse_entry_of_known_shape_stay_sparse(self):
    # Two values, each dense [3, 2] on /cpu:0 and IndexedSlices of dense
    # shape [3, 2] (a constant: fully known statically) on /cpu:1. Mixed
    # dense and sparse values reduce to IndexedSlices, never packed:
    # value k, row r of the dense part: 10 k + r; sparse part: row 1 holds
    # [5, 5] + k. Sum: rows [10 k, 10 k], [10 k + 6 + k] * 2, [10 k + 2] * 2.
    with tf.Graph().as_default():
      pairs = []
      for k in range(2):
        with tf.device(_DEVICES[0]):
          dense = tf.constant(
              10. * k + np.repeat(np.arange(3., dtype=np.float32), 2)
              .reshape(3, 2))
        with tf.device(_DEVICES[1]):
          sparse = tf.IndexedSlices(tf.constant([[5. + k, 5. + k]]),
                                    tf.constant([1]), tf.constant([3, 2]))
        # TF 2: sparse.shape is [3, 2], fully known (TF 1.15 has no .shape).
        pairs.append((values.PerDevice({_DEVICES[0]: dense,
                                        _DEVICES[1]: sparse}), ['/cpu:2']))
      results = replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, pairs)
      for r in results:
        self.assertIsInstance(r.values[0], tf.IndexedSlices)
      with _session() as sess:
        got = sess.run([tf.convert_to_tensor(r.values[0]) for r in results])
    for k, g in enumerate(got):
      self.assertAllEqual([[10. * k] * 2, [11. * k + 6.] * 2,
                           [10. * k + 2.] * 2], g)

  def test_small_values_fill_a_pack_up_to_pack_small_bytes(self):
    # Six [4, 4] float32 values (64 bytes each) on /cpu:0 and /cpu:1;
    # pack_max_bytes=64 lets each be packed, pack_max_group=2 would cap a
    # pack at 2 values, but the six hold 384 bytes <= pack_small_bytes=1024:
    # one pack, so one add_n (a cap of 64 bytes there would give 3 packs).
    graph = tf.Graph()
    with graph.as_default(), tuning.tuning_scope(tuning.Tuning(
        pack_max_bytes=64, pack_max_group=2, pack_small_bytes=1024)):
      pairs = []
      for k in range(6):
        index = {}
        for i, d in enumerate(_DEVICES[:2]):
          with tf.device(d):
            index[d] = tf.constant(np.full((4, 4), 10. * k + i, np.float32))
        pairs.append((values.PerDevice(index), ['/cpu:2']))
      results = replicate.ReductionToOneDeviceCrossTowerOps().batch_reduce(
          ReduceOp.SUM, pairs)
      self.assertEqual(1, _count(graph, 'AddN'))
      self.assertEqual(2, _count(graph, 'ConcatV2'))
      with _session() as sess:
        got = sess.run([r.values[0] for r in results])
    for k, g in enumerate(got):
      self.assertAllEqual(np.full((4, 4), 20. * k + 1.), g)  # 10k + 10k + 1


if __name__ == '__main__':
  tf.test.main()

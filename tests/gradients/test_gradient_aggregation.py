"""Tests for replicate.gradients.gradient_aggregation (packed and per-variable sums)."""
import collections

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.core import tuning
from replicate.gradients import gradient_aggregation

_DEFAULTS = tuning.Tuning()

_DEVICES = replicate.testing.virtual_cpu_devices(4)


def _tower_grads(shapes, num_towers, seed=0, dtype=np.float32,
                 devices=_DEVICES):
  """Per-tower (grad, var) lists; tower t's grads live on /device:CPU:t."""
  rng = np.random.RandomState(seed)
  with tf1.device(devices[0]):
    variables = [tf1.get_variable('v{}'.format(i), shape=s, dtype=dtype,
                                  initializer=tf1.zeros_initializer())
                 for i, s in enumerate(shapes)]
  values = [[rng.standard_normal(s).astype(dtype) for s in shapes]
            for _ in range(num_towers)]
  tower_grads = []
  for t in range(num_towers):
    with tf1.device(devices[t]):
      # Reads of variables, not constants: Grappler would fold constant
      # inputs at graph-optimization time, summing them with other kernels.
      tower_grads.append([
          (tf1.Variable(v, name='g{}_{}'.format(t, i)).read_value(), var)
          for i, (v, var) in enumerate(zip(values[t], variables))])
  return tower_grads, values, variables


class PackedSumTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('deep_like', [(64, 64), (64,)] * 5, 4),
      ('mixed', [(3, 5), (7,), (2, 5), (1,), (4, 5), (7, 2, 3), (9, 2, 3)], 4),
      ('two_towers', [(8, 4), (8,), (6, 4), (5,)], 2),
  )
  def test_packed_sums_bit_identical_to_add_n(self, shapes, num_towers):
    with tf.Graph().as_default():
      tower_grads, values, _ = _tower_grads(shapes, num_towers)
      packed = gradient_aggregation.sum_gradients_by_variable(tower_grads, _DEFAULTS)
      plain = gradient_aggregation.sum_gradients_by_variable(
          tower_grads, _DEFAULTS, pack_max_bytes=0)
      self.assertTrue(any(g.op.type in ('SplitV', 'Split')
                          for g, _ in packed))
      self.assertFalse(any(g.op.type in ('SplitV', 'Split')
                           for g, _ in plain))
      fetches = ([g for g, _ in packed], [g for g, _ in plain])
      # Grappler's arithmetic optimizer may reassociate small AddNs (packed
      # or not), so bit-exactness is checked with it off, closeness with it on.
      exact_config = replicate.testing.virtual_cpu_config(4)
      rewrite = exact_config.graph_options.rewrite_options
      rewrite.arithmetic_optimization = rewrite.OFF
      results = []
      for config in (exact_config, replicate.testing.virtual_cpu_config(4)):
        with tf1.Session(config=config) as sess:
          sess.run(tf1.global_variables_initializer())
          results.append(sess.run(fetches))
    (exact_packed, exact_plain), (got_packed, got_plain) = results
    for i, shape in enumerate(shapes):
      self.assertEqual(got_packed[i].shape, shape)
      # Both add the towers in order, ((t0 + t1) + t2) + t3, in float32 as
      # NumPy does here: bit-identical.
      ordered = values[0][i]
      for t in range(1, num_towers):
        ordered = ordered + values[t][i]
      self.assertAllEqual(exact_packed[i], ordered)
      self.assertAllEqual(exact_plain[i], ordered)
      self.assertAllClose(got_packed[i], ordered, rtol=1e-6, atol=1e-6)
      self.assertAllClose(got_plain[i], ordered, rtol=1e-6, atol=1e-6)

  @parameterized.named_parameters(
      # 20 kernels of 64 x 64 floats (16 KB): 16 of them exceed
      # Tuning.pack_small_bytes (64 KB), so 16 (pack_max_group) and then 4;
      # the 20 biases (256 bytes each, 5 KB in all) share one pack.
      ('small_packs_grow', 64 * 1024, [16, 4, 20]),
      # Without the small-pack rule the biases come 16 + 4 too.
      ('count_only', 0, [16, 4, 16, 4]),
  )
  def test_packs_per_group(self, small_bytes, pack_sizes):
    graph = tf.Graph()
    knobs = tuning.Tuning(pack_small_bytes=small_bytes)
    with graph.as_default():
      tower_grads, values, _ = _tower_grads([(64, 64), (64,)] * 20, 4)
      summed = gradient_aggregation.sum_gradients_by_variable(tower_grads,
                                                              knobs)
      with tf1.Session(
          config=replicate.testing.virtual_cpu_config(4)) as sess:
        sess.run(tf1.global_variables_initializer())
        got = sess.run([g for g, _ in summed])
    by_type = collections.defaultdict(list)
    for op in graph.get_operations():
      by_type[op.type].append(op)
    # A ConcatV2 per tower and pack, one add_n and one split per pack.
    self.assertNotIn('DynamicStitch', by_type)
    self.assertLen(by_type['ConcatV2'], 4 * len(pack_sizes))
    self.assertLen(by_type['AddN'], len(pack_sizes))
    self.assertEqual(pack_sizes, [op.get_attr('num_split')
                                  for op in by_type['SplitV']])
    for i, total in enumerate(got):
      self.assertAllClose(sum(tower[i] for tower in values), total)

  def test_placement_pack_on_tower_sum_on_variable_device(self):
    with tf.Graph().as_default():
      tower_grads, _, variables = _tower_grads([(4, 2), (6, 2)], 4)
      summed = gradient_aggregation.sum_gradients_by_variable(tower_grads, _DEFAULTS)
      self.assertEqual([v.op.name for _, v in summed],
                       [v.op.name for v in variables])
      split = summed[0][0].op
      self.assertIn(split.type, ('Split', 'SplitV'))
      self.assertIn('CPU:0', split.device)
      add_n = split.inputs[1] if split.type == 'Split' else split.inputs[0]
      self.assertEqual(add_n.op.type, 'AddN')
      self.assertIn('CPU:0', add_n.op.device)
      concat_devices = sorted(t.op.device for t in add_n.op.inputs)
      # One pack per tower (28 floats: a ConcatV2).
      self.assertEqual([t.op.type for t in add_n.op.inputs], ['ConcatV2'] * 4)
      for t, device in enumerate(concat_devices):
        self.assertIn('CPU:{}'.format(t), device)

  def test_large_sparse_scalar_and_missing_gradients_not_packed(self):
    with tf.Graph().as_default():
      with tf1.device(_DEVICES[0]):
        big = tf1.get_variable('big', shape=[300, 300])  # 360 KB > 256 KB
        small_a = tf1.get_variable('small_a', shape=[3, 2])
        small_b = tf1.get_variable('small_b', shape=[5, 2])
        scalar = tf1.get_variable('scalar', shape=[])
        emb = tf1.get_variable('emb', shape=[10, 2])
        only_tower0 = tf1.get_variable('only_tower0', shape=[4, 2])
      tower_grads = []
      for t in range(2):
        with tf1.device(_DEVICES[t]):
          sparse = tf.IndexedSlices(tf.ones([1, 2]) * (t + 1),
                                    tf.constant([t]), tf.constant([10, 2]))
          grads = [(tf.ones([300, 300]) * (t + 1), big),
                   (tf.ones([3, 2]) * (t + 1), small_a),
                   (tf.ones([5, 2]) * (t + 1), small_b),
                   (tf.constant(float(t + 1)), scalar),
                   (sparse, emb),
                   (tf.ones([4, 2]) if t == 0 else None, only_tower0)]
        tower_grads.append(grads)
      summed = dict((v.op.name, g) for g, v in
                    gradient_aggregation.sum_gradients_by_variable(tower_grads, _DEFAULTS))
      self.assertEqual(summed['big'].op.type, 'AddN')
      self.assertEqual(summed['scalar'].op.type, 'AddN')
      self.assertIsInstance(summed['emb'], tf.IndexedSlices)
      self.assertIn(summed['small_a'].op.type, ('Split', 'SplitV'))
      with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as sess:
        got = sess.run(summed)
    self.assertAllEqual(got['big'], np.full([300, 300], 3.0))  # 1 + 2
    self.assertAllEqual(got['small_a'], np.full([3, 2], 3.0))
    self.assertAllEqual(got['small_b'], np.full([5, 2], 3.0))
    self.assertEqual(got['scalar'], 3.0)
    # Sparse: values and indices of both towers concatenated, not densified.
    self.assertAllEqual(got['emb'].indices, [0, 1])
    self.assertAllEqual(got['emb'].values, [[1.0, 1.0], [2.0, 2.0]])
    # A gradient from one tower only is passed through unchanged.
    self.assertAllEqual(got['only_tower0'], np.ones([4, 2]))


  @parameterized.parameters(0, 1)
  def test_sparse_in_one_tower_dense_in_another(self, sparse_tower):
    # A small variable (packable by size) whose gradient is IndexedSlices in
    # one tower and dense in the other (a gather in one, a matmul in the
    # other): summed densely, never packed. Tower t adds t + 1 to row t.
    with tf.Graph().as_default():
      with tf1.device(_DEVICES[0]):
        emb = tf1.get_variable('emb', shape=[4, 2])
        other = tf1.get_variable('other', shape=[3, 2])
      tower_grads = []
      for t in range(2):
        with tf1.device(_DEVICES[t]):
          row = tf.ones([1, 2]) * (t + 1)
          if t == sparse_tower:
            grad = tf.IndexedSlices(row, tf.constant([t]), tf.constant([4, 2]))
          else:
            grad = tf.scatter_nd([[t]], row, [4, 2])
          tower_grads.append([(grad, emb), (tf.ones([3, 2]) * (t + 1), other)])
      summed = dict((v.op.name, g) for g, v in
                    gradient_aggregation.sum_gradients_by_variable(
                        tower_grads, _DEFAULTS))
      self.assertNotIsInstance(summed['emb'], tf.IndexedSlices)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as sess:
        got = sess.run(summed)
    self.assertAllEqual(got['emb'], [[1, 1], [2, 2], [0, 0], [0, 0]])
    self.assertAllEqual(got['other'], np.full([3, 2], 3.0))

class PackScalingTest(tf.test.TestCase, parameterized.TestCase):
  """Packs keep one size: their number does not grow with towers."""

  def _ops_by_type(self, num_towers, knobs, shapes):
    graph = tf.Graph()
    devices = replicate.testing.virtual_cpu_devices(num_towers)
    with graph.as_default():
      tower_grads, _, _ = _tower_grads(shapes, num_towers, devices=devices)
      start = len(graph.get_operations())
      gradient_aggregation.sum_gradients_by_variable(tower_grads, knobs)
      return collections.Counter(
          op.type for op in graph.get_operations()[start:])

  def test_concatenations_grow_as_towers_not_their_square(self):
    # 40 kernels of 64 x 64 floats (16 KB each, 640 KB) and 40 biases.
    # Packs by Tuning alone whatever the tower count: 16 + 16 + 8 kernels
    # (pack_max_group) and one pack of the 40 biases (10 KB, within
    # pack_small_bytes), so 4 packs: 4 concatenations a tower, 4 sums and 4
    # splits.
    shapes = [(64, 64), (64,)] * 40
    for num_towers in (2, 4, 8):
      ops = self._ops_by_type(num_towers, tuning.Tuning(), shapes)
      self.assertEqual(4 * num_towers, ops['ConcatV2'], num_towers)
      self.assertEqual(0, ops['DynamicStitch'], num_towers)
      self.assertEqual(4, ops['SplitV'], num_towers)
      self.assertEqual(4, ops['AddN'], num_towers)

  @parameterized.named_parameters(('five', 5), ('eight', 8))
  def test_many_towers_sum_bit_identical_to_one_add_n(self, num_towers):
    # 24 kernels of 64 x 64 (packs of 16 and 8) and their biases (one pack).
    shapes = [(64, 64), (64,)] * 24
    devices = replicate.testing.virtual_cpu_devices(num_towers)
    with tf.Graph().as_default():
      tower_grads, values, _ = _tower_grads(shapes, num_towers, seed=3,
                                            devices=devices)
      packed = gradient_aggregation.sum_gradients_by_variable(tower_grads, _DEFAULTS)
      plain = gradient_aggregation.sum_gradients_by_variable(
          tower_grads, _DEFAULTS, pack_max_bytes=0)
      self.assertEqual(3, len({g.op.name for g, _ in packed}))
      config = replicate.testing.virtual_cpu_config(num_towers)
      rewrite = config.graph_options.rewrite_options
      rewrite.arithmetic_optimization = rewrite.OFF
      with tf1.Session(config=config) as sess:
        sess.run(tf1.global_variables_initializer())
        got_packed, got_plain = sess.run(
            ([g for g, _ in packed], [g for g, _ in plain]))
    for i in range(len(shapes)):
      # One device's order, ((t0 + t1) + t2) + ..., in float32: bit for bit.
      ordered = values[0][i]
      for t in range(1, num_towers):
        ordered = ordered + values[t][i]
      self.assertAllEqual(ordered, got_packed[i])
      self.assertAllEqual(ordered, got_plain[i])


if __name__ == '__main__':
  tf.test.main()

"""Tests for the packers: exact round trips, pack counts, placement, errors."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import packing

_DEVICES = testing.virtual_cpu_devices(2)
# (shape, dtype) per gradient: mixed sizes and dtypes, one float64 in between.
_GRADS = (((), tf.float32), ((3,), tf.float32), ((2, 5), tf.float64),
          ((7,), tf.float32), ((40, 30), tf.float32), ((1,), tf.float32))


def _device_grads():
  rng = np.random.RandomState(1)
  device_grads, arrays, variables = [], [], []
  for i, (shape, dtype) in enumerate(_GRADS):
    variables.append(tf1.get_variable('v%d' % i, shape, dtype=dtype))
  for d in _DEVICES:
    grads, device_arrays = [], []
    for (shape, dtype), var in zip(_GRADS, variables):
      a = np.asarray(rng.randn(*shape)).astype(dtype.as_numpy_dtype)
      with tf.device(d):
        grads.append((tf.constant(a), var))
      device_arrays.append(a)
    device_grads.append(grads)
    arrays.append(device_arrays)
  return device_grads, arrays, variables


class PackingTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.named_parameters(
      ('concat_1', lambda: packing.ConcatAndSplitPacker(1), 2),
      # float32 group split in 3, the float64 group (10 elements) in 3.
      ('concat_3', lambda: packing.ConcatAndSplitPacker(3), 6),
      # As contrib: each dtype in 1000 packs, float64's 10 elements in 999
      # empty packs and a last one of 10: 1000 + 1000.
      ('concat_many', lambda: packing.ConcatAndSplitPacker(1000), 2000),
      # Small: float32 of <= 40 bytes, positions 0, 1, 3, 5. One run of two
      # ([0, 1]); 3 and 5 are runs of one, left alone: 1 pack + 4 others.
      ('small_40', lambda: packing.AggregateSmallTensorPacker(40, 10), 5),
      # Every float32 is small: runs [0, 1] and [3, 4, 5] (the float64 at 2
      # breaks them): 2 packs + the float64.
      ('small_group2', lambda: packing.AggregateSmallTensorPacker(10**6, 2), 3),
  )
  def test_round_trip_exact(self, make_packer, num_packed):
    with tf.Graph().as_default():
      device_grads, arrays, variables = _device_grads()
      packer = make_packer()
      packed = packer.pack(device_grads)
      self.assertLen(packed, len(_DEVICES))
      for device, device_packed in zip(_DEVICES, packed):
        self.assertLen(device_packed, num_packed)
        for t, _ in device_packed:
          self.assertEqual(device_util.canonicalize(t.device),
                           device_util.canonicalize(device))
      unpacked = packer.unpack(packed)
      for grads in unpacked:
        self.assertEqual([v for _, v in grads], variables)
        for (g, _), (shape, dtype) in zip(grads, _GRADS):
          self.assertEqual(g.shape, shape)
          self.assertEqual(g.dtype, dtype)
      with tf1.Session(config=testing.virtual_cpu_config(2)) as sess:
        got = sess.run([[g for g, _ in grads] for grads in unpacked])
    for got_device, want_device in zip(got, arrays):
      for g, w in zip(got_device, want_device):
        self.assertAllEqual(g, w)  # exact round trip

  def test_concat_pack_sizes_are_contribs(self):
    with tf.Graph().as_default():
      device_grads, _, _ = _device_grads()
      packed = packing.ConcatAndSplitPacker(3).pack(device_grads)
      # float32: 1 + 3 + 7 + 1200 + 1 = 1212 elements -> 404 x 3;
      # float64: 10 elements -> 3, 3 and the rest, 4, in the last pack.
      self.assertEqual([t.shape.as_list() for t, _ in packed[0]],
                       [[404], [404], [404], [3], [3], [4]])
      self.assertEqual([v for _, v in packed[1]], [None] * 6)

  def test_small_packs_come_first_with_contribs_placeholder(self):
    with tf.Graph().as_default():
      device_grads, _, variables = _device_grads()
      packed = packing.AggregateSmallTensorPacker(10**6, 2).pack(device_grads)
      # Runs [0, 1] (1 + 3 elements) and [3, 4, 5] (7 + 1200 + 1), then the
      # float64 at position 2, which is never packed.
      self.assertEqual([t.shape.as_list() for t, _ in packed[0]],
                       [[4], [1208], [2, 5]])
      self.assertEqual([v for _, v in packed[0]],
                       ['packing_var_placeholder'] * 2 + [variables[2]])

  def test_small_runs_span_at_most_max_group_as_in_contrib(self):
    # Ten small float32 scalars with max_group 2: a run grows while it spans
    # at most 2 positions, so it takes 4 (0-3), then 4 (4-7), then 2 (8-9).
    with tf.Graph().as_default():
      device_grads = [[(tf.constant(float(10 * d + i)), None)
                       for i in range(10)] for d in range(2)]
      packer = packing.AggregateSmallTensorPacker(4, 2)
      packed = packer.pack(device_grads)
      self.assertEqual([t.shape.as_list() for t, _ in packed[0]],
                       [[4], [4], [2]])
      with self.cached_session() as sess:
        got = sess.run([[g for g, _ in grads]
                        for grads in packer.unpack(packed)])
      self.assertAllEqual(got, [[10. * d + i for i in range(10)]
                                for d in range(2)])

  def test_unpack_takes_the_latest_pack(self):
    with tf.Graph().as_default():
      packer = packing.ConcatAndSplitPacker(2)
      with self.assertRaisesRegex(errors.ContextError,
                                  'ConcatAndSplitPacker.unpack was called '
                                  'before pack'):
        packer.unpack([])
      first = [[(tf.constant([1., 2.]), 'a')]]
      second = [[(tf.constant([[3., 4.], [5., 6.]]), 'b')]]
      packer.pack(first)
      packed = packer.pack(second)
      unpacked = packer.unpack(packed)
      self.assertEqual(unpacked[0][0][1], 'b')
      self.assertEqual(unpacked[0][0][0].shape, (2, 2))

  def test_vectors_are_not_reshaped(self):
    # Of the 6 gradients, the scalar, (2, 5) and (40, 30) need a reshape to
    # be flattened and one back; the vectors (3,), (7,), (1,) need none:
    # 3 x 2 reshapes per device, 2 devices: 12 (a reshape each way for
    # every gradient would make 24). One [-1] shape constant per
    # concatenation that flattens something: 2 dtypes x 2 devices.
    with tf.Graph().as_default() as graph:
      device_grads, _, _ = _device_grads()
      packer = packing.ConcatAndSplitPacker(1)
      packer.unpack(packer.pack(device_grads))
      ops = graph.get_operations()
      self.assertLen([op for op in ops if op.type == 'Reshape'], 12)
      self.assertLen([op for op in ops if op.type == 'Const' and
                      op.name.split('/')[-1].startswith('flat_shape')], 4)

  def test_contrib_split_sizes(self):
    self.assertEqual(packing.contrib_split_sizes(10, 3), [3, 3, 4])
    self.assertEqual(packing.contrib_split_sizes(12, 3), [4, 4, 4])
    self.assertEqual(packing.contrib_split_sizes(2, 4), [0, 0, 0, 2])

  def test_errors(self):
    for bad in (0, -1, 1.5, True):
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'num_packs must be a positive integer'):
        packing.ConcatAndSplitPacker(bad)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'agg_small_grads_max_bytes must be a positive'):
      packing.AggregateSmallTensorPacker(0, 10)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'agg_small_grads_max_group must be a positive'):
      packing.AggregateSmallTensorPacker(10, 0)
    packer = packing.ConcatAndSplitPacker(1)
    with tf.Graph().as_default():
      a = tf.constant([1.])
      unknown = tf1.placeholder(tf.float32, [None])
      sparse = tf.IndexedSlices(a, tf.constant([0]))
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'device_grads must be a non-empty list'):
        packer.pack([])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'same number of \\(grad, var\\) pairs; got '
                                  '1 and 2'):
        packer.pack([[(a, None)], [(a, None), (a, None)]])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'needs fully defined shapes'):
        packer.pack([[(unknown, None)]])
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'Packing needs dense gradients'):
        packer.pack([[(sparse, None)]])


class PackChunksTest(parameterized.TestCase, tf.test.TestCase):
  """packing.pack_chunks: at most max_count values a pack, unless small."""

  @parameterized.named_parameters(
      # 100 biases of 64 floats (256 bytes): 25.6 KB in all, one pack.
      ('tiny', [256] * 100, 16, 65536, [list(range(100))]),
      # 100 kernels of 64 x 64 floats (16 KB): 16 already exceed 64 KB, so
      # packs of 16: six of them and one of the last 4.
      ('kernels', [16384] * 100, 16, 65536,
       [list(range(i, min(i + 16, 100))) for i in range(0, 100, 16)]),
      # 1000 bytes each: a pack grows past 16 while it stays within 65536
      # bytes, i.e. to 65 values (65000); the 66th would make 66000.
      ('grows_to_small_bytes', [1000] * 100, 16, 65536,
       [list(range(65)), list(range(65, 100))]),
      # small_bytes 0: exactly max_count per pack.
      ('count_only', [1] * 5, 2, 0, [[0, 1], [2, 3], [4]]),
      # Mixed: 40000 + 40000 > 65536, so with max_count 1 every large value
      # starts a pack; the two tiny ones join the pack before them
      # (40000 + 100 + 100 <= 65536).
      ('mixed', [40000, 100, 100, 40000, 40000], 1, 65536,
       [[0, 1, 2], [3], [4]]),
      ('empty', [], 16, 65536, []),
  )
  def test_chunks(self, sizes, max_count, small_bytes, want):
    self.assertEqual(want, packing.pack_chunks(sizes, max_count, small_bytes))

  @parameterized.named_parameters(
      ('zero_count', 0, 100, 'max_count must be an int >= 1, got 0'),
      ('float_count', 2.0, 100, 'max_count must be an int >= 1, got 2.0'),
      ('negative_bytes', 4, -1, 'small_bytes must be >= 0'),
  )
  def test_bad_arguments(self, max_count, small_bytes, message):
    with self.assertRaisesRegex(ValueError, message):
      packing.pack_chunks([1, 2], max_count, small_bytes)


class ReduceConcatenatedTest(tf.test.TestCase):
  """packing.reduce_concatenated: tf.concat per source, one reduce, splits."""

  def test_sums_rows_exactly_with_tf_concat(self):
    # Two values ([3, 2] and [1, 2]) on two source devices: each source
    # concatenates its [4, 2] pack with TF's ConcatV2, the sum adds the
    # packs, and each
    # destination splits the [4, 2] sum back into [3, 2] and [1, 2].
    rng = np.random.RandomState(0)
    arrays = [[(rng.randn(*shape) * 100).astype(np.float32)
               for _ in _DEVICES] for shape in ((3, 2), (1, 2))]
    with tf.Graph().as_default() as graph:
      tensors = []
      for per_device in arrays:
        value_tensors = []
        for device, array in zip(_DEVICES, per_device):
          with tf.device(device):
            value_tensors.append(tf.constant(array))
        tensors.append(value_tensors)
      pieces = packing.reduce_concatenated(
          tensors, _DEVICES, tf.math.add_n, _DEVICES, name='rows')
      concats = [op for op in graph.get_operations()
                 if op.name.startswith('rows') and op.type != 'Const']
      self.assertEqual(['ConcatV2'] * 2, [op.type for op in concats])
      self.assertEqual(
          [device_util.canonicalize(d) for d in _DEVICES],
          [device_util.canonicalize(op.device) for op in concats])
      with tf1.Session(config=testing.virtual_cpu_config(2)) as sess:
        got = sess.run(pieces)
    for destination in got:
      for value, per_device in zip(destination, arrays):
        self.assertAllEqual(per_device[0] + per_device[1], value)


if __name__ == '__main__':
  tf.test.main()

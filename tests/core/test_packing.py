"""Tests for the packers: exact round trips, pack counts, placement, errors."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import packing
from replicate.core import tuning

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
      # float32: 1212 elements in 1000 packs; float64: 10 elements, fewer
      # than 1000, so one pack per element: 1000 + 10.
      ('concat_many', lambda: packing.ConcatAndSplitPacker(1000), 1010),
      # <= 40 bytes: scalar, (3,) grouped; (2,5) float64 is 80 bytes alone;
      # (7,) alone (28 bytes, but the next is large); (40,30) alone; (1,).
      ('small_40', lambda: packing.AggregateSmallTensorPacker(40, 10), 5),
      # Everything small; runs break at dtype changes and at 2 tensors:
      # [scalar, (3,)], [(2,5) f64], [(7,), (40,30)], [(1,)].
      ('small_group2', lambda: packing.AggregateSmallTensorPacker(10**6, 2), 4),
  )
  def test_round_trip_exact(self, make_packer, num_packed):
    with tf.Graph().as_default():
      device_grads, arrays, variables = _device_grads()
      packer = make_packer()
      packed, info = packer.pack(device_grads)
      self.assertLen(packed, len(_DEVICES))
      for device, device_packed in zip(_DEVICES, packed):
        self.assertLen(device_packed, num_packed)
        for t, _ in device_packed:
          self.assertEqual(device_util.canonicalize(t.device),
                           device_util.canonicalize(device))
      unpacked = packer.unpack(packed, info)
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

  def test_concat_pack_sizes(self):
    with tf.Graph().as_default():
      device_grads, _, _ = _device_grads()
      packed, _ = packing.ConcatAndSplitPacker(2).pack(device_grads)
      # float32: 1 + 3 + 7 + 1200 + 1 = 1212 elements -> 606 + 606;
      # float64: 10 elements -> 5 + 5.
      self.assertEqual([t.shape.as_list() for t, _ in packed[0]],
                       [[606], [606], [5], [5]])

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
      # The kernels of 4 CPU towers, below 200 KB (204800 bytes) a pack:
      # 12 kernels make 196608 bytes, 13 would make 212992: packs of 12,
      # eight of them and one of the last 4.
      ('kernels', [16384] * 100, 16, 65536, 204800,
       [list(range(i, min(i + 12, 100))) for i in range(0, 100, 12)]),
      # The cap binds before max_count and before small_bytes: 3 + 3 < 7.
      ('cap_first', [3] * 5, 16, 100, 7, [[0, 1], [2, 3], [4]]),
      # A value at or above the cap is a pack of its own.
      ('large_alone', [2, 10, 2, 2], 16, 100, 8, [[0], [1], [2, 3]]),
      ('no_cap', [16384] * 20, 16, 65536, None,
       [list(range(16)), list(range(16, 20))]),
  )
  def test_chunks_below_max_bytes(self, sizes, max_count, small_bytes,
                                  max_bytes, want):
    self.assertEqual(want, packing.pack_chunks(sizes, max_count, small_bytes,
                                               max_bytes))

  @parameterized.named_parameters(
      ('zero_count', 0, 100, None, 'max_count must be an int >= 1, got 0'),
      ('float_count', 2.0, 100, None,
       'max_count must be an int >= 1, got 2.0'),
      ('negative_bytes', 4, -1, None, 'small_bytes must be >= 0'),
      ('zero_max_bytes', 4, 100, 0, 'max_bytes must be None .* got 0'),
      ('float_max_bytes', 4, 100, 1e5,
       r'max_bytes must be None .* got 100000.0'),
  )
  def test_bad_arguments(self, max_count, small_bytes, max_bytes, message):
    with self.assertRaisesRegex(ValueError, message):
      packing.pack_chunks([1, 2], max_count, small_bytes, max_bytes)


class OneThreadPackBytesTest(parameterized.TestCase, tf.test.TestCase):
  """packing.one_thread_pack_bytes: a cap on CPUs, none elsewhere."""

  @parameterized.named_parameters(
      # Up to 4 summed packs: Tuning.one_thread_bytes (200 KB); 8: half.
      ('two_cpus', ['/cpu:0', '/cpu:1'], ['/cpu:0'], 204800),
      ('four_cpus', ['/cpu:%d' % i for i in range(4)], ['/cpu:0'], 204800),
      ('eight_cpus', ['/cpu:%d' % i for i in range(8)], [], 102400),
      ('gpu_source', ['/cpu:0', '/gpu:0'], ['/cpu:0'], None),
      ('gpu_destination', ['/cpu:0', '/cpu:1'], ['/gpu:0'], None),
      ('unknown_device', ['', '/cpu:1'], [], None),
      ('no_sources', [], ['/cpu:0'], None),
  )
  def test_cap(self, sources, devices, want):
    self.assertEqual(want, packing.one_thread_pack_bytes(sources, devices))

  @parameterized.named_parameters(
      # Sized for at most 4 sources: 200 KB for 8 or 16 towers alike.
      ('eight_cpus', 8, 4, 204800),
      ('sixteen_cpus', 16, 4, 204800),
      # Sized for 8 of 16 sources: half.
      ('eight_of_sixteen', 16, 8, 102400),
      ('fewer_sources', 2, 8, 204800),
  )
  def test_max_sources_fixes_the_size(self, num_sources, max_sources, want):
    sources = ['/cpu:%d' % i for i in range(num_sources)]
    self.assertEqual(want, packing.one_thread_pack_bytes(
        sources, ['/cpu:0'], max_sources=max_sources))
    self.assertIsNone(packing.one_thread_pack_bytes(
        sources, ['/gpu:0'], max_sources=max_sources))


class ConcatRowsTest(parameterized.TestCase, tf.test.TestCase):
  """packing.concat_rows: tf.concat along dimension 0, one thread on CPUs."""

  @parameterized.named_parameters(
      ('matrices', [(3, 2), (1, 2), (5, 2)], np.float32),
      ('vectors', [(4,), (2,), (6,)], np.int32),
      ('rank_3', [(2, 3, 2), (1, 3, 2)], np.float64),
      ('booleans', [(2,), (3,)], np.bool_),
  )
  def test_cpu_stitches_the_rows_of_a_large_pack(self, shapes, dtype):
    rng = np.random.RandomState(0)
    arrays = [(rng.randn(*shape) * 100).astype(dtype) for shape in shapes]
    graph = tf.Graph()
    # With a one-thread size of 4 bytes every pack here counts as large.
    with graph.as_default(), tuning.tuning_scope(
        tuning.Tuning(one_thread_bytes=4)):
      with tf.device(_DEVICES[1]):
        tensors = [tf.constant(a) for a in arrays]
      packed = packing.concat_rows(tensors, _DEVICES[0], name='rows')
      # The static shape is known without running.
      self.assertEqual([sum(s[0] for s in shapes)] + list(shapes[0][1:]),
                       packed.shape.as_list())
      self.assertEqual('DynamicStitch', packed.op.type)
      # One index range per value.
      self.assertEqual(len(shapes), packed.op.get_attr('N'))
      self.assertEqual(device_util.canonicalize(_DEVICES[0]),
                       device_util.canonicalize(packed.op.device))
      with tf1.Session(config=testing.virtual_cpu_config(2)) as sess:
        got = sess.run(packed)
    self.assertEqual(dtype, got.dtype)
    self.assertAllEqual(np.concatenate(arrays, axis=0), got)

  @parameterized.named_parameters(
      # 16 kernels of 64 x 64 floats: 256 KB, at least Tuning.one_thread_bytes.
      ('kernels_256_kb', 16, [64, 64], 'DynamicStitch'),
      # 12 of them: 192 KB, which TF's ConcatV2 copies on one thread.
      ('kernels_192_kb', 12, [64, 64], 'ConcatV2'),
      # 100 biases of 64 floats: 25 KB.
      ('biases', 100, [64], 'ConcatV2'),
  )
  def test_size_picks_the_op(self, num_values, shape, op_type):
    rng = np.random.RandomState(1)
    arrays = [rng.randn(*shape).astype(np.float32) for _ in range(num_values)]
    graph = tf.Graph()
    with graph.as_default():
      packed = packing.concat_rows([tf.constant(a) for a in arrays],
                                   _DEVICES[0])
      self.assertEqual(op_type, packed.op.type)
      with tf1.Session(config=testing.virtual_cpu_config(1)) as sess:
        got = sess.run(packed)
    self.assertAllEqual(np.concatenate(arrays, axis=0), got)

  @parameterized.named_parameters(
      ('gpu', '/device:GPU:0', 2, True),
      ('unknown_device', '', 2, True),
      ('one_tensor', '/device:CPU:0', 1, True),
      ('stitch_off', '/device:CPU:0', 2, False),
  )
  def test_tf_concat_elsewhere(self, device, num_tensors, stitch_on_cpus):
    with tf.Graph().as_default(), tuning.tuning_scope(
        tuning.Tuning(stitch_on_cpus=stitch_on_cpus)):
      tensors = [tf.zeros([2, 3]) for _ in range(num_tensors)]
      packed = packing.concat_rows(tensors, device)
      self.assertNotEqual('DynamicStitch', packed.op.type)
      self.assertEqual([2 * num_tensors, 3], packed.shape.as_list())

  def test_bad_tensors(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, 'at least one tensor'):
        packing.concat_rows([], _DEVICES[0])
      with self.assertRaisesRegex(ValueError, r'got b:0 of shape \(2, 4\)'):
        packing.concat_rows([tf.zeros([2, 3], name='a'),
                             tf.zeros([2, 4], name='b')], _DEVICES[0])
      unknown = tf1.placeholder(tf.float32, [None, 3], name='unknown')
      with self.assertRaisesRegex(ValueError, 'got unknown:0'):
        packing.concat_rows([tf.zeros([2, 3]), unknown], _DEVICES[0])
      with self.assertRaisesRegex(ValueError, 'fully known shape'):
        packing.concat_rows([tf.zeros([]), tf.zeros([])], _DEVICES[0])


if __name__ == '__main__':
  tf.test.main()

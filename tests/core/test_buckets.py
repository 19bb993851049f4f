"""Buckets of the gradient all-reduce, in the order back-propagation ends them."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.core import buckets

_F32 = tf.float32
_F16 = tf.float16


class PlanBucketsTest(parameterized.TestCase, tf.test.TestCase):

  # Three layers in variable (forward) order: kernel, bias of layer 0 (ready
  # last, depth 5), layer 1 (depth 3), layer 2 (ready first, depth 1).
  SIZES = [10, 1, 40, 2, 30, 3]
  DEPTHS = [5, 5, 3, 3, 1, 1]

  @parameterized.named_parameters(
      # Ready order 4, 5, 2, 3, 0, 1. A bucket of 30 bytes or more closes
      # before a later depth: [4, 5] (33), [2, 3] (42), [0, 1] (11).
      ('one_layer_a_bucket', 30, [[4, 5], [2, 3], [0, 1]]),
      # 100 bytes hold the 86 of all: one bucket, still in ready order.
      ('all_in_one', 100, [[4, 5, 2, 3, 0, 1]]),
      # [4, 5] (33 < 40) takes layer 1 too (75), then layer 0.
      ('two_layers_then_one', 40, [[4, 5, 2, 3], [0, 1]]),
      # One byte: every depth closes a bucket, but a layer's kernel and bias
      # (one depth) stay together.
      ('never_split_a_depth', 1, [[4, 5], [2, 3], [0, 1]]),
      # Exactly full (33 bytes of 33) closes too: a bucket fills *to* its
      # size, it does not wait for one byte more.
      ('exactly_full', 33, [[4, 5], [2, 3], [0, 1]]),
  )
  def test_buckets_fill_in_ready_order(self, max_bytes, expected):
    self.assertEqual(expected, buckets.plan_buckets(
        self.SIZES, self.DEPTHS, [_F32] * 6, max_bytes))

  def test_one_dtype_a_bucket(self):
    # Layer 1 in float16: a bucket of its own, ready (depth 3) before the
    # float32 bucket of layers 2 and 0 (ready with layer 0, depth 5).
    plan = buckets.plan_buckets(self.SIZES, self.DEPTHS,
                                [_F32, _F32, _F16, _F16, _F32, _F32], 1000)
    self.assertEqual([[2, 3], [4, 5, 0, 1]], plan)

  def test_every_value_in_exactly_one_bucket(self):
    rng = np.random.RandomState(0)
    sizes = [int(s) for s in rng.randint(1, 1000, size=50)]
    depths = [int(d) for d in rng.randint(0, 20, size=50)]
    dtypes = [(_F32, _F16)[int(k)] for k in rng.randint(0, 2, size=50)]
    for max_bytes in (1, 500, 3000, 10 ** 6):
      plan = buckets.plan_buckets(sizes, depths, dtypes, max_bytes)
      self.assertEqual(list(range(50)), sorted(sum(plan, [])))
      for positions in plan:
        self.assertLen(set(dtypes[p] for p in positions), 1)

  def test_bucket_bytes(self):
    mib = 1024 * 1024
    defaults = replicate.Tuning()
    # Defaults: min(25 MiB, ceil(total / 8)).
    self.assertEqual(25 * mib, buckets.bucket_bytes(800 * mib, defaults))
    self.assertEqual(10, buckets.bucket_bytes(80, defaults))
    self.assertEqual(11, buckets.bucket_bytes(81, defaults))  # ceil(81 / 8)
    self.assertEqual(1, buckets.bucket_bytes(0, defaults))
    self.assertEqual(80, buckets.bucket_bytes(
        80, replicate.Tuning(all_reduce_min_buckets=1)))
    self.assertEqual(7, buckets.bucket_bytes(
        80, replicate.Tuning(all_reduce_bucket_bytes=7)))

  @parameterized.parameters(
      ('all_reduce_bucket_bytes', 0, errors.InvalidArgumentError,
       r'Tuning.all_reduce_bucket_bytes must be at least 1, got 0'),
      ('all_reduce_min_buckets', 0, errors.InvalidArgumentError,
       r'Tuning.all_reduce_min_buckets must be at least 1, got 0'),
      ('all_reduce_min_buckets', None, errors.InvalidTypeError,
       r'Tuning.all_reduce_min_buckets must be an int, got None'),
  )
  def test_knobs_are_checked(self, name, value, error, message):
    with self.assertRaisesRegex(error, message):
      replicate.Tuning(**{name: value})


def _mlp_gradients(num_layers=4, cast=False):
  """The gradients of dense layers 0..n-1, in variable (forward) order."""
  net = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
  for index in range(num_layers):
    net = tf1.layers.dense(net, 4 + index, activation=tf.nn.tanh,
                           name='layer_{}'.format(index))
  loss = tf.reduce_sum(net)
  variables = tf1.trainable_variables()
  grads = tf.gradients(loss, variables)
  if cast:
    # Ops added after the gradients, in variable order (fp16 compression).
    grads = [tf.cast(g, tf.float16) for g in grads]
  return grads, variables


class ReadyOrderTest(parameterized.TestCase, tf.test.TestCase):

  def test_depths(self):
    with tf.Graph().as_default():
      a = tf.constant(1.)
      b = a + 1.  # depth 1
      c = b * 2.  # depth 2
      with tf1.control_dependencies([c]):
        d = tf.identity(a)  # waits for c: depth 3
      self.assertEqual([0, 1, 2, 3], buckets.ready_depths([a, b, c, d]))

  def test_while_loop_back_edge_is_ignored(self):
    with tf.Graph().as_default():
      x = tf.constant(1.) * 2.
      looped = tf1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * x),
                              [tf.constant(0), tf.constant(1.)])[1]
      depth_x, depth_looped = buckets.ready_depths([x, looped])
    self.assertGreater(depth_looped, depth_x)

  @parameterized.parameters(False, True)
  def test_the_last_layer_first_the_first_layer_last(self, cast):
    with tf.Graph().as_default():
      grads, variables = _mlp_gradients(cast=cast)
      sizes = [g.shape.num_elements() * g.dtype.size for g in grads]
      plan = buckets.plan_buckets(sizes, buckets.ready_depths(grads),
                                  [g.dtype for g in grads], 1)
    layers = [int(variables[p].op.name.split('/')[0].split('_')[1])
              for positions in plan for p in positions]
    # Variables are [k0, b0, k1, b1, ...]: backward order is layer 3 first.
    self.assertEqual([3, 3, 2, 2, 1, 1, 0, 0], layers)
    self.assertEqual([0, 1], sorted(plan[-1]))  # layer 0's, ready last


class BucketPackerTest(tf.test.TestCase):

  def test_pack_then_unpack_gives_every_value_back(self):
    devices = replicate.testing.virtual_cpu_devices(2)
    shapes = [(2, 3), (3,), (4,), (1, 2), (5,)]
    dtypes = [np.float32, np.float32, np.float64, np.float32, np.float64]
    with tf.Graph().as_default():
      device_grads, arrays = [], []
      for d, device in enumerate(devices):
        # Distinct per device and per value: 100 * device + 10 * value + i.
        values = [(100 * d + 10 * k + np.arange(np.prod(s))).reshape(s)
                  .astype(t) for k, (s, t) in enumerate(zip(shapes, dtypes))]
        arrays.append(values)
        with tf1.device(device):
          device_grads.append([(tf.constant(v), None) for v in values])
      packer = buckets.BucketPacker(replicate.Tuning(), max_bytes=24)
      packed = packer.pack(device_grads)
      # All ready at once (constants): one bucket per dtype, float32 first:
      # 6 + 3 + 2 = 11 float32 elements, then 4 + 5 = 9 float64.
      self.assertEqual([(11, tf.float32), (9, tf.float64)],
                       [(t.shape.num_elements(), t.dtype)
                        for t, _ in packed[0]])
      unpacked = packer.unpack(packed)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as s:
        got = s.run([[g for g, _ in grads] for grads in unpacked])
    for d in range(2):
      for expected, value in zip(arrays[d], got[d]):
        self.assertAllEqual(expected, value)
        self.assertEqual(expected.dtype, value.dtype)

  def test_refuses_what_cannot_be_packed(self):
    with tf.Graph().as_default():
      unknown = tf1.placeholder(tf.float32, [None])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'Packing needs fully defined shapes'):
        buckets.BucketPacker(replicate.Tuning()).pack([[(unknown, None)]])


if __name__ == '__main__':
  tf.test.main()

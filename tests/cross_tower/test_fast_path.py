"""Tests for the all-reduce fast path of `AllReduceCrossTowerOps`: which
values take it, where their results and leaders are, and its fallback."""
import numpy as np
import tensorflow as tf

import replicate
from replicate import testing
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import values

_DEVICES = testing.virtual_cpu_devices(4)
_CANONICAL = [device_util.canonicalize(d) for d in _DEVICES]


def _session():
  return tf1.Session(config=testing.virtual_cpu_config(4))


def _per_device(base, shape=(3,), depth=0):
  """Device i holds base + 10 ** i * [1, 2, ...], after `depth` Identity
  ops (ready later in the graph)."""
  index = {}
  for i, device in enumerate(_DEVICES):
    with tf.device(device):
      t = tf.constant(base + 10. ** i * np.arange(
          1, np.prod(shape) + 1, dtype=np.float32).reshape(shape))
      for _ in range(depth):
        t = tf.identity(t)
      index[device] = t
  return values.PerDevice(index)


def _adds(graph):
  return sorted(device_util.canonicalize(op.device)
                for op in graph.get_operations()
                if op.type in ('Add', 'AddV2', 'AddN'))


class FastPathTest(tf.test.TestCase):

  def test_some_of_the_values_devices_fall_back_with_one_warning(self):
    # Destinations /cpu:1 only, values on 4 devices: TF 1.15 reduces to one
    # device there, with a warning; never an all-reduce.
    with tf.Graph().as_default() as graph:
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy', num_packs=0)
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        result = ops.batch_reduce(ReduceOp.SUM,
                                  [(_per_device(0.), ['/cpu:1'])])[0]
      self.assertLen(logs.records, 1)
      self.assertRegex(logs.output[0],
                       'destinations differ from the devices of the values')
      self.assertEqual((_CANONICAL[1],), result.devices)
      self.assertEqual({_CANONICAL[1]}, set(_adds(graph)))
      with _session() as sess:
        got = sess.run(result.values[0])
    # (1 + 10 + 100 + 1000) * [1, 2, 3].
    self.assertAllEqual(1111. * np.array([1., 2., 3.]), got)

  def test_successive_values_spread_their_leaders(self):
    # Unpacked values 0 and 1: value k sums its halves ([0, 1], [2, 3]) on
    # their devices k % 2 and the total on the first half's: value 0 adds
    # on /cpu:0 twice and /cpu:2, value 1 on /cpu:1 twice and /cpu:3.
    with tf.Graph().as_default() as graph:
      pairs = [(_per_device(1000. * k),) * 2 for k in range(2)]
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy', num_packs=0)
      results = ops.batch_reduce(ReduceOp.SUM, pairs)
      self.assertEqual(sorted([_CANONICAL[0]] * 2 + [_CANONICAL[2]] +
                              [_CANONICAL[1]] * 2 + [_CANONICAL[3]]),
                       _adds(graph))
      with _session() as sess:
        got = sess.run([r.values for r in results])
    # Value k: 1111 * [1, 2, 3] + 4 * 1000 k.
    for k, per_device in enumerate(got):
      for g in per_device:
        self.assertAllEqual(1111. * np.array([1., 2., 3.]) + 4000. * k, g)

  def test_unplaced_values_are_reduced_on_their_keys_devices(self):
    # Values built outside any device scope, keyed by /cpu:0 ... /cpu:3:
    # the results still land on the keys' devices.
    with tf.Graph().as_default():
      value = values.PerDevice({d: tf.constant([1., 2.]) * (10. ** i)
                                for i, d in enumerate(_DEVICES)})
      result = replicate.AllReduceCrossTowerOps(
          'hierarchical_copy', num_packs=0).reduce(ReduceOp.MEAN, value,
                                                   value)
      for d, t in zip(result.devices, result.values):
        self.assertEqual(d, device_util.canonicalize(t.device))
      with _session() as sess:
        got = sess.run(result.values)
    for g in got:
      # (1 + 10 + 100 + 1000) / 4 * [1, 2] = [277.75, 555.5].
      self.assertAllEqual([277.75, 555.5], g)

  def test_agg_small_grads_alone_means_one_pack(self):
    # Three values ready at different depths (0, 1 and 2 Identity ops):
    # buckets would give three all-reduces; contrib's default num_packs=1
    # with agg_small_grads_max_bytes gives one hierarchical copy: 3 adds
    # (two halves and their total).
    with tf.Graph().as_default() as graph:
      pairs = [(_per_device(k, shape, depth=k),) * 2
               for k, shape in enumerate([(3,), (5,), (2, 2)])]
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy',
                                             agg_small_grads_max_bytes=100)
      results = ops.batch_reduce(ReduceOp.SUM, pairs)
      self.assertLen(_adds(graph), 3)
      with _session() as sess:
        got = sess.run([r.values for r in results])
    for k, per_device in enumerate(got):
      # Each element: 4 k + 1111 times its position (1, 2, ...).
      want = 4. * k + 1111. * np.arange(1, per_device[0].size + 1).reshape(
          per_device[0].shape)
      for g in per_device:
        self.assertAllEqual(want, g)


if __name__ == '__main__':
  tf.test.main()

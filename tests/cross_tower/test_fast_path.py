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


def _per_device(base, shape=(3,), depth=0, devices=_DEVICES):
  """Device i of `devices` holds base + 10 ** i * [1, 2, ...], after `depth`
  Identity ops (ready later in the graph)."""
  index = {}
  for i, device in enumerate(devices):
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


class FastPathFallbackTest(tf.test.TestCase):
  """Fallbacks: values on other sets of devices, shapes not fully defined
  under packing knobs, the destinations' order, the warning's reasons."""


  def test_values_on_other_devices_than_the_first_fall_back(self):
    # Value 0 on 4 devices, value 1 on the first 2, each reduced onto its own
    # devices: value 0 is all-reduced, value 1 (not on the batch's devices)
    # reduced to one device, with one warning.
    with tf.Graph().as_default():
      four = _per_device(0.)
      two = _per_device(100., devices=_DEVICES[:2])
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy', num_packs=0)
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        results = ops.batch_reduce(ReduceOp.MEAN, [(four, four), (two, two)])
      self.assertLen(logs.records, 1)
      self.assertRegex(logs.output[0], '1 of 2 values are reduced to one '
                       'device instead of all-reduced: values live on '
                       'different sets of devices')
      self.assertEqual(tuple(_CANONICAL), results[0].devices)
      self.assertEqual(tuple(_CANONICAL[:2]), results[1].devices)
      with _session() as sess:
        got = sess.run([r.values for r in results])
    # Value 0: (1 + 10 + 100 + 1000) / 4 * [1, 2, 3] = 277.75 * [1, 2, 3].
    for g in got[0]:
      self.assertAllEqual(277.75 * np.array([1., 2., 3.]), g)
    # Value 1: (200 + 11 * [1, 2, 3]) / 2 = 100 + 5.5 * [1, 2, 3].
    for g in got[1]:
      self.assertAllEqual(100. + 5.5 * np.array([1., 2., 3.]), g)

  def test_shapes_not_fully_defined_are_all_reduced_unpacked(self):
    # num_packs=1 concatenates; a value of shape [None] on each device cannot
    # be, so the batch is all-reduced value by value, with a warning.
    with tf.Graph().as_default():
      known = _per_device(0., devices=_DEVICES[:2])
      index = {}
      for i, d in enumerate(_DEVICES[:2]):
        with tf.device(d):
          index[d] = tf1.placeholder_with_default(
              np.array([1., 2.], np.float32) * (i + 1), shape=[None])
      unknown = values.PerDevice(index)
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy', num_packs=1)
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        results = ops.batch_reduce(ReduceOp.SUM,
                                   [(known, known), (unknown, unknown)])
      self.assertRegex(logs.output[0], 'not repacked because some shapes are '
                       'not fully defined')
      with _session() as sess:
        got = sess.run([r.values for r in results])
    for g in got[0]:
      self.assertAllEqual(11. * np.array([1., 2., 3.]), g)  # 1 + 10
    for g in got[1]:
      self.assertAllEqual([3., 6.], g)  # [1, 2] + 2 * [1, 2]

  def test_results_follow_the_order_of_the_destinations(self):
    # Values on /cpu:0, /cpu:1 reduced onto /cpu:1, /cpu:0 (the same set,
    # so all-reduced): the result lists its devices in the destinations'
    # order, as reduction to one device does, each value on its device.
    with tf.Graph().as_default():
      value = _per_device(0., devices=_DEVICES[:2])
      destinations = [_DEVICES[1], _DEVICES[0]]
      result = replicate.AllReduceCrossTowerOps(
          'hierarchical_copy', num_packs=0).reduce(ReduceOp.SUM, value,
                                                   destinations)
      one_device = replicate.ReductionToOneDeviceCrossTowerOps().reduce(
          ReduceOp.SUM, value, destinations)
      self.assertEqual((_CANONICAL[1], _CANONICAL[0]), result.devices)
      self.assertEqual(one_device.devices, result.devices)
      for d, t in zip(result.devices, result.values):
        self.assertEqual(d, device_util.canonicalize(t.device))
      with _session() as sess:
        got = sess.run(result.values)
    for g in got:
      self.assertAllEqual(11. * np.array([1., 2., 3.]), g)  # 1 + 10

  def test_the_warning_names_each_reason_once(self):
    # Values 0 and 3 sparse, value 2 reduced onto /cpu:3: one warning naming
    # the two reasons once each, in the order first met.
    with tf.Graph().as_default():
      dense = [_per_device(100. * k, devices=_DEVICES[:2]) for k in range(2)]
      sparse = []
      for k in range(2):
        index = {}
        for i, d in enumerate(_DEVICES[:2]):
          with tf.device(d):
            index[d] = tf.IndexedSlices(tf.constant([[float(i + k)]]),
                                        tf.constant([i]), tf.constant([2, 1]))
        sparse.append(values.PerDevice(index))
      ops = replicate.AllReduceCrossTowerOps('hierarchical_copy', num_packs=0)
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        ops.batch_reduce(ReduceOp.SUM, [
            (sparse[0], sparse[0]), (dense[0], dense[0]),
            (dense[1], '/cpu:3'), (sparse[1], sparse[1])])
    self.assertLen(logs.records, 1)
    message = logs.records[0].getMessage()
    self.assertIn(
        '3 of 4 values are reduced to one device instead of all-reduced: '
        'IndexedSlices are not all-reduced; destinations differ from the '
        'devices of the values.', message)
    self.assertEqual(1, message.count('IndexedSlices'))

  def test_fallback_values_are_packed_as_reduction_to_one_device_packs(self):
    # 20 small values on /cpu:0 and /cpu:1, all reduced onto /cpu:3: none
    # can be all-reduced, so they go to reduction to one device in one
    # batch, which packs them (one AddN), exactly as its own batch_reduce.
    def reduce(make_ops):
      with tf.Graph().as_default() as graph:
        pairs = [(_per_device(10. * k, devices=_DEVICES[:2]), '/cpu:3')
                 for k in range(20)]
        results = make_ops().batch_reduce(ReduceOp.SUM, pairs)
        adds = _adds(graph)
        with _session() as sess:
          return adds, sess.run([r.values[0] for r in results])
    all_reduce = reduce(lambda: replicate.AllReduceCrossTowerOps(
        'hierarchical_copy', num_packs=0))
    one_device = reduce(replicate.ReductionToOneDeviceCrossTowerOps)
    self.assertEqual([_CANONICAL[3]], all_reduce[0])
    self.assertEqual(one_device[0], all_reduce[0])
    for k, got in enumerate(all_reduce[1]):
      # Value k: 2 * 10 k + (1 + 10) * [1, 2, 3].
      self.assertAllEqual(20. * k + 11. * np.array([1., 2., 3.]), got)
      self.assertAllEqual(one_device[1][k], got)

  def test_fallback_packs_by_the_ops_own_tuning(self):
    # With Tuning(pack_max_bytes=0) nothing is packed: the 20 values sum in
    # 20 AddNs on /cpu:3, as ReductionToOneDevice with that tuning sums them
    # (a fallback on the default tuning would make one).
    tuning = replicate.Tuning(pack_max_bytes=0)
    with tf.Graph().as_default() as graph:
      pairs = [(_per_device(10. * k, devices=_DEVICES[:2]), '/cpu:3')
               for k in range(20)]
      replicate.AllReduceCrossTowerOps(
          'hierarchical_copy', num_packs=0, tuning=tuning).batch_reduce(
              ReduceOp.SUM, pairs)
      self.assertEqual([_CANONICAL[3]] * 20, _adds(graph))


if __name__ == '__main__':
  tf.test.main()

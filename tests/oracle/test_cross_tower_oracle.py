"""cross_tower_ops against TF 1.15's own cross_device_ops (an oracle).

Skipped on TF 2.x, whose cross-device ops take other value types. The same
per-device tensors go through our `batch_reduce` and TF's; results and the
devices they land on must be the same. (TF's `PerReplica` is built from a
device map in 1.15; that is the only adaptation.)
"""
import unittest

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import testing
from replicate._compat import IS_TF2
from replicate._compat import tf1
from replicate.core import device_util

NUM = 4
DEVICES = [device_util.canonicalize(d)
           for d in testing.virtual_cpu_devices(NUM)]
CONFIG = testing.virtual_cpu_config(NUM)
# A small matrix, a vector, a 3-D tensor and a 48 KB matrix: packing and
# small-tensor aggregation group some and not others.
_SHAPES = ((3, 4), (5,), (2, 2, 2), (300, 40))


def _tf_ops():
  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import cross_device_ops
  from tensorflow.python.distribute import values
  # pylint: enable=g-import-not-at-top
  return cross_device_ops, values


_IMPLEMENTATIONS = (
    ('reduction_to_one_device',
     replicate.ReductionToOneDeviceCrossTowerOps, 'ReductionToOneDevice', {}),
    ('hierarchical_copy_one_pack', replicate.AllReduceCrossTowerOps,
     'AllReduceCrossDeviceOps',
     {'all_reduce_alg': 'hierarchical_copy', 'num_packs': 1}),
    ('hierarchical_copy_no_packing', replicate.AllReduceCrossTowerOps,
     'AllReduceCrossDeviceOps',
     {'all_reduce_alg': 'hierarchical_copy', 'num_packs': 0}),
    ('hierarchical_copy_small_grads', replicate.AllReduceCrossTowerOps,
     'AllReduceCrossDeviceOps',
     {'all_reduce_alg': 'hierarchical_copy', 'num_packs': 0,
      'agg_small_grads_max_bytes': 1024, 'agg_small_grads_max_group': 10}),
)


def _cases():
  for name, ours, theirs, kwargs in _IMPLEMENTATIONS:
    for op in ('SUM', 'MEAN'):
      yield ('{}_{}'.format(name, op.lower()), ours, theirs, kwargs, op)


@unittest.skipIf(IS_TF2, 'The oracle is TF 1.15 only.')
class CrossTowerOpsOracleTest(parameterized.TestCase, tf.test.TestCase):

  def _batch_reduce(self, ours, make_ops, op_name):
    """(values per pair and device, devices per pair) after batch_reduce."""
    _, values = _tf_ops()
    rng = np.random.RandomState(0)
    arrays = [[rng.randn(*shape).astype(np.float32) for _ in DEVICES]
              for shape in _SHAPES]
    with tf.Graph().as_default():
      per_device = []
      for per_shape in arrays:
        tensors = []
        for device, array in zip(DEVICES, per_shape):
          with tf.device(device):
            tensors.append(tf.constant(array))
        if ours:
          per_device.append(replicate.PerDevice(dict(zip(DEVICES, tensors))))
        else:
          per_device.append(values.PerReplica(
              values.ReplicaDeviceMap(DEVICES), tensors))
      reduce_op = (getattr(replicate.ReduceOp, op_name) if ours else
                   getattr(tf.distribute.ReduceOp, op_name))
      results = make_ops().batch_reduce(
          reduce_op, [(value, value) for value in per_device])
      devices = [[device_util.canonicalize(d) for d in r.devices]
                 for r in results]
      with tf1.Session(config=CONFIG) as sess:
        return sess.run([list(r.values) for r in results]), devices

  @parameterized.named_parameters(*_cases())
  def test_same_values_and_devices_as_tf(self, ours_class, tf_name, kwargs,
                                         op_name):
    cross_device_ops, _ = _tf_ops()
    ours, our_devices = self._batch_reduce(
        True, lambda: ours_class(**kwargs), op_name)
    theirs, their_devices = self._batch_reduce(
        False, lambda: getattr(cross_device_ops, tf_name)(**kwargs), op_name)
    self.assertEqual(their_devices, our_devices)
    for our_pair, their_pair in zip(ours, theirs):
      # The same sums in the same order: equal bit for bit.
      self.assertAllEqual(their_pair, our_pair)


if __name__ == '__main__':
  tf.test.main()

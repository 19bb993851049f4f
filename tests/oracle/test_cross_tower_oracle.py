"""cross_tower_ops against TF 1.15's own cross_device_ops (an oracle).

The same per-device tensors go through our `batch_reduce` and TF's; results
and the devices they land on must be the same. (TF's `PerReplica` is built
from a device map in 1.15; that is the only adaptation.) TF 2.x's
cross-device ops take other value types, so there ours are compared with
TF 1.15's results recorded by record_reference.py (reference/cross_tower/).
"""
from absl.testing import parameterized
import numpy as np
import reference_lib
import tensorflow as tf

import replicate
from replicate import testing
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


_GROUP = 'cross_tower'
REFERENCE_IMPLEMENTATION = 'tensorflow.python.distribute.cross_device_ops'


def _cases():
  for name, ours, theirs, kwargs in _IMPLEMENTATIONS:
    for op in ('SUM', 'MEAN'):
      yield ('{}_{}'.format(name, op.lower()), ours, theirs, kwargs, op)


def _arrays():
  """[shape][device] seeded arrays."""
  rng = np.random.RandomState(0)
  return [[rng.randn(*shape).astype(np.float32) for _ in DEVICES]
          for shape in _SHAPES]


def _batch_reduce(ours, make_ops, op_name):
  """`batch_reduce` of the seeded arrays by `make_ops()` (ours or TF's).

  Returns:
    {'pair<i>/device<j>': value, 'pair<i>/devices': the result's devices}.
  """
  if not ours:
    _, values = _tf_ops()
  feeds = {}
  with tf.Graph().as_default():
    per_device = []
    for per_shape in _arrays():
      tensors = []
      for device, array in zip(DEVICES, per_shape):
        # Fed, not constants: the graph optimizer folds sums of constants
        # in an order of its own (another on TF 2.15), hiding the kernels'.
        with tf.device(device):
          tensors.append(tf1.placeholder(tf.float32, array.shape))
        feeds[tensors[-1]] = array
      if ours:
        per_device.append(replicate.PerDevice(dict(zip(DEVICES, tensors))))
      else:
        per_device.append(values.PerReplica(
            values.ReplicaDeviceMap(DEVICES), tensors))
    reduce_op = (getattr(replicate.ReduceOp, op_name) if ours else
                 getattr(tf.distribute.ReduceOp, op_name))
    results = make_ops().batch_reduce(
        reduce_op, [(value, value) for value in per_device])
    with tf1.Session(config=CONFIG) as sess:
      got = sess.run([list(r.values) for r in results], feeds)
  flat = {}
  for i, (result, pair) in enumerate(zip(results, got)):
    flat['pair{}/devices'.format(i)] = np.array(
        [device_util.canonicalize(d) for d in result.devices])
    for j, value in enumerate(pair):
      flat['pair{}/device{}'.format(i, j)] = value
  return flat


def _reference_case(name, tf_name, kwargs, op_name):
  def compute():
    cross_device_ops, _ = _tf_ops()
    return _batch_reduce(
        False, lambda: getattr(cross_device_ops, tf_name)(**kwargs), op_name)
  return reference_lib.Case(
      _GROUP, name, compute,
      lambda: {'{}_{}'.format(i, j): a for i, per_shape in enumerate(_arrays())
               for j, a in enumerate(per_shape)})


REFERENCE_CASES = tuple(
    _reference_case(name, tf_name, kwargs, op_name)
    for name, _, tf_name, kwargs, op_name in _cases())
_REFERENCES = {case.name: case for case in REFERENCE_CASES}
# Sums of four float32 randn terms (partial sums below 8 in magnitude). With
# fed values TF's and our packed reductions add them in different orders,
# which moves a sum by an ulp or two (an ulp is 4.8e-7 in [4, 8)); the
# unpacked ones agree to the bit, on both TFs.
_TOL = dict(rtol=1e-6, atol=1e-6)


class CrossTowerOpsOracleTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.named_parameters(
      *[(name, name, ours, kwargs, op_name)
        for name, ours, _, kwargs, op_name in _cases()])
  def test_same_values_and_devices_as_tf(self, case_name, ours_class, kwargs,
                                         op_name):
    theirs = reference_lib.reference_results(self, _REFERENCES[case_name],
                                             **_TOL)
    ours = _batch_reduce(True, lambda: ours_class(**kwargs), op_name)
    reference_lib.assert_same_results(self, theirs, ours, **_TOL)


if __name__ == '__main__':
  tf.test.main()

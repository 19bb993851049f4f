"""cross_tower_ops' packers against TF 1.15's own (an oracle).

contrib's `ConcatAndSplitPacker` and `AggregateSmallTensorPacker` live on in
TF 1.15 as `cross_device_ops._ConcatAndSplitPacker` and
`_AggregateSmallTensorPacker`. The same per-device gradients go through
theirs and ours: the packed tensors (their number, order, values and the
variable each is paired with) and what `unpack` gives back must be the same.
On TF 2 ours are compared with the results recorded from TF 1.15
(reference/packers/).
"""
from absl.testing import parameterized
import numpy as np
import reference_lib
import tensorflow as tf

from replicate import cross_tower_ops
from replicate import testing
from replicate._compat import tf1

DEVICES = testing.virtual_cpu_devices(2)
CONFIG = testing.virtual_cpu_config(2)
# Sizes around the small-tensor limits below (4, 40 and 4800 bytes); a
# float64 in the middle, which contrib never aggregates.
_FLOAT32 = tuple((shape, np.float32) for shape in (
    (), (3,), (2, 5), (7,), (40, 30), (1,), (4,), (2, 2), (1, 1)))
_MIXED = _FLOAT32[:3] + (((2, 3), np.float64),) + _FLOAT32[3:]

_GROUP = 'packers'
REFERENCE_IMPLEMENTATION = 'tensorflow.python.distribute.cross_device_ops'

# name, contrib's class name, kwargs, (shape, dtype) of each gradient. ConcatAndSplit takes
# one dtype (contrib concatenated all gradients together).
_CASES = (
    ('concat_1', 'ConcatAndSplitPacker', {'num_packs': 1}, _FLOAT32),
    # 1,235 elements: 411, 411 and the rest, 413, in the last pack.
    ('concat_3', 'ConcatAndSplitPacker', {'num_packs': 3}, _FLOAT32),
    # More packs than elements: 1,999 empty packs, then all 1,235.
    ('concat_2000', 'ConcatAndSplitPacker', {'num_packs': 2000}, _FLOAT32),
    ('small_40_10', 'AggregateSmallTensorPacker',
     {'agg_small_grads_max_bytes': 40, 'agg_small_grads_max_group': 10},
     _MIXED),
    # Every float32 small; runs span at most 2 positions.
    ('small_all_2', 'AggregateSmallTensorPacker',
     {'agg_small_grads_max_bytes': 10**6, 'agg_small_grads_max_group': 2},
     _MIXED),
    ('small_defaults', 'AggregateSmallTensorPacker', {}, _MIXED),
)


def _arrays(shapes):
  """[device][gradient] arrays, distinct per device and per gradient."""
  rng = np.random.RandomState(3)
  arrays = []
  for _ in DEVICES:
    device_arrays = []
    for shape, dtype in shapes:
      device_arrays.append(np.asarray(rng.randn(*shape)).astype(dtype))
    arrays.append(device_arrays)
  return arrays


def _pack_and_unpack(packer, shapes):
  """Packs and unpacks the seeded gradients with `packer`.

  Returns:
    {'packed/d<j>/<k>': pack k of device j, 'packed/vars': the variable each
    of device 0's packs is paired with, 'unpacked/d<j>/<i>': gradient i back,
    'unpacked/vars'}.
  """
  names = ['v{}'.format(i) for i in range(len(shapes))]
  with tf.Graph().as_default():
    device_grads = []
    for device, device_arrays in zip(DEVICES, _arrays(shapes)):
      with tf.device(device):
        device_grads.append([(tf.constant(a), name)
                             for a, name in zip(device_arrays, names)])
    packed = [list(grads) for grads in packer.pack(device_grads)]
    unpacked = packer.unpack(packed)
    with tf1.Session(config=CONFIG) as sess:
      packed_values, unpacked_values = sess.run(
          ([[g for g, _ in grads] for grads in packed],
           [[g for g, _ in grads] for grads in unpacked]))
  results = {'packed/vars': np.array([str(v) for _, v in packed[0]]),
             'unpacked/vars': np.array([str(v) for _, v in unpacked[0]])}
  for j, (packs, grads) in enumerate(zip(packed_values, unpacked_values)):
    for k, value in enumerate(packs):
      results['packed/d{}/{}'.format(j, k)] = value
    for i, value in enumerate(grads):
      results['unpacked/d{}/{}'.format(j, i)] = value
  return results


def _reference_case(name, contrib_name, kwargs, shapes):
  def compute():
    # pylint: disable=g-import-not-at-top
    from tensorflow.python.distribute import cross_device_ops
    # pylint: enable=g-import-not-at-top
    packer = getattr(cross_device_ops, '_' + contrib_name)(**kwargs)
    return _pack_and_unpack(packer, shapes)
  return reference_lib.Case(
      _GROUP, name, compute,
      lambda: {'{}_{}'.format(j, i): a
               for j, device_arrays in enumerate(_arrays(shapes))
               for i, a in enumerate(device_arrays)})


REFERENCE_CASES = tuple(_reference_case(*case) for case in _CASES)
_REFERENCES = {case.name: case for case in REFERENCE_CASES}


class PackersOracleTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.named_parameters(*[(case[0],) + case for case in _CASES])
  def test_packs_as_contrib(self, name, contrib_name, kwargs, shapes):
    theirs = reference_lib.reference_results(self, _REFERENCES[name],
                                             rtol=0, atol=0)
    ours = _pack_and_unpack(getattr(cross_tower_ops, contrib_name)(**kwargs),
                            shapes)
    # Packing copies values: equal to the bit, packs and vars in one order.
    self.assertEqual(sorted(theirs), sorted(ours))
    for key in sorted(theirs):
      self.assertEqual(theirs[key].shape, ours[key].shape, key)
      self.assertAllEqual(theirs[key], ours[key], msg=key)

  def test_cases_pack_something(self):
    # Guards the cases above against comparing nothing: each packs, and the
    # small-tensor cases leave some gradients unpacked.
    for name, contrib_name, kwargs, shapes in _CASES:
      packed = _pack_and_unpack(
          getattr(cross_tower_ops, contrib_name)(**kwargs), shapes)
      packs = [k for k in packed if k.startswith('packed/d0/')]
      self.assertNotEqual(len(packs), len(shapes), name)
      self.assertIn('packing_var_placeholder' if 'small' in name else 'None',
                    list(packed['packed/vars']), name)


if __name__ == '__main__':
  tf.test.main()

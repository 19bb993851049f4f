"""The all-reduce builders against TF 1.15's own (an oracle).

TF 1.15 ships graph builders for ring, recursive halving-doubling and
shuffle all-reduce; ours must give the same numbers on the same inputs. On
TF 1.15 TF's builders run live; TF 2.x has none, so there ours are compared
with their results recorded on TF 1.15 (reference/all_reduce/, written by
record_reference.py).
"""
from absl.testing import parameterized
import numpy as np
import reference_lib
import tensorflow as tf

from replicate import testing
from replicate._compat import tf1
from replicate.cross_tower import algorithms

_CPUS = testing.virtual_cpu_devices(4)
_GROUP = 'all_reduce'
REFERENCE_IMPLEMENTATION = 'tensorflow.python.distribute.all_reduce'

# TF's builders need sizes that split evenly into their chunks; ours pad,
# and the tests in test_all_reduce.py cover the odd sizes.
_CASES = (('ring', 4, (4, 6)), ('ring', 3, (12,)), ('recursive_hd', 4, (8, 5)),
          ('recursive_hd', 2, (4,)), ('shuffle', 4, (5, 8)),
          ('shuffle', 3, (6,)))


def _oracle():
  from tensorflow.python.distribute import all_reduce as tf_all_reduce  # pylint: disable=g-import-not-at-top
  return tf_all_reduce


def _arrays(num_devices, shape):
  rng = np.random.RandomState(3)
  return [rng.randn(*shape).astype(np.float32) for _ in range(num_devices)]


def _ours(name, tensors):
  if name == 'ring':
    return algorithms.build_ring_all_reduce(tensors, num_subchunks=2)
  if name == 'recursive_hd':
    return algorithms.build_recursive_hd_all_reduce(tensors)
  return algorithms.build_shuffle_all_reduce(tensors, _CPUS[:2])


def _theirs(name, tensors):
  oracle = _oracle()
  if name == 'ring':
    return oracle.build_ring_all_reduce(
        tensors, num_workers=1, num_subchunks=2,
        gpu_perm=list(range(len(tensors))), red_op=tf.add)
  if name == 'recursive_hd':
    return oracle.build_recursive_hd_all_reduce(tensors, tf.add)
  return oracle.build_shuffle_all_reduce(tensors, _CPUS[:2], tf.add_n)


def _all_reduce(build, name, num_devices, shape):
  """{'device<i>': the sum on device i} of `build` over seeded arrays."""
  feeds = {}
  with tf.Graph().as_default():
    tensors = []
    for d, a in zip(_CPUS, _arrays(num_devices, shape)):
      # Fed, not constants: the graph optimizer folds sums of constants
      # in an order of its own (another on TF 2.15), hiding the kernels'.
      with tf.device(d):
        tensors.append(tf1.placeholder(tf.float32, shape))
      feeds[tensors[-1]] = a
    reduced = build(name, tensors)
    with tf1.Session(config=testing.virtual_cpu_config(4)) as sess:
      values = sess.run(reduced, feeds)
  return {'device{}'.format(i): v for i, v in enumerate(values)}


def _case_name(name, num_devices):
  return '{}_{}'.format(name, num_devices)


REFERENCE_CASES = tuple(
    reference_lib.Case(
        _GROUP, _case_name(name, num_devices),
        lambda args=(name, num_devices, shape): _all_reduce(_theirs, *args),
        lambda args=(num_devices, shape): {
            str(i): a for i, a in enumerate(_arrays(*args))})
    for name, num_devices, shape in _CASES)
_REFERENCES = {case.name: case for case in REFERENCE_CASES}
# Sums of up to four float32 randn terms (partial sums below 8 in
# magnitude): ours pad and chunk the ring and halving-doubling differently
# from TF's, so some elements are added in another order, an ulp or two
# apart (an ulp is 4.8e-7 in [4, 8)).
_TOL = dict(rtol=1e-6, atol=1e-6)


class AllReduceOracleTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(*_CASES)
  def test_same_numbers_as_tf(self, name, num_devices, shape):
    theirs = reference_lib.reference_results(
        self, _REFERENCES[_case_name(name, num_devices)], **_TOL)
    ours = _all_reduce(_ours, name, num_devices, shape)
    reference_lib.assert_same_results(self, theirs, ours, **_TOL)


if __name__ == '__main__':
  tf.test.main()

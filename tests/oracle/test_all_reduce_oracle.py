"""The all-reduce builders against TF 1.15's own (an oracle; skipped on TF 2).

TF 1.15 ships graph builders for ring, recursive halving-doubling and
shuffle all-reduce; ours must give the same numbers on the same inputs.
"""
import unittest

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from replicate import testing
from replicate._compat import IS_TF2
from replicate._compat import tf1
from replicate.cross_tower import all_reduce

_CPUS = testing.virtual_cpu_devices(4)


def _oracle():
  from tensorflow.python.distribute import all_reduce as tf_all_reduce  # pylint: disable=g-import-not-at-top
  return tf_all_reduce


@unittest.skipIf(IS_TF2, 'The oracle is TF 1.15 only.')
class AllReduceOracleTest(parameterized.TestCase, tf.test.TestCase):

  # TF's builders need sizes that split evenly into their chunks; ours pad,
  # and the tests in test_all_reduce.py cover the odd sizes.
  @parameterized.parameters(
      ('ring', 4, (4, 6)), ('ring', 3, (12,)), ('recursive_hd', 4, (8, 5)),
      ('recursive_hd', 2, (4,)), ('shuffle', 4, (5, 8)), ('shuffle', 3, (6,)))
  def test_same_numbers_as_tf(self, name, num_devices, shape):
    rng = np.random.RandomState(3)
    arrays = [rng.randn(*shape).astype(np.float32) for _ in range(num_devices)]
    with tf.Graph().as_default():
      tensors = []
      for d, a in zip(_CPUS, arrays):
        with tf.device(d):
          tensors.append(tf.constant(a))
      oracle = _oracle()
      if name == 'ring':
        ours = all_reduce.build_ring_all_reduce(tensors, num_subchunks=2)
        theirs = oracle.build_ring_all_reduce(
            tensors, num_workers=1, num_subchunks=2,
            gpu_perm=list(range(num_devices)), red_op=tf.add)
      elif name == 'recursive_hd':
        ours = all_reduce.build_recursive_hd_all_reduce(tensors)
        theirs = oracle.build_recursive_hd_all_reduce(tensors, tf.add)
      else:
        ours = all_reduce.build_shuffle_all_reduce(tensors, _CPUS[:2])
        theirs = oracle.build_shuffle_all_reduce(tensors, _CPUS[:2],
                                                 tf.add_n)
      with tf1.Session(config=testing.virtual_cpu_config(4)) as sess:
        got_ours, got_theirs = sess.run((ours, theirs))
    for a, b in zip(got_ours, got_theirs):
      self.assertAllClose(a, b, atol=1e-5)


if __name__ == '__main__':
  tf.test.main()

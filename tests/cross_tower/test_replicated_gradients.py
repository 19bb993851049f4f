"""Tests for all-reducing the towers' gradients of replicated variables."""
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.core import device_util
from replicate.cross_tower import replicated_gradients


class AllReduceGradientsTest(tf.test.TestCase):

  def test_each_tower_gets_the_sum_on_its_own_device(self):
    # Three towers, each with its own copies of two variables: tower t's
    # update must read the sum on its own device, paired with its own copy.
    devices = replicate.testing.virtual_cpu_devices(3)
    with tf.Graph().as_default():
      tower_grads = []
      for tower_id, device in enumerate(devices):
        with tf.device(device):
          a = tf1.get_variable('a_{}'.format(tower_id), [2])
          b = tf1.get_variable('b_{}'.format(tower_id), [3])
          # Tower t: a's gradient [t, 10 t], b's 100 t + [1, 2, 3].
          grad_a = tf.constant([1. * tower_id, 10. * tower_id])
          grad_b = tf.constant(100. * tower_id + np.arange(
              1., 4., dtype=np.float32))
        tower_grads.append([(grad_a, a), (grad_b, b)])
      reduced = replicated_gradients.all_reduce_gradients(
          tower_grads, devices, replicate.ReductionToOneDeviceCrossTowerOps())
      for device, pairs, own in zip(devices, reduced, tower_grads):
        for (grad, var), (_, own_var) in zip(pairs, own):
          self.assertIs(own_var, var)
          self.assertEqual(device_util.canonicalize(device),
                           device_util.canonicalize(grad.device))
      with tf1.Session(config=replicate.testing.virtual_cpu_config(3)) as s:
        got = s.run([[grad for grad, _ in pairs] for pairs in reduced])
    for grads in got:
      self.assertAllEqual([3., 30.], grads[0])  # 0 + 1 + 2, 0 + 10 + 20
      self.assertAllEqual([303., 306., 309.], grads[1])  # 300 + 3 [1, 2, 3]


if __name__ == '__main__':
  tf.test.main()

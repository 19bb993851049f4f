"""Tower 0's own variable-reuse error is TF's, unchanged: the explanation
of a later tower's missing variable (tower_build._raise_if_unshared) is
about towers after the first only."""
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1


def _model_fn(features, labels, mode):
  # reuse=True of model_fn's own: 'missing/w' exists in no tower.
  with tf1.variable_scope('missing', reuse=True):
    w = tf1.get_variable('w', [3, 1])
  loss = tf1.losses.mean_squared_error(labels, tf.matmul(features['x'], w))
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class TowerZeroReuseErrorTest(tf.test.TestCase):

  def test_tower_zero_missing_variable_is_tfs_error(self):
    x = np.arange(24, dtype=np.float32).reshape([8, 3]) / 10.0
    for tower_build in (replicate.TowerBuild.CLONE,
                        replicate.TowerBuild.CALL_PER_TOWER):
      with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        with self.assertRaisesRegex(ValueError, 'does not exist') as caught:
          replicate.replicate_model_fn(
              _model_fn, devices=replicate.testing.virtual_cpu_devices(2),
              tower_build=tower_build)(
                  {'x': tf.constant(x)}, tf.constant(x[:, :1]),
                  tf1.estimator.ModeKeys.TRAIN)
        # Not replicate's "Tower 0 of 2 asked for a variable tower 0 did
        # not create": tower 0 is the one that creates them.
        self.assertNotIsInstance(caught.exception, replicate.errors.Error)
        self.assertNotIn('Tower 0 of 2', str(caught.exception))


if __name__ == '__main__':
  tf.test.main()

"""Tower 0's name scope is the caller's, ending in '/': the checks that pair
tower i's ops with tower 0's by name hold when replicate_model_fn's wrapper
is called inside a name scope (tower_build._tower_scopes)."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1


def _model_fn(features, labels, mode):
  # Every call adds 0.5 * l2(w) to REGULARIZATION_LOSSES; tower 1 also sees
  # tower 0's entry, so get_total_loss() would count it twice.
  w = tf1.get_variable('w', initializer=tf.constant([[0.1], [-0.2], [0.3]]))
  tf1.losses.mean_squared_error(labels, tf.matmul(features['x'], w))
  tf1.losses.add_loss(0.5 * tf.nn.l2_loss(w),
                      tf1.GraphKeys.REGULARIZATION_LOSSES)
  loss = tf1.losses.get_total_loss()
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _build(scope):
  x = np.arange(24, dtype=np.float32).reshape([8, 3]) / 10.0
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    with tf1.name_scope(scope):
      replicate.replicate_model_fn(
          _model_fn, devices=replicate.testing.virtual_cpu_devices(2),
          tower_build=replicate.TowerBuild.CALL_PER_TOWER)(
              {'x': tf.constant(x)}, tf.constant(x[:, :1]),
              tf1.estimator.ModeKeys.TRAIN)


class ChecksInsideNameScopeTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(None, 'outer', 'outer/inner')
  def test_regularization_counted_twice_is_refused_in_any_scope(self, scope):
    with self.assertRaisesRegex(
        ValueError,
        r'The loss of tower 1 of 2 counts the regularization loss '
        r'.*tower_1/mul:0, which its model_fn call added to '
        r"REGULARIZATION_LOSSES again as tower 0's call added .*mul:0"):
      _build(scope)


if __name__ == '__main__':
  tf.test.main()

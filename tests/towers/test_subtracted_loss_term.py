"""Under `Reduction.SUM` a term *subtracted* from the loss that reads no row (a
reward on the weights) counts once per tower, as an added one does, and is
refused the same way.

One device: loss = sum((x w - y)^2) - 0.1 * sum(w); 4 towers adding their
losses unscaled would subtract 4 * 0.1 * sum(w): the step's gradient for w
would be 4 x (-0.1) instead of -0.1, silently."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1


def _model_fn(features, labels, mode):
  w = tf1.get_variable('w', [3, 1], initializer=(
      tf1.constant_initializer([[0.5], [-0.25], [1.0]])))
  errors_sum = tf.reduce_sum(tf.square(tf.matmul(features['x'], w) - labels))
  reward = tf.multiply(0.1, tf.reduce_sum(w), name='reward')
  loss = tf.subtract(errors_sum, reward, name='loss')
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _build(**kwargs):
  x = np.arange(24, dtype=np.float32).reshape(8, 3) / 10.
  y = np.arange(8, dtype=np.float32).reshape(8, 1)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    replicate.replicate_model_fn(
        _model_fn, devices=replicate.testing.virtual_cpu_devices(4),
        loss_reduction=tf1.losses.Reduction.SUM, **kwargs)(
            {'x': tf.constant(x)}, tf.constant(y),
            tf1.estimator.ModeKeys.TRAIN)


class SubtractedTermTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('copies', {}),
      ('calls', {'tower_build': replicate.TowerBuild.CALL_PER_TOWER}))
  def test_subtracted_term_without_rows_is_refused_under_sum(self, kwargs):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"loss_reduction is Reduction.SUM, so the 4 towers' losses are added "
        r'unscaled, and the term (tower_1/)?reward:0 of the loss of tower '
        r'[01] reads none of the tower\'s rows'):
      _build(**kwargs)


if __name__ == '__main__':
  tf.test.main()

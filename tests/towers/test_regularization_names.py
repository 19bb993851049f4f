"""A regularization loss that every `model_fn` call adds again is found
whatever number TF made its name unique by, two digits included.

A custom getter adds `l2_term` for each of 10 variables; get_variable
clears the name scope while the getter runs, so tower 0's terms are
`l2_term`, `l2_term_1` .. `l2_term_9` and tower 1's `l2_term_10` ..
`l2_term_19`: only stripping every digit of the suffix pairs them."""
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1

_NUM_VARIABLES = 10


def _l2_getter(getter, *args, **kwargs):
  variable = getter(*args, **kwargs)
  tf1.losses.add_loss(tf.multiply(0.5, tf.nn.l2_loss(variable),
                                  name='l2_term'),
                      tf1.GraphKeys.REGULARIZATION_LOSSES)
  return variable


def _model_fn(features, labels, mode):
  with tf1.variable_scope('net', custom_getter=_l2_getter):
    weights = [tf1.get_variable(
        'w{}'.format(i), [3, 1],
        initializer=tf1.constant_initializer([[0.5 + i], [-0.25], [1.0]]))
               for i in range(_NUM_VARIABLES)]
  prediction = tf.add_n([tf.matmul(features['x'], w) for w in weights])
  tf1.losses.mean_squared_error(labels, prediction)
  loss = tf1.losses.get_total_loss()
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class ManyRegularizationTermsTest(tf.test.TestCase):

  def test_term_with_a_two_digit_suffix_is_paired_with_tower_zeros(self):
    x = np.arange(24, dtype=np.float32).reshape([8, 3]) / 10.0
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'The loss of tower 1 of 2 counts the regularization loss '
          r'l2_term_1\d:0, which its model_fn call added to '
          r"REGULARIZATION_LOSSES again as tower 0's call added "
          r'l2_term(_\d)?:0.*apply it 2 times'):
        replicate.replicate_model_fn(
            _model_fn, devices=replicate.testing.virtual_cpu_devices(2),
            tower_build=replicate.TowerBuild.CALL_PER_TOWER)(
                {'x': tf.constant(x)}, tf.constant(x[:, :1]),
                tf1.estimator.ModeKeys.TRAIN)


if __name__ == '__main__':
  tf.test.main()

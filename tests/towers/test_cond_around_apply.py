"""A TF1 `tf.cond` around `apply_gradients` whose predicate does not come
from the tower's rows (a switch the session feeds) is allowed, and trains
as one device (step_checks.check_unconditional).

Only a predicate computed from the rows (one tower deciding for all) is
refused; the check reads TF1 control flow contexts, so the test builds TF1
control flow on both TF versions."""
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1


def _model_fn(features, labels, mode, params):
  del params
  logits = tf1.layers.dense(
      features['x'], 1, name='w',
      kernel_initializer=tf1.constant_initializer([[0.3], [-0.2], [0.5]]))
  loss = tf1.losses.mean_squared_error(labels, logits)
  optimizer = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.5))
  grads_and_vars = optimizer.compute_gradients(loss)
  # Not a function of the rows: a switch, True unless fed.
  apply = tf1.placeholder_with_default(True, [], name='apply')
  train_op = tf1.cond(
      apply,
      lambda: tf.group(optimizer.apply_gradients(
          grads_and_vars, tf1.train.get_global_step())),
      tf.no_op)
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _rows():
  # 4 distinct rows, distinct targets: a mix-up of shards shows.
  x = np.array([[1., 2., 3.], [-1., 0.5, 2.], [0.25, -3., 1.], [2., 1., -1.]],
               np.float32)
  y = np.array([[1.], [-2.], [0.5], [3.]], np.float32)
  return x, y


def _rows_model_fn(features, labels, mode, params):
  """As `_model_fn`, with the predicate computed from the tower's rows."""
  del params
  logits = tf1.layers.dense(features['x'], 1, name='w')
  loss = tf1.losses.mean_squared_error(labels, logits)
  optimizer = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.5))
  grads_and_vars = optimizer.compute_gradients(loss)
  train_op = tf1.cond(
      tf.reduce_sum(features['x']) > 0.,
      lambda: tf.group(optimizer.apply_gradients(
          grads_and_vars, tf1.train.get_global_step())),
      tf.no_op)
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class CondNotOnRowsTest(tf.test.TestCase):

  def setUp(self):
    super(CondNotOnRowsTest, self).setUp()
    # TF1 control flow (TF 1.15's default; TF 2's tf.cond makes a function).
    self._v2 = tf1.control_flow_v2_enabled()
    tf1.disable_control_flow_v2()

  def tearDown(self):
    if self._v2:
      tf1.enable_control_flow_v2()
    super(CondNotOnRowsTest, self).tearDown()

  def test_cond_on_a_fed_switch_trains_as_one_device(self):
    x, y = _rows()
    one = mt.train_variables(_model_fn, {'x': x}, y, ['/cpu:0'], steps=2)
    towers = mt.train_variables(_model_fn, {'x': x}, y, mt.cpus(2), steps=2)
    self.assertEqual(2, towers['global_step'])
    # MEAN over 2 equal shards of 2 rows: the mean of the towers' gradients
    # is one device's gradient over the 4 rows (up to the order of sums).
    for name in ('w/kernel', 'w/bias'):
      self.assertAllClose(one[name], towers[name], rtol=1e-6, atol=1e-7,
                          msg=name)
    # It did train.
    self.assertNotAllClose([[0.3], [-0.2], [0.5]], towers['w/kernel'])

  def test_cond_on_the_rows_is_refused(self):
    x, y = _rows()
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                r'inside a tf\.cond whose predicate'):
      mt.train_variables(_rows_model_fn, {'x': x}, y, mt.cpus(2), steps=1)


if __name__ == '__main__':
  tf.test.main()

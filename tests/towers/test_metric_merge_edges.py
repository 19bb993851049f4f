"""The merge of the towers' metric variables: what it refuses, and a
subtracting metric it sums (replicate/towers/metric_merge.py)."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1

EVAL = tf1.estimator.ModeKeys.EVAL


def _sum_metric(values, dtype):
  """A sum of `values` in a metric variable 'total' of `dtype`."""
  total = tf1.Variable(tf.zeros([], dtype), trainable=False, name='total',
                       collections=[tf1.GraphKeys.LOCAL_VARIABLES,
                                    tf1.GraphKeys.METRIC_VARIABLES])
  return total, tf1.assign_add(total, tf.cast(tf.reduce_sum(values), dtype))


class MetricMergeEdgesTest(parameterized.TestCase, tf.test.TestCase):

  def test_a_metric_variable_of_another_dtype_is_named(self):
    # Tower 1 sums in float64 where tower 0 sums in float32: same count and
    # shape of variables, but they cannot be added into tower 0's.
    def model_fn(features, labels, mode):
      del labels
      loss = tf.reduce_mean(features['x'])
      dtype = (tf.float64 if replicate.get_tower_context().tower_id == 1
               else tf.float32)
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss,
          eval_metric_ops={'sum': _sum_metric(features['x'], dtype)})

    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      features = {'x': tf.constant(np.arange(24, dtype=np.float32)
                                   .reshape(8, 3))}
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'Every tower must create the same metrics, but metric variable '
          r'\S*total\S* \(float64, \(\)\) does not match \S*total\S* '
          r'\(float32, \(\)\) of tower 0'):
        replicate.replicate_model_fn(
            model_fn, devices=replicate.testing.virtual_cpu_devices(2))(
                features, None, EVAL)


  def _evaluate_replicated(self, metric_fn, devices=2):
    """The metric 'm' of `metric_fn(x)` over the 8 rows of x = [[0, 1, 2],
    [3, 4, 5], ...] after one replicated update."""
    def model_fn(features, labels, mode):
      del labels
      loss = tf.reduce_mean(features['x'])
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss, eval_metric_ops={'m': metric_fn(features['x'])})

    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      features = {'x': tf.constant(np.arange(24, dtype=np.float32)
                                   .reshape(8, 3))}
      spec = replicate.replicate_model_fn(
          model_fn, devices=replicate.testing.virtual_cpu_devices(devices))(
              features, None, EVAL)
      value, update = spec.eval_metric_ops['m']
      with tf1.Session(config=replicate.testing.virtual_cpu_config(
          devices)) as sess:
        sess.run([tf1.global_variables_initializer(),
                  tf1.local_variables_initializer()])
        sess.run(update)
        return sess.run(value)

  @parameterized.named_parameters(('ref', False), ('resource', True))
  def test_a_metric_that_subtracts_sums_as_one_device(self, use_resource):
    # assign_sub from zero (AssignSub, AssignSubVariableOp) adds a negative
    # amount: towers' states summed are one device's. Rows sum to
    # 0 + 1 + ... + 23 = 276.
    def count_down(values):
      total = tf1.Variable(0., trainable=False, name='count_down',
                           use_resource=use_resource,
                           collections=[tf1.GraphKeys.LOCAL_VARIABLES,
                                        tf1.GraphKeys.METRIC_VARIABLES])
      return total, tf1.assign_sub(total, tf.reduce_sum(values))

    self.assertAllEqual(-276., self._evaluate_replicated(count_down))

  def test_a_start_that_is_not_a_constant_is_refused(self):
    # A start known only at run time may be nonzero: every tower's copy
    # would count it once.
    def from_random_start(values):
      total = tf1.Variable(tf.random.uniform([], 1., 2.), trainable=False,
                           name='random_start',
                           collections=[tf1.GraphKeys.LOCAL_VARIABLES,
                                        tf1.GraphKeys.METRIC_VARIABLES])
      return total, tf1.assign_add(total, tf.reduce_sum(values))

    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"Metric 'm' cannot be reduced across towers: metric variable "
        r'\S*random_start does not start at a constant zero'):
      self._evaluate_replicated(from_random_start)

  def test_a_tower_whose_metric_does_not_add_is_refused(self):
    # Tower 0's metric adds; tower 1's, built by its own model_fn call,
    # overwrites: every tower's writes are checked, not only tower 0's.
    def model_fn(features, labels, mode):
      del labels
      loss = tf.reduce_mean(features['x'])
      total = tf1.Variable(0., trainable=False, name='total',
                           collections=[tf1.GraphKeys.LOCAL_VARIABLES,
                                        tf1.GraphKeys.METRIC_VARIABLES])
      write = (tf1.assign if replicate.get_tower_context().tower_id == 1
               else tf1.assign_add)
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss, eval_metric_ops={
              'm': (total, write(total, tf.reduce_sum(features['x'])))})

    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      features = {'x': tf.constant(np.arange(24, dtype=np.float32)
                                   .reshape(8, 3))}
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r"Metric 'm' cannot be reduced across towers: its update op "
          r'writes metric variable \S*total\S* with Assign'):
        replicate.replicate_model_fn(
            model_fn, devices=replicate.testing.virtual_cpu_devices(2),
            tower_build=replicate.TowerBuild.CALL_PER_TOWER)(
                features, None, EVAL)


if __name__ == '__main__':
  tf.test.main()

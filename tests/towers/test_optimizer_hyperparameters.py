"""An optimizer hyperparameter that differs between model_fn calls.

Towers built by calls apply with the last tower's optimizer, as tf.contrib
did; copied towers apply with tower 0's. A learning rate computed from the
tower's rows, or drawn by a random op, has another value in each call, so
copies must not stand for the calls there (tower_copier.reason_call_values).
A rate computed from the global step alone is the same in every call, and
is copied.
"""
import tempfile
from unittest import mock

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.towers import tower_cloning

CLONE = replicate.TowerBuild.CLONE
PER_TOWER = replicate.TowerBuild.CALL_PER_TOWER
TOWERS = 4


def _rate(kind, features):
  step = tf1.train.get_global_step()
  if kind == 'rows':
    # The linear scaling rule: 0.05 per row of the batch the call sees.
    # 7 rows split 2, 2, 2, 1: calls apply with the last tower's 0.05,
    # copies would apply with tower 0's 0.1.
    return 0.05 * tf.cast(tf.shape(features['x'])[0], tf.float32)
  if kind == 'noisy':
    # A draw of each call's own random op.
    return tf1.train.noisy_linear_cosine_decay(0.1, step, 10,
                                               initial_variance=1.0)
  # 'schedule': a function of the global step alone.
  return tf1.train.piecewise_constant(
      step, [1, 2], [0.3, 0.2, 0.1]) * tf1.train.cosine_decay(1.0, step, 10)


def _model_fn(features, labels, mode, params):
  # Two same-shaped variables, so that a mix-up between them shows.
  first = tf1.get_variable('first', [3, 1],
                           initializer=tf1.constant_initializer(0.1))
  second = tf1.get_variable('second', [3, 1],
                            initializer=tf1.constant_initializer(-0.2))
  prediction = tf.matmul(features['x'], first) + tf.matmul(
      tf.square(features['x']), second)
  loss = tf1.losses.mean_squared_error(labels, prediction)
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(_rate(params['kind'], features))
  ).minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _input_fn():
  # 7 distinct rows, the same batch every step.
  rng = np.random.RandomState(0)
  x = rng.uniform(-1, 1, (7, 3)).astype(np.float32)
  y = rng.uniform(-1, 1, (7, 1)).astype(np.float32)
  return tf1.data.Dataset.from_tensors(({'x': x}, y)).repeat()


def _trained(kind, tower_build):
  """The variables after 3 steps of an Estimator, and the fallback reasons
  logged."""
  model_fn = replicate.replicate_model_fn(
      _model_fn, devices=mt.cpus(TOWERS), tower_build=tower_build)
  estimator = tf1.estimator.Estimator(
      model_fn, params={'kind': kind},
      config=tf1.estimator.RunConfig(
          model_dir=tempfile.mkdtemp(), tf_random_seed=3,
          session_config=replicate.testing.virtual_cpu_config(TOWERS)))
  with mock.patch.object(tower_cloning, 'warn_not_cloned') as warn:
    estimator.train(_input_fn, steps=3)
  return ({n: estimator.get_variable_value(n) for n in ('first', 'second')},
          [c[0][0] for c in warn.call_args_list])


def _build(model_fn, params, **kwargs):
  """Builds the replicated TRAIN graph of `model_fn` on 2 towers and 7 rows."""
  features, labels = mt.data(batch_size=7)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    replicate.replicate_model_fn(model_fn, devices=mt.cpus(2), **kwargs)(
        {'x': tf.constant(features['x'])}, tf.constant(labels), mt.TRAIN,
        params)


class HyperparameterTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('rows', 'rows', r"the optimizer GradientDescentOptimizer's "
       r"learning_rate is computed from the tower's rows \(.*\), and calls "
       r"apply with the last tower's optimizer"),
      ('noisy', 'noisy', r"the optimizer GradientDescentOptimizer's "
       r'learning_rate is drawn by a random op of its call \(.*RandomStandard'
       r'Normal\)'))
  def test_rate_of_each_call_is_built_by_calls(self, kind, reason):
    calls, no_reasons = _trained(kind, PER_TOWER)
    self.assertEqual([], no_reasons)
    default, reasons = _trained(kind, CLONE)
    self.assertLen(reasons, 1)
    self.assertRegex(reasons[0], reason)
    for name in calls:
      self.assertAllEqual(calls[name], default[name], msg=name)

  def test_rate_of_the_global_step_is_copied(self):
    calls, _ = _trained('schedule', PER_TOWER)
    copies, reasons = _trained('schedule', CLONE)
    self.assertEqual([], reasons)
    for name in calls:
      self.assertAllClose(calls[name], copies[name], rtol=1e-6, atol=1e-7,
                          msg=name)

  def test_second_optimizer_after_the_copies_is_an_error(self):
    # The first optimizer's call copies the towers; the second one's rate
    # comes from the rows, and copies can no longer turn into calls.
    def model_fn(features, labels, mode, params):
      del params
      first = tf1.get_variable('first', [3, 1])
      second = tf1.get_variable('second', [3, 1])
      loss = tf1.losses.mean_squared_error(
          labels, tf.matmul(features['x'], first + second))
      step = tf1.train.get_global_step()
      one = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, var_list=[first])
      two = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(
          _rate('rows', features))).minimize(loss, step, var_list=[second])
      return tf1.estimator.EstimatorSpec(mode, loss=loss,
                                         train_op=tf.group(one, two))

    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"but the optimizer GradientDescentOptimizer's learning_rate is "
        r"computed from the tower's rows .* tower_build=replicate\."
        r'TowerBuild\.CALL_PER_TOWER'):
      _build(model_fn, {})

  def test_replicated_variables_refuse_such_a_rate(self):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"the optimizer GradientDescentOptimizer's learning_rate is "
        r"computed from the tower's rows"):
      _build(_model_fn, {'kind': 'rows'},
             variable_placement=replicate.VariablePlacement.REPLICATED)


if __name__ == '__main__':
  tf.test.main()

"""Loss scaling (mixed precision) in towers: one device's step, or an error.

`TowerOptimizer(MixedPrecisionLossScaleOptimizer(optimizer, 'dynamic'))`
tests the summed gradients for inf/NaN, so a step skipped because of one
row of any tower is skipped as on one device. The other nesting would test
one tower's gradients only; and towers built by their own `model_fn` calls
would keep a loss scale each, of which the step updates one. Both are
errors.
"""
import functools

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

LossScaleOptimizer = tf1.train.experimental.MixedPrecisionLossScaleOptimizer

# Three batches (one per step) of distinct rows, non-uniform weights. With
# `overflow`, row 5 of the first batch (tower 1 of 2, tower 2 of 4) weighs
# 1e36: its gradient times the loss scale 2**15 is beyond float32 (1e36 *
# 2**15 / 8 alone is 4e39 > 3.4e38), so one device skips step 0 (global step
# and variables unchanged), halves the loss scale to 16384 and applies the
# two other batches (good_steps 2).
_STEPS = 3
_X = (np.arange(_STEPS * 24, dtype=np.float32).reshape([_STEPS, 8, 3]) /
      30.0 - 1.0)
_Y = np.linspace(-1.0, 2.0, _STEPS * 8, dtype=np.float32).reshape(
    [_STEPS, 8, 1])
_WEIGHTS = np.tile(np.array([1, 2, .5, 3, 1.5, 1, 2.5, .25], np.float32),
                   [_STEPS, 1])[:, :, None]


def _model_fn(optimizer_fn, nesting='inner'):
  def model_fn(features, labels, mode, params):
    del params
    w = tf1.get_variable('w', [3, 1], initializer=tf1.constant_initializer(
        [[0.1], [0.2], [0.3]]))
    v = tf1.get_variable('v', [3, 1], initializer=tf1.constant_initializer(
        [[-0.2], [0.1], [0.4]]))
    logits = tf.matmul(features['x'], w) + tf.matmul(tf.tanh(features['x']), v)
    loss = tf1.losses.mean_squared_error(labels, logits,
                                         weights=features['weight'])
    if nesting == 'inner':
      optimizer = replicate.TowerOptimizer(
          LossScaleOptimizer(optimizer_fn(), 'dynamic'))
    else:
      optimizer = LossScaleOptimizer(
          replicate.TowerOptimizer(optimizer_fn()), 'dynamic')
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=(
        optimizer.minimize(loss, tf1.train.get_global_step())))
  return model_fn


def _dataset(overflow=False):
  weights = _WEIGHTS.copy()
  if overflow:
    weights[0, 5, 0] = 1e36
  return tf1.data.Dataset.from_tensor_slices(
      ({'x': _X, 'weight': weights}, _Y))


def _train(model_fn, devices=None, overflow=False, steps=_STEPS, **kwargs):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    if devices is not None:
      model_fn = replicate.replicate_model_fn(model_fn, devices=devices,
                                              **kwargs)
    features, labels = tf1.data.make_one_shot_iterator(
        _dataset(overflow)).get_next()
    spec = model_fn(features, labels, mt.TRAIN, None)
    return mt.run_spec(spec, mt.TRAIN, steps=steps)


def _train_estimator(model_fn, devices, **kwargs):
  estimator = tf1.estimator.Estimator(
      replicate.replicate_model_fn(model_fn, devices=devices, **kwargs),
      config=tf1.estimator.RunConfig(
          session_config=replicate.testing.virtual_cpu_config(4)))
  estimator.train(_dataset, steps=1)


_OPTIMIZERS = (
    ('sgd', lambda: tf1.train.GradientDescentOptimizer(0.05)),
    ('adam', lambda: tf1.train.AdamOptimizer(0.05)),
)


class LossScaleTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      (name + suffix, optimizer_fn, num_towers, overflow)
      for name, optimizer_fn in _OPTIMIZERS
      for suffix, num_towers, overflow in (
          ('_2_towers', 2, False), ('_4_towers', 4, False),
          ('_2_towers_overflow', 2, True), ('_4_towers_overflow', 4, True)))
  def test_tower_optimizer_outside_steps_as_one_device(
      self, optimizer_fn, num_towers, overflow):
    model_fn = _model_fn(optimizer_fn)
    expected = _train(model_fn, overflow=overflow)
    got = _train(model_fn, mt.cpus(num_towers), overflow=overflow)
    self.assertEqual(sorted(expected), sorted(got))
    # No overflow: 3 good steps at 2**15; an overflow at step 0 in a row of
    # a tower other than 0: that step skipped, 2 good steps at 2**14.
    self.assertEqual(16384.0 if overflow else 32768.0,
                     expected['current_loss_scale'])
    self.assertEqual(2 if overflow else 3, expected['good_steps'])
    self.assertEqual(2 if overflow else 3, expected['global_step'])
    for name in expected:
      self.assertAllClose(expected[name], got[name], rtol=1e-6, atol=1e-6,
                          msg=name)
    self.assertNotAllClose(_train(_model_fn(optimizer_fn), steps=0)['w'],
                           got['w'])

  @parameterized.parameters(2, 4)
  def test_contrib_loss_scale_optimizer_as_one_device(self, num_towers):
    # TF 1.15 contrib's LossScaleOptimizer never runs Optimizer.__init__
    # (no name): the towers still record and apply it. A fixed scale of 128
    # scales the loss up and the gradients down: one device's SGD step.
    if not hasattr(tf, 'contrib'):
      self.skipTest('tf.contrib exists only in TF 1.x')
    mixed_precision = tf.contrib.mixed_precision  # pylint: disable=no-member

    def model_fn(features, labels, mode, params):
      del params
      w = tf1.get_variable('w', [3, 1], initializer=tf1.constant_initializer(
          [[0.1], [0.2], [0.3]]))
      loss = tf1.losses.mean_squared_error(
          labels, tf.matmul(features['x'], w), weights=features['weight'])
      optimizer = replicate.TowerOptimizer(mixed_precision.LossScaleOptimizer(
          tf1.train.GradientDescentOptimizer(0.05),
          mixed_precision.FixedLossScaleManager(128.0)))
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=(
          optimizer.minimize(loss, tf1.train.get_global_step())))

    expected = _train(model_fn)
    got = _train(model_fn, mt.cpus(num_towers))
    self.assertEqual(3, got['global_step'])
    self.assertAllClose(expected['w'], got['w'], rtol=1e-6, atol=1e-7)
    self.assertNotAllClose(_train(model_fn, steps=0)['w'], got['w'])

  def test_loss_scale_optimizer_outside_is_an_error(self):
    # It would skip or apply the summed step by tower 0's gradients alone:
    # an inf in another tower's row would be applied.
    model_fn = _model_fn(_OPTIMIZERS[0][1], nesting='outer')
    with self.assertRaisesRegex(
        ValueError,
        r'(inside a tf\.cond whose predicate .* is computed from the rows of '
        r'tower 0 of 2.*TowerOptimizer\(MixedPrecisionLossScaleOptimizer'
        r'|inside a TF 2 tf\.cond or tf\.function)'):
      _train_estimator(model_fn, mt.cpus(2))

  @parameterized.named_parameters(('call_per_tower', True), ('fallback', False))
  def test_dynamic_loss_scale_of_each_call_is_an_error(self, asked):
    # Each call makes its own loss scale; the last tower's update would
    # halve its own while tower 0 kept scaling by 2**15 (training could stall
    # for good, as it did in contrib).
    optimizer_fn = _OPTIMIZERS[0][1]
    inner = _model_fn(optimizer_fn)

    def asks_for_its_tower(features, labels, mode, params):
      replicate.get_tower_context()
      return inner(features, labels, mode, params)

    kwargs = {'tower_build': replicate.TowerBuild.CALL_PER_TOWER}
    with self.assertRaisesRegex(
        ValueError,
        r"The step's update writes tower_1/(current_loss_scale|good_steps), "
        r'which the model_fn call of tower 1 of 2 made for itself.*because '
        + (r'tower_build is TowerBuild\.CALL_PER_TOWER' if asked else
           r'model_fn calls replicate\.get_tower_context\(\)')):
      _train_estimator(inner if asked else asks_for_its_tower, mt.cpus(2),
                       **(kwargs if asked else {}))


  def test_state_of_each_call_the_update_only_reads(self):
    # A learning rate kept in a non-trainable variable that each call makes
    # (tower_1/lr beside lr): the last tower's update reads its own, equal
    # to tower 0's, and writes none of it: accepted, as one device. (A
    # resource variable: the update's own ReadVariableOp reads it.)
    def model_fn(features, labels, mode, params):
      del params
      w = tf1.get_variable('w', [3, 1],
                           initializer=tf1.constant_initializer(0.5))
      lr = tf1.Variable(0.1, trainable=False, name='lr', use_resource=True)
      loss = tf1.losses.mean_squared_error(
          labels, tf.matmul(features['x'], w))
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(lr)).minimize(
              loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    features, labels = {'x': _X[0]}, _Y[0]
    one = mt.train_variables(model_fn, features, labels, mt.cpus(1))
    calls = mt.train_variables(
        model_fn, features, labels, mt.cpus(2),
        replicate_fn=functools.partial(
            replicate.replicate_model_fn,
            tower_build=replicate.TowerBuild.CALL_PER_TOWER))
    self.assertIn('tower_1/lr', calls)
    self.assertNotAllClose(0.5 * np.ones([3, 1]), one['w'])  # it trained
    self.assertAllClose(one['w'], calls['w'], rtol=1e-6)


if __name__ == '__main__':
  tf.test.main()

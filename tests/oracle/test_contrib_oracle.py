"""TF 1.15's own tf.contrib.estimator.replicate_model_fn as a reference oracle.

Skipped on TF 2.x, where tf.contrib no longer exists.
"""
from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import IS_TF2
from replicate._compat import tf1

REDUCTION = tf1.losses.Reduction


def _contrib():
  return tf.contrib.estimator  # pylint: disable=no-member


def _model_fn(features, labels, mode, params):
  """An MLP whose optimizer wrapper comes from params (ours or contrib's)."""
  hidden = tf1.layers.dense(
      features['x'], 5, activation=tf.nn.relu,
      kernel_initializer=tf1.glorot_uniform_initializer(seed=1),
      kernel_regularizer=tf.keras.regularizers.l2(0.01), name='hidden')
  logits = tf1.layers.dense(
      hidden, 3, kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
      name='logits')
  classes = tf.argmax(logits, axis=1)
  if mode == mt.PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions={'classes': classes, 'logits': logits})
  loss = tf1.losses.sparse_softmax_cross_entropy(
      labels, logits, reduction=params['reduction'])
  loss += tf1.losses.get_regularization_loss()
  optimizer = params['wrapper'](tf1.train.AdamOptimizer(0.05))
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metric_ops={
          'accuracy': tf1.metrics.accuracy(labels, classes),
          'mean_logit': tf1.metrics.mean(logits),
      })


def _data(batch_size=16):
  rng = np.random.RandomState(7)
  x = rng.normal(size=(batch_size, 4)).astype(np.float32)
  y = (np.abs(x[:, 0]) * 2).astype(np.int64) % 3
  return {'x': x}, y


def _run(replicate_fn, wrapper, mode, reduction, num_towers, steps=4):
  """Builds the replicated model in a graph; trains, evaluates or predicts."""
  features, labels = _data()
  params = {'wrapper': wrapper, 'reduction': reduction}
  with tf.Graph().as_default():
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    spec = replicate_fn(_model_fn, loss_reduction=reduction,
                        devices=mt.cpus(num_towers))(
                            {'x': tf.constant(features['x'])},
                            None if mode == mt.PREDICT else tf.constant(labels),
                            mode, params)
    return mt.run_spec(spec, mode, steps=steps, metric_updates=2)


_AVERAGING = (
    ('mean_2', REDUCTION.MEAN, 2),
    ('mean_4', REDUCTION.MEAN, 4),
    ('nonzero_weights_4', REDUCTION.SUM_BY_NONZERO_WEIGHTS, 4),
)
# Under SUM contrib adds every tower's copy of the regularization loss (N
# times); replicate counts it once, like the unreplicated model. So training
# under SUM is compared on a model without a regularizer (below).
_ALL = _AVERAGING + (('sum_4', REDUCTION.SUM, 4),)


class ContribOracleTest(tf.test.TestCase, parameterized.TestCase):

  def setUp(self):
    super(ContribOracleTest, self).setUp()
    if IS_TF2:
      self.skipTest('tf.contrib (the reference) exists only in TF 1.x')

  def _both(self, mode, reduction, num_towers):
    ours = _run(replicate.replicate_model_fn, replicate.TowerOptimizer, mode,
                reduction, num_towers)
    theirs = _run(_contrib().replicate_model_fn, _contrib().TowerOptimizer,
                  mode, reduction, num_towers)
    return ours, theirs

  @parameterized.named_parameters(*_AVERAGING)
  def test_same_variables_after_training(self, reduction, num_towers):
    ours, theirs = self._both(mt.TRAIN, reduction, num_towers)
    self.assertEqual(sorted(theirs), sorted(ours))
    for name in theirs:
      self.assertAllClose(theirs[name], ours[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  @parameterized.named_parameters(*_ALL)
  def test_same_eval_metrics(self, reduction, num_towers):
    ours, theirs = self._both(mt.EVAL, reduction, num_towers)
    if reduction == REDUCTION.SUM:
      del ours['loss'], theirs['loss']  # regularization: see above
    self.assertAllClose(theirs, ours, rtol=1e-6)

  @parameterized.named_parameters(*_ALL)
  def test_same_predictions(self, reduction, num_towers):
    ours, theirs = self._both(mt.PREDICT, reduction, num_towers)
    self.assertAllClose(theirs, ours)


class ContribOracleNoRegularizerTest(tf.test.TestCase):

  def test_same_variables_without_regularizer_under_sum(self):
    if IS_TF2:
      self.skipTest('tf.contrib (the reference) exists only in TF 1.x')
    features, labels = mt.data(batch_size=8)
    results = [
        mt.train_variables(
            mt.mlp_model_fn, features, labels, mt.cpus(4), steps=3,
            loss_reduction=REDUCTION.SUM, replicate_fn=fn,
            params={'reduction': REDUCTION.SUM, 'wrapper': wrapper,
                    'optimizer_fn':
                        lambda: tf1.train.GradientDescentOptimizer(0.1)})
        for fn, wrapper in ((replicate.replicate_model_fn,
                             replicate.TowerOptimizer),
                            (_contrib().replicate_model_fn,
                             _contrib().TowerOptimizer))]
    ours, theirs = results
    for name in theirs:
      self.assertAllClose(theirs[name], ours[name], rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()

"""TF 1.15's own tf.contrib.estimator.replicate_model_fn as a reference oracle.

On TF 1.15 contrib runs live; on TF 2.x, where tf.contrib no longer exists,
replicate is compared with contrib's results recorded on TF 1.15
(reference/contrib_estimator/, written by record_reference.py). The initial
values come from numpy, so both TFs start from the same variables.
"""
from absl.testing import parameterized
import model_testing as mt
import numpy as np
import reference_lib
import tensorflow as tf

import replicate
from replicate._compat import tf1

REDUCTION = tf1.losses.Reduction
_GROUP = 'contrib_estimator'
REFERENCE_IMPLEMENTATION = ('tf.contrib.estimator.replicate_model_fn, '
                            'TowerOptimizer')
_STEPS = 4


def _contrib():
  return tf.contrib.estimator  # pylint: disable=no-member


def _initial_values():
  """The kernels' initial values: distinct, glorot-uniform sized."""
  rng = np.random.RandomState(11)
  return {
      'hidden/kernel': rng.uniform(-0.8, 0.8, size=(4, 5)).astype(np.float32),
      'logits/kernel': rng.uniform(-0.8, 0.8, size=(5, 3)).astype(np.float32),
  }


def _model_fn(features, labels, mode, params):
  """An MLP whose optimizer wrapper comes from params (ours or contrib's)."""
  initial = _initial_values()
  hidden = tf1.layers.dense(
      features['x'], 5, activation=tf.nn.relu,
      kernel_initializer=tf1.constant_initializer(initial['hidden/kernel']),
      kernel_regularizer=(tf.keras.regularizers.l2(0.01)
                          if params['regularize'] else None), name='hidden')
  logits = tf1.layers.dense(
      hidden, 3,
      kernel_initializer=tf1.constant_initializer(initial['logits/kernel']),
      name='logits')
  classes = tf.argmax(logits, axis=1)
  if mode == mt.PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions={'classes': classes, 'logits': logits})
  loss = tf1.losses.sparse_softmax_cross_entropy(
      labels, logits, reduction=params['reduction'])
  loss += tf1.losses.get_regularization_loss()
  optimizer = params['wrapper'](params['optimizer_fn']())
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


def _inputs():
  features, labels = _data()
  inputs = dict(_initial_values())
  inputs.update(x=features['x'], y=labels)
  return inputs


def _run(replicate_fn, wrapper, mode, reduction, num_towers, regularize=True,
         optimizer_fn=lambda: tf1.train.AdamOptimizer(0.05)):
  """Builds the replicated model in a graph; trains, evaluates or predicts."""
  features, labels = _data()
  params = {'wrapper': wrapper, 'reduction': reduction,
            'regularize': regularize, 'optimizer_fn': optimizer_fn}
  with tf.Graph().as_default():
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    spec = replicate_fn(_model_fn, loss_reduction=reduction,
                        devices=mt.cpus(num_towers))(
                            {'x': tf.constant(features['x'])},
                            None if mode == mt.PREDICT else tf.constant(labels),
                            mode, params)
    return mt.run_spec(spec, mode, steps=_STEPS, metric_updates=2)


def _ours(mode, reduction, num_towers, **kwargs):
  return _run(replicate.replicate_model_fn, replicate.TowerOptimizer, mode,
              reduction, num_towers, **kwargs)


def _theirs(mode, reduction, num_towers, **kwargs):
  return _run(_contrib().replicate_model_fn, _contrib().TowerOptimizer, mode,
              reduction, num_towers, **kwargs)


_AVERAGING = (
    ('mean_2', REDUCTION.MEAN, 2),
    ('mean_4', REDUCTION.MEAN, 4),
    ('nonzero_weights_4', REDUCTION.SUM_BY_NONZERO_WEIGHTS, 4),
)
# Under SUM contrib adds every tower's copy of the regularization loss (N
# times); replicate counts it once, like the unreplicated model. So training
# under SUM is compared on a model without a regularizer (below).
_ALL = _AVERAGING + (('sum_4', REDUCTION.SUM, 4),)
_SGD = lambda: tf1.train.GradientDescentOptimizer(0.1)


def _case(name, *args, **kwargs):
  return reference_lib.Case(_GROUP, name,
                            lambda: _theirs(*args, **kwargs), _inputs)


REFERENCE_CASES = tuple(
    [_case('train_' + name, mt.TRAIN, reduction, num_towers)
     for name, reduction, num_towers in _AVERAGING] +
    [_case('{}_{}'.format(prefix, name), mode, reduction, num_towers)
     for prefix, mode in (('eval', mt.EVAL), ('predict', mt.PREDICT))
     for name, reduction, num_towers in _ALL] +
    [_case('train_sum_4_no_regularizer', mt.TRAIN, REDUCTION.SUM, 4,
           regularize=False, optimizer_fn=_SGD)])
_CASES = {case.name: case for case in REFERENCE_CASES}

# Tolerances: the same float32 math. On TF 1.15 replicate adds the towers'
# terms in contrib's order (equal to the bit); TF 2.15's kernels round some
# ops differently, an ulp here and there, which four Adam steps carry to a
# few 1e-6 relative; the atol covers entries near zero. The metrics and
# predictions go through no training: 1e-6.
_TRAIN_TOL = dict(rtol=1e-5, atol=1e-6)
_EVAL_TOL = dict(rtol=1e-6, atol=1e-6)


def _named(cases):
  """(test name, case name suffix, reduction, num_towers) per case."""
  return [(name, name, reduction, num_towers)
          for name, reduction, num_towers in cases]


class ContribOracleTest(tf.test.TestCase, parameterized.TestCase):

  def _both(self, case_name, mode, reduction, num_towers, tolerance,
            **kwargs):
    theirs = reference_lib.reference_results(self, _CASES[case_name],
                                             **tolerance)
    return _ours(mode, reduction, num_towers, **kwargs), theirs

  @parameterized.named_parameters(*_named(_AVERAGING))
  def test_same_variables_after_training(self, name, reduction, num_towers):
    ours, theirs = self._both('train_' + name, mt.TRAIN, reduction,
                              num_towers, _TRAIN_TOL)
    reference_lib.assert_same_results(self, theirs, ours, **_TRAIN_TOL)

  @parameterized.named_parameters(*_named(_ALL))
  def test_same_eval_metrics(self, name, reduction, num_towers):
    ours, theirs = self._both('eval_' + name, mt.EVAL, reduction, num_towers,
                              _EVAL_TOL)
    if reduction == REDUCTION.SUM:
      del ours['loss'], theirs['loss']  # regularization: see above
    reference_lib.assert_same_results(self, theirs, ours, **_EVAL_TOL)

  @parameterized.named_parameters(*_named(_ALL))
  def test_same_predictions(self, name, reduction, num_towers):
    ours, theirs = self._both('predict_' + name, mt.PREDICT, reduction,
                              num_towers, _EVAL_TOL)
    reference_lib.assert_same_results(self, theirs, ours, **_EVAL_TOL)

  def test_same_variables_without_regularizer_under_sum(self):
    ours, theirs = self._both('train_sum_4_no_regularizer', mt.TRAIN,
                              REDUCTION.SUM, 4, _TRAIN_TOL, regularize=False,
                              optimizer_fn=_SGD)
    reference_lib.assert_same_results(self, theirs, ours, **_TRAIN_TOL)


if __name__ == '__main__':
  tf.test.main()

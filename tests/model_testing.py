"""Small models and a graph-level harness shared by the core tests."""
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

TRAIN = tf1.estimator.ModeKeys.TRAIN
EVAL = tf1.estimator.ModeKeys.EVAL
PREDICT = tf1.estimator.ModeKeys.PREDICT


def data(batch_size=8, num_features=3, seed=0):
  """Deterministic features `{'x': [batch, num_features]}` and labels."""
  rng = np.random.RandomState(seed)
  x = rng.uniform(-1, 1, size=(batch_size, num_features)).astype(np.float32)
  y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
  return {'x': x}, y


def mlp_model_fn(features, labels, mode, params):
  """A two-layer MLP with seeded initializers, so graphs agree on init."""
  params = params or {}
  hidden = tf1.layers.dense(
      features['x'], 4, activation=tf.nn.tanh,
      kernel_initializer=tf1.glorot_uniform_initializer(seed=1),
      kernel_regularizer=params.get('regularizer'), name='hidden')
  logits = tf1.layers.dense(
      hidden, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
      name='logits')
  probabilities = tf.nn.sigmoid(logits)
  predictions = {'logits': logits, 'probabilities': probabilities}
  if mode == PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions=predictions,
        export_outputs={
            'regression': tf1.estimator.export.RegressionOutput(probabilities)
        })
  reduction = params.get('reduction', tf1.losses.Reduction.MEAN)
  loss = tf1.losses.sigmoid_cross_entropy(
      labels, logits, reduction=reduction)
  if params.get('add_regularization'):
    loss += tf1.losses.get_regularization_loss()
  metrics = {
      'accuracy': tf1.metrics.accuracy(labels, tf.cast(logits > 0, tf.float32)),
      'mean_probability': tf1.metrics.mean(probabilities),
  }
  wrapper = params.get('wrapper', replicate.TowerOptimizer)
  optimizer = wrapper(
      params.get('optimizer_fn',
                 lambda: tf1.train.GradientDescentOptimizer(0.5)))
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, eval_metric_ops=metrics,
      predictions=predictions)


def train_variables(model_fn, features, labels, devices, steps=3,
                    loss_reduction=tf1.losses.Reduction.MEAN, params=None,
                    num_cpus=4, replicate_fn=None):
  """Trains in a fresh graph; returns {name: value} of global variables.

  `replicate_fn` replicates `model_fn` (default `replicate.replicate_model_fn`;
  the oracle tests pass TF 1.15's contrib one).
  """
  replicate_fn = replicate_fn or replicate.replicate_model_fn
  with tf.Graph().as_default():
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    spec = replicate_fn(
        model_fn, loss_reduction=loss_reduction, devices=devices)(
            {k: tf.constant(v) for k, v in features.items()},
            None if labels is None else tf.constant(labels), TRAIN, params,
            None)
    with tf1.Session(config=replicate.testing.virtual_cpu_config(
        num_cpus)) as sess:
      sess.run(tf1.global_variables_initializer())
      for _ in range(steps):
        sess.run(spec.train_op)
      return {v.op.name: sess.run(v) for v in tf1.global_variables()}


def run_spec(spec, mode, steps=3, metric_updates=1, num_cpus=4):
  """Runs an `EstimatorSpec` built in the default graph, in a new session.

  Args:
    spec: the spec.
    mode: TRAIN (runs `steps` training steps), EVAL (runs the metric updates
      `metric_updates` times) or PREDICT.
    steps: training steps.
    metric_updates: how many times EVAL runs the metrics' update ops.
    num_cpus: virtual CPUs of the session.

  Returns:
    TRAIN: {name: value} of the global variables; EVAL: {name: value} of
    the metrics, and 'loss'; PREDICT: the predictions.
  """
  with tf1.Session(config=replicate.testing.virtual_cpu_config(
      num_cpus)) as sess:
    sess.run([tf1.global_variables_initializer(),
              tf1.local_variables_initializer()])
    if mode == TRAIN:
      for _ in range(steps):
        sess.run(spec.train_op)
      return {v.op.name: sess.run(v) for v in tf1.global_variables()}
    if mode == EVAL:
      for _ in range(metric_updates):
        sess.run({k: update for k, (_, update) in
                  spec.eval_metric_ops.items()})
      values = sess.run(
          {k: value for k, (value, _) in spec.eval_metric_ops.items()})
      values['loss'] = sess.run(spec.loss)
      return values
    return sess.run(spec.predictions)


def cpus(n):
  return replicate.testing.virtual_cpu_devices(n)


def ancestors(ops):
  """Names of every op `ops` depend on (data and control inputs), `ops`
  included."""
  seen = set()
  stack = list(ops)
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return seen

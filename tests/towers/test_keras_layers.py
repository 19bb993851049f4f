"""Keras layer objects inside model_fn, in TRAIN, EVAL and PREDICT.

`replicate_model_fn` calls model_fn once per mode and copies tower 0 onto
the other towers (output_copies.py, tower_cloning.py), so layer objects
such as `tf.keras.layers.Dense(16)` and `tf.keras.layers.BatchNormalization()`
make one set of variables that every tower uses.
"""
import functools
import os

import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

_NUM_TOWERS = 4
_BATCH = 8


def _keras_model_fn(features, labels, mode, params):
  """Keras Dense + BatchNormalization layer objects (or tf.compat.v1.layers).

  The moving statistics of a Keras BatchNormalization layer object are not
  in `UPDATE_OPS`: the model groups `bn.updates` with its train op, as Keras
  users of TF1 graphs do, so they run once per step, from tower 0 (they are
  not in what the towers copy). With `params['updates_before_minimize']`
  they are in the control dependencies of `minimize` instead, in what the
  towers copy: every tower makes them, as its own model_fn call would.
  """
  params = params or {}
  training = mode == mt.TRAIN
  if params.get('compat_v1_layers'):
    hidden = tf1.layers.dense(
        features['x'], 16, activation=tf.nn.tanh,
        kernel_initializer=tf1.glorot_uniform_initializer(seed=1))
    hidden = tf1.layers.batch_normalization(hidden, training=training)
    logits = tf1.layers.dense(
        hidden, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
    updates = []
  else:
    hidden = tf.keras.layers.Dense(
        16, activation='tanh',
        kernel_initializer=tf1.glorot_uniform_initializer(seed=1))(
            features['x'])
    batch_norm = tf.keras.layers.BatchNormalization()
    hidden = batch_norm(hidden, training=training)
    logits = tf.keras.layers.Dense(
        1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2))(hidden)
    updates = batch_norm.updates
  probability = tf.nn.sigmoid(logits)
  predictions = {'logits': logits, 'probability': probability}
  if mode == mt.PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions=predictions,
        export_outputs={'serving_default':
                        tf1.estimator.export.PredictOutput(predictions)})
  loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
  metrics = {
      'accuracy': tf1.metrics.accuracy(labels,
                                       tf.cast(logits > 0, tf.float32)),
      'mean_probability': tf1.metrics.mean(probability),
  }
  # Plain SGD: the bias before the batch norm has a gradient of rounding
  # noise only, which Adam would scale up to full steps.
  optimizer = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.5))
  before = list(updates) if params.get('updates_before_minimize') else []
  with tf1.control_dependencies(
      tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) + before):
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  if not before and updates:
    train_op = tf.group(train_op, *updates)
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, eval_metric_ops=metrics,
      predictions=predictions)


def _counting(model_fn):
  calls = []

  @functools.wraps(model_fn)
  def counted(features, labels, mode, params):
    calls.append(mode)
    return model_fn(features, labels, mode, params)

  return counted, calls


def _rows(num_rows, seed):
  rng = np.random.RandomState(seed)
  x = rng.uniform(-1, 1, size=(num_rows, 3)).astype(np.float32)
  y = (x.sum(axis=1, keepdims=True) > 0.2).astype(np.float32)
  return x, y


def keras_estimator(model_dir, num_towers, model_fn=_keras_model_fn,
                    params=None):
  """An Estimator of `model_fn`, replicated on `num_towers` virtual CPUs
  (unreplicated for 0), in a session of 4 virtual CPUs."""
  if num_towers:
    model_fn = replicate.replicate_model_fn(
        model_fn, devices=mt.cpus(num_towers))
  return tf1.estimator.Estimator(
      model_fn=model_fn, model_dir=model_dir, params=params,
      config=tf1.estimator.RunConfig(
          tf_random_seed=0, save_summary_steps=None,
          log_step_count_steps=None,
          session_config=replicate.testing.virtual_cpu_config(4)))


def train_input_fn():
  """The same 2 rows 4 times: every tower's shard is the whole batch's
  distribution, so batch statistics (and the moving statistics of tower 0)
  equal the unreplicated model's."""
  x, y = _rows(2, seed=0)
  x, y = np.tile(x, (_NUM_TOWERS, 1)), np.tile(y, (_NUM_TOWERS, 1))
  return tf1.data.Dataset.from_tensor_slices(({'x': x}, y)).repeat().batch(
      _BATCH, drop_remainder=True)


def _eval_input_fn():
  x, y = _rows(2 * _BATCH, seed=1)
  return tf1.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(_BATCH)


def _predict_input_fn():
  x, _ = _rows(_BATCH, seed=2)
  return tf1.data.Dataset.from_tensor_slices({'x': x}).batch(_BATCH)


class QuietEstimatorTestCase(tf.test.TestCase):
  """Keeps the Estimator's INFO lines out of the output; the verbosity is
  restored afterwards (other tests assert on warnings)."""

  @classmethod
  def setUpClass(cls):
    super(QuietEstimatorTestCase, cls).setUpClass()
    cls._verbosity = tf1.logging.get_verbosity()
    tf1.logging.set_verbosity(tf1.logging.WARN)

  @classmethod
  def tearDownClass(cls):
    tf1.logging.set_verbosity(cls._verbosity)
    super(QuietEstimatorTestCase, cls).tearDownClass()


class KerasLayersEstimatorTest(QuietEstimatorTestCase):
  """Through a real Estimator: 4 towers as one device, mode by mode."""

  def _train_both(self, steps=5):
    counted, calls = _counting(_keras_model_fn)
    base = self.get_temp_dir()
    replicated = keras_estimator(os.path.join(base, 'replicated'),
                                 _NUM_TOWERS, counted)
    one = keras_estimator(os.path.join(base, 'one'), 0)
    replicated.train(train_input_fn, steps=steps)
    one.train(train_input_fn, steps=steps)
    return replicated, one, calls

  def test_train_eval_predict_as_one_device(self):
    replicated, one, calls = self._train_both()
    names = replicated.get_variable_names()
    # Checkpoint names of the unreplicated model (no tower_ copies).
    self.assertEqual(one.get_variable_names(), names)
    self.assertIn('batch_normalization/moving_mean', names)
    self.assertIn('dense_1/kernel', names)
    for name in names:
      # Moving statistics of ~1e-3 round differently from 2 or 8 rows.
      self.assertAllClose(one.get_variable_value(name),
                          replicated.get_variable_value(name),
                          rtol=1e-4, atol=1e-5, msg=name)
    # The moving statistics moved (the updates ran) in both.
    self.assertNotAllClose(
        np.zeros(16), replicated.get_variable_value(
            'batch_normalization/moving_mean'))

    # Accuracy and mean over all 16 rows; loss the mean of the 2 batches'.
    replicated_metrics = replicated.evaluate(_eval_input_fn)
    one_metrics = one.evaluate(_eval_input_fn)
    for key in ('accuracy', 'mean_probability', 'loss'):
      self.assertAllClose(one_metrics[key], replicated_metrics[key],
                          rtol=1e-5, atol=1e-6, msg=key)

    predicted = list(replicated.predict(_predict_input_fn))
    expected = list(one.predict(_predict_input_fn))
    self.assertLen(predicted, _BATCH)
    for got, want in zip(predicted, expected):  # batch order
      self.assertAllClose(want['probability'], got['probability'],
                          rtol=1e-5, atol=1e-6)
    # model_fn built tower 0 only, once per graph the Estimator built.
    self.assertEqual([mt.TRAIN, mt.EVAL, mt.PREDICT], calls)


class KerasLayersGraphTest(tf.test.TestCase):
  """Keras BatchNormalization updates: grouped with the train op, tower 0's
  (deterministic); before minimize, every tower's."""

  def test_batch_norm_like_compat_v1_layers_and_deterministic(self):
    # Shards that differ: the moving statistics come from tower 0's shard.
    features, labels = mt.data(batch_size=_BATCH, num_features=3)
    keras_runs = [
        mt.train_variables(_keras_model_fn, features, labels,
                           mt.cpus(_NUM_TOWERS)) for _ in range(2)]
    compat = mt.train_variables(
        _keras_model_fn, features, labels, mt.cpus(_NUM_TOWERS),
        params={'compat_v1_layers': True})
    self.assertEqual(sorted(compat), sorted(keras_runs[0]))
    for name in keras_runs[0]:
      self.assertAllEqual(keras_runs[0][name], keras_runs[1][name], msg=name)
      self.assertAllClose(compat[name], keras_runs[0][name], rtol=1e-5,
                          atol=1e-6, msg=name)

  def test_each_copied_tower_counts_in_metric_variables_of_its_own(self):
    graph = tf.Graph()
    features, labels = mt.data(batch_size=_BATCH, num_features=3)
    with graph.as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(
          _keras_model_fn, devices=mt.cpus(_NUM_TOWERS))(
              {'x': tf.constant(features['x'])}, tf.constant(labels),
              mt.EVAL, None)
      # 2 metrics of 2 variables each (total, count), per tower.
      self.assertLen(tf1.local_variables(), 4 * _NUM_TOWERS)
      values = mt.run_spec(spec, mt.EVAL, metric_updates=2)
    counted = {}
    for op in graph.get_operations():
      if op.type in ('AssignAdd', 'AssignAddVariableOp') and (
          op.name.startswith('tower_')):
        tower = op.name.split('/')[0]
        counted.setdefault(tower, set()).add(op.inputs[0].op.name)
    self.assertEqual(['tower_{}'.format(i) for i in range(1, _NUM_TOWERS)],
                     sorted(counted))
    for tower, variables in counted.items():
      # A tower's updates write its own variables only: no two towers race.
      self.assertEqual([tower], sorted(set(v.split('/')[0]
                                           for v in variables)))
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      one = mt.run_spec(
          _keras_model_fn({'x': tf.constant(features['x'])},
                          tf.constant(labels), mt.EVAL, None),
          mt.EVAL, metric_updates=2)
    for key in one:
      self.assertAllClose(one[key], values[key], rtol=1e-6, msg=key)

  def _moving_statistics_writes(self, params):
    graph = tf.Graph()
    features, labels = mt.data(batch_size=_BATCH, num_features=3)
    with graph.as_default():
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(
          _keras_model_fn, devices=mt.cpus(_NUM_TOWERS))(
              {'x': tf.constant(features['x'])}, tf.constant(labels),
              mt.TRAIN, params)
    return [op for op in graph.get_operations()
            if op.type == 'AssignSubVariableOp' and 'moving_' in
            op.inputs[0].op.name]

  def test_batch_norm_updates_grouped_with_train_op_run_once_per_step(self):
    writes = [op.name for op in self._moving_statistics_writes(None)]
    self.assertLen(writes, 2)  # moving mean and variance, tower 0's
    self.assertFalse([name for name in writes if 'tower_' in name], writes)

  def test_batch_norm_updates_before_minimize_made_by_every_tower(self):
    writes = self._moving_statistics_writes({'updates_before_minimize': True})
    # Moving mean and variance, written by each of the 4 towers: the copies
    # write tower 0's variables, as a model_fn call per tower would.
    self.assertLen(writes, 2 * _NUM_TOWERS)
    self.assertEqual(
        ['batch_normalization/moving_mean',
         'batch_normalization/moving_variance'],
        sorted(set(op.inputs[0].op.name for op in writes)))
    self.assertEqual(
        [''] + ['tower_{}'.format(i) for i in range(1, _NUM_TOWERS)],
        sorted(set(op.name.split('/')[0] if op.name.startswith('tower_')
                   else '' for op in writes)))

  def test_batch_norm_updates_before_minimize_move_statistics_per_tower(self):
    # Every shard holds the same 2 rows, so each tower's batch statistics
    # are the one device's. Each tower's update subtracts
    # (m0 - batch_stat) * (1 - momentum), computed from the step's one read
    # of the variable: after one step m = m0 + 4 * (m_one_device - m0),
    # for the mean (m0 = 0) and the variance (m0 = 1).
    x, y = _rows(2, seed=0)
    features = {'x': np.tile(x, (_NUM_TOWERS, 1))}
    labels = np.tile(y, (_NUM_TOWERS, 1))
    params = {'updates_before_minimize': True}
    towers = mt.train_variables(_keras_model_fn, features, labels,
                                mt.cpus(_NUM_TOWERS), steps=1, params=params)
    one = mt.train_variables(_keras_model_fn, features, labels, mt.cpus(1),
                             steps=1, params=params)
    for name, start in (('batch_normalization/moving_mean', 0.0),
                        ('batch_normalization/moving_variance', 1.0)):
      self.assertNotAllClose(np.full(16, start), one[name])
      self.assertAllClose(start + _NUM_TOWERS * (one[name] - start),
                          towers[name], rtol=1e-5, atol=1e-7, msg=name)
    self.assertAllClose(one['dense_1/kernel'], towers['dense_1/kernel'],
                        rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()

"""EVAL metrics of copied towers equal one device's, or are refused.

The merge adds every tower's metric variables into tower 0's. Through a real
`tf.estimator.Estimator.evaluate` on 4 virtual CPUs: every standard
`tf.compat.v1.metrics` function (state made of sums and counts) gives the
metrics of the unreplicated model on the same data, with distinct rows and
non-uniform weights; metric state that is not a sum (a running maximum, an
amount read from the state, a non-zero start) is an error naming the metric
and why.
"""
import tempfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1

_NUM_TOWERS = 4
_BATCH = 16  # 4 rows per tower
_ROWS = 2 * _BATCH  # two evaluation steps


def _data():
  """Distinct rows, labels of 3 classes and non-uniform weights."""
  rng = np.random.RandomState(7)
  x = rng.uniform(-1, 1, size=(_ROWS, 3)).astype(np.float32)
  classes = rng.randint(0, 3, size=(_ROWS,)).astype(np.int64)
  weights = np.linspace(0.25, 2.0, _ROWS).astype(np.float32)[::-1].copy()
  rng.shuffle(weights)
  return {'x': x, 'weights': weights}, classes


def _input_fn():
  return tf1.data.Dataset.from_tensor_slices(_data()).batch(
      _BATCH, drop_remainder=True)  # static shapes, for mean_tensor


def _standard_metrics(features, classes, logits):
  """Every tf.compat.v1.metrics function, weighted per row.

  But `mean_tensor`: its state has the shape of its values, so per-example
  values give a state per row of the batch, which towers (4 rows each) cannot
  have as one device (16 rows) does; and values reduced over the batch are
  batch statistics, which depend on how the batch is split.
  """
  m = tf1.metrics
  weights = features['weights']
  column = weights[:, None]
  probabilities = tf.nn.softmax(logits)
  binary = tf.cast(tf.equal(classes, 1), tf.float32)
  score = probabilities[:, 1]
  predicted = tf.argmax(logits, axis=1)
  said_one = tf.cast(score > 0.34, tf.float32)
  thresholds = [0.2, 0.34, 0.5]
  labels = classes[:, None]
  one_hot = tf.one_hot(classes, 3)
  unit = tf.math.l2_normalize(logits, axis=1)
  unit_labels = tf.math.l2_normalize(one_hot + 0.5, axis=1)
  return {
      'accuracy': m.accuracy(classes, predicted, weights),
      'mean': m.mean(score, weights),
      'auc': m.auc(binary, score, weights, num_thresholds=20),
      'auc_pr': m.auc(binary, score, weights, num_thresholds=20, curve='PR'),
      'precision': m.precision(binary, said_one, weights),
      'recall': m.recall(binary, said_one, weights),
      'true_positives': m.true_positives(binary, said_one, weights),
      'true_negatives': m.true_negatives(binary, said_one, weights),
      'false_positives': m.false_positives(binary, said_one, weights),
      'false_negatives': m.false_negatives(binary, said_one, weights),
      'precision_at_thresholds': m.precision_at_thresholds(
          binary, score, thresholds, weights),
      'recall_at_thresholds': m.recall_at_thresholds(
          binary, score, thresholds, weights),
      'true_positives_at_thresholds': m.true_positives_at_thresholds(
          binary, score, thresholds, weights),
      'true_negatives_at_thresholds': m.true_negatives_at_thresholds(
          binary, score, thresholds, weights),
      'false_positives_at_thresholds': m.false_positives_at_thresholds(
          binary, score, thresholds, weights),
      'false_negatives_at_thresholds': m.false_negatives_at_thresholds(
          binary, score, thresholds, weights),
      'sensitivity_at_specificity': m.sensitivity_at_specificity(
          binary, score, 0.5, weights, num_thresholds=20),
      'specificity_at_sensitivity': m.specificity_at_sensitivity(
          binary, score, 0.5, weights, num_thresholds=20),
      'mean_iou': m.mean_iou(classes, predicted, 3, weights),
      'mean_per_class_accuracy': m.mean_per_class_accuracy(
          classes, predicted, 3, weights),
      'percentage_below': m.percentage_below(score, 0.3, weights),
      'mean_absolute_error': m.mean_absolute_error(one_hot, probabilities,
                                                   column),
      'mean_squared_error': m.mean_squared_error(one_hot, probabilities,
                                                 column),
      'root_mean_squared_error': m.root_mean_squared_error(
          one_hot, probabilities, column),
      'mean_relative_error': m.mean_relative_error(
          one_hot + 1., probabilities + 1., one_hot + 1., column),
      'mean_cosine_distance': m.mean_cosine_distance(unit_labels, unit, 1,
                                                     column),
      'precision_at_k': m.precision_at_k(labels, logits, 2, weights=weights),
      'recall_at_k': m.recall_at_k(labels, logits, 2, weights=weights),
      'precision_at_top_k': m.precision_at_top_k(
          labels, tf.nn.top_k(logits, 2).indices, weights=weights),
      'average_precision_at_k': m.average_precision_at_k(labels, logits, 2,
                                                         weights=weights),
  }


def _running_max(features, classes, logits):
  del classes, logits
  total = _metric_variable('running_max')
  return total, tf1.assign(total, tf.maximum(total,
                                             tf.reduce_max(features['x'])))


def _local_running_max(features, classes, logits):
  del classes, logits
  total = _metric_variable('running_max',
                           collections=[tf1.GraphKeys.LOCAL_VARIABLES])
  return total, tf1.assign(total, tf.maximum(total,
                                             tf.reduce_max(features['x'])))


def _max_by_addition(features, classes, logits):
  # A running maximum written as an addition: the amount reads the state.
  del classes, logits
  total = _metric_variable('max_by_addition')
  return total, tf1.assign_add(total, tf.maximum(
      tf.reduce_max(features['x']) - total, 0.))


def _count_from(start):
  """A count of the weights that starts at `start` (1., or [0., 1.]: one
  nonzero entry is enough to count the start once per tower)."""
  def metric_fn(features, classes, logits):
    del classes, logits
    total = _metric_variable('count_from_one', initial_value=start)
    return total, tf1.assign_add(
        total, tf.reduce_sum(features['weights']) + tf.zeros_like(start))
  return metric_fn


def _metric_variable(name, initial_value=0.,
                     collections=(tf1.GraphKeys.LOCAL_VARIABLES,
                                  tf1.GraphKeys.METRIC_VARIABLES)):
  return tf1.Variable(initial_value, trainable=False, name=name,
                      collections=list(collections))


def _model_fn(metric_fn):
  def model_fn(features, labels, mode):
    logits = tf1.layers.dense(
        features['x'], 3, name='logits',
        kernel_initializer=tf1.glorot_uniform_initializer(seed=3),
        bias_initializer=tf1.constant_initializer([0.1, -0.2, 0.05]))
    # Summed over rows, as the towers' losses are summed (loss_reduction).
    loss = tf1.losses.sparse_softmax_cross_entropy(
        labels, logits, features['weights'],
        reduction=tf1.losses.Reduction.SUM)
    metrics = metric_fn(features, labels, logits)
    if not isinstance(metrics, dict):  # one hand-made (variable, update op)
      variable, update = metrics
      metrics = {'custom': (tf.identity(variable), update)}
    return tf1.estimator.EstimatorSpec(mode, loss=loss,
                                       eval_metric_ops=metrics)
  return model_fn


def _evaluate(metric_fn, devices,
              tower_build=replicate.TowerBuild.CLONE):
  model_fn = _model_fn(metric_fn) if metric_fn else _head_model_fn
  if devices is not None:
    model_fn = replicate.replicate_model_fn(
        model_fn, loss_reduction=tf1.losses.Reduction.SUM,
        devices=devices, tower_build=tower_build)
  estimator = tf1.estimator.Estimator(
      model_fn, config=tf1.estimator.RunConfig(
          model_dir=tempfile.mkdtemp(),
          session_config=replicate.testing.virtual_cpu_config(_NUM_TOWERS)))
  # No checkpoint to restore: the initializers' (seeded) weights are used.
  return estimator.evaluate(_input_fn, steps=None,
                            checkpoint_path=_checkpoint(model_fn))


def _head_model_fn(features, labels, mode):
  """A TF 2 head: its metrics are Keras metric objects."""
  logits = tf1.layers.dense(
      features['x'], 3, name='logits',
      kernel_initializer=tf1.glorot_uniform_initializer(seed=3),
      bias_initializer=tf1.constant_initializer([0.1, -0.2, 0.05]))
  head = tf.compat.v2.estimator.MultiClassHead(
      3, weight_column='weights',
      loss_reduction=tf.compat.v2.keras.losses.Reduction.SUM)
  return head.create_estimator_spec(features, mode, logits, labels=labels)


_CHECKPOINTS = {}


def _checkpoint(model_fn):
  """A checkpoint of the model's initial weights (one per process)."""
  del model_fn  # every model_fn here has the same weights
  if 'path' not in _CHECKPOINTS:
    with tf.Graph().as_default():
      tf1.layers.dense(
          tf.zeros([1, 3]), 3, name='logits',
          kernel_initializer=tf1.glorot_uniform_initializer(seed=3),
          bias_initializer=tf1.constant_initializer([0.1, -0.2, 0.05]))
      tf1.train.get_or_create_global_step()
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        _CHECKPOINTS['path'] = tf1.train.Saver().save(
            sess, tempfile.mkdtemp() + '/model.ckpt', global_step=0)
  return _CHECKPOINTS['path']


class StandardMetricsTest(tf.test.TestCase):

  def test_every_standard_metric_equals_one_device(self):
    expected = _evaluate(_standard_metrics, None)
    actual = _evaluate(_standard_metrics,
                       replicate.testing.virtual_cpu_devices(_NUM_TOWERS))
    self.assertEqual(sorted(expected), sorted(actual))
    for key in expected:
      # Sums of the same terms in another grouping: float32 rounding only.
      self.assertAllClose(expected[key], actual[key], rtol=1e-5, atol=1e-6,
                          msg=key)
    # The data are not degenerate: the metrics see every tower's rows.
    self.assertBetween(expected['accuracy'], 0.05, 0.95)
    self.assertBetween(expected['auc'], 0.05, 0.95)


class HeadMetricsTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(list(replicate.TowerBuild))
  def test_keras_metrics_of_a_head_equal_one_device(self, tower_build):
    # EstimatorSpec lists a head's Keras metric variables in a Python set's
    # order, another in each model_fn call: the towers' variables must still
    # be paired right (a mismatch adds counts into totals, or fails).
    expected = _evaluate(None, None)
    actual = _evaluate(None, replicate.testing.virtual_cpu_devices(
        _NUM_TOWERS), tower_build)
    self.assertEqual(sorted(expected), sorted(actual))
    for key in expected:
      self.assertAllClose(expected[key], actual[key], rtol=1e-5, atol=1e-6,
                          msg=key)
    self.assertBetween(expected['accuracy'], 0.05, 0.95)


def _local_state_metrics(features, classes, logits):
  """Hand-made metrics whose state is in LOCAL_VARIABLES only.

  `tf1.Variable` makes a new variable in every model_fn call; `get_variable`
  one that later calls share (a tower's own scope reuses it); the histogram
  of classes is written by `scatter_add`.
  """
  del logits
  local = [tf1.GraphKeys.LOCAL_VARIABLES]
  total = tf1.Variable(0., trainable=False, collections=local,
                       name='weighted_x')
  count = tf1.get_variable('weight_total', [], trainable=False,
                           initializer=tf1.zeros_initializer(),
                           collections=local)
  histogram = tf1.Variable(tf.zeros([3]), trainable=False,
                           collections=local, name='class_histogram')
  weights = features['weights']
  update = tf.group(
      tf1.assign_add(total, tf.reduce_sum(features['x'][:, 0] * weights)),
      tf1.assign_add(count, tf.reduce_sum(weights)),
      tf1.scatter_add(histogram, classes, weights))
  return {'weighted_mean': (total / count, update),
          'weight_total': (tf.identity(count), update),
          'histogram_1': (histogram[1], update)}


class LocalStateMetricsTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(list(replicate.TowerBuild))
  def test_equal_one_device(self, tower_build):
    # Towers built by their own calls made their own `weighted_x` and
    # `class_histogram`, which the merge left out: tower 0's shard only (a
    # quarter of the rows) divided by every tower's shared weight total.
    expected = _evaluate(_local_state_metrics, None)
    actual = _evaluate(_local_state_metrics,
                       replicate.testing.virtual_cpu_devices(_NUM_TOWERS),
                       tower_build)
    self.assertEqual(sorted(expected), sorted(actual))
    for key in expected:
      self.assertAllClose(expected[key], actual[key], rtol=1e-5, atol=1e-6,
                          msg=key)
    # Every row counted: the weights' sum over the data.
    self.assertAllClose(np.sum(_data()[0]['weights']),
                        actual['weight_total'], rtol=1e-6)

  def test_copies_write_state_of_their_own(self):
    # Graph only: every copied tower's update writes a variable of its own
    # (no two towers' AssignAdds race on one), which the merge adds up.
    features, classes = _data()
    with tf.Graph().as_default():
      spec = replicate.replicate_model_fn(
          _model_fn(_local_state_metrics),
          loss_reduction=tf1.losses.Reduction.SUM,
          devices=replicate.testing.virtual_cpu_devices(_NUM_TOWERS))(
              {k: tf.constant(v[:_BATCH]) for k, v in features.items()},
              tf.constant(classes[:_BATCH]), tf1.estimator.ModeKeys.EVAL)
      del spec
      names = sorted(v.op.name for v in tf1.local_variables())
    for name in ('weighted_x', 'weight_total', 'class_histogram'):
      self.assertEqual(
          _NUM_TOWERS, len([n for n in names if n.endswith(name)]),
          msg='{} in {}'.format(name, names))


class AddMetricsTest(parameterized.TestCase, tf.test.TestCase):
  """`tf.estimator.add_metrics` reads the merged spec's predictions."""

  @parameterized.parameters(list(replicate.TowerBuild))
  def test_metrics_of_every_towers_predictions(self, tower_build):
    # 22 rows in batches of 8: 8, 8, 6 (4 towers: 2, 2, 2, 2 and 2, 2, 1,
    # 1). The metric mixes predictions with the batch's labels, weights and
    # features: with tower 0's predictions only, it read a quarter of the
    # rows, or failed on the shapes.
    rng = np.random.RandomState(5)
    x = rng.uniform(-1, 1, size=(22, 3)).astype(np.float32)
    y = rng.uniform(-1, 1, size=(22, 1)).astype(np.float32)
    weights = np.linspace(0.5, 2.0, 22).astype(np.float32)[:, None]

    def model_fn(features, labels, mode):
      predictions = tf1.layers.dense(
          features['x'], 1, name='out',
          kernel_initializer=tf1.glorot_uniform_initializer(seed=4))
      loss = tf1.losses.mean_squared_error(labels, predictions)
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss, predictions={'p': predictions,
                                        'scale': tf.constant(2.0)})

    mt_eval = tf1.estimator.ModeKeys.EVAL

    def metric_fn(labels, predictions, features):
      return {
          'mse': tf1.metrics.mean_squared_error(
              labels, predictions['p'], weights=features['w']),
          'mean_p': tf1.metrics.mean(predictions['p'] * features['x'][:, :1]),
          'scale': tf1.metrics.mean(predictions['scale']),
      }

    def input_fn():
      return tf.data.Dataset.from_tensor_slices(
          ({'x': x, 'w': weights}, y)).batch(8)

    with tf.Graph().as_default():  # the initial weights, to evaluate
      model_fn({'x': tf.zeros([1, 3])}, tf.zeros([1, 1]), mt_eval)
      tf1.train.get_or_create_global_step()
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        checkpoint = tf1.train.Saver().save(
            sess, tempfile.mkdtemp() + '/model.ckpt', global_step=0)

    def evaluate(devices):
      fn = model_fn if devices is None else replicate.replicate_model_fn(
          model_fn, devices=devices, tower_build=tower_build)
      estimator = tf1.estimator.add_metrics(tf1.estimator.Estimator(
          fn, config=tf1.estimator.RunConfig(
              model_dir=tempfile.mkdtemp(),
              session_config=replicate.testing.virtual_cpu_config(
                  _NUM_TOWERS))), metric_fn)
      return estimator.evaluate(input_fn, checkpoint_path=checkpoint)

    expected = evaluate(None)
    actual = evaluate(replicate.testing.virtual_cpu_devices(_NUM_TOWERS))
    for key in ('mse', 'mean_p', 'loss'):
      self.assertAllClose(expected[key], actual[key], rtol=1e-5, atol=1e-6,
                          msg=key)
    # A prediction without rows (a scalar) stays tower 0's: the same value.
    self.assertAllClose(2.0, actual['scale'])


class NotASumTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(replicate.TowerBuild.CLONE,
                            replicate.TowerBuild.CALL_PER_TOWER)
  def test_running_max_is_refused(self, tower_build):
    # Before: the towers' maxima were summed (about 4 x the true maximum).
    self._assert_not_a_sum(
        _running_max, tower_build,
        r"\(op .*\), which does not add to it, so its towers' states cannot "
        r'be combined by summing them\. .*sums and counts.*'
        r'tf\.compat\.v1\.metrics.*'
        r'or evaluate on one device')

  def _assert_not_a_sum(self, metric_fn, tower_build, details=''):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"Metric 'custom' cannot be reduced across towers: its update op "
        r'writes metric variable running_max with Assign(VariableOp)? ' +
        details):
      _evaluate(metric_fn,
                replicate.testing.virtual_cpu_devices(_NUM_TOWERS),
                tower_build)

  @parameterized.parameters(replicate.TowerBuild.CLONE,
                            replicate.TowerBuild.CALL_PER_TOWER)
  def test_running_max_in_local_variables_only_is_refused(self, tower_build):
    # Before: copies wrote tower 0's variable, all 4 racing, silently.
    self._assert_not_a_sum(_local_running_max, tower_build)

  def test_running_max_on_one_device(self):
    # The same metric is fine unreplicated: the maximum of every row.
    self.assertAllClose(np.max(_data()[0]['x']),
                        _evaluate(_running_max, None)['custom'])

  def test_amount_read_from_the_state_is_refused(self):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"Metric 'custom' .*adds to metric variable max_by_addition with "
        r"AssignAdd.* an amount computed from the metric's own state"):
      _evaluate(_max_by_addition,
                replicate.testing.virtual_cpu_devices(_NUM_TOWERS))

  @parameterized.named_parameters(('scalar', 1.), ('vector', [0., 1.]))
  def test_non_zero_start_is_refused(self, start):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"Metric 'custom' .*metric variable count_from_one does not start at "
        r'a constant zero'):
      _evaluate(_count_from(start),
                replicate.testing.virtual_cpu_devices(_NUM_TOWERS))

if __name__ == '__main__':
  tf.test.main()

"""Hand-made metrics whose value is a sum over the rows, and whose update
ops also make writes that add nothing, or that the value never reads, or
that add at a constant index; metrics of terms per call that must be
refused; and sums made from a reduction over dimension 0 that may or may not
be the rows (replicate/towers/metric_terms.py). Beside test_uneven_batches.py.
"""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

TOWERS = 4
EVAL = tf1.estimator.ModeKeys.EVAL

_ROWS = np.arange(10, dtype=np.float32)
# Distinct values per row: no two rows, and so no two towers, alike.
_X = np.stack([np.sin(_ROWS), np.cos(0.7 * _ROWS), (_ROWS % 7) / 7.0 - 0.5],
              axis=1).astype(np.float32)
_Y = (np.sin(1.3 * _ROWS) + 0.01 * _ROWS)[:, None].astype(np.float32)


def _metric_variable(name, shape):
  return tf1.Variable(
      tf.zeros(shape), trainable=False, name=name,
      collections=[tf1.GraphKeys.LOCAL_VARIABLES,
                   tf1.GraphKeys.METRIC_VARIABLES])


def _model_fn(features, labels, mode, params):
  prediction = tf1.layers.dense(
      features['x'], 1, kernel_initializer=tf1.glorot_uniform_initializer(
          seed=2), name='out')
  per_row = tf.squeeze(tf.square(labels - prediction), 1)  # [None]
  loss = tf.reduce_mean(per_row)
  total = _metric_variable('total', [])
  metrics = {}
  if params['metric'] == 'zero_add':
    # The loss summed over the rows; the update also adds a static 0 to
    # the same variable (it changes nothing, on any number of towers).
    metrics['summed_loss'] = (tf.identity(total), tf.group(
        tf1.assign_add(total, tf.reduce_sum(per_row)),
        tf1.assign_add(total, tf.constant(0.0))))
  elif params['metric'] == 'unread_count':
    # The value reads only the sum over rows; the update also counts its
    # calls in a variable that the value never reads.
    calls = _metric_variable('calls', [])
    metrics['summed_loss'] = (tf.identity(total), tf.group(
        tf1.assign_add(total, tf.reduce_sum(per_row)),
        tf1.assign_add(calls, 1.0)))
  elif params['metric'] == 'scatter_at_constant_index':
    # The sum over rows added into slot 1 of a table: a sum over the rows,
    # at a constant index.
    table = _metric_variable('table', [3])
    metrics['summed_loss'] = (table[1], tf1.scatter_add(
        table, [1], tf.reshape(tf.reduce_sum(per_row), [1])))
  elif params['metric'] == 'constant_vector_count':
    # Adds [1, 0, 0] each call (a count of calls in slot 0): terms per call
    # only, N per batch on N towers; refused, though two slots add 0.
    counts = _metric_variable('counts', [3])
    metrics['calls'] = (tf.identity(counts), tf1.assign_add(
        counts, tf.constant([1.0, 0.0, 0.0])))
  elif params['metric'] == 'rounded_sum':
    # The sum over the rows rounded to an integer per call: the towers'
    # rounded sums need not add up to one device's rounded sum, so it is
    # no sum over the rows; one variable of per-batch terms: refused.
    rounded = tf1.Variable(
        tf.zeros([], tf.int64), trainable=False, name='rounded',
        collections=[tf1.GraphKeys.LOCAL_VARIABLES,
                     tf1.GraphKeys.METRIC_VARIABLES])
    metrics['rounded_loss'] = (tf.identity(rounded), tf1.assign_add(
        rounded, tf.cast(tf.reduce_sum(per_row), tf.int64)))
  elif params['metric'] in ('row_means_over_calls', 'mean_of_row_sums',
                            'mean_of_column_sums'):
    # A [rows, 3] tensor of unknown shape, and each row's mean over its
    # columns-major copy ([3, rows], as a time-major sequence's): a
    # reduction over dimension 0 that is not the rows, where the step alone
    # knows that. Summed over the rows, it is a sum over the rows.
    x = features['x'] * prediction
    wide = tf.reshape(x, tf.stack([tf.shape(x)[0], -1]))  # [None, None]
    row_means = tf.reduce_mean(tf.transpose(wide), 0)  # [None]: the rows
    if params['metric'] == 'row_means_over_calls':
      # ... divided by a count of calls: N times too many calls on N
      # towers, on any batch.
      count = _metric_variable('count', [])
      metrics['row_means_over_calls'] = (total / count, tf.group(
          tf1.assign_add(total, tf.reduce_sum(row_means)),
          tf1.assign_add(count, 1.0)))
    elif params['metric'] == 'mean_of_row_sums':
      # The same through tf.metrics.mean of the per-batch sum.
      metrics['mean_of_row_sums'] = tf1.metrics.mean(
          tf.reduce_sum(row_means))
    else:
      # A reduction over dimension 0 that is the rows: each column's mean
      # over the batch, summed: a per-batch value, one device's on equal
      # shards.
      metrics['mean_of_column_sums'] = tf1.metrics.mean(
          tf.reduce_sum(tf.reduce_mean(wide, 0)))
  return tf1.estimator.EstimatorSpec(mode, loss=loss,
                                     eval_metric_ops=metrics)


class RowSumEdgesTest(parameterized.TestCase, tf.test.TestCase):

  def _evaluate(self, metric, towers, size=10, batch=6):
    model_dir = '{}/{}'.format(self.get_temp_dir(), metric)
    params = {'metric': metric}
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      _model_fn({'x': tf1.placeholder(tf.float32, [None, 3])},
                tf1.placeholder(tf.float32, [None, 1]), EVAL, params)
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        checkpoint = tf1.train.Saver().save(sess, model_dir + '/start')

    def input_fn():
      return tf1.data.Dataset.from_tensor_slices(
          ({'x': _X[:size]}, _Y[:size])).batch(batch)

    model_fn = _model_fn
    if towers:
      model_fn = replicate.replicate_model_fn(
          _model_fn, devices=replicate.testing.virtual_cpu_devices(towers))
    config = tf1.estimator.RunConfig(
        model_dir=model_dir, tf_random_seed=3,
        session_config=replicate.testing.virtual_cpu_config(TOWERS),
        save_summary_steps=None, log_step_count_steps=None)
    return tf1.estimator.Estimator(model_fn, config=config,
                                   params=params).evaluate(
                                       input_fn, checkpoint_path=checkpoint,
                                       name=str(towers))

  @parameterized.parameters('zero_add', 'unread_count',
                            'scatter_at_constant_index')
  def test_not_refused_when_building(self, metric):
    # The value reads only a sum over the rows: no write of a term per call
    # that it reads, so the EVAL graph builds (unknown batch dimension).
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(
          _model_fn, devices=replicate.testing.virtual_cpu_devices(TOWERS))(
              {'x': tf1.placeholder(tf.float32, [None, 3])},
              tf1.placeholder(tf.float32, [None, 1]), EVAL,
              {'metric': metric}, None)
    self.assertEqual(['summed_loss'], list(spec.eval_metric_ops))

  def test_scatter_at_constant_index_equals_one_device_on_uneven_shards(self):
    # 10 rows in batches of 6 and 4: towers of [2, 2, 1, 1] and [1, 1, 1, 1]
    # rows. One device adds the squared errors of the 10 rows into slot 1;
    # the 4 towers' sums over their rows add up to the same sum.
    metric = 'scatter_at_constant_index'
    expected = self._evaluate(metric, 0)
    actual = self._evaluate(metric, TOWERS)
    self.assertGreater(expected['summed_loss'], 0.0)
    self.assertAllClose(expected['summed_loss'], actual['summed_loss'],
                        rtol=1e-6)

  @parameterized.parameters('unread_count', 'zero_add')
  def test_writes_the_value_does_not_see_need_no_equal_shards(self, metric):
    # The value reads only `total`, a sum over the rows; a count of calls it
    # never reads, or an add of 0, does not make it a per-batch metric:
    # 10 rows in batches of 6 and 4 ([2, 2, 1, 1] and [1, 1, 1, 1] rows per
    # tower) give one device's sum of the 10 squared errors.
    expected = self._evaluate(metric, 0)
    actual = self._evaluate(metric, TOWERS)
    self.assertGreater(expected['summed_loss'], 0.0)
    self.assertAllClose(expected['summed_loss'], actual['summed_loss'],
                        rtol=1e-6)

  @parameterized.parameters((8, 4), (7, 4))
  def test_sum_over_rows_by_a_count_of_calls_fails(self, size, batch):
    # row_means over a count of calls: each tower's first batch has 1 row,
    # and dimension 0 of the reduced [3, rows] copy is 3, not the rows: a
    # sum over the rows over a count of calls, 1/4 of one device's value on
    # 4 towers, so the step fails on equal shards (8 rows in batches of 4)
    # as on unequal ones.
    for metric in ('row_means_over_calls', 'mean_of_row_sums'):
      with self.assertRaisesRegex(
          tf.errors.InvalidArgumentError,
          r'Metric \W+{}\W+ cannot be reduced across towers on this batch: '
          r'its value reads a count of calls and a sum made from a '
          r'reduction over dimension 0 of \S+, which here is not the '
          r'tower'.format(
              metric)):
        self._evaluate(metric, TOWERS, size, batch)
    # One device evaluates them.
    self._evaluate('row_means_over_calls', 0, size, batch)

  def test_per_batch_sum_over_columns_equals_one_device_on_equal_shards(self):
    # Dimension 0 reduced is the rows: a per-batch value. 8 rows in batches
    # of 4 (1 row per tower): the towers' values average to one device's.
    # 10 rows in batches of 6: [2, 2, 1, 1] rows per tower, refused.
    metric = 'mean_of_column_sums'
    expected = self._evaluate(metric, 0, 8, 4)
    actual = self._evaluate(metric, TOWERS, 8, 4)
    self.assertAllClose(expected[metric], actual[metric], rtol=1e-6)
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError,
        r'Metrics \[\W+mean_of_column_sums\W+ take a per-batch value'):
      self._evaluate(metric, TOWERS)


class TermsPerCallRefusedTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(('constant_vector_count', 'calls'),
                            ('rounded_sum', 'rounded_loss'))
  def test_refused_when_building(self, metric, key):
    # The batch dimension is unknown (rows counted at run time), so the
    # metrics' writes are looked at when the EVAL graph is built.
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      replicated = replicate.replicate_model_fn(
          _model_fn, devices=replicate.testing.virtual_cpu_devices(TOWERS))
      with self.assertRaisesRegex(
          replicate.errors.InvalidArgumentError,
          r"Metric '{}' cannot be reduced across towers: its value reads "
          r'only \S+, to which op \S+ adds a (per-batch value|term that '
          r'reads no batch), one term per call'.format(key)):
        replicated({'x': tf1.placeholder(tf.float32, [None, 3])},
                   tf1.placeholder(tf.float32, [None, 1]), EVAL,
                   {'metric': metric}, None)


if __name__ == '__main__':
  tf.test.main()

"""Batches of any size: uneven and partial batches train, evaluate and predict
like one device.

Each Estimator case starts from one checkpoint (one unreplicated step), then
the unreplicated and the replicated Estimator (4 towers) each train one epoch
of `size` distinct rows in batches of `batch` (no drop_remainder, so the last
batch is partial and the batch dimension dynamic), evaluate and predict.
With batch 3 on 4 towers the shards are [1, 1, 1, 0]; with batch 6,
[2, 2, 1, 1]; a final batch of 1 row is [1, 0, 0, 0].
"""
import gc
import shutil

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.towers import batch_split

TOWERS = 4
MAX_ROWS = 43
TRAIN = tf1.estimator.ModeKeys.TRAIN
PREDICT = tf1.estimator.ModeKeys.PREDICT
EVAL = tf1.estimator.ModeKeys.EVAL
Reduction = tf1.losses.Reduction

# Row r: distinct features, label and (nonzero, non-uniform) weight.
_ROWS = np.arange(MAX_ROWS, dtype=np.float32)
_X = np.stack([np.sin(_ROWS), np.cos(0.7 * _ROWS), (_ROWS % 7) / 7.0 - 0.5],
              axis=1).astype(np.float32)
_Y = (np.sin(1.3 * _ROWS) + 0.1 * _ROWS / MAX_ROWS)[:, None].astype(
    np.float32)
_W = (1.0 + (_ROWS % 3))[:, None].astype(np.float32)


def _input_fn(size, batch):
  def input_fn():
    features = {'x': _X[:size], 'id': np.arange(size, dtype=np.int64),
                'w': _W[:size]}
    return tf1.data.Dataset.from_tensor_slices(
        (features, _Y[:size])).batch(batch)
  return input_fn


def _model_fn(features, labels, mode, params):
  hidden = tf1.layers.dense(
      features['x'], 4, activation=tf.nn.tanh,
      kernel_initializer=tf1.glorot_uniform_initializer(seed=1), name='hidden')
  if params.get('batch_norm'):
    # Statistics of a tower's rows: NaN over no rows, and so its gradients.
    hidden = tf1.layers.batch_normalization(hidden, training=mode == TRAIN,
                                            name='bn')
  prediction = tf1.layers.dense(
      hidden, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
      name='out')
  if mode == PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions={'prediction': prediction, 'id': features['id']},
        export_outputs={'out': tf1.estimator.export.RegressionOutput(
            prediction)})
  reduction = params['reduction']
  # Weights only where the reduction's mean of towers equals one device's.
  weights = (features['w'] if reduction == Reduction.SUM_BY_NONZERO_WEIGHTS
             else 1.0)
  loss = tf1.losses.mean_squared_error(labels, prediction, weights=weights,
                                       reduction=reduction)
  if params['plain_mean']:
    loss = tf.reduce_mean(tf.square(labels - prediction))  # NaN on no rows
  optimizer = replicate.TowerOptimizer(
      tf1.train.AdamOptimizer(0.05) if params['optimizer'] == 'adam' else
      tf1.train.GradientDescentOptimizer(0.1),
      accumulation_steps=params['accumulation_steps'],
      compression=params['compression'])
  var_list = None
  if params.get('unused_variable'):
    # In var_list, read by nothing: its gradient is None in every tower.
    tf1.get_variable('unused', [2], initializer=tf1.ones_initializer())
    var_list = tf1.trainable_variables()
  with tf1.control_dependencies(tf1.get_collection(
      tf1.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(loss, tf1.train.get_global_step(),
                                  var_list=var_list)
  metrics = {
      'mse': tf1.metrics.mean_squared_error(labels, prediction),
      'mean_prediction': tf1.metrics.mean(prediction),
      'positive': tf1.metrics.accuracy(labels > 0, prediction > 0),
  }
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                     eval_metric_ops=metrics)


def _config(model_dir):
  return tf1.estimator.RunConfig(
      model_dir=model_dir, tf_random_seed=3,
      session_config=replicate.testing.virtual_cpu_config(TOWERS),
      save_summary_steps=None,
      log_step_count_steps=None)


class LabelsNoneTest(tf.test.TestCase):

  def test_evaluate_without_labels(self):
    # input_fn gives features only; 13 rows in batches of 5 (the last of 3)
    # on 4 towers: rows counted at run time.
    def model_fn(features, labels, mode):
      assert labels is None
      prediction = tf1.layers.dense(
          features['x'], 1, name='out',
          kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
      loss = tf1.losses.mean_squared_error(features['y'], prediction)
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss, train_op=train_op,
          eval_metric_ops={'mean': tf1.metrics.mean(prediction)})

    def input_fn():
      return tf1.data.Dataset.from_tensor_slices(
          {'x': _X[:13], 'y': _Y[:13]}).batch(5)

    root = self.get_temp_dir() + '/labels_none'
    one = tf1.estimator.Estimator(model_fn, config=_config(root + '/one'))
    one.train(input_fn, steps=1)
    many = tf1.estimator.Estimator(
        replicate.replicate_model_fn(
            model_fn, devices=replicate.testing.virtual_cpu_devices(TOWERS)),
        config=_config(root + '/many'))
    checkpoint = one.latest_checkpoint()
    expected = one.evaluate(input_fn, checkpoint_path=checkpoint)
    metrics = many.evaluate(input_fn, checkpoint_path=checkpoint)
    self.assertCountEqual(expected, metrics)
    for key in expected:
      self.assertAllClose(expected[key], metrics[key], rtol=1e-5,
                          atol=1e-6, msg=key)


class UnevenBatchEstimatorTest(tf.test.TestCase, parameterized.TestCase):

  def _compare(self, size, batch, reduction=Reduction.SUM_BY_NONZERO_WEIGHTS,
               optimizer='sgd', plain_mean=False, accumulation_steps=1,
               compression=None, rtol=1e-5, batch_norm=False,
               unused_variable=False, **replication):
    root = self.get_temp_dir() + '/' + self.id().split('.')[-1]
    params = {'reduction': reduction, 'optimizer': optimizer,
              'plain_mean': plain_mean,
              'accumulation_steps': accumulation_steps,
              'compression': compression, 'batch_norm': batch_norm,
              'unused_variable': unused_variable}
    one = tf1.estimator.Estimator(_model_fn, config=_config(root + '/one'),
                                  params=params)
    one.train(_input_fn(3, 3), steps=1)  # the checkpoint both start from
    shutil.copytree(root + '/one', root + '/many')
    many = tf1.estimator.Estimator(
        replicate.replicate_model_fn(
            _model_fn, loss_reduction=reduction,
            devices=replicate.testing.virtual_cpu_devices(TOWERS),
            **replication),
        config=_config(root + '/many'), params=params)
    one.train(_input_fn(size, batch))  # one epoch, the last batch partial
    many.train(_input_fn(size, batch))

    # TRAIN: every variable (Adam's slots, the global step) as one device's.
    names = one.get_variable_names()
    self.assertCountEqual(names, many.get_variable_names())
    for name in names:
      self.assertAllClose(one.get_variable_value(name),
                          many.get_variable_value(name), rtol=rtol,
                          atol=rtol / 10, msg=name)
    # EVAL: every metric and the loss, every row counted once.
    checkpoint = one.latest_checkpoint()
    expected = one.evaluate(_input_fn(size, batch), checkpoint_path=checkpoint,
                            name='one')
    metrics = many.evaluate(_input_fn(size, batch),
                            checkpoint_path=checkpoint, name='many')
    self.assertCountEqual(expected, metrics)
    for key in expected:
      self.assertAllClose(expected[key], metrics[key], rtol=rtol,
                          atol=rtol / 10, msg=key)
    # PREDICT: every row once, in input order.
    expected = list(one.predict(_input_fn(size, batch),
                                checkpoint_path=checkpoint))
    predictions = list(many.predict(_input_fn(size, batch),
                                    checkpoint_path=checkpoint))
    self.assertEqual(list(range(size)), [p['id'] for p in predictions])
    self.assertAllClose([p['prediction'] for p in expected],
                        [p['prediction'] for p in predictions], rtol=rtol,
                        atol=rtol / 10)
    return many

  @parameterized.parameters(
      (size, batch) for size in (1, 3, 5, 43) for batch in (3, 6))
  def test_any_dataset_size(self, size, batch):
    # e.g. 43 rows in batches of 6: 7 batches of 6 ([2, 2, 1, 1] rows per
    # tower), then one of 1 ([1, 0, 0, 0]).
    self._compare(size, batch)

  @parameterized.named_parameters(
      ('mean', Reduction.MEAN), ('sum_over_batch_size',
                                 Reduction.SUM_OVER_BATCH_SIZE),
      ('sum', Reduction.SUM))
  def test_loss_reduction(self, reduction):
    # SUM: a sum over the batch is the sum of the towers' sums; the others
    # weight each tower's mean by its rows / the batch's.
    self._compare(5, 3, reduction=reduction)

  def test_weighted_mean_with_adam(self):
    # SUM_BY_NONZERO_WEIGHTS with weights 1..3 (none zero): tower i's loss
    # is sum(w * l) / rows_i, so rows_i / b times it sums to one device's.
    self._compare(11, 6, reduction=Reduction.SUM_BY_NONZERO_WEIGHTS,
                  optimizer='adam')

  def test_mean_of_no_rows_is_no_nan(self):
    # tf.reduce_mean over tower 3's 0 rows is NaN; its weight is exactly 0.
    self._compare(5, 3, plain_mean=True)

  @parameterized.named_parameters(
      ('sgd', 'sgd', {}), ('adam', 'adam', {}),
      ('replicated', 'adam',
       {'variable_placement': replicate.VariablePlacement.REPLICATED}),
      ('call_per_tower', 'sgd',
       {'tower_build': replicate.TowerBuild.CALL_PER_TOWER}))
  def test_towers_without_rows_add_no_nan(self, optimizer, replication):
    # Batches of 1 row on 4 towers: [1, 0, 0, 0]. Tower 0 is one device;
    # towers 1-3 normalize no rows: mean and variance 0/0 = NaN, and batch
    # norm's gradients NaN with them, though their loss weighs exactly 0.
    self._compare(5, 1, optimizer=optimizer, batch_norm=True, **replication)

  def test_variable_without_gradient(self):
    # A None gradient passes the empty-tower masking untouched (5 rows in
    # batches of 3: [1, 1, 1, 0] rows in the last step).
    self._compare(5, 3, unused_variable=True)

  def test_call_per_tower(self):
    self._compare(5, 3, tower_build=replicate.TowerBuild.CALL_PER_TOWER)

  def test_replicated(self):
    self._compare(5, 6, optimizer='adam',
                  variable_placement=replicate.VariablePlacement.REPLICATED)

  def test_accumulation(self):
    # 11 rows in batches of 3: micro-steps of 3, 3 | 3, 2 rows; each update
    # averages the 2 batches' mean gradients, as one device's.
    self._compare(11, 3, accumulation_steps=2)

  def test_fp16_compression(self):
    # Gradients travel as float16: equal to one device up to its precision.
    self._compare(5, 3, compression=replicate.Compression.fp16, rtol=2e-3)


def _linear_model_fn(features, labels, mode):
  w = tf1.get_variable('w', [3, 1], initializer=tf1.ones_initializer())
  prediction = tf.matmul(features['x'], w)
  if 'scale' in features:
    prediction *= features['scale']
  if 'table' in features:
    prediction += tf.reduce_sum(features['table'])
  if 'z_sparse' in features:  # sorts after 'x', which sets the batch
    prediction += tf1.sparse_reduce_sum(features['z_sparse'], 1,
                                        keepdims=True)
  if mode == PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions=prediction,
        export_outputs={'out': tf1.estimator.export.PredictOutput(
            {'prediction': prediction})})
  loss = tf1.losses.mean_squared_error(labels, prediction)
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _build(features, labels, mode=TRAIN, towers=TOWERS, **kwargs):
  model_fn = replicate.replicate_model_fn(
      _linear_model_fn, devices=replicate.testing.virtual_cpu_devices(towers),
      **kwargs)
  return model_fn(features, labels, mode)


def _ops(graph, op_type):
  return [op for op in graph.get_operations() if op.type == op_type]


class UnevenBatchGraphTest(tf.test.TestCase):

  def _session(self):
    return tf1.Session(config=replicate.testing.virtual_cpu_config(TOWERS))

  def _train(self, towers, features, labels, feed=None, **kwargs):
    """`(w after one step, loss)` of one step on `features`."""
    with tf.Graph().as_default():
      spec = _build(features, labels, towers=towers, **kwargs)
      with self._session() as sess:
        sess.run(tf1.global_variables_initializer())
        loss, _ = sess.run([spec.loss, spec.train_op], feed)
        return sess.run(tf1.global_variables('w')[0]), loss

  def test_even_static_batch_keeps_the_even_split(self):
    # 8 rows on 4 towers: one Split op, losses divided by 4, nothing counted
    # at run time.
    with tf.Graph().as_default() as graph:
      spec = _build({'x': _X[:8]}, _Y[:8])
      self.assertLen(_ops(graph, 'Split'), 2)  # features and labels
      self.assertEqual([], _ops(graph, 'SplitV'))
      self.assertEqual([], _ops(graph, 'PlaceholderWithDefault'))
      self.assertEqual([], [op for op in graph.get_operations()
                            if 'weighted_loss' in op.name])
      self.assertNotEqual([], [op for op in graph.get_operations()
                               if 'averaged_loss' in op.name])
      self.assertIsNotNone(spec.train_op)

  def test_uneven_static_batch_hides_the_row_count(self):
    # 6 rows: [2, 2, 1, 1]; a copy of tower 0 must not bake in its 2 rows.
    with tf.Graph().as_default() as graph:
      seen = []

      def model_fn(features, labels, mode):
        seen.append(features['x'].shape.as_list())
        return _linear_model_fn(features, labels, mode)

      replicate.replicate_model_fn(
          model_fn, devices=replicate.testing.virtual_cpu_devices(TOWERS))(
              {'x': _X[:6]}, _Y[:6], TRAIN)
      self.assertEqual([[None, 3]], seen)
      self.assertLen(_ops(graph, 'SplitV'), 2)

  def test_uneven_static_batch_equals_one_device(self):
    # 6 rows: w after one step and the loss as one device's.
    expected = self._train(1, {'x': _X[:6]}, _Y[:6])
    got = self._train(TOWERS, {'x': _X[:6]}, _Y[:6])
    self.assertAllClose(expected[0], got[0], rtol=1e-6)
    self.assertAllClose(expected[1], got[1], rtol=1e-6)

  def test_predict_and_export_outputs_in_order(self):
    # 3 rows on 4 towers, [1, 1, 1, 0]: every row once, in order.
    with tf.Graph().as_default():
      x = tf1.placeholder(tf.float32, [None, 3])
      spec = _build({'x': x}, None, mode=PREDICT)
      with self._session() as sess:
        sess.run(tf1.global_variables_initializer())
        predictions, exported = sess.run(
            [spec.predictions,
             spec.export_outputs['out'].outputs['prediction']], {x: _X[:3]})
    # w = ones: the prediction is the row sum.
    self.assertAllClose(_X[:3].sum(axis=1, keepdims=True), predictions)
    self.assertAllClose(_X[:3].sum(axis=1, keepdims=True), exported)

  def _predict_odd(self, x, odd, feed=None):
    """PREDICT of a model_fn whose prediction 'odd' is `odd(prediction)`."""

    def model_fn(features, mode):
      prediction = tf1.layers.dense(features['x'], 3, name='out')
      return tf1.estimator.EstimatorSpec(
          mode, predictions={'ok': prediction, 'odd': odd(prediction)})

    spec = replicate.replicate_model_fn(
        model_fn, devices=replicate.testing.virtual_cpu_devices(TOWERS))(
            {'x': x}, None, PREDICT)
    with self._session() as sess:
      sess.run(tf1.global_variables_initializer())
      return sess.run(spec.predictions, feed)

  def test_predictions_without_the_rows_are_refused(self):
    # Concatenated over the towers they would not be one device's: 4
    # towers' transposes side by side, or 4 copies of a per-batch vector.
    message = (r'Predictions\[\W*odd\W*\] in tower \d has {} in dimension '
               r'0, but the tower was given {} of the batch: .* concatenates')
    with tf.Graph().as_default():  # static: 8 rows, 2 a tower; [3, 2]
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  message.format(3, 2)):
        self._predict_odd(_X[:8], tf.transpose)
    for rows in (3, 8):  # counted at run time: [1, 1, 1, 0] and [2] * 4
      with tf.Graph().as_default():
        x = tf1.placeholder(tf.float32, [None, 3])
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError,
            message.format('the size below', 'the rows after it')):
          # Two rows per row: [2, 2, 2, 0] where the towers got [1, 1, 1, 0].
          self._predict_odd(x, lambda p: tf.concat([p, p], 0),
                            {x: _X[:rows]})
    with tf.Graph().as_default():
      # Time-major, 2 steps: [2, rows, 3]. Counted at run time, a tower's
      # rows are unknown when the graph is built, so a dimension 0 known
      # then is not the rows, even where 8 rows give each tower 2 (before:
      # concatenated to [8, 2, 3], one device's [2, 8, 3] mixed up).
      x = tf1.placeholder(tf.float32, [None, 3])
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          message.format('2, fixed when the graph is built,',
                         'a number of rows counted when the step runs')):
        self._predict_odd(x, lambda p: tf.stack([p, 2.0 * p]), {x: _X[:8]})
    with tf.Graph().as_default():  # a scalar: no rows at all
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r"Predictions\['odd'\] is a scalar in each tower.*one row per "
          r'example'):
        self._predict_odd(_X[:8], tf.reduce_mean)

  def test_predictions_that_read_no_rows_are_refused(self):
    # A value per batch (a vocabulary of 2) whose size equals a tower's
    # shard (8 rows, 2 a tower): concatenated it would be 4 copies, [8],
    # where one device returns [2] (and Estimator.predict refuses to yield
    # it per example).
    def model_fn(features, mode):
      prediction = tf1.layers.dense(features['x'], 1, name='out')
      return tf1.estimator.EstimatorSpec(mode, predictions={
          'ok': prediction, 'pair': tf.constant(['neg', 'pos'])})

    def input_fn():
      return tf.data.Dataset.from_tensors({'x': _X[:8]})

    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(
            model_fn, devices=replicate.testing.virtual_cpu_devices(TOWERS)),
        model_dir=self.get_temp_dir(),
        config=tf1.estimator.RunConfig(session_config=tf1.ConfigProto(
            device_count={'CPU': TOWERS})))
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"Predictions\['pair'\] \(Const:0\) is a constant that does not "
        r'depend on the features or labels.*repeat it once per tower'):
      next(estimator.predict(input_fn, yield_single_examples=False))
    # Built from the static size of a tower's rows, TF folds it into a
    # constant: repeated per tower it is one device's where its rows are
    # equal ([0.] * 8), and so is a dropout mask of `tf.ones_like(p)` (each
    # tower draws its rows'); a constant of unequal rows is refused.
    with tf.Graph().as_default():
      predictions = self._predict_odd(
          _X[:8], lambda p: tf.zeros(tf.shape(p)[:1]))
    self.assertAllEqual([0.0] * 8, predictions['odd'])
    with tf.Graph().as_default():
      predictions = self._predict_odd(
          _X[:8], lambda p: tf1.nn.dropout(tf.ones_like(p), rate=0.5))
    self.assertAllInSet(predictions['odd'], [0.0, 2.0])
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r"Predictions\['odd'\] \(Const:0\) is a constant that does not "
          r'depend on the features or labels, and its rows are not all '
          r'equal'):
        self._predict_odd(_X[:8], lambda p: tf.constant([[1.0], [2.0]]))

  def test_predictions_with_the_rows_pass(self):
    with tf.Graph().as_default():
      x = tf1.placeholder(tf.float32, [None, 3])
      predictions = self._predict_odd(x, lambda p: p[:, :1] * 2.0,
                                      {x: _X[:5]})
    self.assertAllClose(predictions['ok'][:, :1] * 2.0, predictions['odd'])

  def test_sparse_feature_split_unevenly(self):
    # 3 rows, [1, 1, 1, 0]: row r holds 10 * r at column r.
    with tf.Graph().as_default():
      sparse = tf1.SparseTensor(indices=[[0, 0], [1, 1], [2, 2]],
                                values=[0, 10, 20], dense_shape=[3, 3])
      split = batch_split.split_batch({'s': sparse}, None, TOWERS, '/cpu:0')
      with tf1.Session() as sess:
        dense, rows = sess.run(
            [[tf1.sparse.to_dense(s['s']) for s in split.feature_shards],
             split.rows])
    self.assertEqual([1, 1, 1, 0], rows)
    self.assertAllEqual([[0, 0, 0]], dense[0])
    self.assertAllEqual([[0, 0, 20]], dense[2])
    self.assertEqual((0, 3), dense[3].shape)

  def test_scalar_feature_goes_to_every_tower(self):
    features = {'x': _X[:6], 'scale': np.float32(2.0)}
    expected = self._train(1, features, _Y[:6])
    got = self._train(TOWERS, features, _Y[:6])
    self.assertAllClose(expected[0], got[0], rtol=1e-6)
    self.assertAllClose(expected[1], got[1], rtol=1e-6)

  def test_unsplit_feature_goes_whole_to_every_tower(self):
    # 'table' has 5 rows for a batch of 8: given whole, its sum (0.1 * 15)
    # is added to every row's prediction in every tower.
    table = np.arange(5, dtype=np.float32)[:, None] / 10
    features = {'x': _X[:8], 'table': table}
    expected = self._train(1, features, _Y[:8])
    got = self._train(TOWERS, features, _Y[:8], unsplit_features=['table'])
    self.assertAllClose(expected[0], got[0], rtol=1e-6)
    self.assertAllClose(expected[1], got[1], rtol=1e-6)

  def test_unsplit_features_must_be_a_list_of_strings(self):
    for bad in ('table', [1], ['table', 3], {'table': 1}):
      with self.assertRaisesRegex(
          TypeError, r'unsplit_features must be a list of feature names'):
        replicate.replicate_model_fn(_linear_model_fn, unsplit_features=bad)

  def test_unsplit_features_must_name_a_feature(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          ValueError, r"unsplit_features names 'tabel', but the features "
          r"have no such key \(features: \['x'\]\)"):
        _build({'x': _X[:8]}, _Y[:8], unsplit_features=['tabel'])

  def test_feature_without_the_batch_rows_is_named(self):
    # 'table' (5 rows, not batched) sorts first and sets the batch, so the
    # message names 'x' first: it says that either may be the odd one, and
    # to name the unbatched one's key (before: "naming it", read as 'x').
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          ValueError, r"features\['x'\] has 8 rows in dimension 0, but the "
          r"batch has 5 \(features\['table'\], the first value split\).*"
          r'either of the two may be the odd one.*not batched.*'
          r'unsplit_features=\[\.\.\.\]\) naming its key'):
        _build({'x': _X[:8], 'table': np.zeros([5, 1], np.float32)}, _Y[:8])

  def test_dynamic_mismatch_fails_at_run_time(self):
    with tf.Graph().as_default():
      x = tf1.placeholder(tf.float32, [None, 3])
      spec = _build({'x': x}, tf.constant(_Y[:8]))
      with self._session() as sess:
        sess.run(tf1.global_variables_initializer())
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError,
            r'labels has 8 rows in dimension 0, but the batch has \(known '
            r'at run time\) \(features\[.{1,2}x.{1,2}\], .*unsplit_features'):
          sess.run(spec.train_op, {x: _X[:5]})

  def test_dynamic_sparse_mismatch_fails_at_run_time(self):
    # A SparseTensor's rows are its dense_shape[0], known at run time: 9
    # against the batch's 8 fails the step naming it (one device fails
    # too, adding 9 rows to 8), where the towers would split it silently.
    with tf.Graph().as_default():
      x = tf1.placeholder(tf.float32, [None, 3])
      sparse = tf1.sparse_placeholder(tf.float32, shape=[None, 2])
      spec = _build({'x': x, 'z_sparse': sparse}, tf.constant(_Y[:8]))
      with self._session() as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(spec.train_op, {x: _X[:8], sparse: tf1.SparseTensorValue(
            [[0, 0], [7, 1]], [1., 2.], [8, 2])})
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError,
            r"features\[.{1,2}z_sparse.{1,2}\] has \(known at run time\) "
            r'rows in dimension 0, but the batch has \(known at run time\) '
            r"\(features\[.{1,2}x.{1,2}\], "):
          sess.run(spec.train_op, {x: _X[:8], sparse: tf1.SparseTensorValue(
              [[0, 0], [8, 1]], [1., 2.], [9, 2])})


def _per_batch_model_fn(features, labels, mode):
  """Metrics of per-batch values (scalars of the batch) and of rows."""
  prediction = tf1.layers.dense(
      features['x'], 1, kernel_initializer=tf1.glorot_uniform_initializer(
          seed=2), name='out')
  per_row = tf1.losses.mean_squared_error(labels, prediction,
                                          reduction=Reduction.NONE)
  loss = tf.reduce_mean(per_row)
  rate = tf1.get_variable('rate', [], initializer=tf1.ones_initializer(),
                          trainable=False)
  metrics = {
      # One term per call: per batch on one device, per tower here.
      'mean_loss': tf1.metrics.mean(loss),
      'weighted_mean_loss': tf1.metrics.mean(loss, weights=2.0),
      'mean_of_batch_mean': tf1.metrics.mean(tf.reduce_mean(prediction)),
      # The same, not of rank 0: a [1], a per-batch vector ([3]), as a
      # tensor, and the [1, 1] that auc makes of a per-batch score.
      'mean_of_loss_vector': tf1.metrics.mean(tf.reshape(loss, [1])),
      'mean_of_column_means': tf1.metrics.mean(
          tf.reduce_mean(features['x'] * prediction, 0)),
      'mean_tensor_of_column_means': tf1.metrics.mean_tensor(
          tf.reduce_mean(features['x'] * prediction, 0)),
      'auc_of_batch_means': tf1.metrics.auc(
          tf.reduce_mean(labels) > 0.,
          tf.sigmoid(tf.reduce_mean(prediction)), num_thresholds=20),
      # Sums over rows, or scalars that do not depend on the batch.
      'mean_per_row_loss': tf1.metrics.mean(per_row),
      'mean_prediction': tf1.metrics.mean(prediction),
      'positive': tf1.metrics.accuracy(labels > 0, prediction > 0),
      'rmse': tf1.metrics.root_mean_squared_error(labels, prediction),
      'rate': tf1.metrics.mean(rate),
      'constant': tf1.metrics.mean(tf.constant(2.0)),
      # Per row, with a state of static shape: a confusion matrix.
      'iou': tf1.metrics.mean_iou(tf.cast(labels > 0, tf.int32),
                                  tf.cast(prediction > 0, tf.int32), 2),
  }
  return tf1.estimator.EstimatorSpec(mode, loss=loss,
                                     eval_metric_ops=metrics)


_PER_BATCH = ['auc_of_batch_means', 'mean_loss', 'mean_of_batch_mean',
              'mean_of_column_means', 'mean_of_loss_vector',
              'mean_tensor_of_column_means', 'weighted_mean_loss']


class PerBatchMetricTest(tf.test.TestCase):
  """A metric of a per-batch value adds one term per tower: one device's
  value only when every tower has the same rows; otherwise the step fails."""

  def _evaluate(self, size, batch, towers):
    model_dir = self.get_temp_dir() + '/' + self.id().split('.')[-1]
    one = tf1.estimator.Estimator(_per_batch_model_fn,
                                  config=_config(model_dir))
    many = tf1.estimator.Estimator(
        replicate.replicate_model_fn(
            _per_batch_model_fn,
            devices=replicate.testing.virtual_cpu_devices(towers)),
        config=_config(model_dir))
    # No train_op: evaluate a fresh checkpoint of the seeded initializers.
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      _per_batch_model_fn({'x': tf1.placeholder(tf.float32, [None, 3])},
                          tf1.placeholder(tf.float32, [None, 1]), EVAL)
      saver = tf1.train.Saver()
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        checkpoint = saver.save(sess, model_dir + '/start')
    expected = one.evaluate(_input_fn(size, batch),
                            checkpoint_path=checkpoint, name='one')
    return expected, lambda: many.evaluate(
        _input_fn(size, batch), checkpoint_path=checkpoint, name='many')

  def test_even_batches_equal_one_device(self):
    # 16 rows in batches of 8 on 4 towers (batch dimension unknown, so rows
    # are counted at run time): 2 rows each, and a tower's mean loss is a
    # quarter of the batch's mean loss, 4 of them per batch.
    expected, evaluate = self._evaluate(16, 8, TOWERS)
    metrics = evaluate()
    self.assertCountEqual(expected, metrics)
    for key in expected:
      if key == 'auc_of_batch_means':
        # One point per tower, where one device has one per batch: not one
        # device's value even on equal shards (documented).
        continue
      self.assertAllClose(expected[key], metrics[key], rtol=1e-6, msg=key)

  def test_uneven_batch_fails_naming_the_metric(self):
    # 6 rows in batches of 3: [1, 1, 1, 0] rows; one device's mean loss of
    # the batch cannot be made from the towers' 3 means and a NaN.
    _, evaluate = self._evaluate(6, 3, TOWERS)
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError,
        r'Metrics \[\W*{}\W+ take a per-batch value .* this batch does '
        r'not divide by 4\. Make every evaluation batch a multiple of 4 '
        r'rows'.format(r'\W+'.join(_PER_BATCH))):
      evaluate()

  def test_only_metrics_of_batch_scalars_are_checked(self):
    checked = []
    with tf.Graph().as_default() as graph:
      features = {'x': tf1.placeholder(tf.float32, [None, 3])}
      labels = tf1.placeholder(tf.float32, [None, 1])
      replicate.replicate_model_fn(
          _per_batch_model_fn,
          devices=replicate.testing.virtual_cpu_devices(TOWERS))(
              features, labels, tf1.estimator.ModeKeys.EVAL, None, None)
      for op in graph.get_operations():
        if op.type == 'Const' and op.get_attr('dtype') == tf.string:
          for value in op.get_attr('value').string_val:
            if value.startswith(b'Metrics '):
              checked.append(value.decode().split(' take ')[0])
    self.assertEqual({'Metrics {}'.format(_PER_BATCH)}, set(checked))

  def test_even_static_batch_is_not_checked(self):
    with tf.Graph().as_default() as graph:
      replicate.replicate_model_fn(
          _per_batch_model_fn,
          devices=replicate.testing.virtual_cpu_devices(TOWERS))(
              {'x': _X[:8]}, _Y[:8], tf1.estimator.ModeKeys.EVAL, None, None)
      self.assertEqual([], [op for op in graph.get_operations()
                            if op.name.startswith('per_batch_metric_check')])


def _evaluate_beside_one_device(test, model_fn, params, size, batch,
                                **kwargs):
  """`[one device's, 4 towers']` metrics of `model_fn` (built with
  `replicate_model_fn(**kwargs)`) from one checkpoint of its initializers."""
  model_dir = test.get_temp_dir() + '/' + test.id().split('.')[-1]
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    model_fn({'x': tf1.placeholder(tf.float32, [None, 3])},
             tf1.placeholder(tf.float32, [None, 1]), EVAL, params)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      checkpoint = tf1.train.Saver().save(sess, model_dir + '/start')
  results = []
  for devices in (None, replicate.testing.virtual_cpu_devices(TOWERS)):
    wrapped = model_fn if devices is None else replicate.replicate_model_fn(
        model_fn, devices=devices, **kwargs)
    results.append(tf1.estimator.Estimator(
        wrapped, config=_config(model_dir), params=params).evaluate(
            _input_fn(size, batch), checkpoint_path=checkpoint,
            name=str(len(results))))
  return results


def _unknown_shape_model_fn(features, labels, mode, params):
  """Metrics of values whose static shape is unknown ([None]): the column
  means of the batch (per batch), and the rows' means read from a
  columns-major copy (per row, as a time-major sequence's)."""
  prediction = tf1.layers.dense(
      features['x'], 1, kernel_initializer=tf1.glorot_uniform_initializer(
          seed=2), name='out')
  loss = tf.reduce_mean(tf1.losses.mean_squared_error(
      labels, prediction, reduction=Reduction.NONE))
  x = features['x'] * prediction
  wide = tf.reshape(x, tf.stack([tf.shape(x)[0], -1]))  # [None, None]
  metrics = {
      'row_means': tf1.metrics.mean(tf.reduce_mean(tf.transpose(wide), 0)),
      'rows': tf1.metrics.mean(tf.reshape(wide, [-1])),
  }
  if params['column_means']:
    # Dimension 0 named as 0, or as -2 of the rank-2 `wide`.
    metrics['column_means'] = tf1.metrics.mean(tf.reduce_mean(
        wide, -2 if params['column_means'] == 'negative_axis' else 0))
  return tf1.estimator.EstimatorSpec(mode, loss=loss,
                                     eval_metric_ops=metrics)


class UnknownShapePerBatchMetricTest(parameterized.TestCase,
                                     tf.test.TestCase):
  """A per-batch value of unknown static shape: found at run time, where a
  reduction took away a dimension 0 that was the tower's rows."""

  def _evaluate(self, size, batch, column_means, **kwargs):
    return _evaluate_beside_one_device(
        self, _unknown_shape_model_fn, {'column_means': column_means}, size,
        batch, **kwargs)

  @parameterized.named_parameters(
      ('copies', {}, True),
      ('copies_negative_axis', {}, 'negative_axis'),
      ('calls', {'tower_build': replicate.TowerBuild.CALL_PER_TOWER}, True))
  def test_uneven_batch_fails_naming_the_metric(self, kwargs, column_means):
    # 7 rows in batches of 4 and 3: [1, 1, 1, 1], then [1, 1, 1, 0]. Before:
    # the towers' column means were averaged as 3 terms and NaN, silently.
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError,
        r'Metrics \[\W*column_means\W+ take a per-batch value'):
      self._evaluate(7, 4, column_means, **kwargs)

  def test_even_batches_equal_one_device(self):
    # 16 rows in batches of 8: 2 rows per tower, each tower's column means
    # are a quarter of the batch's terms.
    expected, actual = self._evaluate(16, 8, True)
    for key in expected:
      self.assertAllClose(expected[key], actual[key], rtol=1e-6, msg=key)

  def test_per_row_values_of_unknown_shape_pass(self):
    # The row means reduce dimension 0 of a [3, rows] tensor: 3 is not the
    # tower's rows (1 or 2: 10 rows in batches of 6 and 4, towers of
    # [2, 2, 1, 1] and [1, 1, 1, 1]), so nothing is refused, and every
    # row counts once, as on one device.
    expected, actual = self._evaluate(10, 6, False)
    for key in expected:
      self.assertAllClose(expected[key], actual[key], rtol=1e-6, msg=key)


def _metric_variable(name, shape):
  return tf1.Variable(
      tf.zeros(shape), trainable=False, name=name,
      collections=[tf1.GraphKeys.LOCAL_VARIABLES,
                   tf1.GraphKeys.METRIC_VARIABLES])


def _running_sum(name, amount):
  """A hand-made metric: the sum of `amount` over every call."""
  total = _metric_variable(name, [])
  return tf.identity(total), tf1.assign_add(total, amount)


def _row_sums_model_fn(features, labels, mode, params):
  """Metrics whose state is a sum over the rows, reduced to a static shape
  (a confusion matrix, a segment sum, a count of rows); with
  `params['refused']`, one metric that divides such a sum by a count of
  calls."""
  logits = tf1.layers.dense(
      features['x'], 3, kernel_initializer=tf1.glorot_uniform_initializer(
          seed=4), name='logits')
  classes = (tf.cast(labels[:, 0] > -0.5, tf.int64) +
             tf.cast(labels[:, 0] > 0.5, tf.int64))  # 0, 1, 2
  predicted = tf.argmax(logits, 1)
  per_row = tf1.losses.sparse_softmax_cross_entropy(
      classes, logits, reduction=Reduction.NONE)
  confusion = tf.math.confusion_matrix(classes, predicted, 3,
                                       dtype=tf.float32)  # static [3, 3]
  counts = _metric_variable('predicted_counts', [3])
  diagonal = _metric_variable('diagonal', [3])
  total = _metric_variable('total', [])
  rows = _metric_variable('rows', [])
  class_sums = _metric_variable('class_sums', [3])
  at_least = _metric_variable('at_least_class', [3])
  metrics = {
      'predicted_counts': (tf.identity(counts), tf1.assign_add(
          counts, tf.reduce_sum(confusion, 0))),
      'agreement': (tf.reduce_sum(diagonal) / total, tf.group(
          tf1.assign_add(diagonal, tf.linalg.diag_part(confusion)),
          tf1.assign_add(total, tf.reduce_sum(confusion)))),
      'rows': (tf.identity(rows), tf1.assign_add(
          rows, tf.cast(tf.size(classes), tf.float32))),
      'class_sums': (tf.identity(class_sums), tf1.assign_add(
          class_sums, tf.reduce_sum(tf.math.unsorted_segment_sum(
              features['x'] * logits, classes, 3), 1))),
      'mean_loss': tf1.metrics.mean(per_row),
      # Cumulative sums over a static axis of a segment sum, as TF 2 Keras
      # AUC's thresholds (below): a sum over rows too.
      'at_least_class': (tf.identity(at_least), tf1.assign_add(
          at_least, tf.cumsum(tf.math.unsorted_segment_sum(
              tf.ones_like(per_row), classes, 3), reverse=True))),
  }
  # Counts by label, by scatter-adds of one update per row. The predictions
  # go through a reshape to a product of the batch's shape, as an
  # embedding column's `safe_embedding_lookup_sparse` does: a reduction of
  # a static shape, which is no per-batch value of the rows' own.
  reshaped = tf.reshape(logits, tf.stack([tf.reduce_prod(
      tf.shape(logits)[:1]), 3]))
  metrics['per_class_accuracy'] = tf1.metrics.mean_per_class_accuracy(
      classes, tf.argmax(reshaped, 1), 3)
  auc = tf.keras.metrics.AUC(name='auc')  # what TF 2's binary heads report
  auc.update_state(tf.cast(tf.equal(classes, 2), tf.float32),
                   tf.nn.softmax(logits)[:, 2])
  metrics['auc'] = auc
  if hasattr(tf, 'contrib'):  # TF 1.15: contrib's, from a confusion matrix
    metrics['kappa'] = tf.contrib.metrics.cohen_kappa(classes, predicted, 3)
  refused = {
      'mean_of_summed_loss': lambda: tf1.metrics.mean(
          tf.reduce_sum(per_row)),
      'mean_of_predicted_counts': lambda: tf1.metrics.mean(
          tf.reduce_sum(confusion, 0)),
      'mean_tensor_of_column_sums': lambda: tf1.metrics.mean_tensor(
          tf.reduce_sum(features['x'] * logits, 0)),
      'sum_of_batch_means': lambda: _running_sum(
          'sum_of_batch_means', tf.reduce_mean(per_row)),
      'count_of_calls': lambda: _running_sum('count_of_calls', 1.0),
  }
  if params['refused']:
    metrics[params['refused']] = refused[params['refused']]()
  return tf1.estimator.EstimatorSpec(mode, loss=tf.reduce_mean(per_row),
                                     eval_metric_ops=metrics)


class RowSumMetricTest(parameterized.TestCase, tf.test.TestCase):
  """State that sums the rows adds up over the towers whatever their rows;
  a metric dividing such a sum by a count of calls is refused."""

  @parameterized.named_parameters(
      ('copies', {}),
      ('calls', {'tower_build': replicate.TowerBuild.CALL_PER_TOWER}))
  def test_uneven_batches_equal_one_device(self, kwargs):
    # 10 rows in batches of 6 and 4: towers of [2, 2, 1, 1] and [1, 1, 1,
    # 1]. Every state is a sum over rows, so each equals one device's sums
    # of 10 rows (rows: 10.0). Before, the confusion matrix's reduce_sum
    # (static [3]) was taken for a per-batch value and refused, and so were
    # TF 2 Keras AUC's and the hand-made cumulative sums (a `Cumsum`), and
    # mean_per_class_accuracy's scatter-adds of rows computed through a
    # reduction of a shape.
    expected, actual = _evaluate_beside_one_device(
        self, _row_sums_model_fn, {'refused': None}, 10, 6, **kwargs)
    self.assertEqual(10.0, expected['rows'])
    # Rows of class >= 0, >= 1, >= 2: 10, then fewer.
    self.assertEqual(10.0, expected['at_least_class'][0])
    self.assertGreater(expected['at_least_class'][0],
                       expected['at_least_class'][2])
    self.assertBetween(expected['auc'], 0.0, 1.0)
    self.assertCountEqual(expected, actual)
    for key in expected:
      self.assertAllClose(expected[key], actual[key], rtol=1e-6, msg=key)

  @parameterized.parameters('mean_of_summed_loss', 'mean_of_predicted_counts',
                            'mean_tensor_of_column_sums')
  def test_sum_over_a_count_of_calls_is_refused(self, refused):
    # 16 rows in batches of 8: 2 rows per tower. One device's mean of the
    # batch's summed loss S averages S over 2 batches; 4 towers would add
    # their sums (S together) with a count of 4 per batch: S / 4. Before,
    # a quarter of one device's value, silently.
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"Metric '{}' cannot be reduced across towers: its value reads "
        r'\S+ \(op \S+ adds a sum over the rows\) and \S+ \(op \S+ adds a '
        r'(per-batch value|term that reads no batch)\)'.format(refused)):
      _evaluate_beside_one_device(self, _row_sums_model_fn,
                                  {'refused': refused}, 16, 8)

  @parameterized.parameters('sum_of_batch_means', 'count_of_calls')
  def test_sum_of_terms_per_call_is_refused(self, refused):
    # 16 rows in batches of 8: one device adds 2 terms (2 batch means, or
    # 2 calls), 4 towers would add 8: 4 times one device's sum. Before,
    # silently.
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"Metric '{}' cannot be reduced across towers: its value reads only "
        r'{}, to which op \S+ adds a (per-batch value|term that reads no '
        r'batch), one term per call\..*N times it, on N equal '
        r'shards'.format(refused, refused)):
      _evaluate_beside_one_device(self, _row_sums_model_fn,
                                  {'refused': refused}, 16, 8)


def _every_tower_writes_model_fn(features, labels, mode, params):
  """A linear model whose forward pass writes from the tower's rows in the
  control_dependencies around minimize, so every tower writes:
  `params['write']` is 'keras_bn' (a Keras BatchNormalization layer's
  updates), 'keras_bn_tensor_training' (the same with `training` a tensor:
  its updates are `cond`s that write, TF 2's `If` or TF1's `Switch`),
  'moving_mean' (a hand-made moving average of the batch mean),
  'scaled_moving_mean' (the same, times the scalar feature 'scale'),
  'scatter_mean' (the batch mean written into row 1 of a table by
  `scatter_update`) or 'rows' (a count of the rows seen: finite on no
  rows)."""
  x = features['x']
  if params['write'].startswith('keras_bn'):
    layer = tf.keras.layers.BatchNormalization()
    x = layer(x, training=True if params['write'] == 'keras_bn' else
              tf1.placeholder_with_default(True, []))
    updates = layer.updates
  else:
    state = tf1.get_variable('state', [3] if params['write'].endswith(
        'moving_mean') else [], initializer=tf1.zeros_initializer(),
                             trainable=False)
    mean = tf.reduce_mean(x, 0)
    if params['write'] == 'scaled_moving_mean':
      mean *= features['scale']  # a scalar feature: every tower's
    updates = [tf1.assign(state, 0.9 * state + 0.1 * mean)
               if params['write'].endswith('moving_mean') else
               # Locked: the towers add at once, and TF 1.15's unlocked add
               # to a reference variable can lose one (with calls as well).
               tf1.assign_add(state, tf.cast(tf.shape(x)[0], tf.float32),
                              use_locking=True)]
    if params['write'] == 'scatter_mean':
      table = tf1.get_variable('table', [2, 3], trainable=False,
                               initializer=tf1.zeros_initializer())
      updates = [tf1.scatter_update(table, [1], [tf.reduce_mean(x, 0)])]
  prediction = tf1.layers.dense(
      x, 1, kernel_initializer=tf1.constant_initializer([0.5, -0.3, 0.2]),
      name='out')
  loss = tf1.losses.mean_squared_error(labels, prediction)
  with tf.control_dependencies(updates):
    train_op = replicate.TowerOptimizer(
        tf1.train.GradientDescentOptimizer(0.1)).minimize(
            loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class EmptyTowerWritesTest(tf.test.TestCase, parameterized.TestCase):
  """A tower given no rows writes no NaN into shared state."""

  def _train(self, write, rows, towers=TOWERS, **kwargs):
    """The variables after one epoch of `rows` rows in batches of 8 on
    `towers` towers, through an Estimator."""
    x, y = _X[:rows].astype(np.float32), _Y[:rows].astype(np.float32)

    def input_fn():
      return tf1.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(8).map(
          lambda f, y: (dict(f, scale=tf.constant(0.5)), y))

    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(
            _every_tower_writes_model_fn,
            devices=replicate.testing.virtual_cpu_devices(towers), **kwargs),
        model_dir='{}/{}{}_{}'.format(self.get_temp_dir(), write, rows,
                                      towers),
        # Soft placement, as the Estimator's default: a Keras update's
        # `If` puts its inlined body on the tower's device and colocates it
        # with the variable.
        config=tf1.estimator.RunConfig(
            session_config=replicate.testing.virtual_cpu_config(
                TOWERS, allow_soft_placement=True)),
        params={'write': write})
    estimator.train(input_fn)
    return {name: estimator.get_variable_value(name)
            for name in estimator.get_variable_names()}

  @parameterized.named_parameters(
      ('keras_bn', 'keras_bn', {}),
      ('keras_bn_tensor_training', 'keras_bn_tensor_training', {}),
      ('keras_bn_tensor_training_replicated', 'keras_bn_tensor_training',
       {'variable_placement': replicate.VariablePlacement.REPLICATED}),
      ('moving_mean', 'moving_mean', {}),
      ('scatter_mean', 'scatter_mean', {}),
      ('scaled_moving_mean', 'scaled_moving_mean', {}),
      ('moving_mean_per_tower', 'moving_mean',
       {'tower_build': replicate.TowerBuild.CALL_PER_TOWER}),
      ('moving_mean_replicated', 'moving_mean',
       {'variable_placement': replicate.VariablePlacement.REPLICATED}),
  )
  def test_a_mean_over_no_rows_fails_the_step(self, write, kwargs):
    # 18 rows: batches of 8, 8 and 2; the last gives towers 2 and 3 none,
    # whose mean is NaN (before: written, silently; every later prediction
    # NaN).
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError,
        r'Tower [23] of 4 was given no rows of this batch .* writes a variable '
        r'from an amount that is not finite .*UPDATE_OPS.* at least 4 rows'):
      self._train(write, 18, **kwargs)
    # 16 rows: no tower goes without rows.
    variables = self._train(write, 16, **kwargs)
    self.assertTrue(all(np.all(np.isfinite(v)) for v in variables.values()))

  def test_two_towers_and_a_batch_of_one_row(self):
    # 17 rows: batches of 8, 8 and 1; the last gives tower 1 of 2 no rows.
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError,
        r'Tower 1 of 2 was given no rows of this batch'):
      self._train('moving_mean', 17, towers=2)
    variables = self._train('moving_mean', 16, towers=2)
    self.assertTrue(all(np.all(np.isfinite(v)) for v in variables.values()))

  def test_updates_that_never_run_get_no_check(self):
    # Towers built by calls make batch-norm updates in UPDATE_OPS, of which
    # only tower 0's run: no check is built for the others', and 2 rows on
    # 4 towers train.
    def model_fn(features, labels, mode, params):
      del params
      x = tf1.layers.batch_normalization(features['x'], training=True)
      loss = tf1.losses.mean_squared_error(labels, tf1.layers.dense(x, 1))
      with tf.control_dependencies(
          tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
        train_op = replicate.TowerOptimizer(
            tf1.train.GradientDescentOptimizer(0.1)).minimize(
                loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      x = tf1.placeholder(tf.float32, [None, 3])
      y = tf1.placeholder(tf.float32, [None, 1])
      spec = replicate.replicate_model_fn(
          model_fn, devices=replicate.testing.virtual_cpu_devices(TOWERS),
          tower_build=replicate.TowerBuild.CALL_PER_TOWER)(
              {'x': x}, y, TRAIN, None)
      self.assertEmpty([op.name for op in graph.get_operations()
                        if 'empty_tower_check' in op.name])
      with tf1.Session(config=replicate.testing.virtual_cpu_config(
          TOWERS)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(spec.train_op, {x: _X[:2], y: _Y[:2]})
        self.assertTrue(all(np.all(np.isfinite(v)) for v in sess.run(
            tf1.global_variables())))

  @parameterized.parameters('moving_mean', 'keras_bn_tensor_training')
  def test_checks_log_no_error(self, write):
    # TF logs "Object was never used" at ERROR, with a traceback, for an
    # assertion op whose result no Python code reads; the checks are
    # control inputs of the writes. Before: one such ERROR per check.
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      x = tf1.placeholder(tf.float32, [None, 3])
      y = tf1.placeholder(tf.float32, [None, 1])
      with self.assertLogs('tensorflow', level='ERROR') as logs:
        replicate.replicate_model_fn(
            _every_tower_writes_model_fn,
            devices=replicate.testing.virtual_cpu_devices(TOWERS))(
                {'x': x}, y, TRAIN, {'write': write})
        gc.collect()
        tf1.logging.error('the build is done')
      self.assertIn('empty_tower_check', [
          op.name.split('/')[0] for op in tf1.get_default_graph()
          .get_operations()])
    self.assertEqual(['the build is done'],
                     [record.getMessage() for record in logs.records])

  def test_a_finite_write_on_no_rows_runs(self):
    # Each tower adds its rows: 8 + 8 + 2 (towers given [1, 1, 0, 0]) = 18,
    # as one device counts.
    self.assertAllEqual(18.0, self._train('rows', 18)['state'])


if __name__ == '__main__':
  tf.test.main()

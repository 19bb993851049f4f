"""replicate_model_fn: training equivalence, EVAL/PREDICT merging, placement."""
import functools

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

REDUCTION = tf1.losses.Reduction


class TrainingEquivalenceTest(tf.test.TestCase, parameterized.TestCase):
  """N towers on the full batch train exactly like one device."""

  @parameterized.named_parameters(
      ('mean_2', REDUCTION.MEAN, 2),
      ('mean_4', REDUCTION.MEAN, 4),
      ('nonzero_weights_2', REDUCTION.SUM_BY_NONZERO_WEIGHTS, 2),
      ('nonzero_weights_4', REDUCTION.SUM_BY_NONZERO_WEIGHTS, 4),
      ('sum_over_batch_size_4', REDUCTION.SUM_OVER_BATCH_SIZE, 4),
      ('sum_4', REDUCTION.SUM, 4),
  )
  def test_same_variables_as_one_device(self, reduction, num_towers):
    features, labels = mt.data(batch_size=8)
    params = {'reduction': reduction}
    # The model reduces its loss with `reduction` and tells replicate so:
    # SUM adds tower losses, the others average them over towers.
    expected = mt.train_variables(mt.mlp_model_fn, features, labels,
                                  mt.cpus(1), loss_reduction=reduction,
                                  params=params)
    actual = mt.train_variables(mt.mlp_model_fn, features, labels,
                                mt.cpus(num_towers), loss_reduction=reduction,
                                params=params)
    self.assertEqual(sorted(expected), sorted(actual))
    for name in expected:
      self.assertAllClose(expected[name], actual[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    self.assertEqual(3, actual['global_step'])  # 3 steps, incremented once each

  def test_linear_model_by_hand(self):
    # w starts at 1; loss_i = mean over tower i of (w * x)^2 / 2, MEAN.
    # Batch x = [1, 2, 3, 4] on 2 towers: shards [1, 2] and [3, 4].
    # Gradient of the global mean: mean(w * x^2) = (1 + 4 + 9 + 16) / 4 = 7.5,
    # and each tower contributes (1/2) * mean over its shard:
    # (1/2) * (1 + 4) / 2 + (1/2) * (9 + 16) / 2 = 1.25 + 6.25 = 7.5.
    # One step of SGD with lr 0.1: w = 1 - 0.1 * 7.5 = 0.25.
    def model_fn(features, labels, mode):
      del labels
      w = tf1.get_variable('w', [], initializer=tf1.ones_initializer())
      loss = tf.reduce_mean(tf.square(w * features['x'])) / 2
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    values = mt.train_variables(
        model_fn, {'x': np.array([1., 2., 3., 4.], np.float32)}, None,
        mt.cpus(2), steps=1)
    self.assertAllClose(0.25, values['w'])

  @parameterized.named_parameters(
      ('copies', replicate.TowerBuild.CLONE),
      ('calls', replicate.TowerBuild.CALL_PER_TOWER))
  def test_regularization_counts_once(self, tower_build):
    # loss = data loss + tf.losses.get_regularization_loss(). The L2 term is
    # created once (with the shared variables, in tower 0); each tower must
    # see it so that averaging over towers keeps it exactly once. (Copies
    # copy tower 0's loss; calls read the collection, which must show tower
    # 0's term to towers 1..N-1: else MEAN counts it 1/N times.)
    replicate_fn = functools.partial(replicate.replicate_model_fn,
                                     tower_build=tower_build)
    features, labels = mt.data(batch_size=8)
    for reduction in (REDUCTION.MEAN, REDUCTION.SUM):
      params = {
          'reduction': reduction,
          'add_regularization': True,
          'regularizer': tf.keras.regularizers.l2(0.5),
      }
      expected = mt.train_variables(mt.mlp_model_fn, features, labels,
                                    mt.cpus(1), loss_reduction=reduction,
                                    params=params)
      actual = mt.train_variables(mt.mlp_model_fn, features, labels,
                                  mt.cpus(4), loss_reduction=reduction,
                                  params=params, replicate_fn=replicate_fn)
      for name in expected:
        self.assertAllClose(expected[name], actual[name], rtol=1e-5,
                            atol=1e-6, msg='{} {}'.format(reduction, name))

  def test_get_total_loss_sees_only_own_tower(self):
    # tf.losses.get_total_loss() reads the LOSSES collection; tower i must not
    # count the losses of towers 0..i-1 (contrib's towers did).
    def model_fn(features, labels, mode):
      logits = tf1.layers.dense(
          features['x'], 1,
          kernel_initializer=tf1.glorot_uniform_initializer(seed=3))
      tf1.losses.sigmoid_cross_entropy(labels, logits)
      loss = tf1.losses.get_total_loss()
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.5)).minimize(loss)
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    features, labels = mt.data(batch_size=8)
    expected = mt.train_variables(model_fn, features, labels, mt.cpus(1))
    actual = mt.train_variables(model_fn, features, labels, mt.cpus(4))
    for name in expected:
      self.assertAllClose(expected[name], actual[name], rtol=1e-5, atol=1e-6)

  def test_two_optimizers_same_order(self):
    # A GAN-like model_fn: two optimizers, each over its own variables.
    def model_fn(features, labels, mode):
      del labels
      with tf1.variable_scope('g'):
        g = tf1.get_variable('w', [], initializer=tf1.ones_initializer())
      with tf1.variable_scope('d'):
        d = tf1.get_variable('w', [], initializer=tf1.ones_initializer())
      g_loss = tf.reduce_mean(g * features['x'])
      d_loss = tf.reduce_mean(d * d * features['x'])
      g_train = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              g_loss, var_list=[g])
      d_train = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              d_loss, var_list=[d])
      return tf1.estimator.EstimatorSpec(
          mode, loss=g_loss + d_loss, train_op=tf.group(g_train, d_train))

    x = {'x': np.array([1., 2., 3., 6.], np.float32)}
    values = mt.train_variables(model_fn, x, None, mt.cpus(4), steps=1)
    # mean(x) = 3. dg = mean(x) = 3 -> g = 1 - 0.3 = 0.7.
    # dd = mean(2 d x) = 6 -> d = 1 - 0.6 = 0.4.
    self.assertAllClose(0.7, values['g/w'])
    self.assertAllClose(0.4, values['d/w'])

  def test_optimizer_fn_and_adam_match_one_device(self):
    features, labels = mt.data(batch_size=8)
    params = {'optimizer_fn': lambda: tf1.train.AdamOptimizer(0.1)}
    expected = mt.train_variables(mt.mlp_model_fn, features, labels,
                                  mt.cpus(1), params=params)
    actual = mt.train_variables(mt.mlp_model_fn, features, labels,
                                mt.cpus(4), params=params)
    # Adam's slots and beta powers keep the unreplicated names.
    self.assertEqual(sorted(expected), sorted(actual))
    for name in expected:
      self.assertAllClose(expected[name], actual[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  def test_sparse_gradients_stay_sparse(self):
    # An embedding lookup gives IndexedSlices gradients; they are concatenated
    # across towers, never densified.
    # Rows of distinct values (row r is [2r + 1, 2r + 2]), so a gradient row
    # applied to the wrong table row changes the result.
    initial = np.arange(1, 21, dtype=np.float32).reshape(10, 2)

    def model_fn(features, labels, mode):
      table = tf1.get_variable('table', [10, 2],
                               initializer=tf1.constant_initializer(initial))
      emb = tf.nn.embedding_lookup(table, features['ids'])
      loss = tf.reduce_mean(tf.square(emb - labels))
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(1.0)).minimize(loss)
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    ids = np.array([0, 1, 1, 3], np.int32)
    labels = np.zeros((4, 2), np.float32)
    with tf.Graph().as_default() as graph:
      spec = replicate.replicate_model_fn(model_fn, devices=mt.cpus(2))(
          {'ids': tf.constant(ids)}, tf.constant(labels), mt.TRAIN)
      op_types = set(op.type for op in graph.get_operations())
      # No dense conversion of the gradients: no UnsortedSegmentSum over the
      # whole table, and the sparse update op is used.
      # Sparse updates are used, and nothing converts the gradient to a dense
      # tensor (that would add an UnsortedSegmentSum over the whole table).
      self.assertTrue(
          op_types & {'ScatterSub', 'ResourceScatterSub', 'ResourceScatterAdd'},
          sorted(op_types))
      self.assertNotIn('UnsortedSegmentSum', op_types)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(spec.train_op)
        table = sess.run(tf1.global_variables()[0])
    # loss = mean over 4 ids x 2 dims of emb^2; d/d emb = 2 emb / 8 = emb / 4
    # per lookup, at rate 1. Row 1 is looked up twice (once per tower):
    # t - 2 t / 4 = t / 2; rows 0 and 3 once: 0.75 t; the others unchanged.
    expected = initial.copy()
    expected[[0, 3]] *= 0.75
    expected[1] *= 0.5
    self.assertAllClose(expected, table)


class EvalAndPredictTest(tf.test.TestCase):

  def _eval(self, num_towers, steps=2):
    features, labels = mt.data(batch_size=8)
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(
          mt.mlp_model_fn, loss_reduction=REDUCTION.MEAN,
          devices=mt.cpus(num_towers))(
              {'x': tf.constant(features['x'])}, tf.constant(labels), mt.EVAL,
              {})
      with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as sess:
        sess.run([tf1.global_variables_initializer(),
                  tf1.local_variables_initializer()])
        for _ in range(steps):
          sess.run([op for _, op in spec.eval_metric_ops.values()])
        values = sess.run({k: v for k, (v, _) in spec.eval_metric_ops.items()})
        values['loss'] = sess.run(spec.loss)
        return values

  def test_metrics_match_one_device(self):
    expected = self._eval(1)
    for num_towers in (2, 4):
      actual = self._eval(num_towers)
      self.assertAllClose(expected, actual, rtol=1e-6)

  def test_metric_reduction_is_idempotent(self):
    features, labels = mt.data(batch_size=4)
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(
          mt.mlp_model_fn, devices=mt.cpus(2))(
              {'x': tf.constant(features['x'])}, tf.constant(labels), mt.EVAL,
              {})
      value, update = spec.eval_metric_ops['mean_probability']
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as sess:
        sess.run([tf1.global_variables_initializer(),
                  tf1.local_variables_initializer()])
        sess.run(update)
        once = sess.run(value)
        sess.run(update)
        twice = sess.run(value)
    # Two updates on the same batch: the running mean is unchanged.
    self.assertAllClose(once, twice)

  def test_predictions_in_batch_order(self):
    features, _ = mt.data(batch_size=8)
    outputs = {}
    for num_towers in (1, 4):
      with tf.Graph().as_default():
        spec = replicate.replicate_model_fn(
            mt.mlp_model_fn, devices=mt.cpus(num_towers))(
                {'x': tf.constant(features['x'])}, None, mt.PREDICT, {})
        export = spec.export_outputs['regression']
        with tf1.Session(
            config=replicate.testing.virtual_cpu_config(4)) as sess:
          sess.run(tf1.global_variables_initializer())
          outputs[num_towers] = sess.run([spec.predictions, export.value])
    self.assertAllClose(outputs[1], outputs[4])
    self.assertEqual((8, 1), outputs[4][1].shape)

  def test_export_outputs_concatenated(self):
    def model_fn(features, labels, mode):
      del labels
      scores = tf.stack([features['x'], -features['x']], axis=1)
      # Distinct per row, and not made from the scores.
      classes = tf.as_string(tf.cast(
          tf.stack([features['x'], 10. * features['x']], axis=1), tf.int32))
      return tf1.estimator.EstimatorSpec(
          mode, predictions={'scores': scores},
          export_outputs={
              'serving_default': tf1.estimator.export.ClassificationOutput(
                  scores=scores, classes=classes),
              'predict': tf1.estimator.export.PredictOutput({'s': scores}),
              # Scores alone: no classes to copy.
              'scores_only': tf1.estimator.export.ClassificationOutput(
                  scores=scores),
          })

    with tf.Graph().as_default():
      spec = replicate.replicate_model_fn(model_fn, devices=mt.cpus(2))(
          {'x': tf.constant([1., 2., 3., 4.])}, None, mt.PREDICT)
      classification = spec.export_outputs['serving_default']
      self.assertEqual([4, 2], classification.classes.shape.as_list())
      self.assertIsNone(spec.export_outputs['scores_only'].classes)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as sess:
        scores, classes, predicted, scores_only = sess.run([
            classification.scores, classification.classes,
            spec.export_outputs['predict'].outputs['s'],
            spec.export_outputs['scores_only'].scores
        ])
    self.assertAllClose([[1, -1], [2, -2], [3, -3], [4, -4]], scores)
    self.assertAllClose(scores, predicted)
    self.assertAllClose(scores, scores_only)
    self.assertAllEqual([[b'1', b'10'], [b'2', b'20'], [b'3', b'30'],
                         [b'4', b'40']], classes)

  def test_scalar_classes_stacked_per_tower_as_contrib(self):
    # One class string per tower, not per row: one device and contrib
    # predict with it; contrib stacks it per tower, and so does replicate.
    def model_fn(features, labels, mode):
      del labels
      scores = tf.stack([features['x'], -features['x']], axis=1)
      output = tf1.estimator.export.ClassificationOutput(
          scores=scores, classes=tf.constant('digit'))
      return tf1.estimator.EstimatorSpec(
          mode, predictions={'scores': scores},
          export_outputs={'classes': output})

    with tf.Graph().as_default():
      spec = replicate.replicate_model_fn(model_fn, devices=mt.cpus(2))(
          {'x': tf.constant([1., 2., 3.])}, None, mt.PREDICT)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as sess:
        classes = sess.run(spec.export_outputs['classes'].classes)
    self.assertAllEqual([b'digit', b'digit'], classes)

    def input_fn():
      return tf.data.Dataset.from_tensor_slices(
          {'x': np.array([1., 2., 3., 4., 5.], np.float32)}).batch(5)

    predicted = {}
    for name, fn in (('one', model_fn),
                     ('two', replicate.replicate_model_fn(
                         model_fn, devices=mt.cpus(2)))):
      estimator = tf1.estimator.Estimator(
          fn, config=tf1.estimator.RunConfig(
              session_config=replicate.testing.virtual_cpu_config(2)))
      predicted[name] = [p['scores'] for p in estimator.predict(input_fn)]
    # Rows 1..5 in order: x and -x.
    self.assertAllClose([[x, -x] for x in (1., 2., 3., 4., 5.)],
                        predicted['two'])
    self.assertAllClose(predicted['one'], predicted['two'])


class PlacementAndNamingTest(tf.test.TestCase, parameterized.TestCase):

  def _build(self, devices, **kwargs):
    features, labels = mt.data(batch_size=8)
    graph = tf.Graph()
    with graph.as_default():
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(mt.mlp_model_fn, devices=devices, **kwargs)(
          {'x': tf.constant(features['x'])}, tf.constant(labels), mt.TRAIN,
          {})
    return graph

  def test_variables_on_consolidation_device_and_unreplicated_names(self):
    graph = self._build(mt.cpus(4))
    with graph.as_default():
      names = sorted(v.op.name for v in tf1.global_variables())
      for var in tf1.global_variables():
        if var.op.name != 'global_step':
          self.assertEqual('/device:CPU:0', var.device, var.op.name)
    self.assertEqual(
        ['global_step', 'hidden/bias', 'hidden/kernel', 'logits/bias',
         'logits/kernel'], names)
    ops = {op.name: op for op in graph.get_operations()}
    # Tower 0 has no prefix; tower 3 runs on CPU:3 under tower_3/.
    self.assertIn('hidden/MatMul', ops)
    self.assertEqual('/device:CPU:0', ops['hidden/MatMul'].device)
    self.assertEqual('/device:CPU:3', ops['tower_3/hidden/MatMul'].device)

  @parameterized.parameters(
      {}, {'variable_placement': replicate.VariablePlacement.REPLICATED})
  def test_copies_named_from_the_top_whatever_scope_copying_starts_in(
      self, **kwargs):
    # A canned head calls minimize inside its `head` name scope: the copies
    # are still tower_<i>/<tower 0's name>, as documented.
    def model_fn(features, labels, mode, params):
      with tf1.name_scope('head'):
        return mt.mlp_model_fn(features, labels, mode, params)

    features, labels = mt.data(batch_size=8)
    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(model_fn, devices=mt.cpus(2), **kwargs)(
          {'x': tf.constant(features['x'])}, tf.constant(labels), mt.TRAIN,
          {})
      names = [op.name for op in graph.get_operations()]
      local = [v.op.name for v in tf1.local_variables()]
    self.assertIn('tower_1/head/hidden/MatMul', names)
    self.assertFalse([n for n in names if n.startswith('head/tower_1')])
    if kwargs:
      self.assertIn('tower_1/hidden/kernel', local)

  def test_round_robin_placement(self):
    graph = self._build(
        mt.cpus(2),
        variable_placement=replicate.VariablePlacement.ROUND_ROBIN)
    with graph.as_default():
      devices = [v.device for v in tf1.trainable_variables()]
    # Four trainable variables alternate over the two tower devices.
    self.assertEqual(['/device:CPU:0', '/device:CPU:1'] * 2, devices)

  def test_no_replication_state_left_in_graph(self):
    graph = self._build(mt.cpus(4))
    for key in graph.get_all_collection_keys():
      self.assertNotIn('replicate', key)
    self.assertIsNone(replicate.get_tower_context())

  def test_tower_context_visible_in_model_fn(self):
    seen = []

    def model_fn(features, labels, mode):
      del labels
      context = replicate.get_tower_context()
      seen.append((context.tower_id, context.num_towers, context.device,
                   context.is_first_tower, context.is_last_tower))
      return tf1.estimator.EstimatorSpec(mode, predictions=features)

    with tf.Graph().as_default():
      replicate.replicate_model_fn(model_fn, devices=['/cpu:0', '/cpu:1'])(
          tf.zeros([4, 1]), None, mt.PREDICT)
    self.assertEqual([(0, 2, '/device:CPU:0', True, False),
                      (1, 2, '/device:CPU:1', False, True)], seen)

  def test_single_device_is_only_placed(self):
    graph = self._build(['/cpu:1'])
    ops = [op.name for op in graph.get_operations()]
    self.assertFalse(any(name.startswith('split_inputs') for name in ops))
    self.assertFalse(any(name.startswith('tower_') for name in ops))
    self.assertEqual('/device:CPU:1',
                     graph.get_operation_by_name('hidden/MatMul').device)


class UpdateOpsPolicyTest(tf.test.TestCase, parameterized.TestCase):
  """Batch-norm moving statistics: tower 0's updates only."""

  @staticmethod
  def _model_fn(features, labels, mode, params=None):
    """BN model; params['wait_at']: where the update ops are waited for."""
    normalized = tf1.layers.batch_normalization(
        features['x'], momentum=0.5, training=mode == mt.TRAIN, name='bn')
    logits = tf1.layers.dense(
        normalized, 1, kernel_initializer=tf1.glorot_uniform_initializer(
            seed=4), name='logits')
    loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
    update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    optimizer = replicate.TowerOptimizer(
        tf1.train.GradientDescentOptimizer(0.1))
    if (params or {}).get('wait_at') == 'apply_gradients':
      grads_and_vars = optimizer.compute_gradients(loss)
      with tf1.control_dependencies(update_ops):
        train_op = optimizer.apply_gradients(grads_and_vars,
                                             tf1.train.get_global_step())
    else:
      with tf1.control_dependencies(update_ops):
        train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  @staticmethod
  def _train(steps, tower_build, params=None):
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    labels = np.ones((8, 1), np.float32)
    replicate_fn = functools.partial(replicate.replicate_model_fn,
                                     tower_build=tower_build)
    return x, mt.train_variables(UpdateOpsPolicyTest._model_fn, {'x': x},
                                 labels, mt.cpus(4), steps=steps,
                                 params=params, replicate_fn=replicate_fn)

  @parameterized.named_parameters(
      ('cloned', replicate.TowerBuild.CLONE),
      ('per_tower', replicate.TowerBuild.CALL_PER_TOWER))
  def test_moving_statistics_deterministic_and_from_first_tower(
      self, tower_build):
    x, first = self._train(1, tower_build)
    _, second = self._train(1, tower_build)
    for name in ('bn/moving_mean', 'bn/moving_variance'):
      self.assertAllEqual(first[name], second[name])  # bit-identical
    # One step, momentum 0.5, moving_mean starts at 0: 0.5 * mean(shard 0).
    # Tower 0's shard is rows 0, 1: x[0:2].mean(0) = [2, 3, 4, 5].
    self.assertAllClose(0.5 * x[0:2].mean(axis=0), first['bn/moving_mean'])
    # Longer runs stay bit-identical too.
    _, third = self._train(4, tower_build)
    _, fourth = self._train(4, tower_build)
    for name in ('bn/moving_mean', 'bn/moving_variance'):
      self.assertAllEqual(third[name], fourth[name])

  @parameterized.named_parameters(
      ('cloned', replicate.TowerBuild.CLONE),
      ('per_tower', replicate.TowerBuild.CALL_PER_TOWER))
  def test_updates_waited_for_at_apply_gradients(self, tower_build):
    x, values = self._train(1, tower_build, {'wait_at': 'apply_gradients'})
    # As above: tower 0's updates ran, once: 0.5 * x[0:2].mean(0).
    self.assertAllClose(0.5 * x[0:2].mean(axis=0), values['bn/moving_mean'])

  @staticmethod
  def _renorm_model_fn(features, labels, mode, params=None):
    """Batch renormalization: the forward pass reads what updates write."""
    del params
    hidden = tf1.layers.dense(
        features['x'], 3, name='hidden', kernel_initializer=(
            tf1.constant_initializer([[.3, -.2, .5], [.1, .4, -.3]])))
    hidden = tf1.layers.batch_normalization(
        hidden, training=True, renorm=True, momentum=0.5,
        renorm_momentum=0.5, name='bn')
    prediction = tf1.layers.dense(tf.nn.tanh(hidden), 1, name='out',
                                  kernel_initializer=tf1.ones_initializer())
    loss = tf1.losses.mean_squared_error(labels, prediction)
    if mode != mt.TRAIN:  # the reference's per-shard loss
      return loss
    optimizer = replicate.TowerOptimizer(
        tf1.train.GradientDescentOptimizer(0.5))
    with tf1.control_dependencies(
        tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
      train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  @parameterized.named_parameters(
      ('cloned', replicate.TowerBuild.CLONE),
      ('per_tower', replicate.TowerBuild.CALL_PER_TOWER))
  def test_forward_reads_of_updated_variables_precede_the_update(
      self, tower_build):
    # Every tower reads renorm_mean / renorm_stddev as they were before the
    # step, tower 0's update writes them after all the reads: the step is
    # the mean of 4 one-device gradients at the initial weights, each on
    # its shard of 3 rows (MEAN over equal shards), applied with SGD 0.5.
    x = ((np.arange(24, dtype=np.float32).reshape(12, 2) ** 1.5 / 10) %
         3.1).astype(np.float32)
    labels = np.sin(np.arange(12, dtype=np.float32)).reshape(12, 1)
    with tf.Graph().as_default():
      shard_x = tf1.placeholder(tf.float32, [3, 2])
      shard_labels = tf1.placeholder(tf.float32, [3, 1])
      loss = self._renorm_model_fn({'x': shard_x}, shard_labels, mt.EVAL)
      variables = tf1.trainable_variables()
      gradients = tf.gradients(loss, variables)
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        initial = sess.run(variables)
        mean = [np.mean(g, axis=0) for g in zip(*[
            sess.run(gradients, {shard_x: x[i:i + 3],
                                 shard_labels: labels[i:i + 3]})
            for i in range(0, 12, 3)])]
      expected = {v.op.name: w - 0.5 * g
                  for v, w, g in zip(variables, initial, mean)}
    replicate_fn = functools.partial(replicate.replicate_model_fn,
                                     tower_build=tower_build)
    for _ in range(3):  # a race shows in some runs, not in all
      got = mt.train_variables(self._renorm_model_fn, {'x': x}, labels,
                               mt.cpus(4), steps=1, replicate_fn=replicate_fn)
      for name, value in expected.items():
        self.assertAllClose(value, got[name], rtol=1e-5, atol=1e-6,
                            msg=name)

  @parameterized.named_parameters(
      ('cloned', replicate.TowerBuild.CLONE),
      ('per_tower', replicate.TowerBuild.CALL_PER_TOWER))
  def test_collection_holds_first_tower_updates_afterwards(self, tower_build):
    x = np.zeros((8, 4), np.float32)
    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(
          self._model_fn, devices=mt.cpus(4), tower_build=tower_build)(
              {'x': tf.constant(x)}, tf.constant(np.ones((8, 1), np.float32)),
              mt.TRAIN)
      updates = graph.get_collection(tf1.GraphKeys.UPDATE_OPS)
    self.assertLen(updates, 2)  # moving mean and variance of one tower
    for op in updates:
      self.assertFalse(op.name.startswith('tower_'), op.name)


if __name__ == '__main__':
  tf.test.main()

"""TowerOptimizer's gradient accumulation and compression, through Estimators.

Accumulation: k micro-steps on batches of b rows update the variables as one
step on k * b rows (the loss reduction's semantics), and the global step
advances once per update. Compression (fp16): the gradients cross devices as
float16; the result stays within float16's tolerance of the exact one.
"""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.gradients import accumulation

_NUM_FEATURES = 3
_OPTIMIZERS = {
    'sgd': lambda: tf1.train.GradientDescentOptimizer(0.5),
    'momentum': lambda: tf1.train.MomentumOptimizer(0.3, 0.9),
    'adam': lambda: tf1.train.AdamOptimizer(0.05),
}


def _rows(num_rows, seed=0):
  """Distinct rows and labels, so that a mix-up of micro-batches shows."""
  rng = np.random.RandomState(seed)
  x = rng.uniform(-1, 1, size=(num_rows, _NUM_FEATURES)).astype(np.float32)
  x += np.arange(num_rows, dtype=np.float32)[:, None] * 0.01
  y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
  return x, y


def _model_fn(features, labels, mode, params):
  with tf1.variable_scope('', use_resource=params.get('use_resource')):
    hidden = tf1.layers.dense(
        features['x'], 4, activation=tf.nn.tanh,
        kernel_initializer=tf1.glorot_uniform_initializer(seed=1),
        name='hidden')
    logits = tf1.layers.dense(
        hidden, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
        name='logits')
  loss = tf1.losses.sigmoid_cross_entropy(
      labels, logits, reduction=params['reduction'])
  optimizer = replicate.TowerOptimizer(params['optimizer_fn'],
                                       **params['tower_optimizer'])
  # What models put around minimize (update ops, asserts) depends on the
  # input: the accumulators' initial values must not.
  dependencies = ([tf.reduce_sum(features['x'])]
                  if params.get('input_dependency') else [])
  with tf1.control_dependencies(dependencies):
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _train(model_dir, batch_size, global_steps, optimizer, reduction,
           num_towers=2, tower_build=replicate.TowerBuild.CLONE,
           input_dependency=False, use_resource=None, **tower_optimizer):
  """Trains an Estimator; returns (its variables, its global step)."""
  x, y = _rows(32)

  def input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(({'x': x}, y))
    return dataset.batch(batch_size, drop_remainder=True).repeat()

  estimator = tf1.estimator.Estimator(
      replicate.replicate_model_fn(
          _model_fn, devices=replicate.testing.virtual_cpu_devices(num_towers),
          loss_reduction=reduction, tower_build=tower_build),
      model_dir=model_dir,
      config=tf1.estimator.RunConfig(
          session_config=replicate.testing.virtual_cpu_config(num_towers),
          tf_random_seed=0, save_summary_steps=None),
      params={'optimizer_fn': _OPTIMIZERS[optimizer], 'reduction': reduction,
              'tower_optimizer': tower_optimizer,
              'input_dependency': input_dependency,
              'use_resource': use_resource})
  estimator.train(input_fn, steps=global_steps)
  names = ['hidden/kernel', 'hidden/bias', 'logits/kernel', 'logits/bias']
  return ({n: estimator.get_variable_value(n) for n in names},
          estimator.get_variable_value('global_step'))


def _assert_same_variables(test, whole, accumulated, rtol=1e-5):
  """The variables after k micro-steps equal those after the whole batch,
  within float rounding of the sums' order."""
  for name, value in whole.items():
    test.assertAllClose(value, accumulated[name], rtol=rtol, atol=1e-6,
                        msg=name)


class AccumulationTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.named_parameters(
      ('sgd_mean', 'sgd', tf1.losses.Reduction.MEAN),
      ('momentum_mean', 'momentum', tf1.losses.Reduction.MEAN),
      ('adam_mean', 'adam', tf1.losses.Reduction.MEAN),
      ('sgd_sum', 'sgd', tf1.losses.Reduction.SUM),
  )
  def test_k_micro_steps_equal_one_step_on_k_times_the_batch(
      self, optimizer, reduction):
    # Two updates: with k = 4, micro-batches of 8 rows (4 per tower); without,
    # batches of 32 rows (16 per tower), the same rows in the same order.
    # MEAN: the mean of four micro-batch means is the mean over 32 rows;
    # SUM: the sum of four micro-batch sums is the sum over 32 rows.
    accumulated, accumulated_step = _train(
        self.get_temp_dir() + '/k4', 8, 2, optimizer, reduction,
        accumulation_steps=4)
    whole, whole_step = _train(
        self.get_temp_dir() + '/k1', 32, 2, optimizer, reduction)
    # `steps=2` counts updates: 8 micro-steps advanced the global step twice.
    self.assertEqual(2, accumulated_step)
    self.assertEqual(2, whole_step)
    _assert_same_variables(self, whole, accumulated)
    # Each update moves the variables, so the comparison can fail: after
    # one update they are elsewhere.
    one_update, _ = _train(self.get_temp_dir() + '/k1_once', 32, 1, optimizer,
                           reduction)
    self.assertNotAllClose(one_update['hidden/kernel'],
                           accumulated['hidden/kernel'])

  @parameterized.named_parameters(
      ('one_tower', 1, replicate.TowerBuild.CLONE),
      ('copies', 2, replicate.TowerBuild.CLONE),
      ('calls', 2, replicate.TowerBuild.CALL_PER_TOWER))
  def test_under_control_dependencies_on_the_input(self, num_towers,
                                                   tower_build):
    # minimize inside control_dependencies of an input-dependent op (the
    # batch-norm idiom's shape): the local-variable initializer ran the
    # step and failed on the uninitialized input iterator. As above, 2
    # updates of 2 micro-batches of 16 rows equal 2 of 32 rows.
    accumulated, step = _train(
        self.get_temp_dir() + '/k2', 16, 2, 'momentum',
        tf1.losses.Reduction.MEAN, num_towers, tower_build,
        input_dependency=True, accumulation_steps=2)
    whole, _ = _train(self.get_temp_dir() + '/k1', 32, 2, 'momentum',
                      tf1.losses.Reduction.MEAN, num_towers, tower_build,
                      input_dependency=True)
    self.assertEqual(2, step)
    _assert_same_variables(self, whole, accumulated)

  def test_one_tower_accumulates_too(self):
    accumulated, step = _train(self.get_temp_dir() + '/k2', 16, 1, 'sgd',
                               tf1.losses.Reduction.MEAN, num_towers=1,
                               accumulation_steps=2)
    whole, _ = _train(self.get_temp_dir() + '/k1', 32, 1, 'sgd',
                      tf1.losses.Reduction.MEAN, num_towers=1)
    self.assertEqual(1, step)
    _assert_same_variables(self, whole, accumulated)

  @parameterized.parameters(1, 2)
  def test_reference_variables(self, num_towers):
    # TF 1 control flow updates reference variables in the `cond` (checked
    # against the whole batch as above); TF 2's cannot, and says so.
    if tf1.control_flow_v2_enabled():
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r"TF 2 control flow cannot update reference variables there: "
          r"\['hidden/kernel', 'hidden/bias', 'logits/kernel', "
          r"'logits/bias'\] are made with use_resource=False"):
        _train(self.get_temp_dir() + '/refs', 16, 1, 'sgd',
               tf1.losses.Reduction.MEAN, num_towers=num_towers,
               use_resource=False, accumulation_steps=2)
      return
    accumulated, step = _train(
        self.get_temp_dir() + '/k2', 16, 1, 'sgd', tf1.losses.Reduction.MEAN,
        num_towers=num_towers, use_resource=False, accumulation_steps=2)
    whole, _ = _train(self.get_temp_dir() + '/k1', 32, 1, 'sgd',
                      tf1.losses.Reduction.MEAN, num_towers=num_towers,
                      use_resource=False)
    self.assertEqual(1, step)
    _assert_same_variables(self, whole, accumulated)

  def test_checkpoints_hold_no_accumulator(self):
    model_dir = self.get_temp_dir() + '/ckpt'
    _train(model_dir, 8, 1, 'momentum', tf1.losses.Reduction.MEAN,
           accumulation_steps=4)
    names = [n for n, _ in tf1.train.list_variables(model_dir)]
    self.assertEqual(
        ['global_step', 'hidden/bias', 'hidden/bias/Momentum',
         'hidden/kernel', 'hidden/kernel/Momentum', 'logits/bias',
         'logits/bias/Momentum', 'logits/kernel', 'logits/kernel/Momentum'],
        sorted(names))

  @parameterized.named_parameters(
      ('zero', 0, errors.InvalidArgumentError,
       'accumulation_steps must be an integer >= 1, got 0'),
      ('float', 2.0, errors.InvalidTypeError,
       'accumulation_steps must be an integer >= 1, got 2.0'),
  )
  def test_bad_accumulation_steps(self, steps, error, message):
    with self.assertRaisesRegex(error, message):
      replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1),
                               accumulation_steps=steps)

  def test_indexed_slices_accumulate_sparsely(self):
    # An embedding's gradient is IndexedSlices: rows 1 and 1 and 3.
    with tf.Graph().as_default():
      table = tf1.get_variable('table', initializer=np.zeros((4, 2),
                                                             np.float32))
      optimizer = tf1.train.GradientDescentOptimizer(1.0)
      grad = tf.IndexedSlices(tf.constant([[1., 2.], [3., 4.], [5., 6.]]),
                              tf.constant([1, 1, 3]), tf.constant([4, 2]))
      applied = []

      def apply_fn(grads_and_vars, step, name):
        applied.extend(grads_and_vars)
        return optimizer.apply_gradients(grads_and_vars, step, name)

      op = accumulation.apply_accumulated(
          apply_fn, [(grad, table)], steps=2, scale=0.5, global_step=None)
      # The optimizer is given the rows the runs named, not every row.
      self.assertIsInstance(applied[0][0], tf.IndexedSlices)
      with tf1.Session() as sess:
        sess.run([tf1.global_variables_initializer(),
                  tf1.local_variables_initializer()])
        sess.run(op)
        self.assertAllEqual(np.zeros((4, 2)), sess.run(table))
        sess.run(op)
        # Two runs of the same slices, averaged: row 1 gets -(1+3, 2+4),
        # row 3 gets -(5, 6).
        self.assertAllClose([[0, 0], [-4, -6], [0, 0], [-5, -6]],
                            sess.run(table))

  @parameterized.named_parameters(
      # Given a zero gradient, FTRL with l1 recomputes a row from its linear
      # accumulator (to 0 here) and RMSProp decays the row's mean square:
      # rows no run named must get no update, as in one run on all rows.
      ('ftrl_l1', lambda: tf1.train.FtrlOptimizer(
          0.5, l1_regularization_strength=0.01)),
      ('rmsprop_momentum', lambda: tf1.train.RMSPropOptimizer(
          0.1, momentum=0.5)),
      ('adagrad', lambda: tf1.train.AdagradOptimizer(0.3)),
  )
  def test_sparse_micro_steps_equal_one_run_on_their_rows(self, optimizer_fn):
    # Micro-step 1 looks up rows 0, 2, 0; micro-step 2 rows 2, 5; rows 1, 3
    # and 4 of the 6 are never named (micro-step 2 pads with a zero row 0,
    # named anyway). One run on both micro-batches gets
    # the concatenated slices; MEAN over the two halves: scale 1/2.
    values = np.arange(10, dtype=np.float32).reshape(5, 2) / 10. - 0.3
    indices = np.array([0, 2, 0, 2, 5], np.int32)
    initial = np.arange(12, dtype=np.float32).reshape(6, 2) / 12. - 0.4
    def gradient_and_feeds(accumulate):
      if accumulate:
        micro = tf1.placeholder(tf.bool, [])
        return tf.IndexedSlices(
            tf1.where(micro, values[:3], np.pad(values[3:], [[0, 1], [0, 0]])),
            tf1.where(micro, indices[:3], np.pad(indices[3:], [0, 1])),
            tf.constant([6, 2])), [{micro: True}, {micro: False}]
      return tf.IndexedSlices(tf.constant(values * 0.5), tf.constant(indices),
                              tf.constant([6, 2])), [{}]

    accumulated, one_run = _accumulated_and_not(initial, optimizer_fn,
                                                gradient_and_feeds)
    self.assertEqual(sorted(one_run), sorted(accumulated))
    _assert_same_variables(self, one_run, accumulated, rtol=1e-6)
    # The rows nobody named kept their initial values.
    self.assertAllEqual(initial[[1, 3, 4]], accumulated['table'][[1, 3, 4]])

  @parameterized.named_parameters(
      ('ftrl_l1', lambda: tf1.train.FtrlOptimizer(
          0.5, l1_regularization_strength=0.01)),
      ('rmsprop_momentum', lambda: tf1.train.RMSPropOptimizer(
          0.1, momentum=0.5)),
  )
  def test_each_cycle_updates_only_its_own_rows(self, optimizer_fn):
    # Cycle 1 names rows 0, 2 and 5; cycle 2 rows 1, 3 and 4. Two runs on
    # each cycle's concatenated slices (MEAN over two micro-steps: scale
    # 1/2) leave rows 0, 2 and 5 alone in the second; so must the
    # accumulator, whose record of named rows starts empty every cycle.
    cycles = [([0, 2, 0], [2, 5]), ([1, 3], [3, 4, 1])]
    initial = np.arange(12, dtype=np.float32).reshape(6, 2) / 12. - 0.4

    def values(indices, offset):
      return (np.arange(2 * len(indices), dtype=np.float32).reshape(-1, 2)
              / 10. - 0.3 + offset)

    def gradient_and_feeds(accumulate):
      fed_values = tf1.placeholder(tf.float32, [None, 2])
      fed_indices = tf1.placeholder(tf.int32, [None])
      grad = tf.IndexedSlices(fed_values, fed_indices, tf.constant([6, 2]))
      if accumulate:
        return grad, [{fed_values: values(part, c), fed_indices: part}
                      for c, cycle in enumerate(cycles) for part in cycle]
      return grad, [{fed_values: 0.5 * np.concatenate(
          [values(part, c) for part in cycle]),
                     fed_indices: np.concatenate(cycle)}
                    for c, cycle in enumerate(cycles)]

    accumulated, two_runs = _accumulated_and_not(initial, optimizer_fn,
                                                 gradient_and_feeds)
    self.assertEqual(sorted(two_runs), sorted(accumulated))
    _assert_same_variables(self, two_runs, accumulated, rtol=1e-6)


def _accumulated_and_not(initial, optimizer_fn, gradient_and_feeds):
  """The variables after two-step accumulation of a `table` gradient (MEAN:
  scale 1/2), then after applying it directly, each in its own graph.

  `gradient_and_feeds(accumulate)` gives the gradient and the feeds of the
  runs, one per micro-step or one per direct application."""
  results = []
  for accumulate in (True, False):
    with tf.Graph().as_default():
      table = tf1.get_variable('table', initializer=initial)
      optimizer = optimizer_fn()
      grad, feeds = gradient_and_feeds(accumulate)
      if accumulate:
        op = accumulation.apply_accumulated(
            lambda gv, step, name: optimizer.apply_gradients(gv),
            [(grad, table)], steps=2, scale=0.5, global_step=None)
      else:
        op = optimizer.apply_gradients([(grad, table)])
      results.append(_run_variables(op, feeds))
  return results


def _run_variables(op, feeds):
  """{name: value} of the global variables after running `op` once per
  feed, in a fresh session of the default graph."""
  with tf1.Session() as sess:
    sess.run([tf1.global_variables_initializer(),
              tf1.local_variables_initializer()])
    for feed in feeds:
      sess.run(op, feed)
    return {v.op.name: sess.run(v) for v in tf1.global_variables()}


class CompressionTest(parameterized.TestCase, tf.test.TestCase):

  def test_fp16_trains_within_float16_tolerance_of_exact(self):
    compressed, _ = _train(self.get_temp_dir() + '/fp16', 16, 3, 'sgd',
                           tf1.losses.Reduction.MEAN, num_towers=4,
                           compression=replicate.Compression.fp16)
    exact, _ = _train(self.get_temp_dir() + '/exact', 16, 3, 'sgd',
                      tf1.losses.Reduction.MEAN, num_towers=4)
    for name, value in exact.items():
      # float16 keeps 11 significant bits: relative error ~5e-4 per sum.
      self.assertAllClose(value, compressed[name], rtol=5e-3, atol=5e-3,
                          msg=name)

  def test_fp16_gradients_cross_devices_as_float16(self):
    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      x, y = _rows(8)
      replicate.replicate_model_fn(
          _model_fn, devices=replicate.testing.virtual_cpu_devices(2))(
              {'x': tf.constant(x)}, tf.constant(y),
              tf1.estimator.ModeKeys.TRAIN,
              {'optimizer_fn': _OPTIMIZERS['sgd'],
               'reduction': tf1.losses.Reduction.MEAN,
               'tower_optimizer': {'compression': replicate.Compression.fp16}},
              None)
    # Each tower casts its 4 gradients to float16 on its own device; the
    # sums are cast back on the variables' device.
    casts = [op for op in graph.get_operations() if op.type == 'Cast' and
             op.get_attr('DstT') == tf.float16]
    self.assertEqual(
        {'/device:CPU:0': 4, '/device:CPU:1': 4},
        {d: sum(1 for op in casts if op.device.endswith(d))
         for d in ('/device:CPU:0', '/device:CPU:1')})

  def test_bad_compression(self):
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                "compression must be replicate.Compression"):
      replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1),
                               compression='fp16')


class MirroredStrategyTest(tf.test.TestCase):

  def _step(self, **tower_optimizer):
    x, y = _rows(8)
    strategy = replicate.MirroredStrategy(
        replicate.testing.virtual_cpu_devices(2))
    with tf.Graph().as_default() as graph:
      with strategy.scope():
        global_step = tf1.train.get_or_create_global_step()
        dataset = tf.data.Dataset.from_tensors(({'x': x}, y)).repeat()
        iterator = strategy.make_dataset_iterator(dataset)

        def step(inputs):
          features, labels = inputs
          logits = tf1.layers.dense(
              features['x'], 1,
              kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
              name='logits')
          loss = tf1.losses.sigmoid_cross_entropy(
              labels, logits, reduction=tf1.losses.Reduction.SUM) / 8.0
          optimizer = replicate.TowerOptimizer(
              tf1.train.GradientDescentOptimizer(0.5), **tower_optimizer)
          return optimizer.minimize(loss, global_step)

        train_op = strategy.group(
            strategy.experimental_run_v2(step, (iterator.get_next(),)))
      with tf1.Session(
          config=replicate.testing.virtual_cpu_config(2)) as sess:
        sess.run([tf1.global_variables_initializer(), iterator.initialize()])
        for _ in range(3):
          sess.run(train_op)
        kernel = [v for v in tf1.global_variables()
                  if v.op.name == 'logits/kernel'][0]
        return sess.run(kernel), graph

  def test_fp16_in_replicas(self):
    exact, _ = self._step()
    compressed, graph = self._step(compression=replicate.Compression.fp16)
    self.assertAllClose(exact, compressed, rtol=5e-3, atol=5e-3)
    self.assertTrue(any(op.type == 'Cast' and op.get_attr('DstT') == tf.float16
                        for op in graph.get_operations()))

  def test_accumulation_in_replicas_raises(self):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        'accumulation_steps=2 is not supported inside MirroredStrategy '
        'replicas'):
      self._step(accumulation_steps=2)


if __name__ == '__main__':
  tf.test.main()

"""ON_READ variables and aggregated assignments inside MirroredStrategy replicas.

Replica i (of 4) adds i + 1 in most tests: its own copy then holds i + 1, and
the copies combine to 1 + 2 + 3 + 4 = 10 (SUM), 10 / 4 = 2.5 (MEAN) or 1
(ONLY_FIRST_REPLICA, replica 0's).
"""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import IS_TF2
from replicate._compat import tf1
from replicate.strategy import sync_on_read

NUM = 4
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)
AGG = tf.VariableAggregation

_COMBINED = (
    ('sum', AGG.SUM, 10.0),
    ('mean', AGG.MEAN, 2.5),
    ('only_first_replica', AGG.ONLY_FIRST_REPLICA, 1.0),
)


def _strategy():
  return replicate.MirroredStrategy(DEVICES)


def _replica_plus_one():
  """i + 1 in replica i, as a float."""
  return float(replicate.get_replica_context().replica_id_in_sync_group) + 1.0


def _on_read(name, aggregation, shape=()):
  return tf1.get_variable(name, shape, initializer=tf1.zeros_initializer(),
                          synchronization=tf.VariableSynchronization.ON_READ,
                          aggregation=aggregation)


class SyncOnReadTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.named_parameters(*_COMBINED)
  def test_replicas_write_their_copy_and_reads_combine(self, aggregation,
                                                       combined):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = _on_read('v', aggregation)
        updates = strategy.experimental_run_v2(
            lambda: v.assign_add(_replica_plus_one()))
        read = v.read_value()
        read_var = strategy.extended.read_var(v)
        converted = tf.convert_to_tensor(v)
        plus_one = v + 1.0
      self.assertIsInstance(v, sync_on_read.SyncOnReadVariable)
      self.assertEqual(v.aggregation, aggregation)
      # ON_READ variables are not trainable, and one entry stands for the
      # copies in the collections.
      self.assertEqual(tf1.global_variables(), [v])
      self.assertEqual(tf1.trainable_variables(), [])
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.unwrap(updates))
        self.assertAllEqual(sess.run(list(v.values)), [1.0, 2.0, 3.0, 4.0])
        self.assertEqual(sess.run(read), combined)
        self.assertEqual(sess.run(read_var), combined)
        self.assertEqual(sess.run(converted), combined)
        self.assertEqual(sess.run(plus_one), combined + 1.0)
        # Fetching the variable itself gives the primary copy, as in TF.
        self.assertEqual(sess.run(v), 1.0)

  def test_reads_across_replicas_as_tf_1_15(self):
    # Copies 1, 2, 3, 4 (SUM: 10). In the strategy's scope a fetch of the
    # variable, a conversion and an operator combine them (TF's get()
    # there is the cross-replica value); outside its scope they are the
    # primary's (TF's default replica context is replica 0); read_value()
    # combines in both; value() is the nearest copy.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = _on_read('v', AGG.SUM)
        updates = strategy.experimental_run_v2(
            lambda: v.assign_add(_replica_plus_one()))
        inside = {'converted': tf.identity(v), 'plus_one': v + 1.0,
                  'read': v.read_value(), 'value': v.value()}
      outside = {'converted': tf.identity(v), 'plus_one': v + 1.0,
                 'read': v.read_value(), 'value': v.value()}
      with tf.device(DEVICES[2]):
        on_copy_2 = v.value()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.unwrap(updates))
        with strategy.scope():
          fetched_inside = sess.run(v)
        fetched_outside = sess.run(v)
        self.assertEqual(10.0, fetched_inside)
        self.assertEqual(1.0, fetched_outside)
        self.assertEqual({'converted': 10.0, 'plus_one': 11.0, 'read': 10.0,
                          'value': 1.0}, sess.run(inside))
        self.assertEqual({'converted': 1.0, 'plus_one': 2.0, 'read': 10.0,
                          'value': 1.0}, sess.run(outside))
        self.assertEqual(3.0, sess.run(on_copy_2))

  def test_reads_inside_a_replica_see_its_copy(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = _on_read('v', AGG.SUM)
        init = v.assign(8.0)  # Cross-replica under SUM: 8 / 4 per copy.

      def read_after_add():
        with tf.control_dependencies([v.assign_add(_replica_plus_one())]):
          return v.read_value()
      reads = strategy.experimental_run_v2(read_after_add)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(init)
        # Copy i: 2 + (i + 1).
        self.assertAllEqual(sess.run(strategy.unwrap(reads)),
                            [3.0, 4.0, 5.0, 6.0])

  @parameterized.named_parameters(
      # assign sets every copy; under SUM to value / 4, so the copies add
      # up to the value.
      ('sum', AGG.SUM, 'assign', 8.0, [2.0] * NUM),
      ('mean', AGG.MEAN, 'assign', 8.0, [8.0] * NUM),
      ('mean_add', AGG.MEAN, 'assign_add', 3.0, [3.0] * NUM),
      ('mean_sub', AGG.MEAN, 'assign_sub', 3.0, [-3.0] * NUM),
      ('first_add', AGG.ONLY_FIRST_REPLICA, 'assign_add', 3.0, [3.0] * NUM))
  def test_cross_replica_assignments(self, aggregation, method, value,
                                     expected):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = _on_read('v', aggregation)
        new_value = getattr(v, method)(value)
        op = getattr(v, method)(value, read_value=False)
      self.assertIsInstance(op, tf.Operation)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        # The combined value after the assignment: the value itself for
        # assign; the copies' mean or first for the others.
        self.assertEqual(sess.run(new_value),
                         value if method == 'assign' else expected[0])
        self.assertAllEqual(sess.run(list(v.values)), expected)
        sess.run(op)
        if method == 'assign':
          self.assertAllEqual(sess.run(list(v.values)), expected)

  def test_assign_without_aggregation_sets_every_copy(self):
    # As TF: no combined value to return, so the op; every copy gets 2.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        unset = _on_read('unset', AGG.NONE)
      assign = unset.assign(2.0)
      self.assertIsInstance(assign, tf1.Operation)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(assign)
        self.assertAllEqual([2.0] * NUM, sess.run(list(unset.values)))

  def test_errors(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        total = _on_read('total', AGG.SUM)
        unset = _on_read('unset', AGG.NONE)
        count = tf1.get_variable(
            'count', [], tf.int32, initializer=tf1.zeros_initializer(),
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=AGG.MEAN)
        with self.assertRaisesRegex(
            errors.InvalidArgumentError,
            r'SyncOnReadVariable.assign_add of total outside the replicas is '
            r'refused: its aggregation is SUM.*4 times over'):
          total.assign_add(1.0)
        with self.assertRaisesRegex(
            errors.InvalidArgumentError,
            'Could not convert from `tf.VariableAggregation` '
            'VariableAggregation.NONE.*ON_READ variable unset has '
            'aggregation NONE.*cannot be combined'):
          unset.read_value()
        with self.assertRaisesRegex(
            errors.InvalidArgumentError,
            'ON_READ variable count of dtype int32 has aggregation MEAN'):
          count.read_value()
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'aggregation must be a '
                                  'tf.VariableAggregation, got 1'):
        sync_on_read.SyncOnReadVariable(strategy, {DEVICES[0]: total.primary},
                                        aggregation=1)

  def test_checkpoint_round_trip_with_one_device_model(self):
    # Saver writes the combined value under the plain name; a restore
    # assigns it as `assign` does (under SUM: a quarter to each copy).
    directory = self.get_temp_dir()
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = _on_read('v', AGG.SUM)
        updates = strategy.experimental_run_v2(
            lambda: v.assign_add(_replica_plus_one()))
      saver = tf1.train.Saver()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.unwrap(updates))
        path = saver.save(sess, directory + '/on_read')
    self.assertEqual(tf.train.list_variables(path), [('v', [])])
    with tf.Graph().as_default():
      plain = tf1.get_variable('v', [])
      saver = tf1.train.Saver()
      with tf1.Session() as sess:
        saver.restore(sess, path)
        self.assertEqual(sess.run(plain), 10.0)
        sess.run(plain.assign(8.0))
        path = saver.save(sess, directory + '/plain')
    with tf.Graph().as_default():
      with strategy.scope():
        v = _on_read('v', AGG.SUM)
      saver = tf1.train.Saver()
      with tf1.Session(config=CONFIG) as sess:
        saver.restore(sess, path)
        self.assertAllEqual(sess.run(list(v.values)), [2.0] * NUM)
        self.assertEqual(sess.run(v.read_value()), 8.0)


class AggregatedAssignTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.named_parameters(*_COMBINED)
  def test_assign_add_inside_replicas_updates_every_copy(self, aggregation,
                                                         combined):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf1.get_variable('v', [], initializer=tf1.zeros_initializer(),
                             aggregation=aggregation)

      def add():
        # Inside a variable scope: the merge_call must leave its nesting
        # intact.
        with tf1.variable_scope('inner'):
          return v.assign_add(_replica_plus_one())
      results = strategy.experimental_run_v2(add)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        # Every replica gets the new value; every copy holds it.
        self.assertAllEqual(sess.run(strategy.unwrap(results)),
                            [combined] * NUM)
        self.assertAllEqual(sess.run(list(v.values)), [combined] * NUM)

  def test_python_numbers_are_each_replicas_value(self):
    # Replica i passes i + 1 (a different Python number each): SUM gives
    # 1 + 2 + 3 + 4 = 10; the same 1 in every replica is one value, whose
    # MEAN is 1 and whose ONLY_FIRST_REPLICA (the global step's aggregation,
    # as in TF) is 1 too.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        total = tf1.get_variable('total', [], aggregation=AGG.SUM,
                                 initializer=tf1.zeros_initializer())
        mean = tf1.get_variable('mean', [], aggregation=AGG.MEAN,
                                initializer=tf1.zeros_initializer())
        step = tf1.train.get_or_create_global_step()
      updates = strategy.experimental_run_v2(
          lambda: (total.assign_add(_replica_plus_one()),
                   mean.assign_add(1.), step.assign_add(1)))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run([strategy.unwrap(u) for u in updates])
        self.assertAllEqual(sess.run(list(total.values)), [10.0] * NUM)
        self.assertAllEqual(sess.run(list(mean.values)), [1.0] * NUM)
        self.assertAllEqual(sess.run(list(step.values)), [1] * NUM)

  # [0., 2.]: some zeros, not all (only a value equal to 0 may be summed).
  @parameterized.parameters((1.0,), ([1.0, 2.0],), ([0.0, 2.0],))
  def test_the_same_python_value_is_not_summed(self, value):
    # TF refuses: one value in every replica is not per-replica (it would
    # be summed 4 times). Zero sums to zero, and is allowed.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        total = tf1.get_variable('total', np.shape(value),
                                 aggregation=AGG.SUM,
                                 initializer=tf1.zeros_initializer())
      with self.assertRaisesRegex(
          ValueError, r'A non-DistributedValues value .* cannot be reduced '
          r'with the given reduce op ReduceOp.SUM'):
        strategy.experimental_run_v2(lambda: total.assign_add(value))
      strategy.experimental_run_v2(
          lambda: total.assign_add(np.zeros_like(value)))

  def test_the_same_python_zero_is_summed(self):
    # Every replica passes the Python float 0.0 (one value to the merge, not
    # per-replica; np.zeros_like above becomes per-replica): 4 x 0 = 0, so
    # TF allows it. assign_add(0.0) keeps 3.0 on every copy; assign(0.0)
    # then sets every copy to 0.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        total = tf1.get_variable('total', [], aggregation=AGG.SUM,
                                 initializer=tf1.constant_initializer(3.0))
      added = strategy.experimental_run_v2(lambda: total.assign_add(0.0))
      with tf.control_dependencies(strategy.experimental_local_results(
          added)):
        after_add = [tf.identity(c) for c in total.values]
      assigned = strategy.experimental_run_v2(lambda: total.assign(0.0))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        self.assertAllEqual([3.0] * NUM, sess.run(after_add))
        sess.run(strategy.unwrap(assigned))
        self.assertAllEqual([0.0] * NUM, sess.run(list(total.values)))

  def test_metrics_inside_replicas_still_raise(self):
    # tf.compat.v1.metrics combine through tf.distribute's own replica
    # context: their variables stay mirrored and refuse replica updates.
    strategy = _strategy()
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.ContextError,
          r'MirroredVariable.assign_add of mean/total was called inside '
          r'replica 0 of its strategy; it is a variable of '
          r'tf.compat.v1.metrics.*build metrics outside the replicas'):
        strategy.experimental_run_v2(
            lambda: tf1.metrics.mean(tf.constant(1.0), name='mean'))


def _batch_norm_model(strategy_cls, wrap, steps=3, batch=16):
  """Trains dense(batch_norm(x)) under `strategy_cls`; returns the values."""
  rng = np.random.RandomState(0)
  x = (rng.normal(size=(batch * steps, 3)) *
       np.arange(1, batch * steps + 1)[:, None] / 10).astype(np.float32)
  y = rng.normal(size=(batch * steps, 1)).astype(np.float32)
  with tf.Graph().as_default():
    strategy = strategy_cls(devices=DEVICES)
    with strategy.scope():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))

      def step(inputs):
        features, labels = inputs
        hidden = tf1.layers.batch_normalization(features, training=True,
                                                momentum=0.5, name='bn')
        predictions = tf1.layers.dense(
            hidden, 1, kernel_initializer=tf1.ones_initializer(), name='d')
        loss = tf.reduce_sum(tf.square(predictions - labels)) / batch
        optimizer = wrap(tf1.train.GradientDescentOptimizer(0.1))
        with tf.control_dependencies(
            tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
          return optimizer.minimize(loss)
      train = strategy.experimental_run(step, iterator)
      reads = {v.op.name: v.read_value() for v in tf1.global_variables()}
      moving_mean = [v for v in tf1.global_variables()
                     if v.op.name == 'bn/moving_mean'][0]
    with tf1.Session(config=CONFIG) as sess:
      sess.run([tf1.global_variables_initializer(), iterator.initialize()])
      sess.run(train)
      copies = sess.run(list(strategy.experimental_local_results(
          moving_mean)))
      for _ in range(steps - 1):
        sess.run(train)
      return x, sess.run(reads), copies


def _keras_model(strategy_cls, wrap, steps=3, batch=16):
  """Trains a Keras Sequential(Dense, BatchNormalization, Dense) built in
  the strategy's scope; returns {name: value} of its variables."""
  rng = np.random.RandomState(1)
  x = rng.normal(size=(batch * steps, 3)).astype(np.float32)
  y = rng.normal(size=(batch * steps, 1)).astype(np.float32)
  with tf.Graph().as_default():
    strategy = strategy_cls(devices=DEVICES)
    with strategy.scope():
      # Built in cross-replica context: Keras calls the layers on a
      # symbolic input, batch normalization's updates included.
      model = tf.keras.Sequential([
          tf.keras.layers.Dense(4, activation='tanh',
                                kernel_initializer='ones', input_shape=(3,)),
          tf.keras.layers.BatchNormalization(momentum=0.5),
          tf.keras.layers.Dense(1, kernel_initializer='ones')])
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))

      def step(inputs):
        features, labels = inputs
        predictions = model(features, training=True)
        loss = tf.reduce_sum(tf.square(predictions - labels)) / batch
        optimizer = wrap(tf1.train.GradientDescentOptimizer(0.1))
        with tf.control_dependencies(model.get_updates_for(features)):
          return optimizer.minimize(loss, var_list=model.trainable_variables)
      train = strategy.experimental_run(step, iterator)
      reads = {v.name: v.read_value() for v in model.variables}
    with tf1.Session(config=CONFIG) as sess:
      sess.run([tf1.global_variables_initializer(), iterator.initialize()])
      for _ in range(steps):
        sess.run(train)
      return sess.run(reads)


class BatchNormalizationTest(tf.test.TestCase):

  def test_keras_model_same_as_tf_mirrored_strategy(self):
    ours = _keras_model(replicate.MirroredStrategy, replicate.TowerOptimizer)
    # The moving statistics moved from their initial values (0 and 1).
    self.assertGreater(np.abs(ours['batch_normalization/moving_mean:0']).max(),
                       1e-3)
    if IS_TF2:
      return  # The reference below is TF 1.15's.
    theirs = _keras_model(tf.distribute.MirroredStrategy,
                          lambda optimizer: optimizer)
    self.assertEqual(sorted(theirs), sorted(ours))
    for name in theirs:
      self.assertAllClose(theirs[name], ours[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  def test_moving_statistics_per_replica(self):
    x, _, copies = _batch_norm_model(replicate.MirroredStrategy,
                                     replicate.TowerOptimizer)
    # After one step from 0 with momentum 0.5, copy i holds half the mean
    # of replica i's rows (rows 4i .. 4i + 3 of the first global batch).
    for i, copy in enumerate(copies):
      self.assertAllClose(copy, 0.5 * x[4 * i:4 * i + 4].mean(axis=0))

  def test_same_as_tf_mirrored_strategy(self):
    if IS_TF2:
      self.skipTest('the reference is TF 1.15 (its MirroredStrategy takes '
                    'a plain optimizer in replicas)')
    _, ours, _ = _batch_norm_model(replicate.MirroredStrategy,
                                   replicate.TowerOptimizer)
    _, theirs, _ = _batch_norm_model(tf.distribute.MirroredStrategy,
                                     lambda optimizer: optimizer)
    self.assertEqual(sorted(theirs), sorted(ours))
    for name in theirs:
      self.assertAllClose(theirs[name], ours[name], rtol=1e-5, atol=1e-6,
                          msg=name)


class SyncOnReadContextsTest(tf.test.TestCase):

  def test_update_sees_the_copy_it_updates(self):
    # extended.update runs fn once per copy, in an update context on that
    # copy's device: there the variable means that copy (TF 1.15's get()),
    # for read_value() as for operators. Copy i (holding i + 1) becomes
    # 10 * (i + 1) + (i + 1) = 11 * (i + 1): 11, 22, 33, 44. Reading the
    # combined value (10) instead would give 110 everywhere.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = _on_read('v', AGG.SUM)
        adds = strategy.experimental_run_v2(
            lambda: v.assign_add(_replica_plus_one()))
        update = strategy.extended.update(
            v, lambda copy: copy.assign(v.read_value() * 10.0 + v,
                                        read_value=False))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.unwrap(adds))
        sess.run(update)
        self.assertAllEqual([11.0, 22.0, 33.0, 44.0], sess.run(list(v.values)))

  def test_cross_replica_assignment_keeps_its_name(self):
    # The value an assignment returns (or, with read_value=False, its op)
    # carries the name given, as for a plain variable.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = _on_read('v', AGG.MEAN)
        new_value = v.assign(2.0, name='set_v')
        op = v.assign_add(3.0, name='add_v', read_value=False)
      self.assertEqual('set_v', new_value.op.name)
      self.assertEqual('add_v', op.name)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        self.assertEqual(2.0, sess.run(new_value))
        sess.run(op)
        self.assertEqual(5.0, sess.run(v.read_value()))  # 2 + 3 per copy

  def test_conversion_to_another_dtype_is_refused(self):
    # In the strategy's scope the conversion is the combined float32 value:
    # asking for int32 is replicate's InvalidTypeError, naming the variable.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = _on_read('v', AGG.SUM)
        with self.assertRaisesRegex(
            errors.InvalidTypeError,
            'Cannot convert ON_READ variable v of dtype float32 to dtype '
            'int32'):
          tf.convert_to_tensor(v, dtype=tf.int32)
        self.assertEqual(tf.float32,
                         tf.convert_to_tensor(v, dtype=tf.float32).dtype)


if __name__ == '__main__':
  tf.test.main()

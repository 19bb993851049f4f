"""Tests of distribute_lib: context rules, default strategy, InputContext."""
import copy
import threading

from absl.testing import parameterized
import tensorflow as tf

import replicate
from replicate import distribute_lib
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.strategy import default_strategy
from replicate.strategy import distribute_context


def _mirrored(num=2):
  return replicate.MirroredStrategy(testing.virtual_cpu_devices(num))


class DefaultStrategyContextTest(tf.test.TestCase):

  def test_default_replica_context(self):
    strategy = replicate.get_strategy()
    self.assertIsInstance(strategy, replicate.Strategy)
    self.assertFalse(replicate.has_strategy())
    self.assertFalse(replicate.in_cross_replica_context())
    self.assertIsNone(replicate.get_cross_replica_context())
    context = replicate.get_replica_context()
    self.assertIsInstance(context, replicate.ReplicaContext)
    self.assertIs(context.strategy, strategy)
    self.assertEqual(context.num_replicas_in_sync, 1)
    self.assertEqual(context.replica_id_in_sync_group, 0)
    self.assertEqual(strategy.num_replicas_in_sync, 1)

  def test_default_strategy_is_the_same_in_every_thread(self):
    seen = []
    thread = threading.Thread(target=lambda: seen.append(
        (replicate.get_strategy(), replicate.has_strategy())))
    thread.start()
    thread.join(10)
    self.assertEqual(seen, [(replicate.get_strategy(), False)])

  def test_default_scope_is_cross_replica(self):
    strategy = replicate.get_strategy()
    with strategy.scope():
      self.assertIsNone(replicate.get_replica_context())
      self.assertIs(replicate.get_cross_replica_context(), strategy)
      self.assertTrue(replicate.in_cross_replica_context())
      self.assertFalse(replicate.has_strategy())
    self.assertIsNotNone(replicate.get_replica_context())

  def test_default_merge_call_runs_in_cross_replica_context(self):
    context = replicate.get_replica_context()
    seen = []

    def merge_fn(strategy, a, b=None):
      seen.append((strategy, replicate.get_replica_context(),
                   replicate.in_cross_replica_context(), a, b))
      return a + b
    self.assertEqual(context.merge_call(merge_fn, args=(1,),
                                        kwargs={'b': 2}), 3)
    self.assertEqual(seen, [(context.strategy, None, True, 1, 2)])
    self.assertIs(replicate.get_replica_context(), context)

  def test_tf_distribute_is_independent(self):
    # tf.distribute has its own default strategy and stack; entering one
    # library's scope must not show up in the other.
    strategy = _mirrored()
    tf_strategy = tf.distribute.OneDeviceStrategy('/cpu:0')
    with tf.Graph().as_default():
      with strategy.scope():
        self.assertFalse(tf.distribute.has_strategy())
        self.assertTrue(replicate.has_strategy())
      with tf_strategy.scope():
        self.assertTrue(tf.distribute.has_strategy())
        self.assertFalse(replicate.has_strategy())
        self.assertIsNotNone(replicate.get_replica_context())


class ScopeRulesTest(tf.test.TestCase):

  def test_scope_makes_strategy_current_and_cross_replica(self):
    strategy = _mirrored()
    with strategy.scope() as entered:  # as in TF, the scope gives the strategy
      self.assertIs(entered, strategy)
      self.assertIs(replicate.get_strategy(), strategy)
      self.assertTrue(replicate.has_strategy())
      self.assertIsNone(replicate.get_replica_context())
      self.assertIs(replicate.get_cross_replica_context(), strategy)
      with strategy.scope() as again:  # Re-entering the same scope is allowed.
        self.assertIs(again, strategy)
        self.assertIs(replicate.get_strategy(), strategy)
      self.assertIs(replicate.get_strategy(), strategy)
    self.assertFalse(replicate.has_strategy())

  def test_mixing_two_strategies_raises(self):
    first, second = _mirrored(), _mirrored()
    with first.scope():
      with self.assertRaisesRegex(errors.ContextError,
                                  'Mixing different strategies.*scope'):
        with second.scope():
          pass
      default = default_strategy.default_strategy()
      with self.assertRaisesRegex(errors.ContextError,
                                  'Mixing different strategies'):
        with default.scope():
          pass
    # Both scopes were popped cleanly.
    self.assertFalse(replicate.has_strategy())

  def test_strategy_methods_of_another_strategy_raise(self):
    first, second = _mirrored(), _mirrored()
    with tf.Graph().as_default(), first.scope():
      with self.assertRaisesRegex(errors.ContextError,
                                  'Mixing different strategies'):
        second.extended.call_for_each_replica(lambda: None)

  def test_scope_inside_replica_raises(self):
    strategy = _mirrored()

    def fn():
      with strategy.scope():
        pass
    with tf.Graph().as_default():
      # TF's sentence first, as TF raises it.
      with self.assertRaisesRegex(
          errors.ContextError,
          r'^Method requires being in cross-replica context, use '
          r'get_replica_context\(\)\.merge_call\(\)\. Strategy\.scope\(\) '
          r'was entered inside a replica \(replica 0\)'):
        strategy.extended.call_for_each_replica(fn)

  def test_run_inside_replica_says_run_enters_the_scope(self):
    # The user never wrote scope(): the message names run as the way in.
    strategy = _mirrored()
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.ContextError,
          r'entered inside a replica \(replica 0\) of the same strategy '
          r'\(directly, or by run, experimental_run_v2'):
        strategy.experimental_run_v2(
            lambda: strategy.experimental_run_v2(lambda: 1.0))

  def test_merge_call_in_cross_replica_context_raises(self):
    context = replicate.get_replica_context()
    with _mirrored().scope():
      with self.assertRaisesRegex(
          errors.ContextError,
          'merge_call must be called in its replica context, but was called '
          'in a cross-replica context'):
        context.merge_call(lambda strategy: None)

  def test_merge_call_inside_merge_fn_raises(self):
    context = replicate.get_replica_context()
    with self.assertRaisesRegex(errors.ContextError,
                                'merge_call must be called in its replica'):
      context.merge_call(lambda strategy: context.merge_call(lambda s: None))

  def test_merge_call_needs_a_callable(self):
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'merge_call needs a callable'):
      replicate.get_replica_context().merge_call(3)

  def test_cross_replica_methods_inside_replica_raise(self):
    strategy = _mirrored()
    messages = []

    def fn():
      for call in (
          lambda: strategy.extended.reduce_to(
              replicate.ReduceOp.SUM, tf.constant(1.), '/cpu:0'),
          lambda: strategy.extended.call_for_each_replica(lambda: None),
          lambda: strategy.reduce(replicate.ReduceOp.SUM, tf.constant(1.))):
        try:
          call()
        except errors.ContextError as e:
          messages.append(str(e))
    with tf.Graph().as_default():
      strategy.extended.call_for_each_replica(fn)
    # 2 replicas x 3 calls, each refused.
    self.assertLen(messages, 6)
    self.assertRegex(messages[0], 'reduce_to must be called in a cross-replica '
                     r'context, but was called inside a replica \(replica 0\)'
                     '.*merge_call')
    self.assertRegex(messages[1], 'call_for_each_replica must be called in a '
                     'cross-replica context')
    self.assertRegex(messages[2], 'reduce must be called in a cross-replica')

  def test_out_of_order_exit_raises(self):
    strategy = _mirrored()
    inner = replicate.get_replica_context()
    outer = strategy.scope()
    outer.__enter__()
    manager = distribute_context.push_replica(inner)
    manager.__enter__()
    with self.assertRaisesRegex(errors.ContextError,
                                'not properly nested'):
      outer.__exit__(None, None, None)
    # The stack is consistent again.
    self.assertFalse(replicate.has_strategy())


class DefaultStrategyMethodsTest(tf.test.TestCase):

  def test_identity_reductions_and_updates(self):
    strategy = replicate.get_strategy()
    extended = strategy.extended
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        v = tf1.get_variable('v', initializer=2.0, use_resource=True)
      t = tf.constant(3.0)
      sum_op = replicate.ReduceOp.SUM
      self.assertIs(extended.reduce_to(sum_op, t, '/cpu:0'), t)
      self.assertEqual(extended.batch_reduce_to(sum_op, [(t, v)]), [t])
      self.assertIs(strategy.reduce(replicate.ReduceOp.MEAN, t), t)
      self.assertIs(extended.broadcast_to(t, '/cpu:0'), t)
      self.assertEqual(strategy.unwrap(t), (t,))
      self.assertEqual(strategy.experimental_local_results(t), (t,))
      self.assertIs(extended.value_container(v), v)
      self.assertTrue(extended.variable_created_in_scope(v))
      seen = []

      def update(var, delta):
        seen.append(replicate.distribute_lib.get_update_device())
        return var.assign_add(delta)
      op = extended.update(v, update, args=(1.5,))
      self.assertEqual(seen, [v.device])
      step = extended.non_slot_devices([v])
      self.assertIs(step, v)
      op2 = extended.update_non_slot(step, lambda: v.assign_add(10.0),
                                     group=False)
      self.assertIsInstance(op2, tuple)
      replica_result = extended.call_for_each_replica(
          lambda x: (replicate.get_replica_context().replica_id_in_sync_group,
                     x), args=(5,))
      self.assertEqual(replica_result, (0, 5))
      with tf1.Session() as sess:
        sess.run(v.initializer)
        sess.run(op)
        self.assertAllClose(sess.run(v), 3.5)  # 2 + 1.5
        sess.run(op2)
        self.assertAllClose(sess.run(v), 13.5)  # 3.5 + 10
        self.assertAllClose(sess.run(extended.read_var(v)), 13.5)
        self.assertIsNone(sess.run(strategy.group([op])))

  def test_default_has_no_fixed_devices(self):
    with self.assertRaisesRegex(errors.ContextError,
                                'default strategy has no fixed devices'):
      _ = replicate.get_strategy().extended.worker_devices

  def test_default_replica_devices_follow_tf_device(self):
    with tf.Graph().as_default(), tf.device('/cpu:0'):
      devices = replicate.get_replica_context().devices
    self.assertLen(devices, 1)
    self.assertIn('CPU:0', devices[0])

  def test_default_iterators_do_not_split(self):
    strategy = replicate.get_strategy()
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(8).batch(4))
      batch = iterator.get_next()
      fn_iterator = strategy.make_input_fn_iterator(
          lambda ctx: tf.data.Dataset.range(8).batch(
              ctx.get_per_replica_batch_size(4)))
      fn_batch = fn_iterator.get_next()
      with tf1.Session() as sess:
        sess.run(iterator.initialize() + fn_iterator.initialize())
        self.assertAllEqual(sess.run(batch), [0, 1, 2, 3])
        self.assertAllEqual(sess.run(fn_batch), [0, 1, 2, 3])

  def test_bad_arguments(self):
    extended = replicate.get_strategy().extended
    # 'sum' and 'MEAN' are taken, as TF takes them; 'prod' is not.
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                r'`reduce_op` must be Reduce.SUM or '
                                r"Reduce.MEAN. Cannot reduce with 'prod'"):
      extended.reduce_to('prod', 1.0, '/cpu:0')
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                "destinations is ''; name at least one"):
      extended.reduce_to(replicate.ReduceOp.SUM, 1.0, '')
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'batch_reduce_to needs a list of'):
      extended.batch_reduce_to(replicate.ReduceOp.SUM, [1.0])
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'call_for_each_replica needs a callable'):
      extended.call_for_each_replica(None)
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'update needs a callable'):
      extended.update(None, 'fn')
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'update_non_slot needs a callable'):
      extended.update_non_slot(None, 'fn')
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'replication_mode must be '
                                'InputReplicationMode.PER_WORKER'):
      replicate.get_strategy().make_input_fn_iterator(lambda c: None,
                                                      'PER_WORKER')
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'input_fn must be a callable'):
      replicate.get_strategy().make_input_fn_iterator(None)
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'dataset must be a tf.data.Dataset'):
      replicate.get_strategy().make_dataset_iterator([1, 2])
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.InvalidTypeError,
          'The value returned by input_fn must be a tf.data.Dataset'):
        replicate.get_strategy().make_input_fn_iterator(lambda ctx: 3)

  def test_configure_and_config_proto(self):
    strategy = _mirrored()
    config = testing.virtual_cpu_config(2)
    updated = strategy.update_config_proto(config)
    self.assertIsNot(updated, config)
    self.assertEqual(updated, config)
    strategy.configure(session_config=config)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'runs on local devices only'):
      strategy.configure(cluster_spec={'worker': ['localhost:1']})
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'update_config_proto needs a'):
      strategy.update_config_proto({})

  def test_properties(self):
    extended = _mirrored().extended
    self.assertFalse(extended.experimental_between_graph)
    self.assertTrue(extended.experimental_should_init)
    self.assertTrue(extended.should_checkpoint)
    self.assertTrue(extended.should_save_summary)
    self.assertIs(replicate.distribute_lib.DistributionStrategy,
                  replicate.Strategy)
    self.assertIs(replicate.distribute_lib.ReduceOp, replicate.ReduceOp)
    self.assertIs(replicate.distribute_lib.DistributionStrategyExtended,
                  replicate.StrategyExtended)


class CopyTest(tf.test.TestCase):

  def test_deepcopy_works_and_copy_raises(self):
    strategy = _mirrored(3)
    copied = copy.deepcopy(strategy)
    self.assertIsNot(copied, strategy)
    self.assertIsNot(copied.extended, strategy.extended)
    self.assertIs(copied.extended._container_strategy(), copied)  # pylint: disable=protected-access
    self.assertEqual(copied.extended.worker_devices,
                     strategy.extended.worker_devices)
    self.assertEqual(copied.num_replicas_in_sync, 3)
    with self.assertRaisesRegex(errors.ContextError,
                                'cannot be shallow-copied.*deepcopy'):
      copy.copy(strategy)
    # The copy is a strategy of its own.
    with strategy.scope():
      with self.assertRaisesRegex(errors.ContextError, 'Mixing'):
        with copied.scope():
          pass

  def test_deepcopy_of_a_used_strategy_starts_clean(self):
    strategy = _mirrored()
    with tf.Graph().as_default(), strategy.scope():
      v = tf1.get_variable('v', initializer=1.0)
      copied = copy.deepcopy(strategy)
      self.assertTrue(strategy.extended.variable_created_in_scope(v))
      self.assertFalse(copied.extended.variable_created_in_scope(v))

  def test_default_strategy_deepcopies_to_itself(self):
    strategy = replicate.get_strategy()
    self.assertIs(copy.deepcopy(strategy), strategy)


class InputContextTest(parameterized.TestCase, tf.test.TestCase):

  def test_defaults(self):
    context = replicate.InputContext()
    self.assertEqual((context.num_input_pipelines, context.input_pipeline_id,
                      context.num_replicas_in_sync), (1, 0, 1))
    self.assertEqual(context.get_per_replica_batch_size(7), 7)

  @parameterized.parameters((64, 4, 16), (64, 8, 8), (6, 3, 2), (5, 5, 1))
  def test_per_replica_batch_size(self, global_batch, replicas, expected):
    context = replicate.InputContext(num_input_pipelines=2,
                                     input_pipeline_id=1,
                                     num_replicas_in_sync=replicas)
    # global_batch / replicas, exactly.
    self.assertEqual(context.get_per_replica_batch_size(global_batch),
                     expected)
    self.assertIn('input_pipeline_id=1', repr(context))

  def test_not_divisible_raises(self):
    context = replicate.InputContext(num_replicas_in_sync=4)
    with self.assertRaisesRegex(
        ValueError, r'global batch size \(65\) is not divisible by the number '
        r'of replicas in sync \(4\); use a global batch size that is a '
        'multiple of 4'):
      context.get_per_replica_batch_size(65)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'input_pipeline_id 2 is out of range for 2'):
      replicate.InputContext(num_input_pipelines=2, input_pipeline_id=2)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'num_replicas_in_sync must be an integer >= 1, got 0'):
      replicate.InputContext(num_replicas_in_sync=0)
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'num_input_pipelines must be an integer'):
      replicate.InputContext(num_input_pipelines=1.5)


class UpdateContextTest(tf.test.TestCase):

  def test_nesting(self):
    self.assertIsNone(distribute_lib.get_update_device())
    with distribute_lib.UpdateContext('/cpu:0'):
      self.assertEqual(distribute_lib.get_update_device(), '/cpu:0')
      with distribute_lib.UpdateContext('/cpu:1'):
        self.assertEqual(distribute_lib.get_update_device(), '/cpu:1')
      self.assertEqual(distribute_lib.get_update_device(), '/cpu:0')
    self.assertIsNone(distribute_lib.get_update_device())

  def test_improper_nesting_raises(self):
    outer = distribute_lib.UpdateContext('/cpu:0')
    inner = distribute_lib.UpdateContext('/cpu:1')
    outer.__enter__()
    inner.__enter__()
    with self.assertRaisesRegex(errors.ContextError,
                                r"UpdateContext\('/cpu:0'\) exited while "
                                'another update context was innermost'):
      outer.__exit__(None, None, None)
    inner.__exit__(None, None, None)
    outer.__exit__(None, None, None)
    self.assertIsNone(distribute_lib.get_update_device())


if __name__ == '__main__':
  tf.test.main()

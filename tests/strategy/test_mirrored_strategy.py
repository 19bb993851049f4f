"""Tests of MirroredStrategy on 4 virtual CPUs."""
import os
import threading
import time

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate import mirrored_strategy
from replicate import testing
from replicate._compat import tf1
from replicate.cross_tower import values
from replicate.strategy import mirrored_values
from replicate.strategy.mirrored_copies import ReplicaBuild

NUM = 4
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)
SUM = replicate.ReduceOp.SUM
MEAN = replicate.ReduceOp.MEAN


def _strategy(**kwargs):
  return replicate.MirroredStrategy(DEVICES, **kwargs)


def _bounded(test, fn, timeout=60.0):
  """Runs `fn` in a thread; fails the test (never hangs) after `timeout` s."""
  outcome = {}
  graph = tf1.get_default_graph()  # The default graph is per thread.

  def target():
    try:
      with graph.as_default():
        outcome['result'] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      outcome['error'] = e
  thread = threading.Thread(target=target)
  thread.daemon = True
  thread.start()
  thread.join(timeout)
  test.assertFalse(thread.is_alive(), 'call did not finish in time')
  return outcome


def _replica_threads():
  return [t for t in threading.enumerate()
          if t.name.startswith('replicate_replica_')]


class MirroredVariableTest(tf.test.TestCase):

  def test_variables_in_scope_are_mirrored(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        w = tf1.get_variable(
            'w', [3], initializer=tf1.random_normal_initializer())
      self.assertIsInstance(w, replicate.cross_tower.values.Mirrored)
      self.assertLen(w.values, NUM)
      for i, copy in enumerate(w.values):
        self.assertIn('CPU:{}'.format(i), copy.device)
      self.assertEqual([c.name for c in w.values],
                       ['w:0', 'w/replica_1:0', 'w/replica_2:0',
                        'w/replica_3:0'])
      self.assertEqual(w.name, 'w:0')
      self.assertEqual(tf1.global_variables(), [w])
      self.assertEqual(tf1.trainable_variables(), [w])
      self.assertTrue(strategy.extended.variable_created_in_scope(w))
      self.assertIs(strategy.extended.value_container(w.values[2]), w)
      self.assertEqual(strategy.unwrap(w), w.values)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        copies = sess.run(list(w.values))
        # A random initializer, yet every copy starts from the same value.
        for copy in copies[1:]:
          self.assertAllEqual(copy, copies[0])
        self.assertAllEqual(sess.run(w), copies[0])  # Cross-replica: primary.
        self.assertAllEqual(sess.run(strategy.extended.read_var(w)), copies[0])

  def test_tf_variable_v2_is_mirrored_and_collected_once(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf.Variable(1.0, name='v2')
        local = tf1.Variable(
            2.0, name='local', trainable=False,
            collections=[tf1.GraphKeys.LOCAL_VARIABLES])
      self.assertIsInstance(v, mirrored_values.MirroredVariable)
      self.assertEqual(tf1.global_variables(), [v])
      self.assertEqual(tf1.trainable_variables(), [v])
      self.assertEqual(tf1.local_variables(), [local])

  def test_replica_reads_its_copy_and_update_changes_every_copy(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf1.Variable(0.0, name='v')
      # Give copy i the value i, to see which copy each replica reads.
      set_copies = tf.group(
          *[c.assign(float(i)) for i, c in enumerate(v.values)])
      reads = strategy.experimental_run_v2(lambda: v * 1.0)
      for i, read in enumerate(strategy.unwrap(reads)):
        self.assertIn('CPU:{}'.format(i), read.device)
      deltas = values.PerReplica({d: tf.constant(10.0 * (i + 1))
                                  for i, d in enumerate(DEVICES)})
      seen_devices = []

      def update(copy, delta):
        seen_devices.append(replicate.distribute_lib.get_update_device())
        return copy.assign_add(delta)
      with strategy.scope():
        update_op = strategy.extended.update(v, update, args=(deltas,))
        ungrouped = strategy.extended.update(v, update, args=(1.0,),
                                             group=False)
        assign_op = v.assign(7.0)
      self.assertEqual(seen_devices, list(v.devices) * 2)
      self.assertIsInstance(ungrouped, tuple)
      self.assertLen(ungrouped, NUM)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(v.initializer)
        sess.run(set_copies)
        self.assertAllEqual(sess.run(strategy.unwrap(reads)), [0., 1., 2., 3.])
        sess.run(update_op)
        # copy i: i + 10 * (i + 1).
        self.assertAllEqual(sess.run(list(v.values)), [10., 21., 32., 43.])
        sess.run(assign_op)
        self.assertAllEqual(sess.run(list(v.values)), [7.] * NUM)

  def test_cross_replica_assign_returns_the_new_values_as_tf_does(self):
    # TF: an assign that reads its value (the default) returns a Mirrored of
    # the new values, read once every copy is assigned; read_value=False, an
    # op. `tf.group` and `session.run` take either.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        step = tf1.Variable(0, name='step')
      incremented = step.assign_add(1)
      quiet = step.assign_add(10, read_value=False)
      self.assertIsInstance(incremented, values.Mirrored)
      self.assertEqual(incremented.devices, step.devices)
      self.assertIsInstance(quiet, tf.Operation)
      doubled = incremented * 2
      grouped = tf.group(incremented)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(step.initializer)
        self.assertEqual(sess.run(incremented), 1)
        sess.run(quiet)
        self.assertEqual(sess.run(doubled), 24)  # (11 + 1) * 2
        sess.run(grouped)
        self.assertAllEqual(sess.run(list(step.values)), [13] * NUM)

  def test_checkpoint_round_trip_with_one_device_model(self):
    # Saver writes the primary copy under the plain variable's name and a
    # restore sets every copy, so checkpoints move between a mirrored and an
    # unreplicated model.
    directory = self.get_temp_dir()
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf1.get_variable('v', [2], initializer=tf1.zeros_initializer())
      saver = tf1.train.Saver()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(v.assign([1.0, 2.0]))
        path = saver.save(sess, directory + '/mirrored')
        sess.run(v.assign([0.0, 0.0]))
        saver.restore(sess, path)
        self.assertAllEqual(sess.run(list(v.values)), [[1.0, 2.0]] * NUM)
    self.assertEqual(tf.train.list_variables(path), [('v', [2])])
    with tf.Graph().as_default():
      plain = tf1.get_variable('v', [2])
      saver = tf1.train.Saver()
      with tf1.Session() as sess:
        saver.restore(sess, path)
        self.assertAllEqual(sess.run(plain), [1.0, 2.0])
        sess.run(plain.assign([3.0, 4.0]))
        path = saver.save(sess, directory + '/plain')
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf1.get_variable('v', [2])
      saver = tf1.train.Saver()
      with tf1.Session(config=CONFIG) as sess:
        saver.restore(sess, path)
        self.assertAllEqual(sess.run(list(v.values)), [[3.0, 4.0]] * NUM)

  def test_update_non_slot_runs_once_per_device(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        w = tf1.Variable(0.0, name='w')
        counter = tf1.Variable(0.0, name='counter')
        devices = strategy.extended.non_slot_devices([w])
        # Inside each device's update, assigning the mirrored counter
        # changes that device's copy only: one increment per copy.
        ops = strategy.extended.update_non_slot(
            devices, lambda: counter.assign_add(1.0, read_value=False),
            group=False)
      self.assertEqual(devices, w.devices)
      self.assertLen(ops, NUM)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(ops)
        self.assertAllEqual(sess.run(list(counter.values)), [1.0] * NUM)

  def test_assign_inside_replica_raises(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf1.Variable(0.0, name='v')
      # A ContextError, and the ValueError TF 1.15 raises, with its phrase.
      with self.assertRaisesRegex(
          ValueError,
          r'^You must specify an aggregation method to update a '
          r'MirroredVariable in Replica Context\. '
          r'MirroredVariable.assign_add of v was called inside replica 0 of '
          r'its strategy, and the variable has no aggregation.*'
          r'aggregation=tf.VariableAggregation.SUM, MEAN or '
          r'ONLY_FIRST_REPLICA.*merge_call') as raised:
        strategy.experimental_run_v2(lambda: v.assign_add(1.0))
      self.assertIsInstance(raised.exception, errors.ContextError)

  def test_synchronization_none_is_an_error_as_in_tf(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        with self.assertRaisesRegex(
            errors.InvalidArgumentError,
            r'^`NONE` variable synchronization mode is not supported with '
            r'`Mirrored` distribution strategy. Please change the '
            r'`synchronization` for variable: n\b'):
          tf1.get_variable('n', [],
                           synchronization=tf.VariableSynchronization.NONE)
        # ON_READ is mirrored like any other variable (replicas cannot write
        # it: nothing to aggregate when reading it).
        on_read = tf1.get_variable(
            'r', [], synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM)
      self.assertIsInstance(on_read, mirrored_values.MirroredVariable)

  def test_variables_created_in_replicas_are_shared(self):
    strategy = _strategy()

    def fn():
      a = tf1.get_variable('a', [2], initializer=tf1.ones_initializer())
      b = tf1.Variable(2.0, name='b')
      c = tf1.Variable(3.0, name='b')  # Same requested name, second one.
      return a, b, c
    with tf.Graph().as_default():
      a, b, c = strategy.experimental_run_v2(fn)
      # Every replica returned the same mirrored variables: not per-replica.
      for v in (a, b, c):
        self.assertIsInstance(v, mirrored_values.MirroredVariable)
      self.assertIsNot(b, c)
      self.assertLen(tf1.global_variables(), 3)

  def test_replicas_creating_different_variables_raise(self):
    strategy = _strategy()

    def fn():
      replica = replicate.get_replica_context().replica_id_in_sync_group
      tf1.Variable(1.0, name='x')
      if replica == 2:
        tf1.Variable(1.0, name='x')
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.ContextError,
          r"Replica 2 created variable 'x' \(number 2 of that name\) but "
          'replica 0 created only 1'):
        strategy.experimental_run_v2(fn)

  def test_callers_creators_apply_in_the_replicas_below_their_own(self):
    # As TF copies the caller's creator stack into its replica threads: a
    # creator entered around the call sees replica 0's creation (the other
    # replicas take replica 0's variable), and a replica's own creator wraps
    # what the caller's returns.
    seen = []

    def outer(next_creator, **kwargs):
      seen.append(kwargs['name'])
      return next_creator(**kwargs)

    def fn():
      replica = replicate.get_replica_context().replica_id_in_sync_group

      def inner(next_creator, **kwargs):
        return (next_creator(**kwargs), replica)
      with tf1.variable_creator_scope(inner):
        return tf1.Variable(1.0, name='x')

    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope(), tf1.variable_creator_scope(outer):
        variable, replicas = strategy.extended.call_for_each_replica(fn)
      self.assertEqual(['x'], seen)
      # One variable for all (regrouped as such), wrapped in every replica.
      self.assertIsInstance(variable, mirrored_values.MirroredVariable)
      self.assertEqual(list(range(NUM)),
                       list(strategy.experimental_local_results(replicas)))
      self.assertLen(tf1.global_variables(), 1)

  def test_summaries_are_recorded_by_replica_zero(self):
    self._check_summaries(writer_inside=False)

  def test_summaries_are_recorded_by_replica_zero_writer_inside(self):
    self._check_summaries(writer_inside=True)

  def _check_summaries(self, writer_inside):
    # As TF: the replicas get the caller's TF 2-style summary writer, step
    # and recording condition, and replica 0 alone records. A writer set
    # around the call wrote nothing; one entered inside, NUM events.
    logdir = os.path.join(self.get_temp_dir(), 'inside_%s' % writer_inside)
    strategy = _strategy()
    with tf.Graph().as_default():
      writer = tf.compat.v2.summary.create_file_writer(logdir)

      def fn():
        replica = replicate.get_replica_context().replica_id_in_sync_group
        value = tf.constant(10.0 + replica)
        if writer_inside:
          with writer.as_default():
            return tf.compat.v2.summary.write('a', value)
        return tf.compat.v2.summary.write('a', value)
      with tf.compat.v2.summary.record_if(True):
        tf.compat.v2.summary.experimental.set_step(7)
        if writer_inside:
          written = strategy.experimental_run_v2(fn)
        else:
          with writer.as_default():
            written = strategy.experimental_run_v2(fn)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(writer.init())
        written = sess.run(list(strategy.experimental_local_results(written)))
        sess.run(writer.flush())
    self.assertEqual([True] + [False] * (NUM - 1), written)
    events = [(event.step, value.tag, float(tf1.make_ndarray(value.tensor)))
              for name in os.listdir(logdir)
              for event in tf1.train.summary_iterator(
                  os.path.join(logdir, name))
              for value in event.summary.value]
    self.assertEqual([(7, 'a', 10.0)], events)  # Replica 0's value, 10.

  def test_colocate_vars_with(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with tf.device(DEVICES[2]):
        plain = tf1.Variable(1.0, name='p', use_resource=True)
      with strategy.scope():
        w = tf1.Variable(1.0, name='w')
        with strategy.extended.colocate_vars_with(w):
          mirrored = tf1.Variable(1.0, name='m')
        with strategy.extended.colocate_vars_with(plain):
          colocated = tf1.Variable(1.0, name='c')
      # Next to a mirrored variable: mirrored too. Next to a plain one: one
      # plain variable, colocated with it.
      self.assertIsInstance(mirrored, mirrored_values.MirroredVariable)
      self.assertEqual(mirrored.devices, w.devices)
      self.assertNotIsInstance(colocated, values.DistributedValues)
      self.assertEqual(colocated.op.colocation_groups(),
                       plain.op.colocation_groups())
      self.assertTrue(strategy.extended.variable_created_in_scope(colocated))
      self.assertFalse(strategy.extended.variable_created_in_scope(plain))

  def test_layers_share_mirrored_variables(self):
    strategy = _strategy()

    def fn():
      return tf1.layers.dense(tf.ones([2, 3]), 4)
    with tf.Graph().as_default():
      outputs = strategy.experimental_run_v2(fn)
      kernel, bias = tf1.global_variables()
      self.assertIsInstance(kernel, mirrored_values.MirroredVariable)
      self.assertEqual(kernel.name, 'dense/kernel:0')
      self.assertIsInstance(bias, mirrored_values.MirroredVariable)
      for i, output in enumerate(strategy.unwrap(outputs)):
        self.assertIn('CPU:{}'.format(i), output.device)

  def test_update_needs_a_variable(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'update needs a variable, got 3.0'):
        strategy.extended.update(3.0, lambda c: c)


class MergeCallTest(tf.test.TestCase):

  def test_merge_function_runs_under_the_replicas_control_dependencies(self):
    # Replica i sets its copy of an ON_READ (SUM) variable to i + 1 and, in
    # a control_dependencies block on that assignment, merge_calls a read
    # of the combined value: 1 + 2 + 3 + 4 = 10 once every assignment ran.
    # (Without the dependencies, fetching the read alone would not run the
    # assignments and give 0.)
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        total = tf1.get_variable(
            'total', [], initializer=tf1.zeros_initializer(),
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM)

      def fn():
        i = replicate.get_replica_context().replica_id_in_sync_group
        assigned = total.assign(float(i + 1))
        with tf.control_dependencies([assigned]):
          return replicate.get_replica_context().merge_call(
              lambda strat: strat.extended.read_var(total))
      result = strategy.experimental_run_v2(fn)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        self.assertEqual(sess.run(result), 10.0)

  def test_merge_call_inside_a_variable_scope(self):
    # The variable scope store is per thread: a merge_call leaves the
    # replica's open `variable_scope` as it was, so it closes cleanly and
    # variables made after the merge_call are named (and shared) in it.
    strategy = _strategy()

    def fn():
      with tf1.variable_scope('model'):
        replicate.get_replica_context().merge_call(lambda strat: None)
        return tf1.get_variable('w', [], initializer=tf1.zeros_initializer())
    with tf.Graph().as_default():
      result = strategy.experimental_run_v2(fn)
      self.assertIsInstance(result, mirrored_values.MirroredVariable)
      self.assertEqual(result.primary.op.name, 'model/w')

  def test_merge_call_order_and_results(self):
    strategy = _strategy()
    events = []

    def merge_fn(strat, per_replica, scale=1):
      events.append(('merge', strat is strategy,
                     replicate.in_cross_replica_context(),
                     per_replica.values, scale))
      return (values.PerReplica({d: scale * v for d, v in
                                 zip(per_replica.devices,
                                     per_replica.values)}), 'same')

    def fn():
      context = replicate.get_replica_context()
      i = context.replica_id_in_sync_group
      events.append(('before', i))
      mine, shared = context.merge_call(merge_fn, args=(i,),
                                        kwargs={'scale': 10})
      events.append(('after', i, mine, shared))
      again, _ = context.merge_call(merge_fn, args=(mine,))
      events.append(('again', i, again))
      return again

    with tf.Graph().as_default():
      result = strategy.experimental_run_v2(fn)
    # Every replica reaches the merge before it runs; it runs once, in
    # cross-replica context, with each replica's argument; each replica gets
    # its component: 10 * i, then (scale 1) 10 * i again.
    self.assertEqual(events, (
        [('before', i) for i in range(NUM)] +
        [('merge', True, True, (0, 1, 2, 3), 10)] +
        [('after', i, 10 * i, 'same') for i in range(NUM)] +
        [('merge', True, True, (0, 10, 20, 30), 1)] +
        [('again', i, 10 * i) for i in range(NUM)]))
    self.assertEqual(strategy.unwrap(result), (0, 10, 20, 30))
    self.assertEqual(_replica_threads(), [])

  def test_merge_fn_runs_in_first_replica_name_scope(self):
    strategy = _strategy()

    def fn():
      with tf1.name_scope('block'):
        return replicate.get_replica_context().merge_call(
            lambda s: tf.constant(1.0, name='merged'))
    with tf.Graph().as_default():
      result = strategy.experimental_run_v2(fn)
    self.assertEqual(result.name, 'block/merged:0')

  def test_different_number_of_merge_calls_raises(self):
    strategy = _strategy()

    def fn():
      context = replicate.get_replica_context()
      if context.replica_id_in_sync_group != 1:
        context.merge_call(lambda s: None)
    with tf.Graph().as_default():
      outcome = _bounded(self, lambda: strategy.experimental_run_v2(fn))
    self.assertIsInstance(outcome['error'], errors.ContextError)
    self.assertRegex(
        str(outcome['error']),
        r'Replicas called merge_call a different number of times \(replica '
        r'0: 1, replica 1: 0, replica 2: 1, replica 3: 1\)')
    self.assertEqual(_replica_threads(), [])

  def test_exception_in_a_replica_surfaces(self):
    strategy = _strategy()

    def fn():
      context = replicate.get_replica_context()
      context.merge_call(lambda s: None)
      if context.replica_id_in_sync_group == 2:
        raise ValueError('boom in replica 2')
      context.merge_call(lambda s: None)
    with tf.Graph().as_default():
      start = time.time()
      outcome = _bounded(self, lambda: strategy.experimental_run_v2(fn))
    self.assertIsInstance(outcome['error'], ValueError)
    self.assertEqual(str(outcome['error']), 'boom in replica 2')
    self.assertLess(time.time() - start, 30)
    self.assertEqual(_replica_threads(), [])
    # The library's context stack is clean afterwards.
    self.assertFalse(replicate.has_strategy())

  def test_exception_in_merge_fn_surfaces(self):
    strategy = _strategy()

    def merge_fn(unused_strategy):
      raise KeyError('merge failed')

    def fn():
      replicate.get_replica_context().merge_call(merge_fn)
    with tf.Graph().as_default():
      outcome = _bounded(self, lambda: strategy.experimental_run_v2(fn))
    self.assertIsInstance(outcome['error'], KeyError)
    self.assertEqual(_replica_threads(), [])

  def test_another_replicas_context_raises(self):
    # Replica 1 must run the function to misuse replica 0's context.
    strategy = _strategy(replica_build=ReplicaBuild.CALL_PER_REPLICA)
    contexts = []

    def fn():
      contexts.append(replicate.get_replica_context())
      contexts[0].all_reduce(SUM, tf.constant(1.0))
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.ContextError,
          r'ReplicaContext.all_reduce was called on a replica context that is '
          r'not the current one \(current: replica 1 of MirroredStrategy .*, '
          r'called on: replica 0 of'):
        strategy.experimental_run_v2(fn)
    self.assertEqual(_replica_threads(), [])

  def test_different_structures_raise(self):
    strategy = _strategy()

    def fn():
      replica = replicate.get_replica_context().replica_id_in_sync_group
      return [1.0] * (replica + 1)
    with tf.Graph().as_default():
      # TF's regroup asserts: an AssertionError, and our ValueError too.
      for error in (errors.InvalidArgumentError, AssertionError):
        with self.assertRaisesRegex(
            error, 'Replicas produced values of different structures'):
          strategy.experimental_run_v2(fn)

  def test_replicas_returning_their_copies_get_the_variable(self):
    # As TF's regroup: each replica's own copy of one distributed variable
    # (v.get(), or what a tape watched) is that variable again.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf1.get_variable('v', [], initializer=tf1.ones_initializer())
        w = tf1.get_variable(
            'w', [], synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM)
        mirrored, on_read = strategy.extended.call_for_each_replica(
            lambda: (v.get(), w.get()))
        reads = strategy.extended.call_for_each_replica(
            lambda: v.get().read_value())
      self.assertIs(v, mirrored)
      self.assertIs(w, on_read)
      self.assertIsInstance(reads, replicate.PerReplica)

  def test_replicas_returning_specs_get_one_spec(self):
    # A namedtuple whose constructor checks its fields (an EstimatorSpec)
    # is rebuilt with _make, as TF's regroup does.
    strategy = _strategy()

    def fn():
      return tf1.estimator.EstimatorSpec(
          tf1.estimator.ModeKeys.TRAIN, loss=tf.constant(2.0),
          train_op=tf.no_op())
    with tf.Graph().as_default():
      spec = strategy.experimental_run_v2(fn)
      self.assertIsInstance(spec, tf1.estimator.EstimatorSpec)
      losses = strategy.unwrap(spec.loss)
      self.assertLen(set(losses), NUM)  # one loss tensor per replica
      with tf1.Session(config=CONFIG) as sess:
        self.assertEqual([2.0] * NUM, sess.run(list(losses)))

  def test_merge_call_from_another_thread_raises(self):
    strategy = _strategy()

    def fn():
      context = replicate.get_replica_context()
      caught = []

      def other():
        try:
          replicate.get_replica_context().merge_call(lambda s: None)
        except errors.ContextError as e:
          caught.append(str(e))
        try:
          context._merge_call(lambda s: None, (), {})  # pylint: disable=protected-access
        except errors.ContextError as e:
          caught.append(str(e))
      t = threading.Thread(target=other)
      t.start()
      t.join(10)
      return tuple(caught)
    with tf.Graph().as_default():
      result = strategy.experimental_run_v2(fn)
    # In a thread of its own, the default replica context is current, so the
    # first merge_call runs (default strategy); the second names the rule.
    self.assertLen(result, 1)
    message = strategy.unwrap(result[0])[0]
    self.assertRegex(message, 'merge_call of replica 0 was called from '
                     'thread .*, not from the thread running that replica')

  def test_eager_raises(self):
    if not tf.executing_eagerly():
      self.skipTest('TF 1.x builds graphs by default; eager needs TF 2.x.')
    strategy = _strategy()
    with self.assertRaisesRegex(errors.ContextError,
                                'builds graphs; it was called eagerly'):
      strategy.experimental_run_v2(lambda: None)


class AllReduceTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(
      # replica i holds a = i + 1 and b = [i, 2i].
      # SUM: a = 1+2+3+4 = 10, b = [0+1+2+3, 2*(0+1+2+3)] = [6, 12].
      (SUM, 10.0, [6.0, 12.0]),
      # MEAN: the sums divided by 4.
      (MEAN, 2.5, [1.5, 3.0]))
  def test_values(self, reduce_op, expected_a, expected_b):
    strategy = _strategy()

    def fn():
      i = float(replicate.get_replica_context().replica_id_in_sync_group)
      reduced = replicate.get_replica_context().all_reduce(
          reduce_op, {'a': tf.constant(i + 1), 'b': tf.constant([i, 2 * i])})
      return reduced
    with tf.Graph().as_default():
      result = strategy.experimental_run_v2(fn)
      for i, a in enumerate(strategy.unwrap(result['a'])):
        self.assertIn('CPU:{}'.format(i), a.device)
      with tf1.Session(config=CONFIG) as sess:
        a, b = sess.run([strategy.unwrap(result['a']),
                         strategy.unwrap(result['b'])])
    self.assertAllClose(a, [expected_a] * NUM)
    self.assertAllClose(b, [expected_b] * NUM)

  @parameterized.parameters(
      # Replica i's loss is c_i * y_i with c_i = i + 1 and y = all_reduce(x).
      # SUM: y_j = sum_i x_i, so d(sum_j L_j)/dx_i = sum_j c_j = 10; each
      # replica computes the gradient of its own loss, and the backward
      # all-sum gathers the other replicas' c_j: every replica gets 10.
      (SUM, 10.0),
      # MEAN: y_j = (1/4) sum_i x_i, so the gradient is (1/4) sum_j c_j.
      (MEAN, 2.5))
  def test_gradients(self, reduce_op, expected):
    strategy = _strategy()

    def fn():
      i = replicate.get_replica_context().replica_id_in_sync_group
      x = tf.constant([1.0, 2.0])
      y = replicate.get_replica_context().all_reduce(reduce_op, x)
      loss = tf.reduce_sum(float(i + 1) * y)
      return tf.gradients(loss, x)[0]
    with tf.Graph().as_default():
      grads = strategy.experimental_run_v2(fn)
      with tf1.Session(config=CONFIG) as sess:
        grads = sess.run(strategy.unwrap(grads))
    self.assertAllClose(grads, [[expected, expected]] * NUM)

  @parameterized.parameters((SUM, 10.0), (MEAN, 2.5))
  def test_gradient_tape(self, reduce_op, expected):
    # As test_gradients, through a GradientTape, which records only its own
    # thread's ops (the reduction is built by the merge) and reads no
    # gradient override: it gave 0 (TF's testAllReduceSumGradientTape).
    strategy = _strategy()

    def fn():
      i = replicate.get_replica_context().replica_id_in_sync_group
      x = tf.constant([1.0, 2.0])
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = replicate.get_replica_context().all_reduce(reduce_op, x)
        loss = tf.reduce_sum(float(i + 1) * y)
      return tape.gradient(loss, x)
    with tf.Graph().as_default():
      grads = strategy.experimental_run_v2(fn)
      with tf1.Session(config=CONFIG) as sess:
        grads = sess.run(strategy.unwrap(grads))
    self.assertAllClose(grads, [[expected, expected]] * NUM)

  @parameterized.parameters(
      # Replica i: y_i = x_i * v with x_i = [i, i + 1], z = all_reduce(y),
      # loss_i = c_i * sum(z), c_i = i + 1. The backward all-sum gives every
      # y_i the gradient sum_j c_j = 10, so replica i's copy of v gets
      # 10 * x_i = [10 i, 10 (i + 1)].
      (SUM, 10.0),
      # MEAN: (1/4) sum_j c_j = 2.5, times x_i.
      (MEAN, 2.5))
  def test_gradients_of_a_mirrored_variable(self, reduce_op, factor):
    # TF 1.15's own all_reduce fails here ("Unsuccessful at finding variable
    # v/replica_1"): tf.custom_gradient walks from the reduced output into
    # the other replicas and cannot find their copies of v.
    strategy = _strategy()

    def fn():
      i = float(replicate.get_replica_context().replica_id_in_sync_group)
      y = tf.constant([i, i + 1.0]) * variable
      z = replicate.get_replica_context().all_reduce(reduce_op, y)
      return tf.gradients(tf.reduce_sum((i + 1.0) * z), variable)[0]
    with tf.Graph().as_default():
      with strategy.scope():
        variable = tf1.get_variable(
            'v', [2], initializer=tf1.constant_initializer([3.0, 5.0]))
        grads = strategy.experimental_run_v2(fn)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        grads = sess.run(strategy.unwrap(grads))
    self.assertAllClose(
        grads, [[factor * i, factor * (i + 1)] for i in range(NUM)])

  @parameterized.parameters(
      # Outside the replicas the all-reduce is the graph it is: replica 0's
      # result is the sum (mean) of the 4 replicas' identities of x, so its
      # gradient with respect to x is 4 (4 * 1/4 = 1) per element.
      (SUM, 4.0), (MEAN, 1.0))
  def test_gradient_outside_the_replicas_is_the_graphs(self, reduce_op,
                                                       expected):
    strategy = _strategy()
    with tf.Graph().as_default() as graph:
      x = tf.constant([1.0, 2.0])
      reduced = strategy.experimental_run_v2(
          lambda: replicate.get_replica_context().all_reduce(reduce_op, x))
      # No gradient override is left on the graph (test_graph_portability).
      self.assertEqual([], [op.name for op in graph.get_operations()
                            if '_gradient_op_type' in op.node_def.attr])
      grad = tf.gradients(strategy.unwrap(reduced)[0], x)[0]
      with tf1.Session(config=CONFIG) as sess:
        self.assertAllClose([expected, expected], sess.run(grad))

  def test_mean_of_integers_raises(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'Cannot take the MEAN of int32'):
        strategy.experimental_run_v2(
            lambda: replicate.get_replica_context().all_reduce(
                MEAN, tf.constant(1)))

  def test_all_reduce_outside_replica_raises(self):
    context = replicate.get_replica_context()
    with _strategy().scope():
      with self.assertRaisesRegex(errors.ContextError,
                                  'ReplicaContext.all_reduce must be called '
                                  'in its replica context'):
        context.all_reduce(SUM, 1.0)


class ReduceTest(tf.test.TestCase):

  def test_reduce_and_reduce_to(self):
    accumulated = []

    def accumulate(tensors):
      accumulated.append(len(tensors))
      return tf.add_n(tensors)
    ops = replicate.ReductionToOneDeviceCrossTowerOps(
        reduce_to_device=DEVICES[3], accumulation_fn=accumulate)
    strategy = _strategy(cross_tower_ops=ops)
    with tf.Graph().as_default():
      per_replica = strategy.experimental_run_v2(
          lambda: tf.cast(replicate.get_replica_context()
                          .replica_id_in_sync_group + 1, tf.float32))
      with strategy.scope():
        total = strategy.reduce(SUM, per_replica)
        mean = strategy.reduce(MEAN, per_replica)
        same = strategy.reduce(MEAN, tf.constant(5.0))
        to_two = strategy.extended.reduce_to(SUM, per_replica, DEVICES[:2])
        w = tf1.Variable(0.0)
        batch = strategy.extended.batch_reduce_to(
            MEAN, [(per_replica, w), (per_replica, DEVICES[1])])
        broadcast = strategy.extended.broadcast_to(tf.constant(3.0), w)
      self.assertIn('CPU:0', total.device)  # The host.
      self.assertLen(to_two.values, 2)
      self.assertEqual(batch[0].devices, w.devices)
      self.assertEqual(broadcast.devices, w.devices)
      # The given cross_tower_ops did the sums: 4 values each, 5 reductions.
      self.assertEqual(accumulated, [NUM] * 5)
      with tf1.Session(config=CONFIG) as sess:
        # 1 + 2 + 3 + 4 = 10; mean 2.5.
        self.assertAllClose(sess.run([total, mean, same]), [10.0, 2.5, 5.0])
        self.assertAllClose(sess.run(list(to_two.values)), [10.0, 10.0])
        self.assertAllClose(sess.run(list(batch[0].values)), [2.5] * NUM)
        self.assertAllClose(sess.run(list(broadcast.values)), [3.0] * NUM)

  def test_reduce_along_an_axis_and_by_name(self):
    # As TF: replica i holds i + 1 rows of [i, i] (replicas may differ in
    # length). Along axis 0, SUM adds every row: sum_i (i + 1) * i = 0 + 2 +
    # 6 + 12 = 20 per column; MEAN divides by all rows, 1 + 2 + 3 + 4 = 10:
    # 2.0 per column. Along axis -1 of one row [i, i] per replica: SUM
    # 2 * (0 + 1 + 2 + 3) = 12; MEAN 12 / (4 * 2) = 1.5.
    strategy = _strategy()
    with tf.Graph().as_default():
      uneven = values.PerReplica({
          d: tf.fill([i + 1, 2], float(i)) for i, d in enumerate(DEVICES)})
      rows = values.PerReplica({
          d: tf.fill([1, 2], float(i)) for i, d in enumerate(DEVICES)})
      with strategy.scope():
        results = [
            strategy.reduce('sum', uneven, axis=0),
            strategy.reduce(tf.distribute.ReduceOp.MEAN, uneven, axis=0),
            strategy.reduce('SUM', rows, axis=-1),
            strategy.reduce(MEAN, rows, axis=-1),
        ]
        with self.assertRaisesRegex(errors.InvalidTypeError,
                                    "int axis .*got '0'"):
          strategy.reduce(SUM, uneven, axis='0')
        with self.assertRaisesRegex(errors.InvalidArgumentError,
                                    "Cannot reduce with 'max'"):
          strategy.reduce('max', uneven)
      with tf1.Session(config=CONFIG) as sess:
        got = sess.run(results)
    for expected, value in zip(([20., 20.], [2., 2.], [12.], [1.5]), got):
      self.assertAllClose(expected, value)

  def test_sum_of_a_single_value_raises(self):
    strategy = _strategy()
    with tf.Graph().as_default(), strategy.scope():
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'Cannot SUM the single value .* over 4 '
                                  'replicas'):
        strategy.reduce(SUM, tf.constant(1.0))

  def test_default_cross_tower_ops_for_cpus(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      strategy.extended.reduce_to(
          MEAN, values.PerReplica({d: tf.constant(1.0) for d in DEVICES}),
          DEVICES[0])
    self.assertIsInstance(
        strategy.extended._cross_tower_ops,  # pylint: disable=protected-access
        replicate.ReductionToOneDeviceCrossTowerOps)


class InputTest(tf.test.TestCase):

  def test_dataset_iterator_splits_global_batch(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(16).batch(8, drop_remainder=True))
      batch = iterator.get_next()
      self.assertIsInstance(batch, values.PerReplica)
      for i, piece in enumerate(batch.values):
        self.assertIn('CPU:{}'.format(i), piece.device)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        # Global batch [0..7]: replica i gets rows 2i and 2i + 1.
        self.assertAllEqual(sess.run(list(batch.values)),
                            [[0, 1], [2, 3], [4, 5], [6, 7]])
        self.assertAllEqual(sess.run(list(batch.values)),
                            [[8, 9], [10, 11], [12, 13], [14, 15]])

  def test_distribute_dataset_initializable_iterator(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      dataset = strategy.experimental_distribute_dataset(
          tf.data.Dataset.range(16).batch(8, drop_remainder=True))
      iterator = dataset.make_initializable_iterator()
      doubled = strategy.experimental_run_v2(
          lambda batch: batch * 2, args=(iterator.get_next(),))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initializer)
        # Global batch [0..7]: replica i gets rows 2i and 2i + 1, doubled.
        self.assertAllEqual(sess.run(strategy.unwrap(doubled)),
                            [[0, 2], [4, 6], [8, 10], [12, 14]])
        self.assertAllEqual(sess.run(strategy.unwrap(doubled)),
                            [[16, 18], [20, 22], [24, 26], [28, 30]])
        # Initializing again restarts the dataset.
        sess.run(iterator.initialize())
        self.assertAllEqual(sess.run(strategy.unwrap(doubled))[0], [0, 2])

  def test_distribute_dataset_one_shot_iterator(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      iterator = strategy.experimental_distribute_dataset(
          tf.data.Dataset.range(8).batch(8)).make_one_shot_iterator()
      self.assertEqual(iterator.initialize(), [])
      batch = iterator.get_next()
      with tf1.Session(config=CONFIG) as sess:
        self.assertAllEqual(sess.run(list(batch.values)),
                            [[0, 1], [2, 3], [4, 5], [6, 7]])
        with self.assertRaises(tf.errors.OutOfRangeError):
          sess.run(list(batch.values))

  def test_distribute_datasets_from_function(self):
    # dataset_fn is called once, with one pipeline and NUM replicas; its
    # per-replica batches (2 rows each: 8 rows for 4 replicas) go to the
    # replicas in turn, as in TF 1.15.
    strategy = _strategy()
    contexts = []

    def dataset_fn(context):
      contexts.append(context)
      batch = context.get_per_replica_batch_size(8)
      return tf.data.Dataset.range(16).batch(batch)
    with tf.Graph().as_default():
      dataset = strategy.experimental_distribute_datasets_from_function(
          dataset_fn)
      self.assertEqual(1, len(contexts))
      self.assertEqual((1, 0, NUM), (contexts[0].num_input_pipelines,
                                     contexts[0].input_pipeline_id,
                                     contexts[0].num_replicas_in_sync))
      iterator = tf1.data.make_initializable_iterator(dataset)
      one_shot = tf1.data.make_one_shot_iterator(dataset)
      self.assertEqual(1, len(contexts))
      batch = iterator.get_next()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        self.assertAllEqual(sess.run(list(batch.values)),
                            [[0, 1], [2, 3], [4, 5], [6, 7]])
        self.assertAllEqual(sess.run(list(batch.values)),
                            [[8, 9], [10, 11], [12, 13], [14, 15]])
        self.assertAllEqual(sess.run(list(one_shot.get_next().values)),
                            [[0, 1], [2, 3], [4, 5], [6, 7]])
    with self.assertRaisesRegex(TypeError, 'dataset_fn must be a callable'):
      strategy.experimental_distribute_datasets_from_function(None)
    with self.assertRaisesRegex(TypeError, 'returned by dataset_fn'):
      strategy.experimental_distribute_datasets_from_function(lambda _: 3)

  def test_distribute_dataset_misuse(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      dataset = strategy.experimental_distribute_dataset(
          tf.data.Dataset.range(8).batch(8))
      with self.assertRaisesRegex(errors.ContextError,
                                  'use make_initializable_iterator'):
        iter(dataset)
      with self.assertRaisesRegex(errors.InvalidTypeError,
                                  'dataset must be a tf.data.Dataset'):
        strategy.experimental_distribute_dataset([1, 2, 3])

  def test_distribute_dataset_without_strategy(self):
    # The default strategy: one replica, the batch as it is.
    with tf.Graph().as_default():
      iterator = replicate.get_strategy().experimental_distribute_dataset(
          tf.data.Dataset.range(4).batch(4)).make_initializable_iterator()
      batch = iterator.get_next()
      self.assertIsInstance(batch, tf.Tensor)
      with tf1.Session() as sess:
        sess.run(iterator.initializer)
        self.assertAllEqual(sess.run(batch), [0, 1, 2, 3])

  def test_static_uneven_batch_splits(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(7).batch(7, drop_remainder=True))
      batch = iterator.get_next()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        # 7 rows on 4 replicas: the first 7 % 4 = 3 get 7 // 4 + 1 = 2 rows.
        self.assertEqual([r.tolist() for r in sess.run(list(batch.values))],
                         [[0, 1], [2, 3], [4, 5], [6]])

  def test_dynamic_partial_batches_split(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      # 5 elements in batches of 3: [0 1 2], then the partial [3 4].
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(5).batch(3))
      batch = iterator.get_next()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        # Fewer rows than replicas: one row each to the first b replicas.
        self.assertEqual([r.tolist() for r in sess.run(list(batch.values))],
                         [[0], [1], [2], []])
        self.assertEqual([r.tolist() for r in sess.run(list(batch.values))],
                         [[3], [4], [], []])

  def test_input_fn_iterator(self):
    strategy = _strategy()
    contexts = []

    def input_fn(context):
      contexts.append(context)
      return tf.data.Dataset.range(100).batch(
          context.get_per_replica_batch_size(8))
    with tf.Graph().as_default():
      iterator = strategy.make_input_fn_iterator(input_fn)
      batch = iterator.get_next()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        # Replicas take successive elements (batches of 8 / 4 = 2), in order.
        self.assertAllEqual(sess.run(list(batch.values)),
                            [[0, 1], [2, 3], [4, 5], [6, 7]])
        self.assertAllEqual(sess.run(list(batch.values)),
                            [[8, 9], [10, 11], [12, 13], [14, 15]])
    self.assertLen(contexts, 1)
    self.assertEqual((contexts[0].num_input_pipelines,
                      contexts[0].input_pipeline_id,
                      contexts[0].num_replicas_in_sync), (1, 0, NUM))

  def test_scalar_input_cannot_be_split(self):
    # An unbatched dataset is refused where the iterator is made, as TF
    # does, with TF's phrase.
    strategy = _strategy()
    with tf.Graph().as_default():
      for make in (strategy.make_dataset_iterator,
                   lambda d: strategy.experimental_distribute_dataset(
                       d).make_initializable_iterator()):
        with self.assertRaisesRegex(
            ValueError, 'Input shape should have at least one dimension. '
            'Perhaps your input dataset is not batched?.*4 replicas'):
          make(tf.data.Dataset.range(3))

  def test_numpy_iterator(self):
    strategy = _strategy()
    features = np.arange(16, dtype=np.float32).reshape(8, 2)
    labels = np.arange(8, dtype=np.int64)
    with tf.Graph().as_default():
      with tf1.Session(config=CONFIG) as sess:
        embedded = strategy.experimental_make_numpy_iterator(
            (features, labels), batch_size=8, shuffle=None)
        with strategy.scope():  # The loading variables are not mirrored.
          loaded = strategy.experimental_make_numpy_iterator(
              {'x': features, 'y': labels}, batch_size=4, num_epochs=2,
              shuffle=None, session=sess)
        variable_ops = [op for op in tf1.get_default_graph().get_operations()
                        if op.type in ('VarHandleOp', 'VariableV2')]
        self.assertLen(variable_ops, 2)  # One per array.
        x, y = embedded.get_next()
        batch = loaded.get_next()
        sess.run(embedded.initialize() + loaded.initialize())
        # 8 rows, global batch 8: replica i gets rows 2i, 2i + 1.
        x3, ys = sess.run([x.values[3], list(y.values)])
        self.assertAllEqual(ys, [[0, 1], [2, 3], [4, 5], [6, 7]])
        self.assertAllEqual(x3, features[6:8])
        # Global batch 4: one row each; 8 rows x 2 epochs = 4 runs.
        for start in (0, 4, 0, 4):
          self.assertAllEqual(sess.run(list(batch['y'].values)),
                              [[start], [start + 1], [start + 2], [start + 3]])
      # Any batch size splits (test_partial_batches.py); it must be >= 1.
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'batch_size must be an integer >= 1, got 0'):
        strategy.experimental_make_numpy_iterator(features, batch_size=0)
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'must all have the same first dimension'):
        strategy.experimental_make_numpy_iterator(
            (features, labels[:4]), batch_size=4)


# A linear model trained on 8 examples: the global batch.
_X = np.array([[1., 2., 0.], [0., 1., 1.], [2., 0., 1.], [1., 1., 1.],
               [0., 2., 2.], [1., 0., 0.], [3., 1., 0.], [0., 0., 1.]],
              np.float32)
_Y = np.array([[1.], [0.], [2.], [1.], [-1.], [0.5], [3.], [0.]], np.float32)
_BATCH = 8
_STEPS = 4
_LR = 0.1


def _model_loss(x, y):
  w = tf1.get_variable('w', [3, 1], initializer=tf1.zeros_initializer())
  b = tf1.get_variable('b', [1], initializer=tf1.constant_initializer(0.5))
  # Loss rule: the sum over this replica's examples divided by the *global*
  # batch; summing the replicas' gradients gives the full-batch gradient.
  loss = tf.reduce_sum(tf.square(tf.matmul(x, w) + b - y)) / _BATCH
  return w, b, loss


def _numpy_sgd():
  """Full-batch gradient descent on the mean squared error, in NumPy."""
  w = np.zeros((3, 1), np.float64)
  b = np.full((1,), 0.5)
  for _ in range(_STEPS):
    residual = _X.dot(w) + b - _Y          # (8, 1)
    # d/dw sum(r^2)/8 = 2 X^T r / 8; d/db = 2 sum(r) / 8.
    w -= _LR * 2 * _X.T.dot(residual) / _BATCH
    b -= _LR * 2 * residual.sum(axis=0) / _BATCH
  return w, b


def _one_device(optimizer_fn):
  """The reference: the same model and optimizer on one device, full batch."""
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    w, b, loss = _model_loss(tf.constant(_X), tf.constant(_Y))
    train = optimizer_fn().minimize(loss, global_step=step)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      for _ in range(_STEPS):
        sess.run(train)
      return sess.run([w, b])


def _one_device_variable_names(optimizer_fn):
  """The global variables' names of the one-device reference graph."""
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    _, _, loss = _model_loss(tf.constant(_X), tf.constant(_Y))
    optimizer_fn().minimize(loss, global_step=step)
    return sorted(v.op.name for v in tf1.global_variables())


def _dataset():
  return tf.data.Dataset.from_tensors((_X, _Y)).repeat()


class TrainingTest(parameterized.TestCase, tf.test.TestCase):

  def _check_copies(self, sess, variables, expected):
    for variable, value in zip(variables, expected):
      copies = sess.run(list(variable.values))
      for copy in copies:
        # Every copy identical, and equal to the one-device result.
        self.assertAllEqual(copy, copies[0])
        self.assertAllClose(copy, value, rtol=1e-5, atol=1e-6)

  def test_explicit_pattern_matches_numpy(self):
    strategy = _strategy()
    expected = _numpy_sgd()

    def merge_update(strat, grads_and_vars):
      summed = strat.extended.batch_reduce_to(SUM, grads_and_vars)
      return tf.group(*[
          strat.extended.update(v, lambda copy, g: copy.assign_sub(_LR * g),
                                args=(s,))
          for (_, v), s in zip(grads_and_vars, summed)])

    def step(inputs):
      x, y = inputs
      w, b, loss = _model_loss(x, y)
      grads = tf.gradients(loss, [w, b])
      return replicate.get_replica_context().merge_call(
          merge_update, args=(list(zip(grads, [w, b])),))

    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(_dataset())
      with strategy.scope():
        train = strategy.group(strategy.experimental_run(step, iterator))
      w, b = tf1.global_variables()
      with tf1.Session(config=CONFIG) as sess:
        sess.run([tf1.global_variables_initializer(), iterator.initialize()])
        for _ in range(_STEPS):
          sess.run(train)
        self._check_copies(sess, [w, b], expected)

  @parameterized.parameters(
      ('adam', lambda: tf1.train.AdamOptimizer(_LR)),
      ('momentum', lambda: tf1.train.MomentumOptimizer(_LR, momentum=0.9)),
      ('sgd', lambda: tf1.train.GradientDescentOptimizer(_LR)))
  def test_tower_optimizer_matches_one_device(self, unused_name,
                                              optimizer_fn):
    expected = _one_device(optimizer_fn)
    strategy = _strategy()
    optimizers = []

    def step(inputs):
      x, y = inputs
      _, _, loss = _model_loss(x, y)
      optimizer = replicate.TowerOptimizer(optimizer_fn())
      optimizers.append(optimizer)
      return optimizer.minimize(loss,
                                global_step=tf1.train.get_global_step())

    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(_dataset())
      with strategy.scope():
        global_step = tf1.train.get_or_create_global_step()
        train = strategy.group(strategy.experimental_run(step, iterator))
      w, b = tf1.trainable_variables()
      self.assertIsInstance(global_step, mirrored_values.MirroredVariable)
      with tf1.Session(config=CONFIG) as sess:
        sess.run([tf1.global_variables_initializer(), iterator.initialize()])
        for _ in range(_STEPS):
          sess.run(train)
        self._check_copies(sess, [w, b], expected)
        # The step advanced once per run, on every copy.
        self.assertAllEqual(sess.run(list(global_step.values)),
                            [_STEPS] * NUM)
      # Optimizer state is per copy (slots next to each copy), mirrored like
      # the variables: the collection holds what one device's graph holds.
      for name in optimizers[0].get_slot_names():
        for copy in w.values:
          self.assertIsNotNone(optimizers[0].get_slot(copy, name))
      names = sorted(v.op.name for v in tf1.global_variables())
      self.assertEqual(_one_device_variable_names(optimizer_fn), names)

  def test_slots_checkpoint_round_trip_with_one_device_model(self):
    # Momentum's slot is made once per copy and mirrored: Saver writes one
    # key per slot, as one device does, and a restore sets every copy.
    directory = self.get_temp_dir()
    strategy = _strategy()
    optimizers = []

    def step(inputs):
      _, _, loss = _model_loss(*inputs)
      optimizer = tf1.train.MomentumOptimizer(_LR, momentum=0.9)
      optimizers.append(optimizer)
      return replicate.TowerOptimizer(optimizer).minimize(loss)

    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(_dataset())
      with strategy.scope():
        train = strategy.group(strategy.experimental_run(step, iterator))
      w, b = tf1.trainable_variables()
      slots = [[optimizers[0].get_slot(copy, 'momentum')
                for copy in variable.values] for variable in (w, b)]
      self.assertEqual(['b', 'b/Momentum', 'w', 'w/Momentum'],
                       sorted(v.op.name for v in tf1.global_variables()))
      saver = tf1.train.Saver()
      with tf1.Session(config=CONFIG) as sess:
        sess.run([tf1.global_variables_initializer(), iterator.initialize()])
        sess.run(train)
        sess.run(train)
        trained = sess.run(slots[0][0])
        path = saver.save(sess, directory + '/mirrored')
    self.assertEqual(
        [('b', [1]), ('b/Momentum', [1]), ('w', [3, 1]),
         ('w/Momentum', [3, 1])], sorted(tf.train.list_variables(path)))
    # One device restores the mirrored checkpoint, changes the slot and
    # saves it; the mirrored model restores that into every copy.
    with tf.Graph().as_default():
      _, _, loss = _model_loss(tf.constant(_X), tf.constant(_Y))
      optimizer = tf1.train.MomentumOptimizer(_LR, momentum=0.9)
      optimizer.minimize(loss)
      plain_w = tf1.trainable_variables()[0]
      plain_slot = optimizer.get_slot(plain_w, 'momentum')
      saver = tf1.train.Saver()
      with tf1.Session() as sess:
        saver.restore(sess, path)
        self.assertAllEqual(sess.run(plain_slot), trained)
        sess.run(plain_slot.assign(trained + 1.0))
        path = saver.save(sess, directory + '/plain')
    optimizers[:] = []
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(_dataset())
      with strategy.scope():
        strategy.experimental_run(step, iterator)
      w, _ = tf1.trainable_variables()
      saver = tf1.train.Saver()
      with tf1.Session(config=CONFIG) as sess:
        saver.restore(sess, path)
        for copy in w.values:
          self.assertAllEqual(
              sess.run(optimizers[0].get_slot(copy, 'momentum')),
              trained + 1.0)

  @parameterized.parameters((False,), (True,))
  def test_plain_optimizer_inside_replica_raises(self, sparse):
    strategy = _strategy()

    def step():
      with tf1.variable_scope('model', reuse=tf1.AUTO_REUSE):
        table = tf1.get_variable('table', [4, 2])
      if sparse:
        loss = tf.reduce_sum(tf.gather(table, [0, 2]))
      else:
        loss = tf.reduce_sum(table)
      return tf1.train.GradientDescentOptimizer(_LR).minimize(loss)
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.ContextError,
          'A plain optimizer update .* of mirrored variable model/table was '
          "built inside replica 0: it would change only this replica's copy"
          '.*replicate.TowerOptimizer'):
        strategy.experimental_run_v2(step)

  @parameterized.parameters(False, True)
  def test_plain_optimizer_with_a_callable_loss_raises(self, sparse):
    # Given a callable, a tf.compat.v1 optimizer updates the variables its
    # tape watched: each replica's own copy, with that replica's gradient
    # alone (TF 1.15's strategy sums them: w differed, 23.2 against 44.4,
    # in TF's own minimize_loss_test). Refused, as with a tensor loss.
    strategy = _strategy()

    def step():
      with tf1.variable_scope('model', reuse=tf1.AUTO_REUSE):
        table = tf1.get_variable('table', [4, 2])

      def loss():
        if sparse:
          return tf.reduce_sum(tf.gather(table, [0, 2]))
        return tf.reduce_sum(table)
      return tf1.train.GradientDescentOptimizer(_LR).minimize(loss)
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.ContextError,
          r'GradientDescent/update_.*\(\w+\) writes the copy of mirrored '
          'variable model/table on .*CPU:0 inside a replica: it would change '
          'only that copy.*replicate.TowerOptimizer'):
        strategy.experimental_run_v2(step)

  def test_replica_assigning_through_the_variable_is_not_refused(self):
    # Writes made the strategy's way (a merge, an update of every copy)
    # are built outside the replicas: nothing to refuse.
    strategy = _strategy()

    def step():
      v = tf1.get_variable('v', [], initializer=tf1.zeros_initializer(),
                           aggregation=tf.VariableAggregation.SUM)
      return v.assign_add(tf.constant(1.0))
    with tf.Graph().as_default():
      update = strategy.experimental_run_v2(step)
      v = tf1.global_variables()[0]
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.experimental_local_results(update))
        # Each of the NUM replicas adds 1, summed: NUM on every copy.
        self.assertAllEqual([float(NUM)] * NUM, sess.run(
            list(strategy.experimental_local_results(v))))

  def test_sparse_gradients_stay_sparse_and_match(self):
    # An embedding lookup gives IndexedSlices gradients; they are summed
    # across replicas without densifying and applied to every copy.
    strategy = _strategy()
    ids = np.array([0, 2, 2, 3, 1, 0, 3, 3], np.int64)

    def step(inputs):
      table = tf1.get_variable('table', initializer=tf.ones([4, 2]))
      loss = tf.reduce_sum(tf.gather(table, inputs) * 2.0) / _BATCH
      optimizer = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(1.0))
      grads_and_vars = optimizer.compute_gradients(loss)
      self.assertIsInstance(grads_and_vars[0][0], tf.IndexedSlices)
      return optimizer.apply_gradients(grads_and_vars)
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.from_tensors(ids).repeat())
      with strategy.scope():
        train = strategy.group(strategy.experimental_run(step, iterator))
      table, = tf1.global_variables()
      with tf1.Session(config=CONFIG) as sess:
        sess.run([tf1.global_variables_initializer(), iterator.initialize()])
        sess.run(train)
        # d loss / d row r = 2 * count(r) / 8; counts: row 0: 2, 1: 1,
        # 2: 2, 3: 3. One step at rate 1 from 1: 1 - count / 4.
        expected = [[0.5, 0.5], [0.75, 0.75], [0.5, 0.5], [0.25, 0.25]]
        for copy in sess.run(list(table.values)):
          self.assertAllClose(copy, expected)

  def test_plain_global_step_advances_once(self):
    strategy = _strategy()
    expected = _numpy_sgd()

    def step(inputs):
      _, _, loss = _model_loss(*inputs)
      optimizer = tf1.train.GradientDescentOptimizer(_LR)
      return mirrored_strategy.apply_gradients_across_replicas(
          optimizer, optimizer.compute_gradients(loss),
          global_step=global_step, name='train_step')
    with tf.Graph().as_default():
      global_step = tf1.train.get_or_create_global_step()  # Not mirrored.
      iterator = strategy.make_dataset_iterator(_dataset())
      with strategy.scope():
        result = strategy.experimental_run(step, iterator)
      # The same op on every replica.
      self.assertIsInstance(result, tf.Operation)
      self.assertEqual(result.name, 'train_step')
      w, b = tf1.trainable_variables()
      with tf1.Session(config=CONFIG) as sess:
        sess.run([tf1.global_variables_initializer(), iterator.initialize()])
        for _ in range(_STEPS):
          sess.run(result)
        self.assertEqual(sess.run(global_step), _STEPS)
        self._check_copies(sess, [w, b], expected)

  def test_apply_gradients_across_replicas_errors(self):
    strategy = _strategy()
    optimizer = tf1.train.GradientDescentOptimizer(_LR)
    with tf.Graph().as_default():
      plain = tf1.Variable(1.0, use_resource=True)
      with self.assertRaisesRegex(
          errors.ContextError,
          'apply_gradients_across_replicas must be called in a replica '
          'context'):
        with strategy.scope():
          mirrored_strategy.apply_gradients_across_replicas(
              optimizer, [(tf.constant(1.0), plain)])
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          'is not a mirrored variable of the current strategy'):
        strategy.experimental_run_v2(
            lambda: mirrored_strategy.apply_gradients_across_replicas(
                optimizer, [(tf.constant(1.0), plain)]))
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          'No gradients were given for any of the variables'):
        strategy.experimental_run_v2(
            lambda: mirrored_strategy.apply_gradients_across_replicas(
                optimizer, [(None, plain)]))

  def test_run_steps_on_iterator(self):
    strategy = _strategy()
    expected = _numpy_sgd()

    def step_fn(context, inputs):
      def replica_step(inputs):
        x, y = inputs
        _, _, loss = _model_loss(x, y)
        return replicate.TowerOptimizer(
            tf1.train.GradientDescentOptimizer(_LR)).minimize(loss), loss
      train, loss = strategy.extended.call_for_each_replica(
          replica_step, args=(inputs,))
      context.set_last_step_output('loss', loss, reduce_op=SUM)
      return strategy.group(train)

    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(_dataset())
      with strategy.scope():
        context = strategy.extended.experimental_run_steps_on_iterator(
            step_fn, iterator, iterations=_STEPS,
            initial_loop_values={'loss': 0.0})
      w, b = tf1.trainable_variables()
      with tf1.Session(config=CONFIG) as sess:
        sess.run([tf1.global_variables_initializer(), iterator.initialize()])
        sess.run(context.run_op)  # All steps in one run.
        self._check_copies(sess, [w, b], expected)
        self.assertGreater(sess.run(context.last_step_outputs['loss']), 0.0)


class RunStepsErrorsTest(tf.test.TestCase):

  def test_output_without_initial_value_raises(self):
    strategy = _strategy()

    def step_fn(context, inputs):
      context.set_last_step_output('loss', tf.reduce_sum(inputs.values[0]))
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(8).batch(4).repeat())
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r"The step function recorded outputs \['loss'\] but "
          r'initial_loop_values has \[\]'):
        strategy.extended.experimental_run_steps_on_iterator(step_fn,
                                                             iterator)

  def test_per_replica_output_needs_reduce_op(self):
    strategy = _strategy()

    def step_fn(context, inputs):
      context.set_last_step_output('x', inputs)
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(8).batch(4).repeat())
      with self.assertRaisesRegex(
          errors.InvalidTypeError,
          r"set_last_step_output\('x'\) got a per-replica value without a "
          'reduce_op'):
        strategy.extended.experimental_run_steps_on_iterator(
            step_fn, iterator, initial_loop_values={'x': 0})
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'iterations must be an integer >= 1, got 0'):
        strategy.extended.experimental_run_steps_on_iterator(
            step_fn, iterator, iterations=0)


class TfParityTest(parameterized.TestCase, tf.test.TestCase):
  """What TF 1.15's MirroredStrategy does or says, where it does."""

  def _variable(self, strategy):
    with strategy.scope():
      return tf1.get_variable('v', initializer=[1., 2.])

  @parameterized.parameters('scatter_add', 'scatter_update', 'scatter_sub',
                            'load', 'count_up_to')
  def test_writes_of_one_copy_are_refused(self, method):
    # They would reach one copy: TF 1.15 does not implement them either.
    strategy = _strategy()
    with tf.Graph().as_default():
      v = self._variable(strategy)
      with self.assertRaisesRegex(
          NotImplementedError, 'MirroredVariable.{} of v would update one '
          'copy only.*strategy.extended.update'.format(method)):
        getattr(v, method)(tf.IndexedSlices(tf.constant([10.]),
                                            tf.constant([0])))

  def test_state_ops_scatter_is_refused(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      v = self._variable(strategy)
      with self.assertRaisesRegex(AttributeError, '_lazy_read.*one copy'):
        tf1.scatter_add(v, [0], [10.])

  def test_scatter_through_update_reaches_every_copy(self):
    # [1, 2] + 10 at row 0, on each of the 4 copies.
    strategy = _strategy()
    with tf.Graph().as_default():
      v = self._variable(strategy)
      update = strategy.extended.update(
          v, lambda copy: copy.scatter_add(tf.IndexedSlices(
              tf.constant([10.]), tf.constant([0]))))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(v.initializer)
        sess.run(strategy.unwrap(update))
        self.assertAllEqual([[11., 2.]] * NUM, sess.run(list(v.values)))

  def test_distribute_strategy_and_worker_devices_by_replica(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      v = self._variable(strategy)
      self.assertIs(strategy, v.distribute_strategy)
    self.assertEqual([[d] for d in strategy.extended.worker_devices],
                     strategy.extended.worker_devices_by_replica)

  @parameterized.parameters('MEAN', 'mean', 'SUM')
  def test_reduce_ops_as_strings(self, name):
    # 1 + 2 + 3 + 4 = 10, mean 2.5.
    strategy = _strategy()
    with tf.Graph().as_default():
      per_replica = strategy.experimental_run_v2(
          lambda: tf.cast(replicate.get_replica_context()
                          .replica_id_in_sync_group + 1, tf.float32))
      reduced = strategy.extended.reduce_to(name, per_replica, DEVICES[0])
      with tf1.Session(config=CONFIG) as sess:
        self.assertAllClose(10. if name == 'SUM' else 2.5,
                            sess.run(strategy.unwrap(reduced))[0])

  def test_tf_phrases(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          RuntimeError, r'Method requires being in cross-replica context, '
          r'use get_replica_context\(\).merge_call\(\)'):
        strategy.experimental_run_v2(
            lambda: strategy.extended.reduce_to(SUM, 1., DEVICES[0]))
      def merge_in_merge():
        context = replicate.get_replica_context()
        return context.merge_call(
            lambda _: context.merge_call(lambda _: None))
      with self.assertRaisesRegex(
          RuntimeError, r'Need to be inside `call_for_each_replica\(\)`'):
        strategy.experimental_run_v2(merge_in_merge)
      with self.assertRaisesRegex(
          RuntimeError, 'Mixing different tf.distribute.Strategy objects'):
        with strategy.scope():
          _strategy().extended.reduce_to(SUM, 1., DEVICES[0])
      with self.assertRaisesRegex(
          ValueError, 'A non-DistributedValues value 1.0 cannot be reduced '
          'with the given reduce op ReduceOp.SUM'):
        strategy.extended.reduce_to(SUM, 1.0, DEVICES[0])
      with self.assertRaisesRegex(
          ValueError, 'Each element of `value_destination_pairs` should be '
          'a tuple'):
        strategy.extended.batch_reduce_to(SUM, [1.0])


class ConstructionTest(tf.test.TestCase):

  def test_bad_arguments(self):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'devices is empty'):
      replicate.MirroredStrategy([])
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'name the same device more than once'):
      replicate.MirroredStrategy(['/cpu:0', '/device:CPU:0'])
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'devices must be a list of device strings'):
      replicate.MirroredStrategy('/cpu:0')
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'cross_tower_ops must be a'):
      replicate.MirroredStrategy(['/cpu:0'], cross_tower_ops='nccl')

  def test_default_devices(self):
    strategy = replicate.MirroredStrategy()
    # No GPU on the test machines: the CPU.
    expected = len(tf.config.experimental.list_physical_devices('GPU')) or 1
    self.assertEqual(strategy.num_replicas_in_sync, expected)

  def test_update_of_another_strategys_variable_raises(self):
    first, second = _strategy(), _strategy()
    with tf.Graph().as_default():
      with first.scope():
        v = tf1.Variable(1.0)
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'a variable of another strategy'):
        second.extended.update(v, lambda c: c.assign(2.0))


class SingleDeviceResultTest(tf.test.TestCase):
  """A value reduced or broadcast to one device, handed to every replica."""

  def _run(self, hand_over):
    # Replica i holds x_i = [1, 2, 4, 8][i]; the mean is 15 / 4 = 3.75,
    # the sum 15.
    strategy = _strategy()
    with tf.Graph().as_default():
      def x():
        return tf.gather(tf.constant([1., 2., 4., 8.]),
                         replicate.get_replica_context()
                         .replica_id_in_sync_group)
      results = hand_over(strategy, x)
      with tf1.Session(config=CONFIG) as sess:
        return sess.run(list(strategy.experimental_local_results(results)))

  def test_merge_result_on_one_device(self):
    for destination, reduce_to in (
        (DEVICES[0], lambda s, v: s.extended.reduce_to(MEAN, v, DEVICES[0])),
        (DEVICES[2], lambda s, v: s.extended.reduce_to(SUM, v, DEVICES[2])),
        (DEVICES[0], lambda s, v: s.extended.broadcast_to(
            tf.constant(3.75), DEVICES[0]))):
      def hand_over(strategy, x, reduce_to=reduce_to):
        def fn():
          merged = replicate.get_replica_context().merge_call(
              reduce_to, args=(x(),))
          self.assertIsInstance(merged, tf.Tensor)
          return tf.identity(merged) * 2.0
        return strategy.experimental_run_v2(fn)
      got = self._run(hand_over)
      # Every replica reads the one copy: 2 x 3.75, or 2 x 15.
      expected = 30.0 if destination == DEVICES[2] else 7.5
      self.assertAllEqual([expected] * NUM, got)

  def test_argument_on_one_device(self):
    def hand_over(strategy, x):
      per_replica = strategy.experimental_run_v2(x)
      mean = strategy.extended.reduce_to(MEAN, per_replica, DEVICES[1])
      self.assertLen(mean.devices, 1)
      self.assertTrue(mean.on_device(DEVICES[1]))
      return strategy.experimental_run_v2(lambda m: m + 1.0, args=(mean,))
    self.assertAllEqual([4.75] * NUM, self._run(hand_over))

  def test_per_replica_argument_still_needs_every_device(self):
    strategy = _strategy()
    with tf.Graph().as_default():
      partial = values.PerReplica({DEVICES[0]: tf.constant(1.0),
                                   DEVICES[1]: tf.constant(2.0)})
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'is not one of the devices of this'):
        strategy.experimental_run_v2(tf.identity, args=(partial,))


class ContribConstructorTest(parameterized.TestCase, tf.test.TestCase):
  """tf.contrib.distribute.MirroredStrategy's arguments."""

  @parameterized.parameters(
      (dict(num_gpus=2), ('/device:GPU:0', '/device:GPU:1')),
      (dict(num_gpus_per_worker=3),
       ('/device:GPU:0', '/device:GPU:1', '/device:GPU:2')),
      (dict(num_gpus=0), ('/device:CPU:0',)),
      (dict(num_gpus=1, auto_shard_dataset=True), ('/device:GPU:0',)),
  )
  def test_gpu_counts(self, kwargs, expected):
    strategy = replicate.MirroredStrategy(**kwargs)
    self.assertEqual(
        tuple(tf1.DeviceSpec.from_string(d).to_string()
              for d in strategy.extended.worker_devices),
        tuple('/replica:0/task:0' + d for d in expected))
    if tf.__version__.startswith('1.'):
      # The same device strings as contrib's: no job, in graph mode.
      contrib = tf.contrib.distribute.MirroredStrategy(**kwargs)  # pylint: disable=no-member

      self.assertEqual(tuple(strategy.extended.worker_devices),
                       tuple(contrib.extended.worker_devices))

  def test_bad_counts(self):
    with self.assertRaisesRegex(
        ValueError, r'^You cannot specify both `num_gpus` and '
        r'`num_gpus_per_worker`\.'):
      replicate.MirroredStrategy(num_gpus=2, num_gpus_per_worker=2)
    with self.assertRaisesRegex(
        ValueError, r'^Must only specify one of `devices` and '
        r'`num_gpus_per_worker`\. Got devices='):
      replicate.MirroredStrategy(DEVICES, num_gpus=2)
    with self.assertRaisesRegex(ValueError, 'num_gpus must be 0 or more'):
      replicate.MirroredStrategy(num_gpus=-1)
    with self.assertRaisesRegex(TypeError, 'num_gpus must be an int'):
      replicate.MirroredStrategy(num_gpus='2')
    with self.assertRaisesRegex(TypeError, 'auto_shard_dataset must be'):
      replicate.MirroredStrategy(DEVICES, auto_shard_dataset='yes')

  def test_contrib_positional_order_is_named(self):
    ops = replicate.cross_tower_ops.ReductionToOneDeviceCrossTowerOps()
    # contrib: (devices, num_gpus, num_gpus_per_worker, cross_device_ops).
    for args in ((None, 2), (DEVICES, None, None, ops)):
      with self.assertRaisesRegex(TypeError,
                                  'pass num_gpus= and cross_device_ops= by '
                                  'keyword'):
        replicate.MirroredStrategy(*args)

  def test_tf_assertions(self):
    # TF asserts these: AssertionError, and ValueError for our callers.
    for kwargs in (
        dict(devices=['/cpu:0', '/device:CPU:0']),
        dict(devices=DEVICES,
             cross_device_ops=replicate.cross_tower_ops.ReductionToOneDevice(),
             cross_tower_ops=replicate.cross_tower_ops.ReductionToOneDevice())):
      for error in (AssertionError, ValueError):
        with self.assertRaises(error):
          replicate.MirroredStrategy(**kwargs)
    with self.assertRaisesRegex(
        AssertionError, r'^No duplicates allowed in `devices` argument: '):
      replicate.MirroredStrategy(['/cpu:0', '/cpu:1', '/cpu:0'])


class FunctionReadsTest(parameterized.TestCase, tf.test.TestCase):
  """A replica that reads its copy of a mirrored variable inside a function
  (a `tf.function`'s call, TF 2's `cond`) does not write it: it trains as
  one device. Before: refused on TF 2.15 ("cond (If) writes the copy of
  mirrored variable w"), where TF's own strategy trains it."""

  def _train(self, reader, optimizer_fn, build=None):
    """w and b after 3 steps: one device where `build` is None."""

    def loss_fn(x, y, replicas):
      w = tf1.get_variable('w', initializer=np.array(
          [[0.5], [-0.3], [0.2]], np.float32))
      b = tf1.get_variable('b', initializer=np.array([0.1], np.float32))
      if reader == 'function':
        penalty = tf.function(
            lambda: tf.reduce_sum(tf.square(w.read_value())))()
      else:  # TF 2: an `If` given w's handle; TF 1: Switch and Merge.
        penalty = tf.cond(
            tf.reduce_sum(x) > -100.0,
            lambda: tf.reduce_sum(tf.square(w.read_value())),
            lambda: tf.constant(0.0))
      # The replicas' penalties add up to one device's: 0.1 * sum(w^2).
      return (tf.reduce_sum(tf.square(tf.matmul(x, w) + b - y)) / _BATCH +
              0.1 * penalty / replicas)

    with tf.Graph().as_default():
      if build is None:
        train = optimizer_fn().minimize(
            loss_fn(tf.constant(_X), tf.constant(_Y), 1))
        initialize = []
      else:
        strategy = _strategy(replica_build=build)
        iterator = strategy.make_dataset_iterator(_dataset())
        initialize = [iterator.initialize()]
        with strategy.scope():
          train = strategy.group(strategy.experimental_run(
              lambda inputs: replicate.TowerOptimizer(optimizer_fn()).minimize(
                  loss_fn(inputs[0], inputs[1], NUM)), iterator))
      variables = [v for v in tf1.global_variables()
                   if v.op.name in ('w', 'b')]
      with tf1.Session(config=CONFIG) as sess:
        sess.run([tf1.global_variables_initializer()] + initialize)
        for _ in range(3):
          sess.run(train)
        return sess.run(variables)

  @parameterized.product(
      reader=['function', 'cond'],
      optimizer=[('sgd', lambda: tf1.train.GradientDescentOptimizer(_LR)),
                 ('adam', lambda: tf1.train.AdamOptimizer(_LR))])
  def test_a_function_reading_the_copy_trains_as_one_device(self, reader,
                                                            optimizer):
    _, optimizer_fn = optimizer
    single = self._train(reader, optimizer_fn)
    called = self._train(reader, optimizer_fn,
                         replicate.ReplicaBuild.CALL_PER_REPLICA)
    cloned = self._train(reader, optimizer_fn, replicate.ReplicaBuild.CLONE)
    for one, calls, copies in zip(single, called, cloned):
      self.assertAllClose(one, calls, rtol=1e-6, atol=1e-7)
      self.assertAllEqual(calls, copies)


if __name__ == '__main__':
  tf.test.main()

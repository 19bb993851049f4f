"""StrategyExtended's public methods: their context and argument checks,
the scope call_for_each_replica enters, and update_non_slot's arguments."""
import copy

import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.strategy import distribute_context
from replicate.strategy import mirrored_values

_NUM = 2
_DEVICES = testing.virtual_cpu_devices(_NUM)
_CONFIG = testing.virtual_cpu_config(_NUM)
SUM = replicate.ReduceOp.SUM


def _strategy():
  return replicate.MirroredStrategy(_DEVICES)


class EntryChecksTest(tf.test.TestCase):

  def test_colocate_vars_with_inside_a_replica_raises(self):
    strategy = _strategy()
    messages = []
    with tf.Graph().as_default():
      with strategy.scope():
        w = tf1.Variable(1.0, name='w')

      def fn():
        try:
          strategy.extended.colocate_vars_with(w)
        except errors.ContextError as e:
          messages.append(str(e))
      strategy.extended.call_for_each_replica(fn)
    self.assertLen(messages, _NUM)  # Each replica is refused.
    self.assertRegex(messages[0], 'colocate_vars_with must be called in a '
                     r'cross-replica context.*\(replica 0\)')

  def test_broadcast_to_empty_destinations_raises(self):
    # The default strategy ignores destinations (one device), so only the
    # public method's check refuses empty ones there.
    for strategy in (_strategy(), replicate.get_strategy()):
      with tf.Graph().as_default(), strategy.scope():
        for empty in ('', [], ()):
          with self.assertRaisesRegex(errors.InvalidArgumentError,
                                      'destinations is .*name at least one'):
            strategy.extended.broadcast_to(tf.constant(1.0), empty)
          with self.assertRaisesRegex(errors.InvalidArgumentError,
                                      'destinations is .*name at least one'):
            strategy.extended.reduce_to(SUM, tf.constant(1.0), empty)
        with self.assertRaisesRegex(errors.InvalidArgumentError,
                                    'destinations is None'):
          strategy.extended.broadcast_to(tf.constant(1.0), None)

  def test_batch_reduce_to_refuses_triples(self):
    # A 3-tuple is not a (value, destinations) pair: the library's error, a
    # ValueError and TypeError, with TF's phrase.
    strategy = _strategy()
    with tf.Graph().as_default(), strategy.scope():
      value = tf.constant(1.0)
      for bad in ([(value, _DEVICES[0], 'extra')], [(value,)]):
        with self.assertRaisesRegex(
            errors.InvalidArgumentTypeError,
            'Each element of `value_destination_pairs` should be a tuple'):
          strategy.extended.batch_reduce_to(SUM, bad)

  def test_call_for_each_replica_enters_the_scope(self):
    # Called outside any scope, it still creates variables the strategy's
    # way (one copy per device), and leaves no strategy behind.
    strategy = _strategy()
    seen = []
    with tf.Graph().as_default():
      def fn():
        seen.append(replicate.get_strategy())
        return tf1.get_variable('v', initializer=1.0)
      v = strategy.extended.call_for_each_replica(fn)
      self.assertFalse(replicate.has_strategy())
    self.assertTrue(strategy.extended.variable_created_in_scope(v))
    self.assertLen(strategy.unwrap(v), _NUM)
    self.assertIsInstance(v, mirrored_values.MirroredVariable)
    self.assertEqual(seen, [strategy] * _NUM)

  def test_update_non_slot_passes_args_and_kwargs(self):
    # fn(2.0, scale=3.0) adds 2 * 3 = 6 to each copy of the counter.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        w = tf1.Variable(0.0, name='w')
        counter = tf1.Variable(0.0, name='counter')
        devices = strategy.extended.non_slot_devices([w])
        ops = strategy.extended.update_non_slot(
            devices,
            lambda amount, scale: counter.assign_add(amount * scale,
                                                     read_value=False),
            args=(2.0,), kwargs={'scale': 3.0}, group=False)
      with tf1.Session(config=_CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(ops)
        self.assertAllEqual(sess.run(list(counter.values)), [6.0] * _NUM)


  def test_configure_refuses_a_task_id_alone(self):
    strategy = _strategy()
    for kwargs in ({'task_id': 0}, {'task_type': 'worker'},
                   {'cluster_spec': {'worker': ['localhost:1']}}):
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'runs on local devices only'):
        strategy.configure(**kwargs)
    strategy.configure(session_config=tf1.ConfigProto())  # Allowed.

  def test_deepcopy_forgets_the_originals_variables(self):
    # The copy starts without the original's bookkeeping: neither its plain
    # variables nor the containers of its mirrored copies are the copy's.
    strategy = _strategy()
    with tf.Graph().as_default(), strategy.scope():
      v = tf1.get_variable('v', initializer=1.0)
      with distribute_context.unmirrored_variables():
        plain = tf1.get_variable('plain', initializer=2.0)
      copied = copy.deepcopy(strategy)
      first = strategy.unwrap(v)[0]
      self.assertTrue(strategy.extended.variable_created_in_scope(plain))
      self.assertFalse(copied.extended.variable_created_in_scope(plain))
      self.assertIs(strategy.extended.value_container(first), v)
      self.assertIs(copied.extended.value_container(first), first)


if __name__ == '__main__':
  tf.test.main()

"""ON_READ variables in an update context, assignment names, conversions.

The copies hold 1, 2, 3, 4 after replica i adds i + 1 (SUM: 10).
"""
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1

NUM = 4
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)
AGG = tf.VariableAggregation


def _strategy():
  return replicate.MirroredStrategy(DEVICES)


def _replica_plus_one():
  """i + 1 in replica i, as a float."""
  return float(replicate.get_replica_context().replica_id_in_sync_group) + 1.0


def _on_read(name, aggregation):
  return tf1.get_variable(name, (), initializer=tf1.zeros_initializer(),
                          synchronization=tf.VariableSynchronization.ON_READ,
                          aggregation=aggregation)


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

"""ReplicaContext: num_replicas_in_sync in replicas, all_reduce, devices."""
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1

NUM = 4
DEVICES = testing.virtual_cpu_devices(NUM)


class ReplicaContextTest(tf.test.TestCase):

  def test_num_replicas_in_sync_inside_replicas(self):
    # Every replica of a 4-device strategy is one of 4 (not 1, its devices).
    strategy = replicate.MirroredStrategy(DEVICES)
    seen = []
    with tf.Graph().as_default():
      strategy.experimental_run_v2(lambda: seen.append(
          replicate.get_replica_context().num_replicas_in_sync))
    self.assertEqual([NUM] * NUM, seen)

  def test_default_all_reduce_refuses_other_ops(self):
    # One replica makes SUM and MEAN identities, but other ops are still
    # refused, as in a strategy's replicas.
    context = replicate.get_replica_context()
    with tf.Graph().as_default():
      t = tf.constant(1.0)
      for op in ('MAX', tf.VariableAggregation.ONLY_FIRST_REPLICA, None):
        with self.assertRaisesRegex(errors.InvalidArgumentError,
                                    'Cannot reduce with'):
          context.all_reduce(op, t)
      self.assertIsInstance(context.all_reduce('sum', t), tf.Tensor)

  def test_default_all_reduce_of_a_variable_gives_tensors(self):
    # The reduced nest holds tensors (a read of the variable), not the
    # variable itself.
    context = replicate.get_replica_context()
    with tf.Graph().as_default():
      v = tf1.get_variable('v', initializer=2.0, use_resource=True)
      reduced = context.all_reduce(replicate.ReduceOp.SUM, {'v': v})
      self.assertIsInstance(reduced['v'], tf.Tensor)
      with tf1.Session() as sess:
        sess.run(v.initializer)
        self.assertEqual({'v': 2.0}, sess.run(reduced))

  def test_devices_outside_its_replica_raises(self):
    strategy = replicate.MirroredStrategy(DEVICES)
    contexts = []
    with tf.Graph().as_default():
      strategy.experimental_run_v2(
          lambda: contexts.append(replicate.get_replica_context()))
      # No strategy is current: outside its replica.
      with self.assertRaisesRegex(
          errors.ContextError,
          'ReplicaContext.devices was called outside its replica'):
        _ = contexts[0].devices
      with strategy.scope():
        with self.assertRaisesRegex(
            errors.ContextError,
            'ReplicaContext.devices must be called in its replica context, '
            'but was called in a cross-replica context'):
          _ = contexts[1].devices


if __name__ == '__main__':
  tf.test.main()

"""The context errors name where the other strategy was met, and nest."""
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing


def _mirrored(num=2):
  return replicate.MirroredStrategy(testing.virtual_cpu_devices(num))


class WrongStrategyMessageTest(tf.test.TestCase):

  def test_message_says_scope_inside_a_scope(self):
    first, second = _mirrored(), _mirrored()
    with tf.Graph().as_default(), first.scope():
      with self.assertRaisesRegex(
          errors.ContextError,
          r'Mixing different strategies: MirroredStrategy \(id 0x[0-9a-f]+\) '
          r'was used inside the scope of another strategy'):
        second.extended.reduce_to(replicate.ReduceOp.SUM, tf.constant(1.),
                                  '/cpu:0')

  def test_message_says_replica_context_inside_a_replica(self):
    # Replica 0 of `first` calls `second`: the message says it was inside
    # the replica context (not a scope) of another strategy.
    first, second = _mirrored(), _mirrored()
    messages = []

    def fn():
      try:
        second.extended.reduce_to(replicate.ReduceOp.SUM, tf.constant(1.),
                                  '/cpu:0')
      except errors.ContextError as e:
        messages.append(str(e))
    with tf.Graph().as_default():
      first.extended.call_for_each_replica(fn)
    self.assertLen(messages, 2)  # Both replicas refused.
    for message in messages:
      self.assertRegex(message,
                       'was used inside the replica context of another '
                       'strategy')
      self.assertNotRegex(message, 'inside the scope of')


if __name__ == '__main__':
  tf.test.main()

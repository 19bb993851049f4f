"""Nesting of distribute_context's thread-local blocks and stack checks."""
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate.strategy import distribute_context


class CounterBlocksNestTest(tf.test.TestCase):

  def test_unmirrored_variables_stays_open_after_an_inner_block(self):
    self.assertFalse(distribute_context.creating_unmirrored_variables())
    with distribute_context.unmirrored_variables():
      with distribute_context.unmirrored_variables():
        self.assertTrue(distribute_context.creating_unmirrored_variables())
      # The outer block is still open.
      self.assertTrue(distribute_context.creating_unmirrored_variables())
    self.assertFalse(distribute_context.creating_unmirrored_variables())

  def test_nested_unmirrored_block_keeps_variables_plain(self):
    # A variable made after an inner block closes, still inside the outer
    # one, is a plain variable, not a mirrored one.
    strategy = replicate.MirroredStrategy(testing.virtual_cpu_devices(2))
    with tf.Graph().as_default(), strategy.scope():
      with distribute_context.unmirrored_variables():
        with distribute_context.unmirrored_variables():
          pass
        v = tf.compat.v1.get_variable('plain', initializer=1.0)
      w = tf.compat.v1.get_variable('mirrored', initializer=1.0)
    self.assertNotIsInstance(v, type(w))
    self.assertLen(strategy.unwrap(v), 1)
    self.assertLen(strategy.unwrap(w), 2)

  def test_loop_body_stays_open_after_an_inner_block(self):
    self.assertFalse(distribute_context.building_loop_body())
    with distribute_context.in_loop_body():
      with distribute_context.in_loop_body():
        self.assertTrue(distribute_context.building_loop_body())
      self.assertTrue(distribute_context.building_loop_body())
    self.assertFalse(distribute_context.building_loop_body())


class PushedChecksTheTopTest(tf.test.TestCase):

  def test_exit_with_the_same_depth_but_another_top_raises(self):
    # x (depth 1) and y (depth 2) are pushed; x exits first (reported, and the
    # stack is emptied). w (depth 1) and v (depth 2) are then pushed: when y
    # exits the stack has y's depth again but v on top, which is misnesting.
    strategy = replicate.MirroredStrategy(testing.virtual_cpu_devices(2))
    contexts = [distribute_context.Context(strategy,
                                           cross_replica_context=strategy)
                for _ in range(4)]
    x, y, w, v = [distribute_context.pushed(c) for c in contexts]
    try:
      x.__enter__()
      y.__enter__()
      with self.assertRaisesRegex(errors.ContextError, 'not properly nested'):
        x.__exit__(None, None, None)
      self.assertIsNone(distribute_context.innermost())
      w.__enter__()
      v.__enter__()
      with self.assertRaisesRegex(errors.ContextError, 'not properly nested'):
        y.__exit__(None, None, None)
      # y's failed exit cut the stack back to below y's depth: w is innermost.
      self.assertIs(distribute_context.innermost(), contexts[2])
      with self.assertRaisesRegex(errors.ContextError, 'not properly nested'):
        v.__exit__(None, None, None)
      w.__exit__(None, None, None)
      self.assertIsNone(distribute_context.innermost())
    finally:
      # Under a bug the generators may still be open: close them quietly and
      # leave an empty stack for the next test.
      for manager in (v, w, y, x):
        try:
          manager.gen.close()
        except errors.ContextError:
          pass
      del distribute_context._stack()[:]  # pylint: disable=protected-access


if __name__ == '__main__':
  tf.test.main()

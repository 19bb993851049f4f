"""The default strategy's extended methods: order, grouping, colocation."""
import tensorflow as tf

import replicate
from replicate import testing
from replicate._compat import tf1

SUM = replicate.ReduceOp.SUM


def _colocation(op):
  return [g.decode() for g in op.colocation_groups()]


class DefaultStrategyExtendedTest(tf.test.TestCase):

  def test_batch_reduce_to_keeps_the_order(self):
    # One replica: each reduction is its value, in the order given.
    extended = replicate.get_strategy().extended
    with tf.Graph().as_default():
      v = tf1.get_variable('v', initializer=0.0, use_resource=True)
      values = [tf.constant(1.0), tf.constant(2.0), tf.constant(3.0)]
      reduced = extended.batch_reduce_to(SUM, [(t, v) for t in values])
      self.assertLen(reduced, 3)
      for t, r in zip(values, reduced):
        self.assertIs(t, r)

  def test_update_groups_as_asked(self):
    # group=True: fn's result as it is; group=False: each leaf as a tuple of
    # its one replica's results (as TF's default strategy).
    extended = replicate.get_strategy().extended
    with tf.Graph().as_default():
      v = tf1.get_variable('v', initializer=2.0, use_resource=True)
      grouped = extended.update(
          v, lambda var: tf.identity(var.assign_add(1.0)))
      ungrouped = extended.update(
          v, lambda var: tf.identity(var.assign_add(10.0)), group=False)
      self.assertIsInstance(grouped, tf.Tensor)
      self.assertIsInstance(ungrouped, tuple)
      self.assertLen(ungrouped, 1)
      with tf1.Session() as sess:
        sess.run(v.initializer)
        self.assertEqual(3.0, sess.run(grouped))
        self.assertEqual((13.0,), sess.run(ungrouped))

  def test_updates_are_colocated_with_the_variable(self):
    # The ops fn builds in update / update_non_slot go with the variable.
    extended = replicate.get_strategy().extended
    with tf.Graph().as_default():
      v = tf1.get_variable('v', initializer=2.0, use_resource=True)

      def fn(var, delta):
        return var.assign_add(tf.add(delta, 1.0, name='in_update'))
      extended.update(v, fn, args=(1.0,))
      extended.update_non_slot(
          v, lambda: v.assign_add(tf.add(2.0, 1.0, name='in_non_slot')))
      graph = tf1.get_default_graph()
      self.assertEqual(['loc:@v'],
                       _colocation(graph.get_operation_by_name('in_update')))
      self.assertEqual(['loc:@v'],
                       _colocation(graph.get_operation_by_name('in_non_slot')))

  def test_colocate_vars_with(self):
    extended = replicate.get_strategy().extended
    with tf.Graph().as_default():
      v = tf1.get_variable('v', initializer=2.0, use_resource=True)
      with extended.colocate_vars_with(v):
        w = tf1.get_variable('w', initializer=3.0, use_resource=True)
      self.assertEqual(['loc:@v'], _colocation(w.op))

  def test_variable_created_in_scope_refuses_distributed_variables(self):
    # A variable of a MirroredStrategy was not created by the default one.
    strategy = replicate.MirroredStrategy(testing.virtual_cpu_devices(2))
    with tf.Graph().as_default():
      with strategy.scope():
        mirrored = tf1.get_variable('m', initializer=1.0)
      plain = tf1.get_variable('p', initializer=1.0)
      extended = replicate.get_strategy().extended
      self.assertFalse(extended.variable_created_in_scope(mirrored))
      self.assertTrue(extended.variable_created_in_scope(plain))

  def test_read_var_is_a_tensor(self):
    extended = replicate.get_strategy().extended
    with tf.Graph().as_default():
      v = tf1.get_variable('v', initializer=2.0, use_resource=True)
      read = extended.read_var(v)
      self.assertIsInstance(read, tf.Tensor)
      with tf1.Session() as sess:
        sess.run(v.initializer)
        self.assertEqual(2.0, sess.run(read))


if __name__ == '__main__':
  tf.test.main()

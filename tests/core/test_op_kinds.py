"""`op_kinds.variable_writes` follows a resource handle into the functions
that get it (a `tf.function`'s call, TF 2's `cond` and `while_loop`): a call
whose functions only read the variable is no write, one whose functions
write it (or pass it to a write, nested or returned) is."""
import tensorflow as tf

from replicate._compat import tf1
from replicate.core import op_kinds


def _variable(name='v'):
  return tf1.get_variable(name, initializer=[1.0, 2.0], use_resource=True)


def _writes(variable):
  """The types of the variable's writes but its initializer."""
  return sorted(op.type for op in op_kinds.variable_writes(variable.op)
                if op is not variable.initializer)


class FunctionCallWritesTest(tf.test.TestCase):

  def test_a_function_that_reads_is_no_write(self):
    with tf.Graph().as_default():
      v = _variable()

      @tf.function
      def read(x):
        return x * v.read_value()

      read(tf.constant(3.0))
      self.assertIn('StatefulPartitionedCall', [
          op.type for op in v.op.outputs[0].consumers()])
      self.assertEqual([], _writes(v))

  def test_a_function_that_assigns_is_a_write(self):
    with tf.Graph().as_default():
      v = _variable()

      @tf.function
      def add(x):
        v.assign_add([x, x])
        return v.read_value()

      add(tf.constant(3.0))
      self.assertEqual(['StatefulPartitionedCall'], _writes(v))

  def test_nested_functions(self):
    # The outer function only passes the handle to the inner one: the
    # outer call writes where the inner function does.
    for inner_writes in (False, True):
      with tf.Graph().as_default():
        v = _variable()

        @tf.function
        def inner(x, write=inner_writes):
          if write:
            v.assign([x, x])
          return v.read_value()

        @tf.function
        def outer(x):
          return inner(x) + 1.0

        outer(tf.constant(3.0))
        self.assertEqual(['StatefulPartitionedCall'] if inner_writes else [],
                         _writes(v))

  def test_a_returned_handle_is_followed(self):
    # The function returns the handle it got; the assign outside writes
    # through that result. Calls of two variables tell the variables apart.
    with tf.Graph().as_default():
      v, w = _variable('v'), _variable('w')

      @tf.function
      def handles():
        return tf.identity(v.handle), w.read_value()

      handle, _ = handles()
      tf1.raw_ops.AssignVariableOp(resource=handle, value=[5.0, 6.0])
      self.assertEqual(['AssignVariableOp'], _writes(v))
      self.assertEqual([], _writes(w))

  def test_v2_cond_and_while_loop(self):
    if not tf1.control_flow_v2_enabled():
      self.skipTest('TF1 control flow: Switch and Enter, followed as before')
    with tf.Graph().as_default():
      v, w = _variable('v'), _variable('w')
      read = tf.cond(tf.constant(True), lambda: v.read_value() + w,
                     lambda: tf.zeros([2]))
      self.assertIn('If', [op.type for op in v.op.outputs[0].consumers()])
      tf.while_loop(lambda i: i < 3.0,
                    lambda i: i + tf.reduce_sum(v.read_value()), [0.0])
      self.assertEqual([], _writes(v))
      tf.cond(read[0] > 0.0, lambda: w.assign([0.0, 0.0]).op, tf.no_op)

      def body(i):
        with tf.control_dependencies([v.assign_add([i, i])]):
          return i + 1.0

      tf.while_loop(lambda i: i < 3.0, body, [0.0])
      self.assertEqual(['If'], _writes(w))
      self.assertEqual(['While'], _writes(v))


if __name__ == '__main__':
  tf.test.main()

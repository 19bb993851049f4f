"""`op_kinds.variable_writes` follows a resource handle into the functions
that get it (a `tf.function`'s call, TF 2's `cond`, `switch_case` and
`while_loop`, TF 1's `Defun` called by name): a call whose functions only
read the variable is no write, one whose functions write it (or pass it to
a write, nested or returned) is."""
import tensorflow as tf
from tensorflow.python.framework import function as tf_function  # Defun

from replicate._compat import tf1
from replicate.core import op_kinds


def _variable(name='v', use_resource=True):
  return tf1.get_variable(name, initializer=[1.0, 2.0],
                          use_resource=use_resource)


def _writes(variable):
  """The types of the variable's writes but its initializer."""
  return sorted(op.type for op in op_kinds.variable_writes(variable.op)
                if op is not variable.initializer)


def _read(handle):
  return tf1.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)


def _assign(handle, value):
  return tf1.raw_ops.AssignVariableOp(resource=handle, value=value)


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


class MoreCallWritesTest(tf.test.TestCase):

  def test_a_cond_whose_else_branch_writes_is_a_write(self):
    # The write is in the else branch only (then only reads).
    if not tf1.control_flow_v2_enabled():
      self.skipTest('TF1 control flow: Switch and Merge')
    with tf.Graph().as_default():
      v = _variable()
      tf.cond(tf.constant(False), lambda: tf.identity(v.read_value()),
              lambda: v.assign([0.0, 0.0]).value())
      self.assertEqual(['If'], _writes(v))

  def test_a_switch_case_whose_last_branch_writes_is_a_write(self):
    # A `Case` op: branches 0 and 1 read, branch 2 writes.
    if not tf1.control_flow_v2_enabled():
      self.skipTest('TF1 control flow')
    with tf.Graph().as_default():
      v, w = _variable('v'), _variable('w')
      tf.switch_case(tf.constant(1), [
          lambda: v.read_value() + w.read_value(),
          lambda: 2.0 * v.read_value(),
          lambda: v.assign([0.0, 0.0]).value()])
      self.assertIn('Case', [op.type for op in v.op.outputs[0].consumers()])
      self.assertEqual(['Case'], _writes(v))
      self.assertEqual([], _writes(w))

  def test_a_while_condition_that_writes_is_a_write(self):
    # The loop's condition counts its tests in v; the body only reads v.
    if not tf1.control_flow_v2_enabled():
      self.skipTest('TF1 control flow: Enter and Exit')
    with tf.Graph().as_default():
      v = _variable()

      def cond(i):
        with tf.control_dependencies([v.assign_add([1.0, 1.0])]):
          return i < 3.0

      tf.while_loop(cond, lambda i: i + tf.reduce_sum(v.read_value()), [0.0])
      self.assertEqual(['While'], _writes(v))

  def test_one_function_getting_the_handle_twice(self):
    # f reads its first argument and writes its second; given v's handle as
    # both, the call writes v (whichever argument is looked at first).
    with tf.Graph().as_default():
      v = _variable()

      @tf.function
      def f(a, b):
        with tf.control_dependencies([_assign(b, [5.0, 6.0])]):
          return _read(a)

      f(v.handle, v.handle)
      self.assertEqual(['StatefulPartitionedCall'], _writes(v))

  def test_identity_n_in_a_body(self):
    # The handle at position 1 of an `IdentityN` in the body: read through
    # it, no write; assigned through it, a write.
    for write in (False, True):
      with tf.Graph().as_default():
        v = _variable()

        @tf.function
        def f(x, write=write):
          y, handle = tf.identity_n([x, v.handle])
          if write:
            _assign(handle, y)
          return _read(handle) + y

        f(tf.constant([3.0, 4.0]))
        self.assertEqual(['StatefulPartitionedCall'] if write else [],
                         _writes(v), msg=write)

  def test_identity_n_passes_on_only_the_handle(self):
    # The other output of an `IdentityN` (a value) is no variable: assigning
    # it to a reference variable w writes w, not v.
    with tf.Graph().as_default():
      v = _variable('v')
      w = _variable('w', use_resource=False)
      handle, value = tf.identity_n([v.handle, tf.constant([3.0, 4.0])])
      tf1.assign(w, value)
      _read(handle)
      self.assertEqual([], _writes(v))
      self.assertEqual(['Assign'], _writes(w))

  def test_a_handle_returned_by_a_nested_function_is_followed(self):
    # inner returns v's handle; outer assigns through it.
    with tf.Graph().as_default():
      v = _variable()

      @tf.function
      def inner():
        return tf.identity(v.handle)

      @tf.function
      def outer(x):
        _assign(inner(), x)
        return x

      outer(tf.constant([3.0, 4.0]))
      self.assertEqual(['StatefulPartitionedCall'], _writes(v))

  def test_calls_by_name(self):
    # TF 1's `Defun` calls a function by its name (the op type is the
    # function's): one that reads is no write; one whose nested call returns
    # the handle, which it assigns, is.
    with tf.Graph().as_default():
      v = _variable('v')
      w = _variable('w')

      @tf_function.Defun(tf.resource)
      def read(handle):
        return _read(handle) * 2.0

      @tf_function.Defun(tf.resource)
      def passed(handle):
        return tf.identity(handle)

      @tf_function.Defun(tf.resource)
      def write(handle):
        inner = passed(handle)
        with tf.control_dependencies([_assign(inner, [5.0, 6.0])]):
          return tf.constant(1.0)

      read(v.handle)
      write(w.handle)
      self.assertEqual([], _writes(v))
      self.assertEqual([write.name], _writes(w))



if __name__ == '__main__':
  tf.test.main()

"""Per-variable gradient gating for towers: GATE_OP's guarantee, cheaper.

GATE_OP keeps a variable's update from running while a backward op (e.g.
`dY . W^T`) still reads the variable, by grouping the outputs of every
gradient function: every gradient op then depends on its siblings, and a
tower must compute its own weight gradients even where the aggregation could
fuse them. Towers instead compute gradients ungated and make each variable's
gradient wait for the ops of the tower's gradient computation that read that
variable. A variable read inside TF1 control flow (`while_loop`/`cond` built
as frames and branches, where nothing outside may wait for one op) waits for
every gradient of the tower instead. The ungated gradients are returned as
`RawGradient`s, so that the aggregation can fuse them under the same gate.
"""
import collections

import tensorflow as tf

from replicate._compat import tf1

# Ops that read a variable without copying it: a reference variable's
# snapshot (`Identity`) and a resource variable's `ReadVariableOp`.
READ_OP_TYPES = frozenset(['Identity', 'ReadVariableOp'])
# Ops that are a variable.
VARIABLE_OP_TYPES = frozenset(['VariableV2', 'Variable', 'VarHandleOp'])
# TF1 control flow: ops that run in a loop's frame or a branch, where no op
# outside may wait for them (see the module docstring).
_CONTROL_FLOW_OP_TYPES = frozenset([
    'Enter', 'RefEnter', 'Switch', 'RefSwitch', 'Merge', 'RefMerge', 'Exit',
    'RefExit', 'NextIteration', 'RefNextIteration', 'LoopCond'])
# Those of them through which a loop or a branch receives a tensor (here: a
# variable, or a read of one).
_CONTROL_FLOW_ENTRY_TYPES = frozenset(['Enter', 'RefEnter', 'Switch',
                                       'RefSwitch'])


class RawGradient(
    collections.namedtuple('RawGradient', ['tensor', 'gates'])):
  """An ungated gradient and what it must wait for.

  Attributes:
    tensor: the gradient as the gradient function produced it (a `Tensor`, or
      the values of an `IndexedSlices`).
    gates: ops of the same tower's gradient computation that must have run
      before the variable may change: those that read it, or, for a
      variable read inside TF1 control flow, every gradient of the tower;
      whatever is computed from `tensor` in its place must not be used
      before they ran.
  """
  __slots__ = ()


def ops_created_by(graph, fn):
  """Calls `fn()` and returns its result and the ops it added to `graph`.

  Args:
    graph: the graph `fn` builds in.
    fn: a function with no arguments.

  Returns:
    `(result, ops)`: `fn`'s return value and the list of new operations, in
    creation order.
  """
  first = len(graph.get_operations())
  result = fn()
  return result, graph.get_operations()[first:]


def gate_by_variable(grads_and_vars, gradient_ops):
  """Gates each variable's gradient on the gradient ops that read it.

  Args:
    grads_and_vars: `(gradient, variable)` pairs computed without gating
      (`gate_gradients=GATE_NONE`); `None` gradients are kept as they are.
    gradient_ops: the ops the gradient computation created (see
      `ops_created_by`).

  Returns:
    `(gated_grads_and_vars, raw)`: the pairs with every gradient whose
    variable is read by some op of `gradient_ops` replaced by an identity
    that waits for those ops (an `IndexedSlices` gets gated values), and a
    dict from each returned gradient tensor's name (the values' name for
    `IndexedSlices`) to its `RawGradient`. A variable that some op of
    `gradient_ops` reads inside TF1 control flow gets a gradient that waits
    for every gradient in `grads_and_vars` instead.
  """
  readers, read_in_control_flow = _readers_by_variable_op(gradient_ops)
  every_gradient = None
  result = []
  raw = {}
  for grad, var in grads_and_vars:
    if grad is None:
      result.append((grad, var))
      continue
    gates = readers.get(var.op.name, ())
    if var.op.name in read_in_control_flow:
      if every_gradient is None:
        every_gradient = _gradient_ops(grads_and_vars)
      gates = list(gates) + [op for op in every_gradient if op not in gates]
    values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
    gated_values = gate(values, gates)
    raw[gated_values.name] = RawGradient(values, tuple(gates))
    if isinstance(grad, tf.IndexedSlices):
      grad = tf.IndexedSlices(gated_values, grad.indices, grad.dense_shape)
    else:
      grad = gated_values
    result.append((grad, var))
  return result, raw


def gate(tensor, gates):
  """`tensor`, or an identity of it (on its device) that waits for `gates`."""
  return _gated_identity(tensor, gates) if gates else tensor


def _gated_identity(tensor, gates):
  with tf1.device(tensor.device), tf1.control_dependencies(gates):
    return tf.identity(tensor, name='gated_gradient')


def _gradient_ops(grads_and_vars):
  """The ops producing the gradients of `grads_and_vars`, without repeats."""
  ops = []
  for grad, _ in grads_and_vars:
    if grad is None:
      continue
    parts = ([grad.values, grad.indices] if isinstance(grad, tf.IndexedSlices)
             else [grad])
    for tensor in parts:
      if tensor.op not in ops:
        ops.append(tensor.op)
  return ops


def _readers_by_variable_op(ops):
  """The ops among `ops` that read each variable, and where that is unsafe.

  Returns:
    `(readers, read_in_control_flow)`: a dict from each variable op's name
    to the ops that read the variable outside TF1 control flow, and the set
    of the names of the variables that some op brings into TF1 control flow.
  """
  readers = collections.defaultdict(list)
  read_in_control_flow = set()
  for op in ops:
    if op.type in _CONTROL_FLOW_OP_TYPES:
      if op.type in _CONTROL_FLOW_ENTRY_TYPES and op.inputs:
        variable_op = _variable_op_read_by(op.inputs[0])
        if variable_op is not None:
          read_in_control_flow.add(variable_op.name)
      continue
    if op.outputs and not any(t.consumers() for t in op.outputs):
      # A dead end of the gradient computation (e.g. the gradient of the
      # first layer's input): nothing runs it, so there is nothing to wait
      # for, and waiting would make every step compute it.
      continue
    seen = set()
    for tensor in op.inputs:
      variable_op = _variable_op_read_by(tensor)
      if variable_op is not None and variable_op.name not in seen:
        seen.add(variable_op.name)
        readers[variable_op.name].append(op)
  return readers, read_in_control_flow


def _variable_op_read_by(tensor):
  """The variable op `tensor` is (or is a read of), or None."""
  source = tensor.op
  if source.type in READ_OP_TYPES and source.inputs:
    source = source.inputs[0].op
  return source if source.type in VARIABLE_OP_TYPES else None

"""Per-variable gradient gating for towers: GATE_OP's guarantee, cheaper.

`Optimizer.compute_gradients(gate_gradients=GATE_OP)` (the default, and what
`minimize` passes) groups the outputs of every gradient function, so that a
variable's gradient is not released while another gradient op still reads
the variable: without it, the update could overwrite a reference variable's
buffer while, e.g., the input gradient of a `MatMul` (`dY . W^T`) still reads
`W`. The grouping has a price in a replicated model: it makes every gradient
op depend on all of its siblings, so a tower always computes its own weight
gradient `X^T . dY` even when the aggregation could compute the sum of all
towers' in one product (see `gradient_aggregation.py`), and it adds a `tuple`
(a `NoOp` and one `Identity` per output) to every gradient function.

Towers therefore compute their gradients ungated and gate each *variable's*
gradient instead: it depends on every op of the tower's gradient computation
that reads that variable (except dead ends nothing consumes, such as the
gradient of the model's input, which then is not computed at all). That is
the race GATE_OP exists to prevent (no update of `W` while a backward op
reads `W`), with one identity per variable that is read during
back-propagation instead of a tuple per gradient op.

TF1 control flow (`tf.compat.v1.while_loop` and `cond` with control flow
v1) needs more. Its backward ops read a variable through an `Enter` or
`Switch` and run in a loop's frame or a branch, where no op outside may
wait for them, and a loop's outputs leave it one by one: the summed
gradient of `W` can exit the backward loop while the loop's last `dA . W^T`
still reads `W`. The gradient of a variable read that way waits for every
gradient of the tower instead (GATE_GRAPH's guarantee, for that variable
only): a backward op whose result is used at all feeds one of them, so all
of them have run once every gradient has been computed. (Functional control
flow, TF 2's `While` and `If`, reads the variable as an input of the op
itself and is gated like any other reader.)

The ungated gradients are returned alongside, as `RawGradient`s, so that the
aggregation can compute a sum from a gradient's inputs and apply the same
gate to them.
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

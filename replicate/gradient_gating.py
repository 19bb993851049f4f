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
gradient of the model's input, which then is not computed at all, and TF1
control-flow ops, which run in a loop's frame). That is the race GATE_OP
exists to prevent (no update of `W` while a backward op reads `W`), with one
identity per variable that is read during back-propagation instead of a
tuple per gradient op.

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
# TF1 control flow brings a variable into a `tf.while_loop` or `tf.cond`
# through these; the ops that read it inside run in the loop's frame, where
# no op outside may wait for them. They need no gate either: a gradient
# flowing out of a loop is only produced once the loop has finished.
_CONTROL_FLOW_OP_TYPES = frozenset([
    'Enter', 'RefEnter', 'Switch', 'RefSwitch', 'Merge', 'RefMerge', 'Exit',
    'RefExit', 'NextIteration', 'RefNextIteration', 'LoopCond'])


class RawGradient(
    collections.namedtuple('RawGradient', ['tensor', 'gates'])):
  """An ungated gradient and what it must wait for.

  Attributes:
    tensor: the gradient as the gradient function produced it (a `Tensor`, or
      the values of an `IndexedSlices`).
    gates: the ops (of the same tower's gradient computation) that read the
      variable; whatever is computed from `tensor` in its place must not be
      used before they ran.
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
    `IndexedSlices`) to its `RawGradient`.
  """
  readers = _readers_by_variable_op(gradient_ops)
  result = []
  raw = {}
  for grad, var in grads_and_vars:
    if grad is None:
      result.append((grad, var))
      continue
    gates = readers.get(var.op.name, ())
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


def _readers_by_variable_op(ops):
  """For each variable op name, the ops among `ops` that read the variable."""
  readers = collections.defaultdict(list)
  for op in ops:
    if op.type in _CONTROL_FLOW_OP_TYPES:
      continue
    if op.outputs and not any(t.consumers() for t in op.outputs):
      # A dead end of the gradient computation (e.g. the gradient of the
      # first layer's input): nothing runs it, so there is nothing to wait
      # for, and waiting would make every step compute it.
      continue
    seen = set()
    for tensor in op.inputs:
      source = tensor.op
      if source.type in READ_OP_TYPES and source.inputs:
        variable_op = source.inputs[0].op
      else:
        variable_op = source
      if _is_variable_op(variable_op) and variable_op.name not in seen:
        seen.add(variable_op.name)
        readers[variable_op.name].append(op)
  return readers


def _is_variable_op(op):
  return op.type in VARIABLE_OP_TYPES

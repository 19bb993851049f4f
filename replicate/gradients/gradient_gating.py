"""`gate_gradients` of towers and replicas, and the ops a call creates.

A variable's update must not run while a backward op (e.g. `dY . W^T`)
still reads the variable, whichever ops lie between the variable and that
reader (a `read` snapshot, a `Transpose` or `Reshape` that aliases its
buffer, control flow). One device gets this from `GATE_OP`: TF's `tuple`
per gradient op, about 350 ops per ResNet-50 tower. Towers instead compute
their gradients ungated (`tower_kwargs`) and the update waits for one
barrier per tower (`barrier`, `wait_for_barriers`): a `NoOp` that waits for
every gradient the tower hands to `apply_gradients`, so for every backward
op the step runs. The gradients themselves are not gated, so all-reducing
them still overlaps back-propagation.

`MirroredStrategy` replicas, and towers of a `SyncReplicasOptimizer` (whose
updates run outside the step), keep the `gate_gradients` given. Imports
nothing of the package but `_compat`, `errors` and `core`.
"""
import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.core import op_kinds

_GATES = (tf1.train.Optimizer.GATE_NONE, tf1.train.Optimizer.GATE_OP,
          tf1.train.Optimizer.GATE_GRAPH)


def check_gate_gradients(kwargs):
  """Checks the `gate_gradients` of `compute_gradients`' keyword arguments.

  Raises:
    InvalidArgumentError: if it is not `GATE_NONE`, `GATE_OP` or
      `GATE_GRAPH`.
  """
  gate_gradients = kwargs.get('gate_gradients', tf1.train.Optimizer.GATE_OP)
  if gate_gradients not in _GATES:
    raise errors.InvalidArgumentError(
        'gate_gradients must be TowerOptimizer.GATE_NONE, GATE_OP or '
        'GATE_GRAPH, got {!r}.'.format(gate_gradients))


def tower_kwargs(optimizer, kwargs):
  """A tower's `compute_gradients` arguments: `GATE_OP` (the default) becomes
  `GATE_NONE`, since the update waits for the tower's barrier instead.
  `GATE_GRAPH` (every gradient computed before any is used, transforms
  included) is kept, and so is any gate of a `SyncReplicasOptimizer`: its
  updates run in its chief's queue runner, outside the step that the
  barriers hold back; only TF's tuples tie its accumulators' inputs to the
  backward reads."""
  gate = kwargs.get('gate_gradients', tf1.train.Optimizer.GATE_OP)
  if (gate == tf1.train.Optimizer.GATE_OP and
      not isinstance(optimizer, tf1.train.SyncReplicasOptimizer)):
    return dict(kwargs, gate_gradients=tf1.train.Optimizer.GATE_NONE)
  return kwargs


def barrier(gradients, name_scope):
  """A `NoOp` that waits for `gradients` (Tensors or IndexedSlices, and
  the losses they are of) only.

  Returns None for no gradient. Made under the absolute `name_scope` ('' or
  ending in '/': the tower's), outside any open control dependencies (those
  of the tower's call are the update's business) and, as TF's `group`, on
  the device of the gradients' ops.
  """
  tensors = []
  for grad in gradients:
    if isinstance(grad, tf.IndexedSlices):
      tensors.extend(t for t in (grad.values, grad.indices, grad.dense_shape)
                     if t is not None)
    elif grad is not None:
      tensors.append(grad)
  if not tensors:
    return None
  with tf1.name_scope(name_scope), tf1.control_dependencies(None):
    waits = [_data_wait(t) for t in tensors]
    with tf1.device(tensors[0].device), tf1.control_dependencies(waits):
      return tf.no_op(name='gradients_computed')


def _data_wait(tensor):
  """What waits for `tensor`'s value: its op, or, where the op calls a
  function (a `tf.function`, TF 2 control flow), an `Identity` of it. Once TF
  inlines the call, a control edge from it waits only for the function's
  stateful ops, not for its outputs, nor for the backward ops that feed
  them (a `dY . W^T` still reading a reference variable)."""
  if tensor.op.type not in op_kinds.FUNCTION_CALL_OP_TYPES:
    return tensor
  with tf1.device(tensor.device):
    return tf.identity(tensor, name='gradient_value')


def wait_for_barriers(result, created, barriers):
  """Makes the writes of an apply wait for every tower's barrier.

  The ops that `result` (the apply's Tensor, Operation or variable) needs
  among `created` (the ops the apply made), and that take a variable made
  before the apply (its reference or handle, directly or passed on), get
  `barriers` as control inputs: every update, and what brings a variable
  into an update's control flow (a `Switch`, an `Enter`, a TF 2 `If`). A
  variable the towers read was made before the apply; the gradients and
  their all-reduce get no control input.

  Returns:
    The ops given the control inputs.
  """
  barriers = [op for op in barriers if op is not None]
  if not barriers:
    return []
  created_set = set(created)
  start = getattr(result, 'op', result)
  stack = [start] if start in created_set else []
  seen = set(stack)
  gated = []
  while stack:
    op = stack.pop()
    if any(_is_variable_made_before(t, created_set) for t in op.inputs):
      gated.append(op)
    for parent in [t.op for t in op.inputs] + list(op.control_inputs):
      if parent in created_set and parent not in seen:
        seen.add(parent)
        stack.append(parent)
  for op in gated:
    _compat.add_control_inputs(
        op, [b for b in barriers if b not in op.control_inputs])
  return gated


def _is_variable_made_before(tensor, created_set):
  dtype = tensor.dtype
  if dtype != tf.resource and dtype.base_dtype == dtype:
    return False
  if tensor.op in created_set:
    return False
  return (tensor.op.type in op_kinds.VARIABLE_OP_TYPES or
          tensor.op.type in op_kinds.VARIABLE_FORWARD_OP_TYPES)


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

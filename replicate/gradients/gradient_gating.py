"""Per-variable gradient gating for towers: GATE_OP's guarantee, cheaper.

GATE_OP keeps a variable's update from running while a backward op (e.g.
`dY . W^T`) still reads the variable, by grouping the outputs of every
gradient function: a layer's input gradient then waits for its weight
gradient, which lengthens back-propagation. Towers instead compute
gradients ungated and make each variable's gradient wait for the ops of the
tower's gradient computation that read that variable. A variable read inside
TF1 control flow (`while_loop`/`cond` built as frames and branches, where
nothing outside may wait for one op) waits for every gradient of the tower
instead.
"""
import collections

import tensorflow as tf

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


def gated_gradients(graph, optimizer, loss, var_list, kwargs):
  """`optimizer.compute_gradients(loss, ...)`, GATE_OP gated per variable.

  With `GATE_OP` (the default, what `minimize` passes) the gradients are
  computed ungated and each variable's gradient waits for the ops of this
  computation that read the variable (`gate_by_variable`); `GATE_NONE` and
  `GATE_GRAPH` are passed through.
  """
  if kwargs.get('gate_gradients',
                tf1.train.Optimizer.GATE_OP) != tf1.train.Optimizer.GATE_OP:
    return optimizer.compute_gradients(loss, var_list=var_list, **kwargs)
  kwargs = dict(kwargs, gate_gradients=tf1.train.Optimizer.GATE_NONE)
  grads_and_vars, gradient_ops = ops_created_by(
      graph, lambda: optimizer.compute_gradients(
          loss, var_list=var_list, **kwargs))
  return gate_by_variable(grads_and_vars, gradient_ops)


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
    The pairs, with every gradient whose variable is read by some op of
    `gradient_ops` replaced by an identity that waits for those ops (an
    `IndexedSlices` gets gated values). A variable that some op of
    `gradient_ops` reads inside TF1 control flow gets a gradient that waits
    for every gradient in `grads_and_vars` instead.
  """
  readers, read_in_control_flow = _readers_by_variable_op(gradient_ops)
  every_gradient = None
  result = []
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
    if isinstance(grad, tf.IndexedSlices):
      grad = tf.IndexedSlices(gated_values, grad.indices, grad.dense_shape)
    else:
      grad = gated_values
    result.append((grad, var))
  return result


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
    if op.type in op_kinds.CONTROL_FLOW_OP_TYPES:
      if op.type in op_kinds.CONTROL_FLOW_ENTRY_TYPES and op.inputs:
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
  if source.type in op_kinds.READ_OP_TYPES and source.inputs:
    source = source.inputs[0].op
  return source if source.type in op_kinds.VARIABLE_OP_TYPES else None

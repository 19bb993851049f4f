"""What a tower given no rows writes.

Rows go to towers as evenly as a batch allows, so a batch with fewer rows
than towers gives the last towers none. Their losses count exactly 0
(batch_split.py), but a write that every tower makes from its own rows (a
Keras `BatchNormalization` layer's `updates` in the `control_dependencies`
around `minimize`, a hand-made moving average of the batch mean) runs in
them too, as a `model_fn` call on no rows would make it: a mean over no
rows is NaN, and written into shared state it would turn every later step
and prediction into NaN, where one device, given all the rows, writes a
number. Such a write fails the step instead (`write_checks`) where its
amount is not finite; a finite one (a count of rows, adding 0) runs. A
function call or TF 2 `cond` whose functions write a variable it gets counts
as a write of its floating-point inputs.

A write inside a TF 1 `while_loop` whose amount the loop computes cannot
be checked from outside the loop: it is logged as a WARNING and left
unchecked.

May import `_compat`, `core` and `step_checks`.
"""
import tensorflow as tf

from replicate import _compat
from replicate._compat import tf1
from replicate.core import logs as logging
from replicate.core import op_kinds
from replicate.towers import step_checks


def write_checks(train_op, tower_inputs, tower_rows):
  """Makes each tower's writes from its own rows check that it had rows or
  writes a finite amount.

  Args:
    train_op: the merged step's train op.
    tower_inputs: per tower, the tensors of its shard (features and labels,
      flattened; tensors every tower shares are left out here).
    tower_rows: per tower, its rows: scalar tensors where the rows are
      counted at run time, else None (a static split gives no tower none).

  Returns:
    The assertions made: each a control input of its write, or of
    `train_op` where the write is inside a `cond` or `while_loop` that
    `train_op` runs (the write then runs, but the step fails).
  """
  if not tower_rows or len(tower_inputs) < 2:
    return []
  train_op = op_kinds.op_of(train_op)
  shared = set(tower_inputs[0]) & set(tower_inputs[1])
  sources = {}
  for tower_id, inputs in enumerate(tower_inputs):
    for tensor in inputs:
      if tensor not in shared:
        sources[tensor] = sources.get(tensor, 0) | 1 << tower_id
  towers = {}  # op: the towers whose rows it reads, bit i for tower i
  bodies = {}  # function name: whether it writes a variable
  checks = []
  cone = None
  loops = None  # the ops inside TF 1 while_loops' frames, when needed
  for write in train_op.graph.get_operations():
    if not (_may_write(write.type) or
            write.type in op_kinds.FUNCTION_CALL_OP_TYPES or
            _compat.is_graph_function(write.graph, write.type)):
      continue
    amounts = _written_amounts(write, bodies)
    bits = _towers_read(amounts, sources, towers)
    tower_id = bits.bit_length() - 1
    if tower_id < 1 or bits != 1 << tower_id:
      continue  # reads tower 0's rows, several towers' or none
    # Only what the step runs: a tower built by a call makes batch-norm
    # updates that never run (tower 0's run).
    cone = cone or op_kinds.backward_cone([train_op])
    if write not in cone:
      continue
    amounts = [_outside_loops(t) for t in amounts]
    loops = _loop_ops(train_op.graph) if loops is None else loops
    if any(t.op in loops for t in amounts):
      logging.warning(
          'Tower %d of %d writes a variable from its own rows inside a '
          'while_loop (op %s), from an amount computed in the loop: it cannot '
          'be checked for a tower given no rows, where a mean over no rows '
          'would write NaN. Give every batch at least %d rows (e.g. '
          'batch(..., drop_remainder=True)).', tower_id, len(tower_inputs),
          write.name, len(tower_inputs))
      continue
    check = _check(write, amounts, tower_id, len(tower_inputs),
                   tower_rows[tower_id])
    in_frame = _compat.in_control_flow(write) or write in loops
    _compat.add_control_inputs(train_op if in_frame else write, [check])
    checks.append(check)
  return checks


def _may_write(op_type):
  """Whether ops of `op_type` may write a variable from an amount (the
  optimizers' updates apply the towers' summed gradients: every tower's)."""
  return op_type.startswith('Assign') or 'Scatter' in op_type or (
      op_type.endswith('StridedSliceAssign'))


def _towers_read(tensors, sources, towers):
  """The towers whose rows `tensors` depend on through data inputs, as bits
  of the tower ids; `sources` gives each shard tensor's (tensors, not their
  ops: one split op makes every tower's shard). `towers` memoizes ops
  across calls. A loop's back edge is cut where it meets an op whose
  inputs are being walked: the loop's inputs carry the rows in."""
  bits = 0
  pending = []
  for tensor in tensors:
    bits |= sources.get(tensor, 0)
    pending.append((tensor.op, False))
  walking = set()
  while pending:
    op, inputs_done = pending.pop()
    if inputs_done:
      walking.discard(op)
      towers[op] = 0
      for tensor in op.inputs:
        towers[op] |= sources.get(tensor, 0) | towers.get(tensor.op, 0)
      continue
    if op in towers or op in walking:
      continue
    walking.add(op)
    pending.append((op, True))
    pending.extend((t.op, False) for t in op.inputs
                   if t.op not in towers and t.op not in walking)
  for tensor in tensors:
    bits |= towers.get(tensor.op, 0)
  return bits


def _written_amounts(op, bodies):
  """The floating-point amounts `op` writes into a variable, if it writes
  one (not a lookup table or an iterator). A function call or TF 2 `cond`
  (Keras batch normalization's update under a tensor `training`) that gets
  a variable writes it where its functions hold a write: its amounts are
  its floating-point inputs. `bodies` memoizes functions by name."""
  if not any(step_checks.variable_op(t) is not None
             for t in step_checks.written(op)):
    return []
  if (op.type in op_kinds.FUNCTION_CALL_OP_TYPES or _compat.is_graph_function(
      op.graph, op.type)) and not _calls_write(op.graph, op.node_def, bodies):
    return []
  return [t for t in op.inputs
          if t.dtype.is_floating and not op_kinds.is_variable(t)]


def _calls_write(graph, node_def, bodies):
  """Whether a function that `node_def` calls (by its type, or through a
  function attribute: a branch, a loop's body) holds a write, nested calls
  included."""
  names = [node_def.op] if _compat.is_graph_function(graph, node_def.op) else []
  for attr in node_def.attr.values():
    names.extend([attr.func.name] if attr.func.name else [])
    names.extend(func.name for func in attr.list.func)
  for name in names:
    if name not in bodies:
      bodies[name] = False  # a recursive call adds nothing
      definition = _compat.graph_function_def(graph, name)
      bodies[name] = definition is not None and any(
          _may_write(node.op) or _calls_write(graph, node, bodies)
          for node in definition.node_def)
    if bodies[name]:
      return True
  return False


def _loop_ops(graph):
  """The ops of `graph` that run inside a TF 1 `while_loop`'s frame: those
  that descend from an `Enter` through data or control inputs without
  leaving by an `Exit`. (A tower copied from tower 0 carries no Python
  control-flow context, so its loops are told by their ops.) Ops are taken
  in creation order until nothing changes: a loop's back edge and control
  inputs added later point to later ops."""
  inside = set()
  changed = True
  while changed:
    changed = False
    for op in graph.get_operations():
      if op in inside:
        continue
      if op.type in ('Enter', 'RefEnter') or any(
          parent in inside and parent.type not in ('Exit', 'RefExit')
          for parent in [t.op for t in op.inputs] + list(op.control_inputs)):
        inside.add(op)
        changed = True
  return inside


def _outside_loops(tensor):
  """The value a TF 1 `while_loop` body reads unchanged (a loop invariant
  brought in by a constant `Enter`), followed out of nested loops: the check
  is built outside the loop, and no op there may read a tensor of the
  loop's frame. Other tensors are returned as they are."""
  while (tensor.op.type in ('Enter', 'RefEnter') and
         tensor.op.get_attr('is_constant')):
    tensor = tensor.op.inputs[0]
  return tensor


def _check(write, amounts, tower_id, num_towers, rows):
  # Where the amount is made: only a boolean crosses devices.
  with tf1.name_scope('empty_tower_check'), \
      tf1.colocate_with(amounts[0].op, ignore_existing=True):
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t))
                            for t in amounts])
    check = tf1.assert_equal(
        tf.logical_or(tf.greater(rows, 0), finite), True,
        message=(
            'Tower {} of {} was given no rows of this batch (fewer rows than '
            'towers), and its op {} writes a variable from an amount that is '
            'not finite (a mean over no rows is NaN). Every tower makes this '
            'write from its own rows, as a model_fn call per tower would '
            '(e.g. a Keras BatchNormalization layer\'s updates in the '
            'control_dependencies around minimize); written, the NaN would '
            'reach every later step and prediction. Add such updates to '
            'tf.compat.v1.GraphKeys.UPDATE_OPS (tower 0\'s run), or give '
            'every batch at least {} rows (e.g. batch(..., '
            'drop_remainder=True)).'.format(tower_id, num_towers,
                                            write.name, num_towers)),
        data=['Rows of tower {}:'.format(tower_id), rows])
  # The check runs as a control input of the write, which reads no Python
  # attribute of it: TF 2 would log it as "never used" at ERROR.
  getattr(check, 'mark_used', lambda: None)()
  return check

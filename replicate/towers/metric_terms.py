"""What each write of a metric adds per call: one term per call, or terms of
the tower's rows.

The merge (metric_merge.py) adds the towers' metric variables. A metric
that adds one term per call (a per-batch value: `tf.metrics.mean(loss)`; a
constant count) gains one term per tower where one device gains one per
batch: one device's value when the shards are equal, which
`even_rows_checks` asserts for the metrics `per_batch_metrics` finds.

Only asked where rows are counted at run time (batch_split.py).
"""
import numpy as np
import tensorflow as tf

from replicate._compat import tf1
from replicate.core import op_kinds

# Ops reducing their first input: from a scalar, one term per call.
_REDUCTIONS = frozenset(['Sum', 'Mean', 'Prod', 'Max', 'Min', 'Size'])
# Reductions along given axes (their second input).
_AXIS_REDUCTIONS = frozenset(['Sum', 'Mean', 'Prod', 'Max', 'Min'])
# Ops whose outputs describe a tensor's shape, not the batch's values.
_SHAPE_OPS = frozenset(['Shape', 'ShapeN', 'Size', 'Rank'])


def reads_of(variable_ops, cone):
  """The ops of `cone` whose outputs depend on those variables' values."""
  seen = set()
  pending = list(variable_ops)
  while pending:
    op = pending.pop()
    for consumer in (c for t in op.outputs for c in t.consumers()):
      if consumer in cone and consumer not in seen:
        seen.add(consumer)
        pending.append(consumer)
  return seen


def amount_inputs(write):
  """What a write adds besides the variable: its inputs after the first,
  and those of the ops forwarding the variable to it (a cond's predicate)."""
  inputs = list(write.inputs[1:])
  op = write.inputs[0].op
  while op.type in op_kinds.VARIABLE_FORWARD_OP_TYPES:
    inputs.extend(op.inputs[1:])
    op = op.inputs[0].op
  return inputs


def per_batch_metrics(metrics, metric_variables, inputs):
  """`{key: reduced}`: tower 0's metrics that add one term per call.

  A write of such a metric adds an amount reduced (`Sum`, `Size`, ...) from
  a value of the batch as a whole, e.g. `tf.metrics.mean(loss)`: its total
  gains the tower's loss and its count 1, where a per-row metric
  (`tf.metrics.mean(per_example_loss)`) reduces a tensor of the tower's rows.
  Such a value is a scalar, or a tensor without the tower's rows in its
  shape (`tf.reshape(loss, [1])`, `tf.reduce_mean(logits, 0)`, the `[1, 1]`
  that `auc` makes of scalars). Only asked where rows are counted at run
  time, where the shards' shapes hide them (batch_split.py): a fully static
  shape holds no rows.

  A metric that adds a constant to one variable (a count of 1, or of ones
  the shape of a static value: `tf.metrics.mean_tensor`) while its other
  writes read the batch adds one term per call too.

  A value whose static shape is not known is one where a reduction took
  away dimension 0 (`tf.reduce_mean(x, 0)` of an `x` of unknown columns):
  that was the rows where its input's dimension 0 is the tower's rows,
  which only the step knows (a time-major sequence has time there). For
  those, `reduced` is that input; for the others, None.
  """
  cone = op_kinds.backward_cone(
      [op_kinds.op_of(update) for _, update in metrics.values()])
  input_ops = set(t.op for t in inputs)
  batch_ops = reads_of(input_ops, cone) | input_ops
  reads_batch = lambda tensor: tensor.op in batch_ops
  found = {}
  constant_writes = set()  # metric keys with a write that reads no batch
  batch_writes = set()  # metric keys with a write that reads the batch
  for variable in metric_variables:
    for write in op_kinds.variable_writes(variable.op, cone):
      key = metric_key([metrics], write)
      value, reduced = _reduced_per_batch(write)
      if value is not None and reads_batch(value):
        found.setdefault(key, reduced)
      if any(reads_batch(t) for t in amount_inputs(write)):
        batch_writes.add(key)
      else:
        constant_writes.add(key)
  for key in batch_writes & constant_writes:
    found[key] = None
  return found


def _reduced_per_batch(write):
  """`(value, reduced)`: the first per-batch value that a write's amount is
  reduced from, and None or what took its rows away (`per_batch_metrics`);
  `(None, None)` where there is none."""
  pending = list(amount_inputs(write))
  seen = set()
  while pending:
    op = pending.pop().op
    if op in seen:
      continue
    seen.add(op)
    if op.type in _REDUCTIONS:
      value = op.inputs[0]
      if _is_per_batch(value):
        return value, None
      reduced = _first_dimension_reduced(value)
      if reduced is not None:
        return value, reduced
      continue  # a reduction of rows, or of a tensor of unknown rank
    pending.extend(t for t in op.inputs if not op_kinds.is_variable(t))
  return None, None


def _first_dimension_reduced(tensor):
  """The input of the reduction over dimension 0 that made `tensor` (through
  identities and casts), or None."""
  op = tensor.op
  while op.type in ('Identity', 'Cast'):
    op = op.inputs[0].op
  if op.type not in _AXIS_REDUCTIONS:
    return None
  axes = tf.get_static_value(op.inputs[1])
  if axes is None:
    return None
  rank = op.inputs[0].shape.ndims
  axes = set(np.atleast_1d(axes).tolist())
  if 0 in axes or (rank is not None and -rank in axes):
    return op.inputs[0]
  return None


def _is_per_batch(tensor):
  """Whether a reduced tensor has a static shape (so no rows), and is not a
  shape itself."""
  return (tensor.shape.is_fully_defined() and
          tensor.op.type not in _SHAPE_OPS)


def even_rows_checks(per_batch, tower_rows, device):
  """`[assertion]` that the towers' rows are equal, where metrics need it.

  Rows go to towers as evenly as they can, the first ones getting the
  extra rows, so the first and the last tower have equal rows only when all
  do.
  """
  if not per_batch:
    return []
  checks = []
  with tf1.name_scope('per_batch_metric_check'):
    sure = sorted(key for key, reduced in per_batch.items() if reduced is None)
    if sure:
      with tf1.device(device):
        checks.append(tf1.assert_equal(
            tower_rows[0], tower_rows[-1],
            data=['Rows per tower:'] + list(tower_rows),
            message=_per_batch_message(sure, len(tower_rows))))
    for key, reduced in sorted(per_batch.items()):
      if reduced is None:
        continue
      # Where the value is made: only its first dimension crosses devices.
      with tf1.colocate_with(reduced.op, ignore_existing=True):
        first = tf.shape(reduced, out_type=tower_rows[0].dtype)[0]
      with tf1.device(device):
        checks.append(tf1.assert_equal(
            tf.logical_or(tf.equal(tower_rows[0], tower_rows[-1]),
                          tf.not_equal(first, tower_rows[0])), True,
            data=['Rows per tower:'] + list(tower_rows),
            message=_per_batch_message([key], len(tower_rows))))
  return checks


def _per_batch_message(keys, num_towers):
  return (
      'Metrics {} take a per-batch value (a value of the batch as a '
      'whole, such as its loss), so each of the {} towers adds one '
      'term for its shard: one device\'s value only when the shards are '
      'equal, and this batch does not divide by {}. Make every '
      'evaluation batch a multiple of {} rows (e.g. batch(..., '
      'drop_remainder=True)), or '
      'compute these metrics from per-row values (e.g. '
      'tf.compat.v1.metrics.mean of the per-example losses, from '
      'Reduction.NONE).'.format(keys, num_towers, num_towers, num_towers))


def metric_key(metrics, write):
  for tower in metrics:
    for key, (_, update) in sorted(tower.items()):
      if write in op_kinds.backward_cone([op_kinds.op_of(update)]):
        return key
  return None  # pragma: no cover (every write checked is in some cone)

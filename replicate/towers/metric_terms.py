"""What each write of a metric adds per call: a sum over the tower's rows, or
one term per call.

The merge (metric_merge.py) adds the towers' metric variables. A write whose
amount is a sum over the rows (`tf.metrics.mean(per_row)`'s total and count)
adds up over the towers to one device's; a write that adds one term per call
(a per-batch value: `tf.metrics.mean(loss)`; a constant count) gains one
term per tower where one device gains one per batch. A metric made only of
the latter is one device's value when the shards are equal
(`per_batch_metrics`, `even_rows_checks`) and the value divides them by a
count of calls; a metric whose value reads both kinds, or one variable of
terms per call only, is not, on any batch (refused by `per_batch_metrics`).

Only asked where rows are counted at run time, where a tensor's unknown
dimensions are the tower's rows (batch_split.py).
"""
import collections
import enum

import numpy as np
import tensorflow as tf

from replicate import errors
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
  """`{key: PerBatch}`: tower 0's metrics that add one term per call.

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
  writes read the batch adds one term per call too. Only the writes that
  can change the metric's value count: of a variable the value reads, of
  an amount other than a static zero.

  A value whose static shape is not known is one where a reduction took
  away dimension 0 (`tf.reduce_mean(x, 0)` of an `x` of unknown columns):
  that was the rows where its input's dimension 0 is the tower's rows,
  which only the step knows (a time-major sequence has time there), and
  otherwise a sum over the rows is made from it. For those, `reduced` is
  that input, and `counted` says whether the value also reads a term per
  call (a count of calls), with which such a sum over the rows is never one
  device's value; for the others, `reduced` is None.

  Raises:
    InvalidArgumentError: where a metric's value reads both a sum over the
      rows and a term per call, or one variable of terms per call only
      (`_check_terms`).
  """
  by_key = _value_writes(metrics, _writes(metrics, metric_variables, inputs))
  _check_terms(by_key)
  found = {}
  for key, writes in sorted(by_key.items()):
    terms = [w.term for w in writes]
    ambiguous = [w.reduced for w in writes
                 if w.term is _Term.PER_BATCH and w.reduced is not None]
    per_call = any(w.term is _Term.CONSTANT or (
        w.term is _Term.PER_BATCH and w.reduced is None) for w in writes)
    if ambiguous:
      found[key] = PerBatch(ambiguous[0], per_call)
    elif _Term.PER_BATCH in terms or (
        _Term.CONSTANT in terms and any(t is not _Term.CONSTANT
                                        for t in terms)):
      found[key] = PerBatch(None, False)
  return found


class PerBatch(collections.namedtuple('PerBatch', ['reduced', 'counted'])):
  """How a metric of terms per call is checked at run time.

  Attributes:
    reduced: None where the metric surely adds per-batch values (the
      towers' rows must be equal); else the tensor whose dimension 0 a
      reduction took away, which were the rows only where that dimension is
      the tower's rows.
    counted: whether the value also reads a term per call, so that where
      `reduced`'s dimension 0 is not the rows, the value divides a sum over
      the rows by a count of calls.
  """
  __slots__ = ()


class _Write(collections.namedtuple(
    '_Write', ['variable', 'write', 'term', 'reduced'])):
  __slots__ = ()


def _value_writes(metrics, writes):
  """`{key: [_Write]}`: the writes that can change each metric's value: of a
  variable the value reads, adding something other than a static zero."""
  by_key = {}
  reads = {}
  for key, variable, write, term, reduced in writes:
    if _adds_zero(write):
      continue
    if key not in reads:
      reads[key] = op_kinds.backward_cone([op_kinds.op_of(metrics[key][0])])
    if variable.op in reads[key]:
      by_key.setdefault(key, []).append(
          _Write(variable, write, term, reduced))
  return by_key


def _check_terms(by_key):
  """Raises where a metric's value cannot be one device's on any batch.

  A write that adds a sum over the tower's rows gains over the towers what
  one device's gains; one that adds a term per call (a per-batch value, a
  constant count) gains a term per tower. A value that reads both, such as
  `tf.metrics.mean(tf.reduce_sum(per_row))` (a sum over the rows, divided
  by a count of calls), is then not one device's on any batch: here 1/N of
  it, on N equal shards. Nor is a value that reads one variable, of terms
  per call only (a running sum of the batch's mean loss, a count of calls):
  N times one device's, with nothing to divide it by.

  Args:
    by_key: `_value_writes`.
  """
  for key, writes in sorted(by_key.items()):
    sums = [w for w in writes if w.term is _Term.ROWS]
    calls = [w for w in writes
             if w.term in (_Term.PER_BATCH, _Term.CONSTANT)]
    if sums and calls:
      raise errors.InvalidArgumentError(
          'Metric {!r} cannot be reduced across towers: its value reads {} '
          '(op {} adds {}) and {} (op {} adds {}). Over the towers the '
          'first gains what it gains on one device, the second a term per '
          'tower where one device gains one per batch, so the value differs '
          'from one device\'s on every batch. Compute the metric from '
          'per-row values (e.g. tf.compat.v1.metrics.mean of the per-example '
          'values, not of their sum), or evaluate on one device.'.format(
              key, sums[0].variable.op.name, sums[0].write.name,
              sums[0].term.value, calls[0].variable.op.name,
              calls[0].write.name, calls[0].term.value))
    if calls and len(calls) == len(writes) and len(
        set(w.variable.op for w in writes)) == 1:
      raise errors.InvalidArgumentError(
          'Metric {!r} cannot be reduced across towers: its value reads only '
          '{}, to which op {} adds {}, one term per call. Over the towers it '
          'gains a term per tower where one device gains one per batch, and '
          'nothing divides it by their count, so the value differs from one '
          'device\'s (N times it, on N equal shards). Divide it by a count '
          'of calls (as tf.compat.v1.metrics.mean does), compute it from '
          'per-row values, or evaluate on one device.'.format(
              key, calls[0].variable.op.name, calls[0].write.name,
              calls[0].term.value))


class _Term(enum.Enum):
  """What a write of a metric variable adds each call."""
  ROWS = 'a sum over the rows'
  PER_BATCH = 'a per-batch value'
  CONSTANT = 'a term that reads no batch'
  OTHER = 'something else'


# Writes that add their second input to the variable (or subtract it).
_ADDS = frozenset(['AssignAdd', 'AssignSub', 'AssignAddVariableOp',
                   'AssignSubVariableOp'])
# Writes that add their updates (input 2) at their indices (input 1).
_SCATTER_ADDS = frozenset([
    'ScatterAdd', 'ScatterSub', 'ResourceScatterAdd', 'ResourceScatterSub',
    'ScatterNdAdd', 'ScatterNdSub', 'ResourceScatterNdAdd',
    'ResourceScatterNdSub'])


def _writes(metrics, metric_variables, inputs):
  """`(key, variable, write, term, reduced)` for each write of a metric
  variable by the metrics' update ops; `reduced` as in
  `per_batch_metrics`."""
  cone = op_kinds.backward_cone(
      [op_kinds.op_of(update) for _, update in metrics.values()])
  input_ops = set(t.op for t in inputs)
  batch_ops = reads_of(input_ops, cone) | input_ops
  reads_batch = lambda tensor: tensor.op in batch_ops
  # Ops made from a reduction that took dimension 0 away and left unknown
  # dimensions: those are not the rows (`tf.reduce_mean(x, 0)`).
  reducers = set(op for op in cone if op.type in _AXIS_REDUCTIONS and
                 not op.outputs[0].shape.is_fully_defined() and
                 _first_dimension_reduced(op.outputs[0]) is not None)
  unrowed = reads_of(reducers, cone) | reducers
  cones = _update_cones(metrics)
  for variable in metric_variables:
    for write in op_kinds.variable_writes(variable.op, cone):
      key = _key_of(cones, write)
      amounts = amount_inputs(write)
      reduced = None
      if not any(reads_batch(t) for t in amounts):
        term = _Term.CONSTANT
      elif (write.type in _ADDS and _sums_rows(write.inputs[1], unrowed) and
            not any(reads_batch(t) for t in amounts[1:])):
        term = _Term.ROWS
      elif (write.type in _SCATTER_ADDS and
            all(_rows_unknown(t, unrowed) for t in write.inputs[1:3]) and
            not any(reads_batch(t) for t in amounts[2:])):
        # A row's update added at the row's index (`mean_per_class_accuracy`
        # counts by label): a sum over the rows, whatever the rows were
        # computed from (a shape's product in an embedding lookup).
        term = _Term.ROWS
      else:
        value, reduced = _reduced_per_batch(write, unrowed)
        if value is None and write.type in _ADDS:
          value = write.inputs[1]  # added itself: `assign_add(v, loss)`
          value = value if _is_per_batch(value) else None
        term = (_Term.PER_BATCH if value is not None and reads_batch(value)
                else _Term.OTHER)
      yield key, variable, write, term, reduced


def _adds_zero(write):
  value = tf.get_static_value(write.inputs[-1])
  return value is not None and not np.any(value)


def _reduced_per_batch(write, unrowed):
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
      if _is_per_batch(value) and not (op.type in ('Sum', 'Mean') and
                                       _sums_rows(value, unrowed)):
        if op.type in ('Sum', 'Mean') and _sums_rows(value, frozenset()):
          # A sum over the rows unless a reduction over dimension 0 before
          # it took the rows away: only the step knows.
          return value, _reduction_in(value, unrowed)
        return value, None
      reduced = _first_dimension_reduced(value)
      if reduced is not None:
        return value, reduced
      continue  # a reduction of rows, or of a tensor of unknown rank
    pending.extend(t for t in op.inputs if not op_kinds.is_variable(t))
  return None, None


def _reduction_in(tensor, unrowed):
  """The input of a reduction over dimension 0 of unknown result that
  `tensor` is made from (`per_batch_metrics`)."""
  pending = [tensor.op]
  seen = set()
  while pending:
    op = pending.pop()
    if op in seen or op not in unrowed:
      continue
    seen.add(op)
    if (op.type in _AXIS_REDUCTIONS and
        not op.outputs[0].shape.is_fully_defined()):
      reduced = _first_dimension_reduced(op.outputs[0])
      if reduced is not None:
        return reduced
    pending.extend(t.op for t in op.inputs)
  raise AssertionError('no reduction in ' + tensor.name)  # pragma: no cover


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


# Ops through which a sum over rows stays one (linear; input 0 carries it).
# `Cumsum` runs over a summed tensor's static axes (TF 2 Keras AUC's
# thresholds): cumulative sums of the towers' sums add up to one device's.
_LINEAR_OPS = frozenset([
    'Identity', 'Reshape', 'Transpose', 'ExpandDims', 'Squeeze', 'Slice',
    'StridedSlice', 'DiagPart', 'MatrixDiagPart', 'MatrixDiagPartV2',
    'MatrixDiagPartV3', 'Neg', 'Cumsum'])
# Ops whose output is a sum of their inputs.
_SUM_OPS = frozenset(['Add', 'AddV2', 'AddN', 'Sub'])
# Ops adding up the entries of one input (by position) at indices.
_SCATTER_SUMS = {'ScatterNd': 1, 'UnsortedSegmentSum': 0,
                 'SparseTensorDenseAdd': 1}


def _sums_rows(tensor, unrowed):
  """Whether a tensor of static shape is a sum over the tower's rows, so
  that the towers' values add up to one device's.

  Such a sum reduces a tensor of unknown shape (the rows, where they are
  counted at run time: `_rows_unknown`) to a static one by `Sum`, `Size` or
  a scatter that adds (a confusion matrix), then goes through linear ops
  only: sums of such sums, reshapes, slices, diagonals, casts that do not
  round.
  """
  op = tensor.op
  while op.type in _LINEAR_OPS or (op.type == 'Cast' and _exact_cast(op)):
    op = op.inputs[0].op
  if op.type in _SUM_OPS:
    return all(_sums_rows(t, unrowed) for t in op.inputs)
  if op.type in ('Sum', 'Mean'):
    data = op.inputs[0]
    if data.shape.is_fully_defined():
      return _sums_rows(data, unrowed)
    return (op.type == 'Sum' and op.outputs[0].shape.is_fully_defined() and
            _rows_unknown(data, unrowed))
  if op.type == 'Size':
    return _rows_unknown(op.inputs[0], unrowed)
  if op.type in _SCATTER_SUMS:
    if op.type == 'SparseTensorDenseAdd':
      onto = tf.get_static_value(op.inputs[3])
      if onto is None or np.any(onto):
        return False
    return _rows_unknown(op.inputs[_SCATTER_SUMS[op.type]], unrowed)
  return False


def _rows_unknown(tensor, unrowed):
  """Whether `tensor`'s dimensions known only at run time are the rows: it
  has some, and is not made from a reduction that took dimension 0 away
  (`unrowed`)."""
  return not tensor.shape.is_fully_defined() and tensor.op not in unrowed


def _exact_cast(op):
  """Whether a cast keeps sums: to a float, or between integers."""
  source, target = op.inputs[0].dtype.base_dtype, op.outputs[0].dtype
  return (source.is_integer or source.is_floating) and (
      target.is_floating or (source.is_integer and target.is_integer))


def _is_per_batch(tensor):
  """Whether a reduced tensor has a static shape (so no rows), and is not a
  shape itself."""
  return (tensor.shape.is_fully_defined() and
          tensor.op.type not in _SHAPE_OPS)


def even_rows_checks(per_batch, tower_rows, device):
  """`[assertion]` that the towers' rows are equal, where metrics need it,
  and that no metric divides a sum over the rows by a count of calls.

  Rows go to towers as evenly as they can, the first ones getting the
  extra rows, so the first and the last tower have equal rows only when all
  do.

  Args:
    per_batch: `per_batch_metrics`.
    tower_rows: each tower's rows, int tensors.
    device: where the assertions run.
  """
  if not per_batch:
    return []
  checks = []
  equal = lambda: tf.equal(tower_rows[0], tower_rows[-1])
  data = lambda: ['Rows per tower:'] + list(tower_rows)
  with tf1.name_scope('per_batch_metric_check'):
    sure = sorted(key for key, check in per_batch.items()
                  if check.reduced is None)
    if sure:
      with tf1.device(device):
        checks.append(tf1.assert_equal(
            equal(), True, data=data(),
            message=_per_batch_message(sure, len(tower_rows))))
    for key, check in sorted(per_batch.items()):
      if check.reduced is None:
        continue
      # Where the value is made: only its first dimension crosses devices.
      with tf1.colocate_with(check.reduced.op, ignore_existing=True):
        first = tf.shape(check.reduced, out_type=tower_rows[0].dtype)[0]
      rows_reduced = tf.equal(first, tower_rows[0])
      with tf1.device(device):
        checks.append(tf1.assert_equal(
            tf.logical_or(equal(), tf.logical_not(rows_reduced)), True,
            data=data(), message=_per_batch_message([key], len(tower_rows))))
        if check.counted:
          checks.append(tf1.assert_equal(
              rows_reduced, True,
              data=['Dimension 0 of {}:'.format(check.reduced.name), first,
                    'rows of tower 0:', tower_rows[0]],
              message=_counted_message(key, check.reduced)))
  return checks


def _counted_message(key, reduced):
  return (
      'Metric {!r} cannot be reduced across towers on this batch: its value '
      'reads a count of calls and a sum made from a reduction over '
      'dimension 0 of {}, which here is not the tower\'s rows, so the sum '
      'runs over the rows. Over the towers that sum gains what it gains on '
      'one device and the count a term per tower, so the value differs '
      'from one device\'s. Compute the metric from per-row values (e.g. '
      'tf.compat.v1.metrics.mean of the per-example values, not of their '
      'sum), or evaluate on one device.'.format(key, reduced.name))


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
  """The key of the first metric, in a list of towers' metrics, whose update
  op depends on `write`."""
  for tower in metrics:
    key = _key_of(_update_cones(tower), write)
    if key is not None:
      return key
  return None  # pragma: no cover (every write checked is in some cone)


def _update_cones(metrics):
  """`[(key, cone)]`, by key: each metric's update op and every op it
  depends on, built once for all the writes looked up."""
  return [(key, op_kinds.backward_cone([op_kinds.op_of(update)]))
          for key, (_, update) in sorted(metrics.items())]


def _key_of(cones, write):
  return next((key for key, cone in cones if write in cone), None)

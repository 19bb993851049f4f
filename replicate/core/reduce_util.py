"""`ReduceOp`: how values from several replicas are combined."""
import enum

import tensorflow as tf

from replicate import errors
from replicate._compat import tf1


class ReduceOp(enum.Enum):
  """How values from several replicas (towers) are combined.

  * `SUM`: add the values.
  * `MEAN`: add the values and divide by how many there are.
  """
  SUM = 'SUM'
  MEAN = 'MEAN'

  @staticmethod
  def from_variable_aggregation(aggregation):
    """The `ReduceOp` matching a `tf.VariableAggregation`.

    Args:
      aggregation: `tf.VariableAggregation.SUM` or `.MEAN`.

    Returns:
      `ReduceOp.SUM` or `ReduceOp.MEAN`.

    Raises:
      InvalidArgumentError: for any other aggregation.
    """
    op = _FROM_AGGREGATION.get(aggregation)
    if op is None:
      raise errors.InvalidArgumentError(
          'Cannot reduce with aggregation {!r}: only SUM and MEAN combine '
          'values from several replicas; pass tf.VariableAggregation.SUM / '
          'MEAN or replicate.ReduceOp.SUM / MEAN.'.format(aggregation))
    return op


_FROM_AGGREGATION = {
    tf.VariableAggregation.SUM: ReduceOp.SUM,
    tf.VariableAggregation.MEAN: ReduceOp.MEAN,
}
# TF's own enum, what code written for tf.distribute passes.
_TF_REDUCE_OP = tf.distribute.ReduceOp


def as_reduce_op(aggregation):
  """Validates `aggregation` and returns it as a `ReduceOp`.

  Args:
    aggregation: a `ReduceOp`, `tf.distribute.ReduceOp.SUM` / `MEAN`, or
      `tf.VariableAggregation.SUM` / `MEAN` (the names TF 1.x
      `contrib.distribute` used).

  Returns:
    A `ReduceOp`.

  Raises:
    InvalidArgumentError: for anything else (other aggregations such as
      `ONLY_FIRST_REPLICA`, strings, None).
  """
  if isinstance(aggregation, ReduceOp):
    return aggregation
  if isinstance(aggregation, _TF_REDUCE_OP):
    return ReduceOp(aggregation.value)
  if isinstance(aggregation, (tf.VariableAggregation, tf1.VariableAggregation)):
    return ReduceOp.from_variable_aggregation(
        as_variable_aggregation(aggregation))
  raise errors.InvalidArgumentError(
      '`reduce_op` must be Reduce.SUM or Reduce.MEAN. Cannot reduce with '
      '{!r}: the reduction must be replicate.ReduceOp.SUM '
      '/ MEAN, tf.distribute.ReduceOp.SUM / MEAN or tf.VariableAggregation.SUM '
      '/ MEAN.'.format(aggregation))


def as_strategy_reduce_op(reduce_op):
  """`as_reduce_op`, also taking `'SUM'` / `'MEAN'` in any case, as TF's
  strategies and replica contexts do.

  Raises:
    InvalidArgumentError: as `as_reduce_op`.
  """
  if isinstance(reduce_op, str) and reduce_op.upper() in ('SUM', 'MEAN'):
    return ReduceOp(reduce_op.upper())
  return as_reduce_op(reduce_op)


def as_variable_aggregation(aggregation):
  """`aggregation` as a `tf.VariableAggregation`.

  Args:
    aggregation: a `tf.VariableAggregation`, or on TF 2.x also a
      `tf.compat.v1.VariableAggregation` (a separate enum there, the one
      `tf.compat.v1` variables and layers pass).

  Returns:
    The `tf.VariableAggregation` member of the same value.

  Raises:
    InvalidTypeError: for anything else.
  """
  if isinstance(aggregation, (tf.VariableAggregation,
                              tf1.VariableAggregation)):
    return tf.VariableAggregation(aggregation.value)
  raise errors.InvalidTypeError(
      'aggregation must be a tf.VariableAggregation, got {!r}.'.format(
          aggregation))

"""EVAL's metrics of several towers: one device's values, or an error.

Each tower updates its own metric variables; after every step the merge
adds towers 1..N-1's into tower 0's (`reduce_metric_variables`). That is one
device's state only for state made of sums and counts from zero, which
`check_summable` checks when the graph is built; and, for a metric of a
per-batch value (one term per call: `tf.metrics.mean(loss)`), only when the
towers' shards are equal (metric_terms.py tells the writes apart, and asserts
that where rows are counted at run time).
"""
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import op_kinds
from replicate.towers import metric_terms


def reduce_metric_variables(tower_metric_variables):
  """Adds towers 1.. metric variables into tower 0's, then zeroes them."""
  counts = [len(v) for v in tower_metric_variables]
  if len(set(counts)) > 1:
    raise errors.InvalidArgumentError(
        'Different `EstimatorSpec.eval_metric_ops` across `model_fn()` calls: '
        'every tower must create the same metrics. Expected {} local '
        'variables (tower 0\'s {} in each of {} towers), but got {} instead '
        '({} respectively). Make model_fn return the same eval_metric_ops on '
        'every call.'.format(counts[0] * len(counts), counts[0], len(counts),
                             sum(counts), counts))
  resets = []
  with tf1.name_scope('metric_reduction'):
    for position, primary in enumerate(tower_metric_variables[0]):
      replicas = [tower[position] for tower in tower_metric_variables[1:]]
      for replica in replicas:
        if (replica.dtype.base_dtype != primary.dtype.base_dtype or
            not replica.shape.is_compatible_with(primary.shape)):
          raise errors.InvalidArgumentError(
              'Every tower must create the same metrics, but metric variable '
              '{} ({}, {}) does not match {} ({}, {}) of tower 0. Make '
              'model_fn return the same eval_metric_ops on every call.'.format(
                  replica.op.name, replica.dtype.base_dtype.name,
                  replica.shape, primary.op.name,
                  primary.dtype.base_dtype.name, primary.shape))
      add = tf1.assign_add(primary, tf.math.add_n(
          [tf1.convert_to_tensor(r) for r in replicas]))
      with tf1.control_dependencies([add]):
        resets.extend(
            tf1.assign(replica, tf.zeros_like(replica)) for replica in replicas)
    return tf.group(*resets, name='reduce_metric_variables')


# Writes that add to (or subtract from) a variable: from zero, the towers'
# states summed are what one device's updates would have made.
_ADDITIVE_WRITES = frozenset([
    'AssignAdd', 'AssignSub', 'ScatterAdd', 'ScatterSub', 'ScatterNdAdd',
    'ScatterNdSub', 'AssignAddVariableOp', 'AssignSubVariableOp',
    'ResourceScatterAdd', 'ResourceScatterSub', 'ResourceScatterNdAdd',
    'ResourceScatterNdSub'])


def check_summable(metrics, tower_metric_variables):
  """Raises unless summing the towers' metric variables is exact.

  The merge adds the towers' metric variables into tower 0's. That gives one
  device's state only where every write of a metric variable by the metrics'
  update ops adds an amount that reads no metric state, to a variable that
  starts at zero.

  Args:
    metrics: for each tower, its `{key: (value, update_op)}`.
    tower_metric_variables: for each tower, its metric variables.

  Raises:
    InvalidArgumentError: naming the metric, the variable, the write and the
      fix.
  """
  updates = [op_kinds.op_of(update) for tower in metrics for _, update in tower.values()]
  cone = op_kinds.backward_cone(updates)
  owned = {v.op: v for tower in tower_metric_variables for v in tower}
  stateful = metric_terms.reads_of(owned, cone)
  # Tower 0's first, so that the message names the variable model_fn made.
  for variable in [v for tower in tower_metric_variables for v in tower]:
    for write in op_kinds.variable_writes(variable.op, cone):
      reason = None
      if write.type not in _ADDITIVE_WRITES:
        reason = (
            'its update op writes metric variable {} with {} (op {}), which '
            'does not add to it, so its towers\' states cannot be combined by '
            'summing them'.format(variable.op.name, write.type, write.name))
      elif any(t.op in stateful for t in metric_terms.amount_inputs(write)):
        reason = (
            'its update op adds to metric variable {} with {} (op {}) an '
            'amount computed from the metric\'s own state, so its towers\' '
            'states cannot be combined by summing them'.format(
                variable.op.name, write.type, write.name))
      elif not _starts_at_zero(variable):
        reason = (
            'metric variable {} does not start at a constant zero, and the '
            'copy of every tower starts where it does, so summing the towers\' '
            'states would count the start more than once'.format(
                variable.op.name))
      if reason:
        raise errors.InvalidArgumentError(
            'Metric {!r} cannot be reduced across towers: {}. '
            'replicate_model_fn merges the towers of a metric by adding their '
            'metric variables, which is exact only for state made of sums '
            'and counts (AssignAdd, ScatterAdd and the like) from zero. '
            'Build the metric from sums and counts, as the '
            'tf.compat.v1.metrics functions are, or evaluate on one '
            'device.'.format(
                metric_terms.metric_key(metrics, write), reason))


def _starts_at_zero(variable):
  value = tf.get_static_value(variable.initial_value)
  return value is not None and not value.any()



"""Whether the one update of a replicated step is the one one device makes.

The towers' gradients are summed and applied once. Two things can make that
update another one than one device's, silently, and are refused here:

- `apply_gradients` called inside a TF1 `tf.cond` whose predicate comes
  from the tower's rows (an optimizer wrapping `TowerOptimizer`, such as
  `MixedPrecisionLossScaleOptimizer` testing the gradients for inf/NaN):
  the step is applied or skipped by what one tower saw.
- towers built by their own `model_fn` calls, each with state of its own
  that the update writes (a dynamic loss scale): only the applying tower's
  is written, and the other towers go on reading theirs.

May import `replicate.core` and `replicate._compat`.
"""
import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.core import op_kinds


def check_unconditional(replication):
  """Raises if `apply_gradients` is being built under a condition on rows.

  Args:
    replication: the `tower_context.Replication` being built.

  Raises:
    InvalidArgumentError: if a `tf.cond` around the call has a predicate
      that depends on the tower's shard of the batch.
  """
  inputs = set(t.op for t in replication.tower_inputs if t is not None)
  if not inputs:
    return
  for predicate in _compat.cond_predicates(replication.graph):
    if inputs & op_kinds.backward_cone([predicate.op]):
      if predicate.op.type == 'Identity':  # tf.cond's `pred_id`
        predicate = predicate.op.inputs[0]
      raise errors.InvalidArgumentError(
          'TowerOptimizer.apply_gradients is called inside a tf.cond whose '
          'predicate {} is computed from the rows of tower {} of {}, e.g. by '
          'an optimizer that wraps TowerOptimizer (MixedPrecisionLoss'
          'ScaleOptimizer skips a step whose gradients are not finite): '
          'the summed step of every tower would be applied or skipped by '
          "what one tower saw, where one device decides on the whole batch. "
          'Wrap the other way, TowerOptimizer(MixedPrecisionLossScale'
          'Optimizer(optimizer, ...)), so that the decision is made on the '
          'summed gradients.'.format(
              predicate.name, replication.tower.tower_id,
              replication.num_towers))


def check_no_tower_state_written(replication, created):
  """Raises if the update writes a variable that one tower's call made.

  Args:
    replication: the `tower_context.Replication` being built, the applying
      tower's `model_fn` call (not tower 0's) under way.
    created: the ops the applying tower's update built.

  Raises:
    InvalidArgumentError: if an op of `created` writes a variable named in
      the applying tower's name scope of which tower 0's call made its own
      (the same name in tower 0's scope).
  """
  tower_scope = replication.name_scopes.get(replication.tower.tower_id)
  first_scope = replication.name_scopes.get(0, '')
  if not tower_scope:
    return
  graph = replication.graph
  # Trainable ones are check_tower's error (tower_build.py), made after.
  trainable = set(v.op.name for v in graph.get_collection(
      tf1.GraphKeys.TRAINABLE_VARIABLES))
  for op in created:
    for tensor in _written(op):
      variable = _variable_op(tensor)
      if (variable is None or not variable.name.startswith(tower_scope) or
          variable.name in trainable):
        continue
      first = first_scope + variable.name[len(tower_scope):]
      if _has_op(graph, first):
        raise errors.InvalidArgumentError(
            "The step's update writes {}, which the model_fn call of tower "
            '{} of {} made for itself, as tower 0 made {} (e.g. the loss '
            'scale of a MixedPrecisionLossScaleOptimizer with a dynamic loss '
            'scale): towers built by their own model_fn calls keep one such '
            'state each, and only the applying tower\'s would be updated '
            'while every tower goes on reading its own. Towers are built by '
            'calls here because {}; without that, towers are copies of tower '
            '0 (TowerBuild.CLONE) and share the state. Or make the state with '
            'tf.compat.v1.get_variable under a reusing variable scope.'.format(
                variable.name, replication.tower.tower_id,
                replication.num_towers, first,
                replication.not_cloned_reason or
                'tower_build is TowerBuild.CALL_PER_TOWER'))


def _written(op):
  """The refs and resource handles `op` may write (a function call's too)."""
  if (op.type in op_kinds.VARIABLE_READER_OP_TYPES or
      op.type in op_kinds.VARIABLE_FORWARD_OP_TYPES):
    return []
  takes_refs = any(arg.is_ref for arg in op.op_def.input_arg)
  return [t for t in op.inputs if t.dtype == tf.resource or (
      takes_refs and op_kinds.is_variable(t))]


def _has_op(graph, name):
  try:
    graph.get_operation_by_name(name)
  except KeyError:
    return False
  return True


def _variable_op(tensor):
  """The variable op a ref or resource tensor stands for, or None."""
  seen = set()
  while tensor.op not in seen:
    op = tensor.op
    seen.add(op)
    if op.type in op_kinds.VARIABLE_OP_TYPES:
      return op
    refs = [t for t in op.inputs if op_kinds.is_variable(t)]
    if op.type not in op_kinds.VARIABLE_FORWARD_OP_TYPES or not refs:
      return None
    tensor = refs[0]
  return None

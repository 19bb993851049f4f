"""Whether the one update of a replicated step is the one one device makes.

The towers' gradients are summed and applied once. These make that update
another one than one device's, silently, and are refused here:

- a gradient given to `apply_gradients` that depends on the tower's rows
  other than through `TowerOptimizer.compute_gradients` (a term from
  `tf.gradients`): only `compute_gradients` scales the tower's loss for the
  loss reduction, so the sum over N towers would count that term N times.
- `apply_gradients` called inside a TF1 `tf.cond` whose predicate comes
  from the tower's rows (an optimizer wrapping `TowerOptimizer`, such as
  `MixedPrecisionLossScaleOptimizer` testing the gradients for inf/NaN):
  the step is applied or skipped by what one tower saw.
- towers built by their own `model_fn` calls, each with state of its own
  that the update writes (a dynamic loss scale): only the applying tower's
  is written, and the other towers go on reading theirs.
- under `Reduction.SUM`, a term of a tower's loss that reads none of the
  tower's rows (a penalty of the variables added to the loss): every tower
  adds its loss unscaled, so the term counts once per tower.
- towers built by calls that each add a regularization loss
  (`tf.compat.v1.losses.add_loss(..., loss_collection=REGULARIZATION_LOSSES)`
  inside `model_fn`): every tower sees tower 0's regularization losses, so
  that the regularizers of the shared variables count once, and its own as
  well, so it counts twice (N times under `Reduction.SUM`).

May import `replicate.core` and `replicate._compat`.
"""
import re

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


def record_computed(replication, grads_and_vars):
  """Records the gradients a tower's `compute_gradients` returned."""
  ops = replication.computed_gradient_ops.setdefault(
      replication.tower.tower_id, set())
  for grad, _ in grads_and_vars:
    ops.update(t.op for t in _components(grad))


def check_gradients_computed(replication, grads_and_vars):
  """Raises if a gradient depends on the rows besides `compute_gradients`.

  Args:
    replication: the `tower_context.Replication` being built.
    grads_and_vars: what the tower gives `apply_gradients`.

  Raises:
    InvalidArgumentError: naming the first variable whose gradient reaches
      the tower's shard of the batch by a path that does not pass through
      a gradient the tower's `compute_gradients` returned (not under
      `Reduction.SUM`, which scales no tower loss).
  """
  if replication.loss_reduction == tf1.losses.Reduction.SUM:
    return  # tower losses are not scaled: a sum of row sums is one device's
  inputs = set(t.op for t in replication.tower_inputs if t is not None)
  computed = replication.computed_gradient_ops.get(
      replication.tower.tower_id, set())
  starts = [(t.op, variable) for grad, variable in grads_and_vars
            for t in _components(grad)]
  if not inputs or not (inputs & _cone_short_of(
      [op for op, _ in starts], computed)):
    return
  for op, variable in starts:
    if inputs & _cone_short_of([op], computed):
      raise errors.InvalidArgumentError(
          'TowerOptimizer.apply_gradients got a gradient for {} that depends '
          'on the rows of tower {} of {} other than through the gradients '
          'TowerOptimizer.compute_gradients returned (e.g. a term from '
          'tf.gradients, or one scaled by a statistic of the batch): '
          'compute_gradients scales the tower\'s loss for the loss reduction, '
          'so the sum over the {} towers would count that term {} times, or '
          'weigh it by one tower\'s rows. Add such a term to the loss given '
          'to TowerOptimizer.compute_gradients (or minimize) instead.'.format(
              getattr(variable, 'name', variable), replication.tower.tower_id,
              replication.num_towers, replication.num_towers,
              replication.num_towers))


# Ops whose output is the sum (or difference) of their inputs' terms.
_TERM_OPS = frozenset(['Add', 'AddV2', 'AddN', 'Sub', 'Identity'])


def check_terms_read_rows(replication, tower_id, loss, regularization):
  """Raises if, under `Reduction.SUM`, a term of a tower's loss reads none
  of the tower's rows.

  Every tower's loss is added unscaled under `SUM`, so a term that does not
  come from the tower's shard (`loss = ce + 0.01 * tf.nn.l2_loss(w)`, or
  `tf.compat.v1.losses.add_loss` of such a penalty) counts once per tower,
  where one device counts it once (contrib did the same, silently); tower
  0's terms are checked where the other towers copy them. Terms
  are what `Add`, `AddN` and `Sub` sum; regularization losses are exempt:
  only tower 0 counts them under `SUM` (tower_collections.py). A constant
  zero (`get_regularization_loss()` where there is none) changes nothing.

  Args:
    replication: the `tower_context.Replication` being built.
    tower_id: the tower whose `model_fn` call returned `loss`.
    loss: that loss, unscaled.
    regularization: the `REGULARIZATION_LOSSES` entries the tower sees.

  Raises:
    InvalidArgumentError: naming the term, the towers and the fixes.
  """
  if (loss is None or replication.num_towers == 1 or
      replication.loss_reduction != tf1.losses.Reduction.SUM):
    return
  inputs = set(t.op for t in replication.tower_inputs if t is not None)
  if not inputs:
    return
  # A variable's regularizer is read again by each read of TF 2's lazy
  # collection entry, under `<variable>/Regularizer/`; other entries are
  # tensors.
  skipped = set(item.op for item in regularization
                if isinstance(item, (tf.Tensor, tf1.Operation)))
  for term in _terms(loss, skipped):
    if 'Regularizer' in term.op.name.split('/'):
      continue
    if inputs & op_kinds.backward_cone([term.op]):
      continue
    value = tf.get_static_value(term)
    if value is not None and not value.any():
      continue
    raise errors.InvalidArgumentError(
        'loss_reduction is Reduction.SUM, so the {n} towers\' losses are '
        'added unscaled, and the term {term} of the loss of tower {tower} '
        'reads none of the tower\'s rows (a penalty of the variables, or '
        'tf.compat.v1.losses.add_loss of one): every tower whose loss has it '
        'counts it again ({n} times when every tower does), where one device '
        'counts it once. Make it a regularizer of '
        'its variable (tf.compat.v1.get_variable(regularizer=...), a layer\'s '
        'kernel_regularizer) read through tf.compat.v1.losses.'
        'get_regularization_loss(), which only tower 0 counts under SUM; or '
        'add it in tower 0 only (replicate.get_tower_context()'
        '.is_first_tower); or use a mean loss_reduction.'.format(
            n=replication.num_towers, term=term.name, tower=tower_id))


def _terms(loss, skipped):
  """The tensors `loss` adds up (through `_TERM_OPS`), less `skipped` ops."""
  terms = []
  seen = set()
  pending = [loss]
  while pending:
    tensor = pending.pop()
    op = tensor.op
    if op in skipped or op in seen:
      continue
    seen.add(op)
    if op.type in _TERM_OPS:
      pending.extend(op.inputs)
    else:
      terms.append(tensor)
  return terms


def check_regularization_counted_once(replication, tower_id, loss, first,
                                      own):
  """Raises if a tower built by a call counts a regularization loss again.

  Args:
    replication: the `tower_context.Replication` being built.
    tower_id: a tower after the first, built by its own `model_fn` call.
    loss: the loss that call returned, unscaled.
    first: the `REGULARIZATION_LOSSES` entries tower 0 added.
    own: those tower `tower_id` added (its call again, as tower 0's did).

  Raises:
    InvalidArgumentError: if `loss` counts an entry of `own` that has a
      counterpart in `first` (the same name in tower 0's scope, or outside
      the towers' scopes, where a custom getter names its ops) twice: it
      depends on both, or on `own` under `Reduction.SUM` (which every tower
      adds unscaled).
  """
  if loss is None or not own or not first:
    return
  tower_scope = replication.name_scopes.get(tower_id, '')
  first_scope = replication.name_scopes.get(0, '')
  by_name = {_canonical(t.op.name, first_scope): t for t in first
             if hasattr(t, 'op')}
  cone = None
  for entry in own:
    if not hasattr(entry, 'op'):
      continue
    counterpart = by_name.get(_canonical(entry.op.name, tower_scope))
    if counterpart is None:
      continue
    if cone is None:
      cone = op_kinds.backward_cone([loss.op])
    summed = replication.loss_reduction == tf1.losses.Reduction.SUM
    if entry.op in cone and (summed or counterpart.op in cone):
      raise errors.InvalidArgumentError(
          'The loss of tower {} of {} counts the regularization loss {}, '
          'which its model_fn call added to REGULARIZATION_LOSSES again as '
          'tower 0\'s call added {}, {}: the step would apply it {} times. '
          'Towers are built by calls here because {}. {} the regularizer '
          'to the variable (tf.compat.v1.get_variable(regularizer=...), a '
          'layer\'s kernel_regularizer), which adds it once, with the '
          'variable, or add it in tower 0 only (replicate.get_tower_context()'
          '.is_first_tower).'.format(
              tower_id, replication.num_towers, entry.name, counterpart.name,
              'and every tower adds its loss unscaled under Reduction.SUM'
              if summed else 'which every tower sees too, so that the '
              'regularizers of shared variables count once',
              replication.num_towers if summed else '2',
              replication.not_cloned_reason or
              'tower_build is TowerBuild.CALL_PER_TOWER',
              'Give' if summed else 'Without that, towers are copies of '
              'tower 0 (TowerBuild.CLONE), which count it once. Or give'))


def _canonical(name, scope):
  """`name` less `scope`, each part less the `_<n>` TF made it unique by.

  A name outside `scope` keeps its whole path: ops a custom getter makes
  are named outside the tower's name scope (`get_variable` clears it).
  """
  if name.startswith(scope):
    name = name[len(scope):]
  return '/'.join(re.sub(r'_\d+$', '', part) for part in name.split('/'))


def _components(grad):
  if grad is None:
    return []
  if isinstance(grad, tf.IndexedSlices):
    return [t for t in (grad.values, grad.indices, grad.dense_shape)
            if t is not None]
  return [grad]


def _cone_short_of(ops, stops):
  """`ops` and what they depend on through data inputs, not past `stops`."""
  pending = [op for op in ops if op not in stops]
  seen = set(pending)
  while pending:
    op = pending.pop()
    for tensor in op.inputs:
      source = tensor.op
      if source not in seen and source not in stops:
        seen.add(source)
        pending.append(source)
  return seen


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
  # Trainable ones are check_tower's error (tower_build.py), made after,
  # and so are their slots: that error names the cause.
  trainable = set(v.op.name for v in graph.get_collection(
      tf1.GraphKeys.TRAINABLE_VARIABLES))
  if any(name.startswith(tower_scope) for name in trainable):
    return
  for op in created:
    for tensor in written(op):
      variable = variable_op(tensor)
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


def check_only_tower_optimizers_update(replication, train_op):
  """Raises if the step runs an update of a trainable variable by an
  optimizer that is not a `TowerOptimizer` (a second optimizer left plain,
  such as `DNNLinearCombinedClassifier`'s default `linear_optimizer='Ftrl'`):
  it would apply one tower's unscaled gradients, silently.

  Args:
    replication: the `tower_context.Replication` built, with several towers.
    train_op: the step's `train_op`.

  Raises:
    InvalidArgumentError: naming the variable and the update.
  """
  if train_op is None or replication.num_towers < 2:
    return
  trainable = set(v.op for v in replication.graph.get_collection(
      tf1.GraphKeys.TRAINABLE_VARIABLES))
  for op in op_kinds.backward_cone([op_kinds.op_of(train_op)]):
    if (op in replication.tower_optimizer_updates or
        not op.type.startswith(op_kinds.OPTIMIZER_UPDATE_PREFIXES) or
        not op.inputs):
      continue
    variable = variable_op(op.inputs[0])
    if variable in trainable:
      raise errors.InvalidArgumentError(
          'Trainable variable {} is updated by {} ({}), which no '
          'TowerOptimizer made: an optimizer that is not wrapped would apply '
          "one tower's gradients alone. Wrap every optimizer of model_fn in "
          'replicate.TowerOptimizer (a canned estimator takes optimizer '
          'objects: e.g. DNNLinearCombinedClassifier(linear_optimizer='
          'replicate.TowerOptimizer(tf.compat.v1.train.FtrlOptimizer(...)), '
          'dnn_optimizer=replicate.TowerOptimizer(...))).'.format(
              variable.name, op.name, op.type))


def written(op):
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


def variable_op(tensor):
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

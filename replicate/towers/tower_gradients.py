"""What `TowerOptimizer` does inside `replicate_model_fn`'s towers.

`compute_gradients`: a tower's loss scaled for the loss reduction, its
gradients computed by the wrapped optimizer, `GATE_OP` carried out by one
barrier per tower that the update waits for (gradient_gating.py).
`apply_gradients`: every
tower records its gradients; one call (tower 0's when the towers are
copies, else the last tower's) sums them per variable on the variable's
device, or all-reduces them under `VariablePlacement.REPLICATED`, and
applies them once, under the scopes of tower 0's call so that slots and ops
get one device's names. `apply_once` is the wrapped optimizer's
`apply_gradients` with gradient accumulation, also used outside towers.
"""
import collections
import contextlib

import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.gradients import accumulation
from replicate.gradients import gradient_aggregation
from replicate.gradients import gradient_gating
from replicate.towers import step_checks
from replicate.towers import tower_cloning
from replicate.towers import tower_collections

# What a `TowerOptimizer` was made with that applying needs.
Settings = collections.namedtuple('Settings',
                                  ['compression', 'accumulation_steps'])


def compute_gradients(replication, optimizer, loss, var_list, kwargs):
  """One tower's `(gradient, variable)` pairs (N > 1 towers).

  Raises:
    InvalidArgumentError: for a callable `loss`, a loss that is not a
      floating-point tensor (TF's optimizer's message: scaling an integer
      loss would hide it), a loss of one value per row under a mean
      reduction, or a `gate_gradients` that is not `GATE_NONE`, `GATE_OP`
      or `GATE_GRAPH`.
  """
  if callable(loss):
    raise errors.InvalidArgumentError(
        'TowerOptimizer.compute_gradients needs the loss tensor in graph '
        'mode, got the callable {!r}; pass the tensor instead.'.format(loss))
  dtype = getattr(loss, 'dtype', None)
  if dtype is not None and not (dtype.base_dtype.is_floating or
                                dtype.base_dtype.is_complex):
    raise errors.InvalidArgumentError(
        'Invalid type {!r} for {}, expected: {}. A loss to differentiate is '
        'a floating-point tensor; cast it, e.g. tf.cast(loss, tf.float32).'
        .format(dtype.base_dtype, loss.name, [
            tf.float32, tf.float64, tf.float16, tf.bfloat16]))
  _check_not_per_row(replication, loss)
  gradient_gating.check_gate_gradients(kwargs)
  replication.towers_computing.add(replication.tower.tower_id)
  if replication.tower.tower_id == tower_collections.UPDATE_TOWER_ID:
    pairs = _tower_gradients(replication, optimizer, loss, var_list, kwargs)
  else:
    # The other towers keep their update ops out of the step: neither the
    # scaled loss nor the gradients may depend on the
    # `control_dependencies(update_ops)` block models usually put around
    # `minimize` (see tower_collections.py). They still wait for everything
    # else the block names.
    with _without_update_ops(replication.graph):
      pairs = _tower_gradients(replication, optimizer, loss, var_list,
                               kwargs)
  step_checks.record_computed(replication, pairs)
  return pairs


def _check_not_per_row(replication, loss):
  """Raises for a loss whose dimension 0 is the tower's rows (unknown
  until run time) under a mean reduction.

  TF differentiates a non-scalar loss as its sum; a mean reduction weighs
  each tower's loss as a mean over its rows (by its share of the batch),
  so the towers' step would be about 1 / N of one device's. A static
  dimension 0 cannot be told from a few stacked means, and passes.
  """
  shape = getattr(loss, 'shape', None)
  if (replication.loss_reduction == tf1.losses.Reduction.SUM or
      shape is None or not shape.ndims or
      tf.compat.dimension_value(shape[0]) is not None):
    return
  raise errors.InvalidArgumentError(
      'TowerOptimizer got the loss {} of shape {}: a value per row (its '
      'dimension 0 is the batch\'s). TF differentiates a non-scalar loss as '
      'its sum, while loss_reduction={} weighs each tower\'s loss as a mean '
      'over its rows, so the towers\' step would be about 1/{} of one '
      'device\'s. Reduce the loss to a scalar (e.g. tf.reduce_mean, or a '
      'tf.compat.v1.losses function), or, for a sum over the rows, pass '
      'replicate_model_fn(..., loss_reduction=tf.compat.v1.losses.Reduction'
      '.SUM).'.format(loss.name, shape.as_list(), replication.loss_reduction,
                      replication.num_towers))


def _tower_gradients(replication, optimizer, loss, var_list, kwargs):
  if replication.cloner is not None:
    replication.gradient_losses.append(loss)
  replication.record_loss(loss)
  return optimizer.compute_gradients(
      replication.scale_loss(loss), var_list=var_list,
      **gradient_gating.tower_kwargs(optimizer, kwargs))


def apply_gradients(replication, optimizer, grads_and_vars, global_step,
                    name, settings):
  """A tower's `apply_gradients`: recorded, or the step's one update.

  Raises:
    InvalidArgumentError: if the towers do not make the same optimizer
      calls, if this tower computed no gradients with `TowerOptimizer`, for
      an optimizer `REPLICATED` cannot apply (`_check_replicable`), or for
      an update that is not one device's (step_checks.py).
  """
  grads_and_vars = list(grads_and_vars)
  if (replication.num_towers > 1 and
      replication.tower.tower_id not in replication.towers_computing):
    raise errors.InvalidArgumentError(
        'TowerOptimizer.apply_gradients got gradients that no '
        'TowerOptimizer.compute_gradients (or minimize) of this tower '
        'computed, e.g. from tf.gradients: those differentiate the tower\'s '
        'unscaled loss, so the sum over the {} towers would apply {} times '
        'one device\'s step. Compute them with TowerOptimizer.'
        'compute_gradients (and transform them as you like before '
        'apply_gradients), or call minimize.'.format(
            replication.num_towers, replication.num_towers))
  if replication.num_towers > 1:
    step_checks.check_gradients_computed(replication, grads_and_vars)
  if replication.num_towers == 1:
    if replication.replicated is None:
      return apply_once(optimizer, grads_and_vars, global_step, name,
                        settings, replication.loss_reduction)
    # One tower of several workers (REPLICATED): all-reduce, then apply.
    _check_replicable(optimizer)
    return _apply_replicated(replication, optimizer, [grads_and_vars],
                             global_step, name, settings)
  step_checks.check_unconditional(replication)
  call_index = replication.record_optimizer_call(_name_of(optimizer),
                                                 grads_and_vars)
  if replication.cloner is not None:
    tower_cloning.clone_optimizer_call(replication, call_index, optimizer)
  if replication.tower.tower_id != replication.applying_tower_id:
    # What the call is made under (the control dependencies open around it,
    # e.g. tower 0's update ops), for the applying tower's update to wait
    # for; not the gradients, which it reads anyway: everything that update
    # builds would wait for the batch (SyncReplicasOptimizer's
    # local_step_init_op, which its hook runs when the session starts).
    # Less its update ops for a tower other than tower 0, whose are the only
    # ones that run (tower_collections.py).
    with (contextlib.nullcontext() if
          replication.tower.tower_id == tower_collections.UPDATE_TOWER_ID
          else _without_update_ops(replication.graph)):
      under = tf.no_op(name='tower_optimizer_call')
    gradients = [g for g, _ in grads_and_vars if g is not None]
    with tf1.control_dependencies(_tensors_of(gradients) + [under]):
      ready = tf.no_op(name='tower_gradients_recorded')
    # What the tower gets back stands for the update of the step, which a
    # later tower builds: it is made to wait for that update then, so that
    # what the tower builds under `control_dependencies([train_op])` (a
    # counter, a second optimizer's step) runs after it, as on one device.
    with tf1.control_dependencies([ready]):
      returned = tf.no_op(name='tower_train_op')
    replication.record_returned_op(call_index, under, returned)
    return returned
  if replication.tower.tower_id == tower_collections.UPDATE_TOWER_ID:
    # Copied towers: tower 0 applies, under its call's control dependencies
    # and their copies (tower_cloning._gradient_controls).
    with tf1.control_dependencies(
        replication.copied_controls.get(call_index, [])):
      return _apply_sums(replication, optimizer, call_index, global_step,
                         name, settings)
  # The last tower applies for every tower, but only tower 0's update ops
  # may run (see tower_collections.py): the update waits for what every
  # tower's same call was made under (less the update ops of towers other
  # than tower 0), and for what this call is made under less the last
  # tower's update ops. (Another tower's block may name gradients of a
  # later call, whose backward pass reads a variable this update writes.)
  with _without_update_ops(replication.graph), tf1.control_dependencies(
      [replication.ready_op(tower_id, call_index)
       for tower_id in range(replication.tower.tower_id)]):
    train_op = _apply_sums(replication, optimizer, call_index, global_step,
                           name, settings)
  # A Tensor, an Operation, or (an `assign` of a resource variable, as
  # SyncReplicasOptimizer's last op) a variable that has the op.
  update = getattr(train_op, 'op', train_op)
  for returned in replication.returned_ops(call_index):
    _compat.add_control_inputs(returned, [update])
  return train_op


def _without_update_ops(graph):
  """Re-enters the open control dependencies less the tower's update ops.

  An update op is an entry of the tower's view of `UPDATE_OPS`; a group of
  ops (`tf.group`, a `NoOp`) counts as one if it waits for one.
  """
  updates = set(item.op if isinstance(item, (tf.Tensor, tf.Variable)) else
                item for item in graph.get_collection(
                    tf1.GraphKeys.UPDATE_OPS))
  kept = sorted((op for op in _compat.current_control_dependencies(graph)
                 if not _waits_for_update(op, updates)),
                key=lambda op: op.name)
  return _only_control_dependencies(kept)


def _waits_for_update(op, updates):
  if op in updates:
    return True
  return op.type == 'NoOp' and any(
      _waits_for_update(control, updates) for control in op.control_inputs)


@contextlib.contextmanager
def _only_control_dependencies(ops):
  # The inner block is made after the outer one is entered: TF leaves out
  # of a new block the ops that the open blocks name.
  with tf1.control_dependencies(None):
    with tf1.control_dependencies(ops):
      yield


def _apply_sums(replication, optimizer, call_index, global_step, name,
                settings):
  """Sums every tower's gradients of call `call_index` and applies them.

  Under `VariablePlacement.REPLICATED` the sums are all-reduced onto every
  tower, and one `apply_gradients` updates every tower's copies.
  """
  if replication.replicated is not None:
    _check_replicable(optimizer)
  tower_grads = replication.gradients_of_call(call_index)
  # Every write of the update waits for every tower's gradients, and so for
  # every backward read of the variables (GATE_OP's guarantee, towers
  # having computed without its tuples), and for the losses they are of:
  # a term no gradient needs (a regularizer's value) may read a variable
  # on another device, and the step reports the loss before its update.
  barriers = [
      gradient_gating.barrier(
          [g for g, _ in pairs] + _losses_of(replication, tower_id,
                                             call_index),
          _name_scope(replication, tower_id))
      for tower_id, pairs in enumerate(tower_grads)]
  tower_grads = _without_empty_towers(replication, tower_grads)

  def apply():
    try:
      with replication.first_tower_call_scopes(call_index):
        if replication.replicated is not None:
          return _apply_replicated(replication, optimizer, tower_grads,
                                   global_step, name, settings)
        with tf1.name_scope('gradient_aggregation'):
          compressed, contexts = _compressed(tower_grads, settings)
          summed = gradient_aggregation.sum_gradients_by_variable(
              compressed, replication.tuning)
          summed = [(_decompressed(grad, contexts, var, settings), var)
                    for grad, var in summed]
        return apply_once(optimizer, summed, global_step, name, settings,
                          replication.loss_reduction)
    except ValueError as e:
      if call_index == 0 or 'already exists' not in str(e):
        raise
      raise errors.InvalidArgumentError(
          'Optimizer call {} of the towers ({}) makes a variable that an '
          'earlier optimizer call of the step made: {} With towers built by '
          'their own model_fn calls, each update is built under tower 0\'s '
          'scopes, where TF gives a second optimizer of the same name the '
          'first one\'s slot names (one device names them <name>_1). Give '
          'each optimizer its own name, e.g. MomentumOptimizer(..., '
          'name=\'Momentum_2\').'.format(
              call_index, optimizer.get_name(),
              str(e).strip().splitlines()[0])) from e

  train_op, created = gradient_gating.ops_created_by(replication.graph, apply)
  gradient_gating.wait_for_barriers(train_op, created, barriers)
  if replication.cloner is None:
    # Towers built by calls: the last one applies, with its own state.
    replication.tower_optimizer_updates.update(created)
    step_checks.check_no_tower_state_written(replication, created)
    return train_op
  # Tower 0 applies for copied towers: what it builds here is the one
  # update of the step, never to be copied (e.g. when a later optimizer
  # call of tower 0 depends on this one).
  replication.tower_optimizer_updates.update(created)
  replication.cloner.share(created)
  return train_op


def _losses_of(replication, tower_id, call_index):
  """The losses whose gradients tower `tower_id` gives its optimizer call
  `call_index` (a copy's are the copies of tower 0's). Only those: a later
  call's loss may be made after this call's update (a second `minimize`
  under `control_dependencies` of the first)."""
  if replication.towers_cloned and tower_id:
    return [replication.cloner.get(tower_id, loss)
            for loss in replication.losses_of_call(0, call_index)]
  return replication.losses_of_call(tower_id, call_index)


def _name_scope(replication, tower_id):
  """Tower `tower_id`'s name scope ('' or ending in '/')."""
  if tower_id and replication.cloner is not None:
    return replication.cloner.name_scope(tower_id)
  return replication.name_scopes.get(tower_id, '')


def _without_empty_towers(replication, tower_grads):
  """Each tower's gradients, made exactly zero for a tower without rows.

  A tower given no rows of a short batch (`b < N`) has its loss weighted 0,
  yet its gradients can be NaN: statistics over no rows (batch
  normalization's mean and variance) are 0/0, and 0 * NaN is NaN. One device
  never builds that tower, so its gradients must add nothing.
  `multiply_no_nan` by the tower's 0-or-1 mask keeps every other gradient bit
  for bit. Only where rows are counted at run time (`tower_rows`).
  """
  if replication.tower_rows is None:
    return tower_grads
  masked = []
  for rows, pairs in zip(replication.tower_rows, tower_grads):
    masks = {}

    def mask_of(grad, rows=rows, masks=masks):
      dtype = grad.dtype.base_dtype
      if dtype not in masks:
        with tf1.device(rows.device), tf1.name_scope('empty_tower_mask'):
          masks[dtype] = tf.cast(rows > 0, dtype)
      return masks[dtype]

    tower = []
    for grad, var in pairs:
      if grad is not None and grad.dtype.base_dtype.is_floating:
        with tf1.device(grad.device), tf1.name_scope('empty_tower_gradient'):
          if isinstance(grad, tf.IndexedSlices):
            grad = tf.IndexedSlices(
                tf.math.multiply_no_nan(grad.values, mask_of(grad.values)),
                grad.indices, grad.dense_shape)
          else:
            grad = tf.math.multiply_no_nan(grad, mask_of(grad))
      tower.append((grad, var))
    masked.append(tower)
  return masked


def _apply_replicated(replication, optimizer, tower_grads, global_step, name,
                      settings):
  """All-reduces the towers' gradients; applies them to every copy."""
  replicated = replication.replicated
  with tf1.name_scope('gradient_all_reduce'):
    compressed, contexts = _compressed(tower_grads, settings)
    reduced = replicated.all_reduce(compressed)
    reduced = [[(_decompressed(grad, contexts, var, settings), var)
                for grad, var in pairs] for pairs in reduced]
  replicated.make_slots(optimizer, reduced)
  # A variable without copies (one not trainable, given in `var_list`) is
  # the same in every tower's pairs: applied once, the all-reduced sum, as
  # the other placements apply it.
  applied = list(reduced[0]) + [
      pair for pairs in reduced[1:] for index, pair in enumerate(pairs)
      if pair[1] is not reduced[0][index][1]]
  train_op, update_ops = gradient_gating.ops_created_by(
      replication.graph, lambda: apply_once(
          optimizer, applied, global_step, name, settings,
          replication.loss_reduction))
  replicated.note_updates(update_ops)
  replicated.adopt_slots(optimizer, reduced)
  return train_op


def _compressed(tower_grads, settings):
  """`(tower_grads compressed, contexts by variable)`."""
  contexts = {}
  if settings.compression is None:
    return tower_grads, contexts
  compressed = []
  for grads_and_vars in tower_grads:
    pairs = []
    for grad, var in grads_and_vars:
      if grad is not None:
        grad, contexts[id(var)] = settings.compression.compress(grad)
      pairs.append((grad, var))
    compressed.append(pairs)
  return compressed, contexts


def _decompressed(grad, contexts, var, settings):
  if grad is None or settings.compression is None:
    return grad
  return settings.compression.decompress(grad, contexts[id(var)])


def apply_once(optimizer, grads_and_vars, global_step, name, settings,
               loss_reduction=None):
  """`optimizer.apply_gradients`, every `accumulation_steps` runs.

  The accumulated sum is scaled by `1 / accumulation_steps`, except under
  `loss_reduction=SUM` (the sum over a k-times larger batch is the sum of
  the sums).
  """
  steps = settings.accumulation_steps
  if steps == 1:
    return optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                     name=name)
  scale = 1.0 if loss_reduction == tf1.losses.Reduction.SUM else 1.0 / steps
  return accumulation.apply_accumulated(
      lambda pairs, step, op_name: optimizer.apply_gradients(
          pairs, global_step=step, name=op_name),
      grads_and_vars, steps, scale, global_step, name)


def _check_replicable(optimizer):
  """Raises for optimizers that cannot update per-tower copies.

  Raises:
    InvalidArgumentError: for a `SyncReplicasOptimizer`, whose shared queues
      and accumulators need parameter servers, and for any other optimizer
      overriding `apply_gradients` (a wrapper), which would see every copy's
      gradients in the one call.
  """
  if isinstance(optimizer, tf1.train.SyncReplicasOptimizer):
    raise errors.InvalidArgumentError(
        'variable_placement=REPLICATED all-reduces the gradients itself; a '
        'SyncReplicasOptimizer ({}) aggregates them on parameter servers. '
        'Pass its wrapped optimizer to TowerOptimizer, or use '
        'VariablePlacement.PARAMETER_SERVERS.'.format(_name_of(optimizer)))
  if type(optimizer).apply_gradients is not tf1.train.Optimizer.apply_gradients:
    raise errors.InvalidArgumentError(
        'variable_placement=REPLICATED applies the gradients of every '
        'tower\'s copies in one apply_gradients call of the wrapped '
        'optimizer, but {} ({}) overrides apply_gradients: a wrapper that '
        'looks at all the gradients at once (a global norm to clip by, a '
        'loss scale) would see N copies of each. Transform the gradients '
        'between TowerOptimizer.compute_gradients and apply_gradients, or '
        'use VariablePlacement.CONSOLIDATION_DEVICE.'.format(
            _name_of(optimizer), type(optimizer).__name__))


def _name_of(optimizer):
  """The optimizer's name; its class's for one that never ran
  `Optimizer.__init__` (TF 1.15 contrib's `LossScaleOptimizer`)."""
  try:
    return optimizer.get_name()
  except AttributeError:
    return type(optimizer).__name__


def _tensors_of(gradients):
  """The tensors a list of gradients consists of (IndexedSlices unpacked)."""
  tensors = []
  for grad in gradients:
    if isinstance(grad, tf.IndexedSlices):
      tensors.extend([grad.values, grad.indices])
    else:
      tensors.append(grad)
  return tensors

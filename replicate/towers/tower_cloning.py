"""Towers 1..N-1 as copies of tower 0's training graph.

Building N towers by calling `model_fn` N times costs N Python
constructions of the model and N calls of `tf.gradients` (figures:
docs/performance.md). In TRAIN, `replicate_model_fn` therefore calls
`model_fn` once, for tower 0. When tower 0 hands its gradients to
`TowerOptimizer.apply_gradients`, the ops it built to compute them (forward
pass, loss, gradients and their gates) are copied onto every other tower's
device with `tf.import_graph_def`: the same op types and attributes, named
under `tower_<i>/` as if `model_fn` had built them there, reading tower i's
shard of the batch. The copies are made before the gradients are summed, so
`apply_gradients` returns the real update.

A copy must do what another `model_fn` call would have built (the rule of
graph_copy/copy_policy.py; the table is docs/replicate_model_fn.md's "What
a copy preserves"). Shared with tower 0, not copied: variables and lookup
tables and their plain reads and initializers; the update ops tower 0 added
to `UPDATE_OPS` (the documented difference: the moving statistics come from
tower 0, see tower_collections.py); and everything built before tower 0
(the batch split, the global step). Other writes the copies need (a counter
in the forward pass) are copied, so every tower makes them. With a graph
seed, random ops of tower i get `seed2` offset by `i` (node_defs.reseeds).

When copying cannot be shown right, every tower is built by its own
`model_fn` call, as in tf.contrib, and one warning says why (`POLICY`):
`model_fn` asked `replicate.get_tower_context()` which tower it builds; the
loss reduction is `SUM` and tower 0 created regularization losses (they
count in tower 0 only); a device scope around the replicated `model_fn`
changed where tower 0's ops went; the optimizer holds a hyperparameter
computed from the tower's rows or by a random op (calls apply with the
last tower's); or the copies would write a non-trainable `tf.Variable`
tower 0 made (each call makes its own). What copies do not repeat: `model_fn`'s
Python code runs once, so Python-side state it keeps (a call counter, a
Python random number) is the same for every tower, and summaries, hooks and
other ops built after `apply_gradients` exist in tower 0 only.
`TowerBuild.CALL_PER_TOWER` restores contrib's behaviour.
"""
import enum

import tensorflow as tf

from replicate import _compat
from replicate._compat import tf1
from replicate.core import logs as logging
from replicate.graph_copy import copy_policy
from replicate.towers import tower_specs


class TowerBuild(enum.Enum):
  """How `replicate_model_fn` builds the towers after the first.

  Attributes:
    CLONE: call `model_fn` once and copy what tower 0 built onto the other
      devices: in TRAIN its forward pass, loss and gradients (this module),
      in EVAL and PREDICT what its outputs need (output_copies.py); where
      copying cannot be shown to be right, fall back to `CALL_PER_TOWER` with
      a warning. The default.
    CALL_PER_TOWER: call `model_fn` once per tower, as tf.contrib did.
  """
  CLONE = 'clone'
  CALL_PER_TOWER = 'call_per_tower'


# "Copy, or say why not" (graph_copy/copy_policy.py), worded for towers.
POLICY = copy_policy.CopyPolicy(
    copies='replicate_model_fn(tower_build=TowerBuild.CLONE) copies tower 0 '
           'onto the other towers',
    calls='calling model_fn once per tower',
    fix='pass tower_build=replicate.TowerBuild.CALL_PER_TOWER (what copies '
        'preserve: docs/replicate_model_fn.md#what-a-copy-preserves)')


def warn_not_cloned(reason):
  """Logs once why towers are built by calling model_fn per tower."""
  logging.log_first_n(logging.WARNING, '%s', 1,
                      POLICY.fallback_message(reason))


def clone_optimizer_call(replication, call_index, optimizer):
  """Copies tower 0's gradients of one optimizer call onto the other towers.

  Called by tower 0's `TowerOptimizer.apply_gradients` while
  `replication.cloner` is set. The first call decides whether tower 0 may be
  copied at all: if not, it logs why, unsets `replication.cloner`, and the
  other towers are built by calling `model_fn`. Otherwise every tower gets a
  copy of the call (its gradients and their gates), and
  `replication.towers_cloned` is set.

  Tower 0's `optimizer` applies for every tower where calls would apply
  with the last tower's: a hyperparameter tensor it holds (a learning rate)
  must not differ between calls (`TowerCloner.reason_call_values`). Nor may
  the first call's copies write a variable each call would make its own of
  (`TowerCloner.reason_variables_made_anew`).

  Args:
    replication: the `tower_context.Replication` being built.
    call_index: the index of the call among tower 0's optimizer calls.
    optimizer: the optimizer `TowerOptimizer` wraps.

  Raises:
    InvalidArgumentError: where a later call's optimizer holds such a
      hyperparameter, once the towers are copies.
  """
  cloner = replication.cloner
  optimizer_name, grads_and_vars = replication.optimizer_call(0, call_index)
  # A gradient is copied with its gate: GATE_OP's `tuple` identity, which
  # waits for the other gradients of its op (the backward reads of W).
  targets = []
  for grad, _ in grads_and_vars:
    if isinstance(grad, tf.IndexedSlices):
      targets.extend(t for t in (grad.values, grad.indices, grad.dense_shape)
                     if t is not None)
    elif grad is not None:
      targets.append(grad)
  reason = cloner.reason_call_values(_hyperparameters(optimizer))
  if reason is not None:
    reason += ", and calls apply with the last tower's optimizer"
  if replication.towers_cloned:
    POLICY.check(reason)
  else:
    reason = reason or cloner.reason_variables_made_anew(
        targets + replication.gradient_losses) or cloner.reason_not_to_clone(
            replication.tower_context_requested,
            replication.loss_reduction == tf1.losses.Reduction.SUM)
    if reason is not None:
      warn_not_cloned(reason)
      replication.not_cloned_reason = reason
      replication.cloner = None
      return
  replicated = replication.replicated
  if replicated is not None:
    replicated.make_copies(cloner)
  if replication.ops_before_updates is None:
    replication.ops_before_updates = frozenset(
        replication.graph.get_operations())
  controls = _gradient_controls(replication)
  # The loss values are copied now too: the model's spec reports one of them
  # as a rule, and a round of its own would cost another import.
  cloner.clone(targets + replication.gradient_losses + controls)
  replication.towers_cloned = True
  replication.copied_controls[call_index] = [
      cloner.get(tower_id, op) for tower_id in range(1, replication.num_towers)
      for op in controls]
  for tower_id in range(1, replication.num_towers):
    copied = []
    for grad, var in grads_and_vars:
      if replicated is not None:
        var = replicated.copy_of(tower_id, var)
      copied.append((cloner.get(tower_id, grad), var))
    replication.record_optimizer_call(optimizer_name, copied,
                                      tower_id=tower_id)


def _hyperparameters(optimizer):
  """`(description, tensor)` for the tensors `optimizer` holds, and those
  of the optimizers it wraps (e.g. `SyncReplicasOptimizer`'s)."""
  found, pending, seen = [], [optimizer], set()
  while pending:
    current = pending.pop()
    if id(current) in seen:
      continue
    seen.add(id(current))
    for name, value in sorted(getattr(current, '__dict__', {}).items()):
      if isinstance(value, tf.Tensor):
        found.append(("the optimizer {}'s {}".format(
            type(current).__name__, name.lstrip('_')), value))
      elif isinstance(value, tf1.train.Optimizer):
        pending.append(value)
  return found


def _gradient_controls(replication):
  """What the open control dependencies name of tower 0's gradients.

  Tower 0's gradients, or values made of them before any update (a GAN's
  two optimizers: every gradient computed, then both updates under
  `control_dependencies` of them all). The update waits for them, as on one
  device; it must wait for their copies too, or it may write a variable
  that a copy's backward pass still reads (a reference variable's read
  aliases it). Ops written by an update, or made after one, are not copied.
  """
  open_ops = _compat.current_control_dependencies(replication.graph)
  if not open_ops:
    return []
  before = replication.ops_before_updates
  pending = [op for op in replication.computed_gradient_ops.get(0, ())
             if op in before]
  derived = set(pending)
  while pending:
    op = pending.pop()
    for consumer in [c for t in op.outputs for c in t.consumers()]:
      if consumer in before and consumer not in derived:
        derived.add(consumer)
        pending.append(consumer)
  return sorted(open_ops & derived, key=lambda op: op.name)


def copied_specs(cloner, replication, first_spec, unscaled_loss, collections):
  """The `EstimatorSpec`s of towers 1..N-1 when they are copies of tower 0.

  Each is tower 0's spec with the tower's own scaled loss: the copy of tower
  0's loss (already copied, as a rule, since the gradients needed it). The
  copies of tower 0's `LOSSES` entries are recorded as the towers' own.

  Args:
    cloner: the `TowerCloner` that copied tower 0.
    replication: the `tower_context.Replication` being built.
    first_spec: tower 0's spec, its loss scaled.
    unscaled_loss: the loss tower 0's `model_fn` returned.
    collections: the `tower_collections.TowerCollections` of the towers.

  Returns:
    A list of `num_towers - 1` specs.
  """
  losses = collections.added(0, tf1.GraphKeys.LOSSES)
  cloner.clone([unscaled_loss] + losses)
  specs = []
  for tower_id in range(1, replication.num_towers):
    collections.record_copied_losses(
        tower_id, [cloner.get(tower_id, loss) for loss in losses])
    with tf1.device(cloner.device(tower_id)), tf1.name_scope(
        cloner.name_scope(tower_id)):
      loss = replication.scale_loss(cloner.get(tower_id, unscaled_loss),
                                    tower_id)
    specs.append(tower_specs.replaced(first_spec, loss=loss))
  return specs

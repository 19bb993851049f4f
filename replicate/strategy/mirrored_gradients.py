"""Gradients of `MirroredStrategy` replicas: summed once, applied to every copy.

`apply_gradients_across_replicas` is the route a mirrored replica context
offers optimizer wrappers (`ReplicaContext._apply_gradients`): one
`merge_call` sums each variable's gradients over the replicas and one
`apply_gradients` updates every copy.
"""
import functools

import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core.compression import Compression
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import values as values_lib
from replicate.graph_copy import bulk_variables
from replicate.strategy import default_strategy
from replicate.strategy import distribute_context
from replicate.strategy.mirrored_values import MirroredVariable


def apply_gradients_across_replicas(optimizer, grads_and_vars,
                                    global_step=None, name=None,
                                    compression=None):
  """Sums each variable's gradient over replicas and updates every copy.

  Call it inside `call_for_each_replica` of a `MirroredStrategy`, once per
  replica, with that replica's gradients (of a loss scaled to the global
  batch). In one `merge_call`, the per-replica gradients are summed with
  `batch_reduce_to` onto the variables' devices, and `optimizer` updates every
  copy of every variable with the sum. All copies are updated by a single
  `apply_gradients` call, so state the optimizer keeps once per step (Adam's
  beta powers, the global step) advances once. Slots are made per copy
  (the primary's by the optimizer, the others' from it: see
  graph_copy/bulk_variables.py) and then mirrored like the variables: one
  checkpoint key per slot, named as one device names it, restored into
  every copy.

  Args:
    optimizer: a `tf.compat.v1.train.Optimizer`.
    grads_and_vars: this replica's `(gradient, variable)` pairs; variables are
      mirrored variables of the current strategy.
    global_step: optional variable incremented once per step, after the
      updates.
    name: optional name of the returned op.
    compression: optional compressor (`replicate.Compression.fp16`): each
      replica's gradients are compressed on its device before the
      reduction and decompressed after it.

  Returns:
    The op applying the update (the same op on every replica).

  Raises:
    ContextError: outside a replica context.
    InvalidArgumentError: if no gradient is given, or a variable is not a
      mirrored variable of the current strategy.
  """
  replica = default_strategy.get_replica_context()
  if replica is None:
    raise errors.ContextError(
        'apply_gradients_across_replicas must be called in a replica context '
        '(inside call_for_each_replica), not in a cross-replica context. In '
        'cross-replica context call optimizer.apply_gradients on reduced '
        'gradients instead.')
  grads_and_vars = [tuple(pair) for pair in grads_and_vars]
  contexts = None
  if compression is not None and compression is not Compression.none:
    compressed = [compression.compress(g) if g is not None else (None, None)
                  for g, _ in grads_and_vars]
    grads_and_vars = [(c, v) for (c, _), (_, v) in
                      zip(compressed, grads_and_vars)]
    contexts = _Contexts(compression, [context for _, context in compressed])
  # The optimizer travels in the merge function, not its arguments: replicas
  # may each have built their own optimizer object (e.g. a model_fn called
  # per replica); the first replica's one applies the update, as in TF.
  return replica.merge_call(
      functools.partial(_apply_merged, optimizer=optimizer),
      args=(grads_and_vars, global_step, name, contexts))


class _Contexts(object):
  """A compressor and what it needs to decompress each gradient.

  A plain object, so that `merge_call` hands it over whole.
  """

  def __init__(self, compressor, contexts):
    self.compressor = compressor
    self.contexts = contexts


def _first_replica(value):
  """One replica's component of a merge argument (all replicas' are alike)."""
  if isinstance(value, values_lib.PerReplica):
    return value.values[0]
  return value


def _apply_merged(strategy, grads_and_vars, global_step, name, contexts,
                  optimizer):
  pairs = [(g, v) for g, v in grads_and_vars if g is not None]
  if not pairs:
    raise errors.InvalidArgumentError(
        'No gradients were given for any of the variables {}; check that the '
        'loss depends on them.'.format([v.name for _, v in grads_and_vars]))
  for _, v in pairs:
    if not (isinstance(v, MirroredVariable) and v.strategy is strategy):
      raise errors.InvalidArgumentError(
          'Variable {!r} is not a mirrored variable of the current strategy; '
          'create the model variables inside strategy.scope() (or inside '
          'call_for_each_replica).'.format(v))
  reduced = iter(strategy.extended.batch_reduce_to(ReduceOp.SUM, pairs))
  per_copy = []
  contexts = _first_replica(contexts)
  for index, (g, v) in enumerate(grads_and_vars):
    if g is None:
      continue
    summed = next(reduced)
    for device, copy in zip(v.devices, v.values):
      value = summed.get(device)
      if contexts is not None:
        value = contexts.compressor.decompress(value,
                                               contexts.contexts[index])
      per_copy.append((value, copy))
  with distribute_context.unmirrored_variables():
    # The primaries' slots made by the optimizer, the other copies' from
    # them (grouped per variable by `_mirror_slots` below).
    variables = [v for _, v in pairs]
    bulk_variables.create_slot_copies(
        optimizer, [v.values[0] for v in variables],
        [list(v.values[1:]) for v in variables], collections=[])
    apply_op = optimizer.apply_gradients(
        per_copy, name=name if global_step is None else None)
  strategy.extended._mirror_slots(optimizer, [v for _, v in pairs])  # pylint: disable=protected-access
  if global_step is None:
    return apply_op
  with tf.control_dependencies([apply_op]):
    if isinstance(global_step, MirroredVariable):
      increment = strategy.extended.update(
          global_step, lambda copy: copy.assign_add(1, read_value=False))
      return tf.group(increment, name=name) if name else increment
    with tf1.get_default_graph().colocate_with(global_step):
      return global_step.assign_add(1, name=name, read_value=False)

"""`ReplicaContext`: what code running in one replica sees and can do.

The default implementation serves the default strategy's single replica;
strategies with several replicas subclass it (see `mirrored_run`).
"""
import tensorflow as tf

from replicate import errors
from replicate.core import reduce_util
from replicate.strategy import distribute_context
from replicate.strategy.context_rules import describe_strategy
from replicate.strategy.context_rules import require_replica_context


class ReplicaContext(object):
  """The context of one replica, inside `call_for_each_replica`.

  Also a context manager that makes itself the current context. Get it with
  `replicate.get_replica_context()`: TF's `tf.distribute.get_replica_context()`
  does not see replicate's replicas and returns its default context.
  """

  def __init__(self, strategy, replica_id_in_sync_group):
    """The context of replica `replica_id_in_sync_group` of `strategy`."""
    self._strategy = strategy
    self._replica_id_in_sync_group = replica_id_in_sync_group
    self._pushed = []

  def __enter__(self):
    manager = distribute_context.push_replica(self)
    manager.__enter__()
    self._pushed.append(manager)
    return self

  def __exit__(self, exc_type, exc_value, traceback):
    return self._pushed.pop().__exit__(exc_type, exc_value, traceback)

  def merge_call(self, merge_fn, args=(), kwargs=None):
    """Runs `merge_fn(strategy, *args, **kwargs)` once, cross-replica.

    Every replica must call `merge_call` (the same number of times); each
    pauses until all have arrived. `merge_fn` then sees each argument leaf
    that differs between replicas as a `PerReplica` value, and each replica
    gets the result (its own component of per-replica results).

    Args:
      merge_fn: a callable taking the strategy first.
      args: positional arguments for `merge_fn`.
      kwargs: keyword arguments for `merge_fn`.

    Returns:
      This replica's share of what `merge_fn` returned.

    Raises:
      ContextError: if this is not the current replica context (in a
        cross-replica context, or another replica's).
      InvalidTypeError: if `merge_fn` is not callable.
    """
    require_replica_context(self, 'merge_call')
    if not callable(merge_fn):
      raise errors.InvalidTypeError(
          'merge_call needs a callable merge_fn(strategy, ...), got {!r}.'
          .format(merge_fn))
    return self._merge_call(merge_fn, tuple(args), dict(kwargs or {}))

  def _merge_call(self, merge_fn, args, kwargs):
    with distribute_context.push_cross_replica(self._strategy):
      return merge_fn(self._strategy, *args, **kwargs)

  @property
  def num_replicas_in_sync(self):
    """How many replicas run in sync."""
    return self._strategy.num_replicas_in_sync

  @property
  def replica_id_in_sync_group(self):
    """This replica's index, in `[0, num_replicas_in_sync)` (a Python int)."""
    return self._replica_id_in_sync_group

  @property
  def strategy(self):
    """The strategy this replica belongs to."""
    return self._strategy

  @property
  def devices(self):
    """The devices this replica runs on, as a tuple of strings.

    Raises:
      ContextError: if this is not the current replica context.
    """
    require_replica_context(self, 'devices')
    return self._devices()

  def _devices(self):
    return (self._strategy.extended.worker_devices[
        self._replica_id_in_sync_group],)

  def all_reduce(self, reduce_op, value):
    """Reduces `value` (a nest of tensors) over replicas; all get the result.

    Differentiable: the gradient flowing into each replica's input is the
    all-reduce (same op) of the gradients of every replica's output, also
    where the inputs depend on mirrored variables. Build that gradient inside
    the replicas (`tf.gradients` in the replica function; elsewhere the
    strategy raises `ContextError`).

    Args:
      reduce_op: `ReduceOp.SUM` / `MEAN` (or `tf.VariableAggregation`).
      value: a nest of tensors.

    Returns:
      The nest of reduced tensors, on this replica's device.

    Raises:
      ContextError: if this is not the current replica context.
      InvalidArgumentError: for another reduce op.
    """
    require_replica_context(self, 'all_reduce')
    reduce_op = reduce_util.as_strategy_reduce_op(reduce_op)
    return self._all_reduce(reduce_op, value)

  def _all_reduce(self, reduce_op, value):
    del reduce_op  # One replica: SUM and MEAN are both the identity.
    return tf.nest.map_structure(tf.identity, value)

  # The gradient route: how an optimizer wrapper (`TowerOptimizer`) treats
  # gradients computed in this replica. Here, and in the default context,
  # the wrapped optimizer applies them as it is; a strategy whose replicas
  # must sum gradients across replicas overrides both.

  def _routes_gradients(self):
    """Whether `_apply_gradients` replaces the optimizer's own apply."""
    return False

  def _apply_gradients(self, optimizer, grads_and_vars, global_step, name,
                       compression=None):
    """Applies this replica's share of a step's gradients with `optimizer`.

    `compression` (a `Compression` compressor) applies to what crosses
    devices; with one replica nothing does.
    """
    del compression  # Nothing crosses devices.
    return optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                     name=name)

  def __repr__(self):
    return 'ReplicaContext(replica {} of {})'.format(
        self._replica_id_in_sync_group, describe_strategy(self._strategy))



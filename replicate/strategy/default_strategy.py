"""The default strategy: one replica, wherever `tf.device` puts it.

It is what `get_strategy()` returns outside any scope, so that code written
against the strategy API runs unchanged without distribution. Its reductions
are identities and its updates run once, next to the variable.
"""
import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.cross_tower import values as values_lib
from replicate.strategy import distribute_context
from replicate.strategy import input_lib
from replicate.strategy.distribute_context import UpdateContext
from replicate.strategy.replica_context import ReplicaContext
from replicate.strategy.strategy_base import Strategy
from replicate.strategy.strategy_extended import StrategyExtended


class _DefaultExtended(StrategyExtended):
  """One replica, on the caller's device; reductions are identities."""

  @property
  def _num_replicas_in_sync(self):
    return 1

  def _is_default_strategy(self):
    return True

  def _colocate_vars_with(self, colocate_with_variable):
    def creator(next_creator, **kwargs):
      with tf1.get_default_graph().colocate_with(colocate_with_variable):
        return next_creator(**kwargs)
    return tf1.variable_creator_scope(creator)

  def _variable_created_in_scope(self, v):
    return not isinstance(v, values_lib.DistributedValues)

  def _read_var(self, v):
    return tf.identity(v)

  def _broadcast_to(self, tensor, destinations):
    del destinations  # One device: nothing to copy.
    return tensor

  def _call_for_each_replica(self, fn, args, kwargs):
    with ReplicaContext(self._container_strategy(), 0):
      return fn(*args, **kwargs)

  def _reduce_to(self, reduce_op, value, destinations):
    del reduce_op, destinations  # One replica: the value is its own reduction.
    return value

  def _batch_reduce_to(self, reduce_op, value_destination_pairs):
    return [self._reduce_to(reduce_op, v, d)
            for v, d in value_destination_pairs]

  def _reduce(self, reduce_op, value):
    del reduce_op  # One replica.
    return value

  def _update(self, var, fn, args, kwargs, group):
    graph = tf1.get_default_graph()
    with graph.colocate_with(var), UpdateContext(var.device):
      result = fn(var, *args, **kwargs)
    if group:
      return result
    return tf.nest.map_structure(lambda r: (r,), result)

  def _non_slot_devices(self, var_list):
    return min(var_list, key=lambda v: v.name)

  def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
    graph = tf1.get_default_graph()
    with graph.colocate_with(colocate_with), \
        UpdateContext(colocate_with.device):
      result = fn(*args, **kwargs)
    if group:
      return result
    return tf.nest.map_structure(lambda r: (r,), result)

  def _value_container(self, value):
    return value

  def _worker_devices(self):
    raise errors.ContextError(
        'The default strategy has no fixed devices: its one replica runs '
        'wherever tf.device places it. Use MirroredStrategy(devices=[...]) '
        'to name devices.')

  _parameter_devices = _worker_devices

  def _make_dataset_iterator(self, dataset, one_shot=False):
    return input_lib.DatasetIterator(dataset, devices=None, one_shot=one_shot)

  def _make_input_fn_iterator(self, input_fn, one_shot=False):
    return input_lib.InputFunctionIterator(input_fn, devices=None,
                                           one_shot=one_shot)


class _DefaultStrategy(Strategy):
  """The strategy in effect when no other is: one replica, no distribution."""

  def __init__(self):
    super(_DefaultStrategy, self).__init__(_DefaultExtended(self))

  def __deepcopy__(self, memo):
    return self  # There is one default strategy.


class _DefaultReplicaContext(ReplicaContext):

  def _devices(self):
    return (_compat.current_device(),)


def _make_default_context():
  strategy = _DefaultStrategy()
  return distribute_context.Context(
      strategy, replica_context=_DefaultReplicaContext(strategy, 0))


# The bottom entry of every thread's stack, made once at import.
_DEFAULT_CONTEXT = _make_default_context()


def current_context():
  """The innermost context entry of this thread (the default one if none)."""
  return distribute_context.innermost() or _DEFAULT_CONTEXT


def default_strategy():
  """The default strategy (one replica, no distribution)."""
  return _DEFAULT_CONTEXT.strategy


def has_strategy():
  """Whether a strategy other than the default one is current."""
  return get_strategy() is not default_strategy()


def get_strategy():
  """The current `Strategy`: the one whose scope or replica we are in.

  Returns:
    The strategy of the innermost context; the default strategy (one replica,
    identity reductions) outside any scope.
  """
  return current_context().strategy


def get_replica_context():
  """The current `ReplicaContext`, or None in a cross-replica context.

  Returns:
    Inside `call_for_each_replica`, the context of the replica being built;
    outside any strategy scope, the default strategy's replica context (one
    replica); inside `Strategy.scope()` or a merge function, None.
  """
  return current_context().replica_context


def get_cross_replica_context():
  """The current `Strategy` when in a cross-replica context, else None.

  Returns:
    The strategy whose scope (or merge function) we are in; None inside a
    replica, and None outside any scope (the default replica context).
  """
  return current_context().cross_replica_context


def in_cross_replica_context():
  """Whether we are in a cross-replica context (a scope or a merge function)."""
  return current_context().cross_replica_context is not None

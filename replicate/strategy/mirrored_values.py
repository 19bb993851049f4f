"""`MirroredVariable`: one copy of a variable on each device of a strategy.

A `MirroredVariable` is a `values.Mirrored` whose values are resource
variables, all initialized from the first copy's initial value. Where a copy
is needed, it picks one:

* inside `StrategyExtended.update` (an `UpdateContext`): the copy on the
  device being updated;
* inside a replica of its strategy: that replica's copy;
* elsewhere (cross-replica, or no strategy): the first (primary) copy.

Every other attribute (`dtype`, `shape`, `op`, `handle`, `read_value`, ...)
is the chosen copy's, so TensorFlow code (ops, `tf.gradients`, optimizers'
`compute_gradients`) uses the local copy without knowing it is mirrored.
Assignment in cross-replica context updates every copy; inside a replica,
every copy gets the replicas' values combined by the variable's
`aggregation`, and without one it is refused (the copies would differ).
"""
import numpy as np
import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.core import reduce_util
from replicate.cross_tower import values as values_lib
from replicate.strategy import default_strategy
from replicate.strategy import distribute_context


class MirroredVariable(values_lib.Mirrored, _compat.TrackableBase):
  """A variable with one identical copy per device of a strategy.

  `tf.compat.v1.train.Saver` saves it like a plain variable (the primary
  copy's value under the primary's name) and restores every copy.
  """

  # TensorFlow's gradient and optimizer code treats objects with this
  # attribute like a resource variable, asking for `.handle` (here: the local
  # copy's), so gradients flow to the copy the replica read.
  _should_act_as_resource_variable = True

  def __init__(self, strategy, index, assign_in_replica=True):
    """Wraps the copies in `index`.

    Args:
      strategy: the `Strategy` that created the copies.
      index: a `{device: variable}` dict, the primary copy first.
      assign_in_replica: False refuses assignments inside a replica whatever
        the aggregation (`tf.compat.v1.metrics`' variables: see
        sync_on_read.py).

    Raises:
      InvalidArgumentError, InvalidTypeError: as `values.Mirrored`.
    """
    super(MirroredVariable, self).__init__(index)
    self._strategy = strategy
    self._replica_ids = {d: i for i, d in enumerate(self.devices)}
    self._assign_in_replica_allowed = assign_in_replica

  @property
  def strategy(self):
    """The strategy whose scope created this variable."""
    return self._strategy

  @property
  def primary(self):
    """The first copy."""
    return self.values[0]

  def _local_copy(self):
    """The copy the current context means (see the module docstring)."""
    device = distribute_context.get_update_device()
    if device is not None:
      return self._lookup(device)
    replica = default_strategy.get_replica_context()
    if (replica is not None and replica.strategy is self._strategy and
        default_strategy.get_strategy() is self._strategy):
      # The private id: asking the public one marks a replica function
      # that may differ per replica (mirrored_copies.py).
      return self.values[replica._replica_id_in_sync_group]  # pylint: disable=protected-access
    return self.primary

  def _copy_as_tensor(self):
    # Where a tensor is expected (device, dtype, fetching, ...): the copy the
    # context means, as everywhere else for a variable.
    return self._local_copy()

  def get(self, device=None):
    """The copy on `device`; with no device, the copy the context means.

    Args:
      device: a device string in any spelling, or None.

    Returns:
      A variable (one copy).

    Raises:
      InvalidArgumentError: if `device` holds no copy.
    """
    if device is None:
      return self._local_copy()
    return self._lookup(device)

  def __getattr__(self, name):
    # Dunders, this object's own state and the checkpointing base class's
    # lazily created `_self_*` state are never taken from a copy.
    if name.startswith('__') or name.startswith('_self_') or name in (
        '_index', '_devices', '_strategy', '_replica_ids',
        '_assign_in_replica_allowed'):
      raise AttributeError(name)
    if name == '_lazy_read':
      # What `tf.compat.v1.scatter_*` return through: they write one
      # copy's handle (TF 1.15's mirrored variables have no `_lazy_read`
      # either).
      raise AttributeError(
          "'MirroredVariable' object has no attribute '_lazy_read': "
          'tf.compat.v1.scatter_* would update one copy of {} only. Update '
          'every copy: strategy.extended.update(var, fn, args=(...)).'
          .format(self.primary.op.name))
    return getattr(self._local_copy(), name)

  @property
  def distribute_strategy(self):
    """The strategy whose scope created this variable (TF's name)."""
    return self._strategy

  def _one_copy_write(self, method):
    raise NotImplementedError(
        'MirroredVariable.{} of {} would update one copy only, and the '
        'copies would differ (TF 1.15 does not implement it either). Update '
        'every copy: strategy.extended.update(var, lambda copy, *args: '
        'copy.{}(*args), args=(...)).'.format(
            method, self.primary.op.name, method))

  def _gather_saveables_for_checkpoint(self):
    copies = self.values
    name = self.primary.op.name

    def factory(name=name):
      return _compat.make_copies_saveable(copies, name)
    return {_compat.VARIABLE_VALUE_KEY: factory}

  @property
  def name(self):
    """The primary copy's name (the name a checkpoint of one device uses)."""
    return self.primary.name

  @property
  def initializer(self):
    """One op initializing every copy."""
    return tf.group(*[v.initializer for v in self.values])

  @property
  def constraint(self):
    """The copies' constraint function (or None).

    Raises:
      ContextError: inside a replica of this variable's strategy, where only
        the update of a single copy asks for it: `tf.compat.v1` optimizers
        read it when they update a variable, and an update there would
        change only this replica's copy.
    """
    replica = default_strategy.get_replica_context()
    if (distribute_context.get_update_device() is None and
        replica is not None and replica.strategy is self._strategy):
      raise errors.ContextError(
          'A plain optimizer update (apply_gradients / minimize) of mirrored '
          'variable {} was built inside replica {}: it would change only '
          "this replica's copy and the copies would differ. Wrap the "
          'optimizer in replicate.TowerOptimizer, or call '
          'replicate.mirrored_strategy.apply_gradients_across_replicas.'
          .format(self.primary.op.name, replica._replica_id_in_sync_group))
    return self._local_copy().constraint

  def _assign(self, method, value, use_locking, name, read_value):
    if distribute_context.get_update_device() is not None:
      return getattr(self._local_copy(), method)(
          value, use_locking=use_locking, name=name, read_value=read_value)

    def update(copy, value):
      return getattr(copy, method)(value, use_locking=use_locking,
                                   read_value=read_value)
    replica = default_strategy.get_replica_context()
    if replica is not None and replica.strategy is self._strategy:
      return self._assign_in_replica(replica, method, value, update)
    return self._strategy.extended.update(self, update, args=(value,))

  def _assign_in_replica(self, replica, method, value, update):
    """Every copy gets the replicas' values combined by `aggregation`.

    One `merge_call`: SUM and MEAN reduce the replicas' values onto every
    copy's device, ONLY_FIRST_REPLICA broadcasts replica 0's; then every copy
    is updated with the result, as a cross-replica assignment would.

    Raises:
      ContextArgumentError: (a `ContextError` and the `ValueError` TF
        raises) if the variable's aggregation is NONE (each replica
        would assign its own value and the copies would differ).
      ContextError: for a variable that refuses assignments in replicas.
      InvalidArgumentError: (TF's ValueError) for aggregation SUM and the
        same nonzero Python value in every replica: no per-replica value to
        sum.
    """
    aggregation = reduce_util.as_variable_aggregation(
        self.primary.aggregation)
    where = 'MirroredVariable.{} of {} was called inside replica {} of its ' \
        'strategy'.format(method, self.primary.op.name,
                          replica._replica_id_in_sync_group)  # pylint: disable=protected-access
    if not self._assign_in_replica_allowed:
      raise errors.ContextError(
          '{}; it is a variable of tf.compat.v1.metrics, which combine their '
          "variables through tf.distribute's own replica context: build "
          'metrics outside the replicas, on the values the replicas '
          'return.'.format(where))
    if aggregation == tf.VariableAggregation.NONE:
      raise errors.ContextArgumentError(
          'You must specify an aggregation method to update a '
          'MirroredVariable in Replica Context. '  # TF 1.15's phrase
          '{}, and the variable has no aggregation: assigning one copy would '
          'make the copies differ. Create it with aggregation='
          'tf.VariableAggregation.SUM, MEAN or ONLY_FIRST_REPLICA (every '
          "copy then gets the replicas' values combined), or assign in a "
          'cross-replica context, e.g. get_replica_context().merge_call('
          'lambda strategy: strategy.extended.update(var, fn)).'.format(
              where))

    # Python data, which the merge sees as one value where every replica
    # passed the same (as TF's does).
    python_value = None if _is_graph_value(value) else value
    # Each replica's value, as a tensor of the variable's dtype on its
    # device.
    value = tf.convert_to_tensor(value, dtype=self.primary.dtype.base_dtype)

    def merge_fn(strategy, value, python_value):
      leaves = tf.nest.flatten(python_value)
      if (aggregation == tf.VariableAggregation.SUM and
          python_value is not None and not any(
              isinstance(leaf, values_lib.DistributedValues)
              for leaf in leaves) and np.any(np.asarray(leaves) != 0)):
        # The same Python value in every replica is not per-replica: TF
        # refuses to sum it (a MEAN of it is the value itself).
        raise errors.InvalidArgumentError(
            'A non-DistributedValues value {} cannot be reduced with the '
            'given reduce op ReduceOp.SUM. '  # TF's phrase
            '{}, with the same Python value in every replica, for a '
            'variable of aggregation SUM. Pass a tensor computed in the '
            'replica.'.format(python_value, where))
      if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
        first = strategy.experimental_local_results(value)[0]
        combined = strategy.extended.broadcast_to(first, self)
      else:
        combined = strategy.extended.reduce_to(aggregation, value, self)
      return strategy.extended.update(self, update, args=(combined,))
    return replica.merge_call(merge_fn, args=(value, python_value))

  def assign(self, value, use_locking=None, name=None, read_value=True):
    """Assigns `value` to every copy (cross-replica) or to the updated copy.

    Returns:
      In an `UpdateContext`, what the copy's `assign` returns. Else, as in
      TF: with `read_value`, a `Mirrored` of the new values, read once every
      copy is assigned; without, one op assigning every copy.

    Inside a replica of its strategy, every copy gets the replicas' values
    combined by the variable's `aggregation` (one `merge_call`).

    Raises:
      ContextError: inside a replica, for a variable without aggregation.
    """
    return self._assign('assign', value, use_locking, name, read_value)

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    """Adds `delta` to every copy; see `assign`.

    Raises:
      ContextError: inside a replica, for a variable without aggregation.
    """
    return self._assign('assign_add', delta, use_locking, name, read_value)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    """Subtracts `delta` from every copy; see `assign`.

    Raises:
      ContextError: inside a replica, for a variable without aggregation.
    """
    return self._assign('assign_sub', delta, use_locking, name, read_value)

  def __iter__(self):
    raise TypeError('A MirroredVariable is not iterable.')

  def __repr__(self):
    return '<MirroredVariable {} on {}>'.format(
        self.primary.name, ', '.join(self.devices))


def _convert_to_tensor(var, dtype=None, name=None, as_ref=False):
  return _compat.variable_to_tensor(var.get(), dtype=dtype, name=name,
                                    as_ref=as_ref)


tf.register_tensor_conversion_function(MirroredVariable, _convert_to_tensor)


def _is_graph_value(value):
  """Whether `value` is a tensor, variable or distributed value (not Python
  or NumPy data)."""
  return isinstance(value, (tf.Tensor, tf.Variable, tf.IndexedSlices,
                            tf1.Operation, values_lib.DistributedValues))


def _one_copy_write(name):
  def refuse(self, *args, **kwargs):
    del args, kwargs
    self._one_copy_write(name)  # pylint: disable=protected-access
  refuse.__name__ = name
  refuse.__doc__ = 'Raises NotImplementedError: it would update one copy.'
  return refuse


# Writes of a resource variable that `assign` does not cover: on a
# MirroredVariable they would reach the local copy only.
_ONE_COPY_WRITES = (
    'scatter_sub', 'scatter_add', 'scatter_max', 'scatter_min',
    'scatter_mul', 'scatter_div', 'scatter_update', 'batch_scatter_update',
    'scatter_nd_sub', 'scatter_nd_add', 'scatter_nd_update',
    'scatter_nd_max', 'scatter_nd_min', 'load', 'count_up_to')
for _name in _ONE_COPY_WRITES:
  setattr(MirroredVariable, _name, _one_copy_write(_name))


def _operator(name):
  def apply(self, *args):
    return getattr(self.get().value(), name)(*args)
  apply.__name__ = name
  return apply


for _name in values_lib.OPERATORS:
  setattr(MirroredVariable, _name, _operator(_name))
del _name

"""`SyncOnReadVariable`: per-replica copies, combined when read across replicas.

A variable created with `synchronization=tf.VariableSynchronization.ON_READ`
in a `MirroredStrategy`'s scope (batch normalization's moving mean and
variance are, with `aggregation=MEAN`) gets one copy per device, like a
mirrored variable, but its copies are not kept equal:

* Inside a replica, reads and assignments use that replica's copy: each
  replica's batch statistics update its own moving averages, with no
  traffic between devices.
* In the strategy's cross-replica context, `read_value()`, conversion to
  a tensor, Python operators and fetching the variable combine the copies
  by the variable's `aggregation`: SUM adds them, MEAN averages them,
  ONLY_FIRST_REPLICA takes the primary (NONE cannot be combined:
  `InvalidArgumentError`). Outside the strategy's scope conversion,
  operators and fetching give the primary copy, and `read_value()` still
  combines; `value()` is the copy nearest the context (the replica's, the
  current device's, else the primary), all as in TF 1.15. `assign`
  sets every copy, to value / n under SUM so that the copies add up to the
  value; `assign_add` / `assign_sub` change every copy, and are refused
  under SUM (the sum would change n times over). They return the combined
  new value (TF 1.15 returns the op, which `read_value=False` gives here,
  and NONE always: code that expects an assignment's value, such as Keras'
  batch normalization built in cross-replica context, gets one).
* `tf.compat.v1.train.Saver` saves the combined value under the primary's
  name, as one device names the variable, and restores it as `assign` does.

Fetch `read_value()` for the combined value wherever the fetch is built.

`tf.compat.v1.metrics` also make ON_READ (SUM) variables, but combine them
through `tf.distribute`'s own replica context, which this library's replicas
are not: `MirroredStrategy` keeps metric variables mirrored (build metrics
outside the replicas), so a metric never reads one replica's partial count.
"""
import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import reduce_util
from replicate.cross_tower import values as values_lib
from replicate.strategy import default_strategy
from replicate.strategy import distribute_context
from replicate.strategy.mirrored_values import MirroredVariable


class SyncOnReadVariable(MirroredVariable):
  """One copy per device; a replica uses its own, cross-replica reads combine.

  See the module docstring.
  """

  def __init__(self, strategy, index, aggregation):
    """Wraps the copies in `index`.

    Args:
      strategy: the `Strategy` that created the copies.
      index: a `{device: variable}` dict, the primary copy first.
      aggregation: a `tf.VariableAggregation`: how a cross-replica read
        combines the copies.

    Raises:
      InvalidTypeError: if `aggregation` is not a `tf.VariableAggregation`;
        as `values.Mirrored` for a bad `index`.
      InvalidArgumentError: as `values.Mirrored` for a bad `index`.
    """
    self._aggregation = reduce_util.as_variable_aggregation(aggregation)
    super(SyncOnReadVariable, self).__init__(strategy, index)

  @property
  def aggregation(self):
    """How cross-replica reads combine the copies."""
    return self._aggregation

  def _uses_one_copy(self):
    """Whether the context means one copy: an update, or a replica."""
    if distribute_context.get_update_device() is not None:
      return True
    replica = default_strategy.get_replica_context()
    return (replica is not None and replica.strategy is self._strategy and
            default_strategy.get_strategy() is self._strategy)

  def _combined(self):
    """The copies combined by `aggregation`, on the primary's device.

    Raises:
      InvalidArgumentError: if the aggregation is NONE, or MEAN of a
        non-floating dtype.
    """
    name = self.primary.op.name
    if self._aggregation == tf.VariableAggregation.NONE:
      raise errors.InvalidArgumentError(
          'Could not convert from `tf.VariableAggregation` '
          'VariableAggregation.NONE to`tf.distribute.ReduceOp` type. '  # TF
          'ON_READ variable {} has aggregation NONE, so its per-replica '
          'copies cannot be combined when it is read (or saved) across '
          'replicas. Create it with aggregation=tf.VariableAggregation.SUM, '
          'MEAN or ONLY_FIRST_REPLICA.'.format(name))
    if self._aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
      return self.primary.read_value()
    dtype = self.primary.dtype.base_dtype
    if self._aggregation == tf.VariableAggregation.MEAN and not (
        dtype.is_floating or dtype.is_complex):
      raise errors.InvalidArgumentError(
          'ON_READ variable {} of dtype {} has aggregation MEAN, which needs '
          'a floating-point dtype; use SUM or ONLY_FIRST_REPLICA.'.format(
              name, dtype.name))
    reads = []
    # Each copy is read on its device, whatever colocation the caller asked
    # for (e.g. Keras' `colocate_with(variable)`: the primary).
    with tf1.get_default_graph().colocate_with(None, ignore_existing=True):
      for copy in self.values:
        with tf.device(copy.device):
          reads.append(copy.read_value())
      with tf.device(self.primary.device):
        total = tf.math.add_n(reads)
        if self._aggregation == tf.VariableAggregation.MEAN:
          total = total / tf.constant(len(reads), dtype=dtype)
        return total

  def _in_scope(self):
    return default_strategy.get_strategy() is self._strategy

  def _context_copy_or_combined(self):
    """What a tensor of the variable is here (TF's `get()`): the copy of the
    replica or update, the primary outside the strategy's scope, else the
    combined value."""
    if self._uses_one_copy():
      return self._local_copy()
    if not self._in_scope():
      return self.primary
    return self._combined()

  def _as_graph_element(self):
    value = self._context_copy_or_combined()
    if isinstance(value, tf.Tensor):
      return value
    return value._as_graph_element()  # pylint: disable=protected-access

  def value(self):
    """The value of the copy nearest the context (as TF 1.15): the
    replica's or update's, else the one on the current device, else the
    primary. `read_value()` combines them."""
    if self._uses_one_copy():
      return self._local_copy().value()
    device = _compat.current_device()
    if device and device_util.canonicalize(device) in self.devices:
      return self.get(device).value()
    return self.primary.value()

  def read_value(self):
    """As `value()`, read now (after the control dependencies in scope).

    Raises:
      InvalidArgumentError: across replicas, as `_combined`.
    """
    if self._uses_one_copy():
      return self._local_copy().read_value()
    return self._combined()  # Fresh reads of every copy.

  def _assign(self, method, value, use_locking, name, read_value):
    if self._uses_one_copy():
      return getattr(self._local_copy(), method)(
          value, use_locking=use_locking, name=name, read_value=read_value)
    if (self._aggregation == tf.VariableAggregation.SUM and
        method != 'assign'):
      raise errors.InvalidArgumentError(
          'SyncOnReadVariable.{} of {} outside the replicas is refused: its '
          'aggregation is SUM, and changing every copy would change the sum '
          '{} times over. Assign the new total with assign().'.format(
              method, self.primary.op.name, len(self.values)))
    if (self._aggregation == tf.VariableAggregation.SUM and
        method == 'assign'):
      dtype = self.primary.dtype.base_dtype
      value = tf.cast(tf.convert_to_tensor(value, dtype=dtype) /
                      len(self.values), dtype)
    updates = []
    with tf1.get_default_graph().colocate_with(None, ignore_existing=True):
      for copy in self.values:
        with tf.device(copy.device):
          updates.append(getattr(copy, method)(
              value, use_locking=use_locking, read_value=False))
    # Without an aggregation there is no combined value to read back: the
    # op, as TF returns.
    read_value = read_value and (
        self._aggregation != tf.VariableAggregation.NONE)
    group = tf.group(*updates, name=None if read_value else name)
    if not read_value:
      return group
    with tf.control_dependencies([group]):
      return tf.identity(self._combined(), name=name)

  def _gather_saveables_for_checkpoint(self):
    name = self.primary.op.name
    primary = self.primary

    def factory(name=name):
      return _compat.make_saveable(
          name, primary, primary.dtype.base_dtype, primary.device,
          read_fn=self._combined,
          restore_fn=lambda value: self._assign('assign', value, None, None,
                                                False))
    return {_compat.VARIABLE_VALUE_KEY: factory}

  def __repr__(self):
    return '<SyncOnReadVariable {} on {} (aggregation {})>'.format(
        self.primary.name, ', '.join(self.devices), self._aggregation.name)


def _convert_to_tensor(var, dtype=None, name=None, as_ref=False):
  # pylint: disable=protected-access
  value = var.get() if as_ref else var._context_copy_or_combined()
  if not isinstance(value, tf.Tensor):
    return _compat.variable_to_tensor(value, dtype=dtype, name=name,
                                      as_ref=as_ref)
  if dtype is not None and not dtype.is_compatible_with(value.dtype):
    raise errors.InvalidTypeError(
        'Cannot convert ON_READ variable {} of dtype {} to dtype {}.'.format(
            var.primary.op.name, value.dtype.name, tf.as_dtype(dtype).name))
  return value


# Before MirroredVariable's (priority 100), which would match it too.
tf.register_tensor_conversion_function(SyncOnReadVariable, _convert_to_tensor,
                                       priority=99)


def _operator(name):
  def apply(self, *args):
    return getattr(_convert_to_tensor(self), name)(*args)
  apply.__name__ = name
  return apply


for _name in values_lib.OPERATORS:
  setattr(SyncOnReadVariable, _name, _operator(_name))
del _name

"""`StrategyExtended`: the device-level half of a strategy.

The public methods check the context (most need a cross-replica context, or
no strategy at all: context_rules.py) and their arguments, then call the
private `_method` a subclass implements.
"""
import contextlib
import copy

from replicate import errors
from replicate._compat import tf1
from replicate.core import reduce_util
from replicate.core.checks import check_int
from replicate.cross_tower import values as values_lib
from replicate.strategy import context_rules
from replicate.strategy import distribute_context
from replicate.strategy import input_lib
from replicate.strategy.context_rules import (
  require_cross_replica_or_default_context,
)


class StrategyExtended(object):
  """The device-level half of a strategy (`strategy.extended`).

  Public methods check the context and arguments; subclasses implement the
  private `_method`s.
  """

  def __init__(self, container_strategy):
    """Builds the object for `container_strategy` (the `Strategy`)."""
    self._container_strategy_ref = container_strategy

  def _container_strategy(self):
    return self._container_strategy_ref

  # Scope and variables.

  @contextlib.contextmanager
  def _scope(self, strategy):
    """Pushes the cross-replica context of `strategy` (see `Strategy.scope`)."""
    context = distribute_context.innermost()
    if context is not None and context.cross_replica_context is strategy:
      yield strategy  # Entering the scope again: nothing more to push.
      return
    if (context is not None and
        not context.strategy.extended._is_default_strategy()):  # pylint: disable=protected-access
      if context.strategy is not strategy:
        raise context_rules.wrong_strategy_error(strategy, context)
      raise errors.ContextError(
          'Method requires being in cross-replica context, use '
          'get_replica_context().merge_call(). '  # TF's phrase
          'Strategy.scope() was entered inside a replica (replica {}) of the '
          'same strategy (directly, or by run, experimental_run_v2 or '
          'call_for_each_replica, which enter it); scopes are cross-replica. '
          'Enter the scope and run the replicas from outside the replica '
          'function, not inside it.'.format(
              context.replica_context._replica_id_in_sync_group))
    with distribute_context.push_cross_replica(strategy):
      with self._scope_extras():
        yield strategy  # `with strategy.scope() as s` gives it, as in TF.

  def _is_default_strategy(self):
    """Whether this is the default strategy (one replica, no distribution)."""
    return False

  def _scope_extras(self):
    """What a subclass enters inside its scope (e.g. a variable creator)."""
    return null_context()

  def colocate_vars_with(self, colocate_with_variable):
    """A scope in which new variables are placed like `colocate_with_variable`.

    Args:
      colocate_with_variable: a variable created in this strategy's scope.

    Returns:
      A context manager.

    Raises:
      ContextError: inside a replica.
    """
    require_cross_replica_or_default_context(self, 'colocate_vars_with')
    return self._colocate_vars_with(colocate_with_variable)

  def variable_created_in_scope(self, v):
    """Whether variable `v` was created while this strategy's scope was active.

    Args:
      v: a variable.

    Returns:
      A bool.
    """
    return self._variable_created_in_scope(v)

  def read_var(self, v):
    """A tensor with the value of variable `v` (cross-replica).

    Args:
      v: a variable of this strategy.

    Returns:
      A tensor.

    Raises:
      ContextError: inside a replica.
    """
    require_cross_replica_or_default_context(self, 'read_var')
    return self._read_var(v)

  def broadcast_to(self, tensor, destinations):
    """Copies `tensor` onto `destinations` (devices, a variable, ...).

    Args:
      tensor: a tensor.
      destinations: where the copies go.

    Returns:
      A mirrored value (the tensor itself for the default strategy).

    Raises:
      ContextError: inside a replica.
      InvalidArgumentError: for empty destinations.
    """
    require_cross_replica_or_default_context(self, 'broadcast_to')
    _check_destinations(destinations)
    return self._broadcast_to(tensor, destinations)

  def call_for_each_replica(self, fn, args=(), kwargs=None):
    """Runs `fn(*args, **kwargs)` once per replica, each in its replica context.

    `PerReplica` leaves of `args` / `kwargs` are split: replica i gets its own
    component. Inside `fn`, `get_replica_context().merge_call` synchronizes the
    replicas.

    Args:
      fn: the function to replicate.
      args: positional arguments.
      kwargs: keyword arguments.

    Returns:
      What `fn` returned, with per-replica leaves (a plain value with one
      replica).

    Raises:
      ContextError: inside a replica, or if replicas call `merge_call` a
        different number of times.
      InvalidTypeError: if `fn` is not callable.
      Any exception `fn` raises on a replica.
    """
    require_cross_replica_or_default_context(self, 'call_for_each_replica')
    if not callable(fn):
      raise errors.InvalidTypeError(
          'call_for_each_replica needs a callable, got {!r}.'.format(fn))
    if kwargs is None:
      kwargs = {}
    with self._container_strategy().scope():
      return self._call_for_each_replica(fn, tuple(args), dict(kwargs))

  def reduce_to(self, reduce_op, value, destinations):
    """Reduces a per-replica `value` and puts the result on `destinations`.

    Args:
      reduce_op: `ReduceOp.SUM` / `MEAN` (or `tf.VariableAggregation`).
      value: a per-replica value (or a single tensor).
      destinations: devices, a variable or a distributed value.

    Returns:
      A mirrored value on the destinations (the value itself for the default
      strategy).

    Raises:
      ContextError: inside a replica.
      InvalidArgumentError: for another reduce op or empty destinations.
    """
    require_cross_replica_or_default_context(self, 'reduce_to')
    reduce_op = reduce_util.as_strategy_reduce_op(reduce_op)
    _check_destinations(destinations)
    return self._reduce_to(reduce_op, value, destinations)

  def batch_reduce_to(self, reduce_op, value_destination_pairs):
    """`reduce_to` for several `(value, destinations)` pairs at once.

    Args:
      reduce_op: as in `reduce_to`.
      value_destination_pairs: a list of `(value, destinations)` pairs.

    Returns:
      A list of reduced values, in order.

    Raises:
      ContextError: inside a replica.
      InvalidArgumentError: for another reduce op or empty destinations.
      InvalidArgumentTypeError: (TF's ValueError, and a TypeError) if the
        pairs are not a list of pairs.
    """
    require_cross_replica_or_default_context(self, 'batch_reduce_to')
    reduce_op = reduce_util.as_strategy_reduce_op(reduce_op)
    if not isinstance(value_destination_pairs, (list, tuple)) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2
        for p in value_destination_pairs):
      raise errors.InvalidArgumentTypeError(
          'Each element of `value_destination_pairs` should be a tuple. '
          'batch_reduce_to needs a list of (value, destinations) pairs, got '
          '{!r}.'.format(value_destination_pairs))
    for _, destinations in value_destination_pairs:
      _check_destinations(destinations)
    return self._batch_reduce_to(reduce_op, list(value_destination_pairs))

  def update(self, var, fn, args=(), kwargs=None, group=True):
    """Runs `fn(copy, *args, **kwargs)` on every copy of `var`.

    Each call runs on the copy's device, inside an `UpdateContext` for it;
    distributed leaves of `args` / `kwargs` give the component on that
    device.

    Args:
      var: a variable of this strategy (a mirrored variable updates every
        copy).
      fn: the update function.
      args: positional arguments.
      kwargs: keyword arguments.
      group: True to return, per leaf of `fn`'s result, one op running all
        copies' updates (where `fn` returns ops) or a `Mirrored` of their
        values read after all of them (where it returns tensors, e.g. an
        `assign` that reads its value), as TF does; False to return, per
        leaf, the tuple of results.

    Returns:
      See `group`.

    Raises:
      ContextError: inside a replica.
      InvalidTypeError: if `fn` is not callable.
    """
    require_cross_replica_or_default_context(self, 'update')
    if not callable(fn):
      raise errors.InvalidTypeError(
          'update needs a callable, got {!r}.'.format(fn))
    return self._update(var, fn, tuple(args), dict(kwargs or {}), group)

  def update_non_slot(self, colocate_with, fn, args=(), kwargs=None,
                      group=True):
    """Runs `fn(*args, **kwargs)` once per non-slot device.

    Args:
      colocate_with: what `non_slot_devices(var_list)` returned.
      fn: the update function.
      args: positional arguments.
      kwargs: keyword arguments.
      group: as in `update`.

    Returns:
      As in `update`.

    Raises:
      ContextError: inside a replica.
      InvalidTypeError: if `fn` is not callable.
    """
    require_cross_replica_or_default_context(self, 'update_non_slot')
    if not callable(fn):
      raise errors.InvalidTypeError(
          'update_non_slot needs a callable, got {!r}.'.format(fn))
    return self._update_non_slot(colocate_with, fn, tuple(args),
                                 dict(kwargs or {}), group)

  def value_container(self, value):
    """The distributed variable `value` (a per-device copy) belongs to.

    Args:
      value: a component (e.g. the copy an update function received).

    Returns:
      Its container, or `value` itself if it has none.
    """
    return self._value_container(value)

  def non_slot_devices(self, var_list):
    """Where state not tied to one variable (e.g. Adam's beta powers) goes.

    Args:
      var_list: the model variables.

    Returns:
      Something to pass as `colocate_with` to `update_non_slot`.
    """
    return self._non_slot_devices(var_list)

  @property
  def worker_devices(self):
    """The devices replicas run on, one per replica, as a tuple."""
    return self._worker_devices()

  @property
  def worker_devices_by_replica(self):
    """For each replica, the list of devices it runs on (one each here)."""
    return [[device] for device in self.worker_devices]

  @property
  def parameter_devices(self):
    """The devices variables are stored on, as a tuple."""
    return self._parameter_devices()

  def experimental_run_steps_on_iterator(self, fn, iterator, iterations=1,
                                         initial_loop_values=None):
    """Runs `fn(context, inputs)` for `iterations` steps in one graph loop.

    Args:
      fn: called once per step in a cross-replica context with a
        `MultiStepContext` and the next per-replica inputs; it usually calls
        `call_for_each_replica` and records outputs with
        `context.set_last_step_output`.
      iterator: from `make_dataset_iterator` or `make_input_fn_iterator`.
      iterations: how many steps each run of the returned op takes.
      initial_loop_values: a dict name -> tensor of initial loop outputs.

    Returns:
      The `MultiStepContext`; its `run_op` runs all steps and its
      `last_step_outputs` are the outputs of the last step.

    Raises:
      ContextError: inside a replica.
      InvalidArgumentError: if `iterations` is not a positive integer.
    """
    require_cross_replica_or_default_context(
        self, 'experimental_run_steps_on_iterator')
    check_int('iterations', iterations, 1)
    with self._container_strategy().scope():
      return input_lib.run_steps_on_iterator(
          self._container_strategy(), fn, iterator, iterations,
          initial_loop_values)

  @property
  def experimental_require_static_shapes(self):
    """Whether the strategy needs static shapes (False: no TPU here)."""
    return False

  def experimental_make_numpy_dataset(self, numpy_input, session=None):
    """An unbatched `tf.data.Dataset` of the rows of NumPy arrays.

    `session`, if given, loads the arrays through variables initialized in
    it instead of embedding constants. Raises `InvalidArgumentError` if the
    arrays have different lengths.
    """
    return input_lib.numpy_dataset(numpy_input, session)

  @property
  def experimental_between_graph(self):
    """Whether each worker builds its own graph (False for local strategies)."""
    return False

  @property
  def experimental_should_init(self):
    """Whether this task should run variable initialization."""
    return True

  @property
  def should_checkpoint(self):
    """Whether this task should save checkpoints."""
    return True

  @property
  def should_save_summary(self):
    """Whether this task should write summaries."""
    return True

  # To implement in subclasses.

  @property
  def _num_replicas_in_sync(self):
    raise NotImplementedError('Subclasses give the replica count.')

  def _local_results(self, value):
    if isinstance(value, values_lib.DistributedValues):
      return value.values
    return (value,)

  def _configure(self, session_config, cluster_spec, task_type, task_id):
    del session_config  # A local strategy has nothing to derive from it.
    if cluster_spec is not None or task_type is not None or task_id is not None:
      raise errors.InvalidArgumentError(
          '{} runs on local devices only; it cannot be configured for a '
          'cluster (cluster_spec={!r}, task_type={!r}, task_id={!r}). Leave '
          'those arguments out.'.format(
              type(self._container_strategy()).__name__, cluster_spec,
              task_type, task_id))

  def _update_config_proto(self, config_proto):
    result = tf1.ConfigProto()
    result.CopyFrom(config_proto)
    return result

  def __deepcopy__(self, memo):
    result = type(self).__new__(type(self))
    memo[id(self)] = result
    for key, value in self.__dict__.items():
      if key in self._NOT_DEEPCOPIED:
        value = type(value)()
      else:
        value = copy.deepcopy(value, memo)
      setattr(result, key, value)
    return result

  # Per-graph bookkeeping a copy starts without (see subclasses).
  _NOT_DEEPCOPIED = ()



def _check_destinations(destinations):
  if destinations is None or (
      isinstance(destinations, (str, list, tuple)) and
      not destinations):
    raise errors.InvalidArgumentError(
        'destinations is {!r}; name at least one device (a device string, a '
        'list of them, a variable or a distributed value).'.format(
            destinations))


@contextlib.contextmanager
def null_context():
  yield

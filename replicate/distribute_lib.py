"""Strategy, StrategyExtended and ReplicaContext: code written once, run on N devices.

Library code asks `get_replica_context()` / `get_strategy()` what it runs in
and uses the methods here; with no strategy it gets the default one (one
replica, identity reductions) and runs unchanged.

Two kinds of context:

* replica context: inside `call_for_each_replica`, one per replica. Values are
  this replica's. `ReplicaContext.merge_call` hops to the cross-replica context.
* cross-replica context: inside `Strategy.scope()` and inside merge functions.
  Values may be per-replica (`PerReplica`) or mirrored, and `reduce_to`,
  `batch_reduce_to`, `update` combine or update them.

The context stack is `replicate.distribute_context`, this library's own.
"""
import contextlib
import copy
import enum

import six
import tensorflow as tf

from replicate import distribute_context
from replicate import errors
from replicate import input_lib
from replicate import reduce_util
from replicate import values as values_lib
from replicate._compat import tf1
from replicate.distribute_context import get_cross_replica_context
from replicate.distribute_context import get_replica_context
from replicate.distribute_context import get_strategy
from replicate.distribute_context import get_update_device
from replicate.distribute_context import in_cross_replica_context
from replicate.distribute_context import UpdateContext
from replicate.reduce_util import ReduceOp

__all__ = [
    'ReduceOp', 'InputReplicationMode', 'InputContext', 'UpdateContext',
    'get_update_device', 'Strategy', 'DistributionStrategy',
    'StrategyExtended', 'DistributionStrategyExtended', 'ReplicaContext',
    'get_strategy', 'has_strategy', 'get_replica_context',
    'get_cross_replica_context', 'in_cross_replica_context',
]


class InputReplicationMode(enum.Enum):
  """How `make_input_fn_iterator` replicates the input pipeline.

  * `PER_WORKER`: `input_fn` is called once per worker; each of that worker's
    replicas takes successive elements of the dataset it returns.
  """
  PER_WORKER = 'PER_WORKER'


def _check_int(name, value, minimum):
  if not isinstance(value, six.integer_types) or isinstance(value, bool):
    raise errors.InvalidTypeError('{} must be an integer, got {!r}.'.format(
        name, value))
  if value < minimum:
    raise errors.InvalidArgumentError(
        '{} must be at least {}, got {}.'.format(name, minimum, value))


class InputContext(object):
  """What an `input_fn` needs to know to build its share of the input.

  Passed to the `input_fn` of `Strategy.make_input_fn_iterator`.
  """

  def __init__(self, num_input_pipelines=1, input_pipeline_id=0,
               num_replicas_in_sync=1):
    """Describes one input pipeline among several.

    Args:
      num_input_pipelines: how many pipelines there are (one per worker).
      input_pipeline_id: which one this is, in `[0, num_input_pipelines)`.
      num_replicas_in_sync: how many replicas train in sync (over all
        pipelines).

    Raises:
      InvalidTypeError: if an argument is not an integer.
      InvalidArgumentError: if a count is below 1 or the id is out of range.
    """
    _check_int('num_input_pipelines', num_input_pipelines, 1)
    _check_int('input_pipeline_id', input_pipeline_id, 0)
    _check_int('num_replicas_in_sync', num_replicas_in_sync, 1)
    if input_pipeline_id >= num_input_pipelines:
      raise errors.InvalidArgumentError(
          'input_pipeline_id {} is out of range for {} input pipelines; it '
          'must be in [0, {}).'.format(input_pipeline_id, num_input_pipelines,
                                       num_input_pipelines))
    self._num_input_pipelines = num_input_pipelines
    self._input_pipeline_id = input_pipeline_id
    self._num_replicas_in_sync = num_replicas_in_sync

  @property
  def num_input_pipelines(self):
    """How many input pipelines there are."""
    return self._num_input_pipelines

  @property
  def input_pipeline_id(self):
    """This pipeline's id, in `[0, num_input_pipelines)`."""
    return self._input_pipeline_id

  @property
  def num_replicas_in_sync(self):
    """How many replicas train in sync."""
    return self._num_replicas_in_sync

  def get_per_replica_batch_size(self, global_batch_size):
    """The batch size of each replica, for a global batch of `global_batch_size`.

    Args:
      global_batch_size: the batch size summed over all replicas.

    Returns:
      `global_batch_size // num_replicas_in_sync`.

    Raises:
      InvalidArgumentError (a ValueError): if the global batch size is not
        divisible by the number of replicas.
    """
    if global_batch_size % self._num_replicas_in_sync:
      raise errors.InvalidArgumentError(
          'The global batch size ({}) is not divisible by the number of '
          'replicas in sync ({}); use a global batch size that is a multiple '
          'of {}.'.format(global_batch_size, self._num_replicas_in_sync,
                          self._num_replicas_in_sync))
    return global_batch_size // self._num_replicas_in_sync

  def __repr__(self):
    return ('InputContext(num_input_pipelines={}, input_pipeline_id={}, '
            'num_replicas_in_sync={})'.format(
                self._num_input_pipelines, self._input_pipeline_id,
                self._num_replicas_in_sync))


# --- Context rules ------------------------------------------------------------


def has_strategy():
  """Whether a strategy other than the default one is current."""
  return get_strategy() is not _get_default_strategy()


def _wrong_strategy_error(strategy, context):
  return errors.ContextError(
      'Mixing different strategies: {} was used inside the {} of another '
      'strategy, {}. Use one strategy at a time: leave the other scope first.'
      .format(_describe(strategy), _describe_context(context),
              _describe(context.strategy)))


def _describe(strategy):
  return '{} (id {:#x})'.format(type(strategy).__name__, id(strategy))


def _describe_context(context):
  if context.replica_context is not None:
    return 'replica context'
  return 'scope'


def require_cross_replica_or_default_context(extended, method):
  """Raises unless `method` of `extended` may run in the current context.

  Allowed: the cross-replica context of this strategy, or no strategy at all
  (the default replica context).

  Args:
    extended: a `StrategyExtended`.
    method: the method's name, for the message.

  Raises:
    ContextError: in a replica context of this strategy, or in any context of
      another strategy.
  """
  context = distribute_context.current_context()
  strategy = extended._container_strategy()  # pylint: disable=protected-access
  if context.cross_replica_context is strategy:
    return
  if distribute_context.is_default_context(context):
    return
  if context.strategy is not strategy:
    raise _wrong_strategy_error(strategy, context)
  raise errors.ContextError(
      '{} must be called in a cross-replica context, but was called inside a '
      'replica (replica {}). Call it from a merge function: '
      'get_replica_context().merge_call(fn) runs fn(strategy, ...) in the '
      'cross-replica context.'.format(
          method, context.replica_context.replica_id_in_sync_group))


def require_replica_context(replica_context, method):
  """Raises unless `replica_context` is the current context.

  Args:
    replica_context: a `ReplicaContext`.
    method: the method's name, for the message.

  Raises:
    ContextError: in a cross-replica context, or in another replica's context.
  """
  context = distribute_context.current_context()
  if context.replica_context is replica_context:
    return
  if context.replica_context is None:
    raise errors.ContextError(
        'ReplicaContext.{} must be called in its replica context, but was '
        'called in a cross-replica context (a strategy scope or a merge '
        'function). Call it from the function given to '
        'call_for_each_replica.'.format(method))
  raise errors.ContextError(
      'ReplicaContext.{} was called on a replica context that is not the '
      'current one (current: replica {} of {}, called on: replica {} of {}). '
      'Use get_replica_context() for the current one.'.format(
          method, context.replica_context.replica_id_in_sync_group,
          _describe(context.strategy),
          replica_context.replica_id_in_sync_group,
          _describe(replica_context.strategy)))


# --- Strategy -------------------------------------------------------------------


class Strategy(object):
  """A way to run a computation on several devices (or one).

  The user-facing half; device-level methods are on `strategy.extended`.
  """

  def __init__(self, extended):
    """Wraps `extended`, the `StrategyExtended` doing the work."""
    self._extended = extended

  @property
  def extended(self):
    """The `StrategyExtended` with the device-level methods."""
    return self._extended

  def scope(self):
    """A context manager making this the current strategy (cross-replica).

    Variables created in the scope are created the strategy's way (mirrored,
    for `MirroredStrategy`). Re-entering the scope of the same strategy is
    allowed.

    Returns:
      A context manager.

    Raises:
      ContextError: (on entering) inside a scope or replica of another
        strategy, or inside a replica of this strategy.
    """
    return self._extended._scope(self)  # pylint: disable=protected-access

  @property
  def num_replicas_in_sync(self):
    """How many replicas run in sync."""
    return self._extended._num_replicas_in_sync  # pylint: disable=protected-access

  def make_dataset_iterator(self, dataset):
    """An iterator giving each replica its slice of each global batch.

    Args:
      dataset: a `tf.data.Dataset` of global batches (dimension 0 is
        divisible by `num_replicas_in_sync`).

    Returns:
      An iterator with `initialize()` (a list of ops to run first) and
      `get_next()` (per-replica values).

    Raises:
      InvalidTypeError: if `dataset` is not a dataset.
    """
    return self._extended._make_dataset_iterator(dataset)  # pylint: disable=protected-access

  def make_input_fn_iterator(self, input_fn,
                             replication_mode=InputReplicationMode.PER_WORKER):
    """An iterator over datasets made by `input_fn(InputContext)`.

    `input_fn` returns a dataset of per-replica batches (use
    `InputContext.get_per_replica_batch_size`); replicas take successive
    elements.

    Args:
      input_fn: a callable taking an `InputContext`, returning a dataset.
      replication_mode: `InputReplicationMode.PER_WORKER`.

    Returns:
      An iterator as in `make_dataset_iterator`.

    Raises:
      InvalidArgumentError: for another replication mode.
      InvalidTypeError: if `input_fn` is not callable or does not return a
        dataset.
    """
    if replication_mode is not InputReplicationMode.PER_WORKER:
      raise errors.InvalidArgumentError(
          'replication_mode must be InputReplicationMode.PER_WORKER (the only '
          'mode supported), got {!r}.'.format(replication_mode))
    if not callable(input_fn):
      raise errors.InvalidTypeError(
          'input_fn must be a callable taking an InputContext, got {!r}.'
          .format(input_fn))
    return self._extended._make_input_fn_iterator(input_fn)  # pylint: disable=protected-access

  def experimental_make_numpy_iterator(self, numpy_input, batch_size,
                                       num_epochs=1, shuffle=1024,
                                       session=None):
    """An iterator over global batches of in-memory NumPy data.

    Args:
      numpy_input: a nest of NumPy arrays with one first dimension.
      batch_size: the global batch size (divisible by the replica count);
        an incomplete last batch is dropped.
      num_epochs: how many passes over the data (None: forever).
      shuffle: shuffle buffer size; None or 0 for no shuffling.
      session: optional `tf.Session`. When given, the arrays are loaded into
        the graph through variables initialized in that session (instead of
        being embedded as constants).

    Returns:
      An iterator as in `make_dataset_iterator`.

    Raises:
      InvalidArgumentError: if `batch_size` is not a positive multiple of the
        number of replicas, or the arrays have different lengths.
    """
    _check_int('batch_size', batch_size, 1)
    InputContext(num_replicas_in_sync=self.num_replicas_in_sync
                ).get_per_replica_batch_size(batch_size)
    dataset = input_lib.numpy_dataset(numpy_input, session)
    if shuffle:
      dataset = dataset.shuffle(shuffle)
    dataset = dataset.repeat(num_epochs)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    return self.make_dataset_iterator(dataset)

  def experimental_run(self, fn, input_iterator=None):
    """Runs `fn(inputs)` on each replica with its share of the next batch.

    Args:
      fn: the function to replicate.
      input_iterator: an iterator from `make_dataset_iterator` or
        `make_input_fn_iterator`; None calls `fn()` without inputs.

    Returns:
      What `fn` returned, with per-replica leaves (`PerReplica`).

    Raises:
      ContextError: as `call_for_each_replica`.
    """
    with self.scope():
      args = (input_iterator.get_next(),) if input_iterator is not None else ()
      return self._extended.call_for_each_replica(fn, args=args)

  def experimental_run_v2(self, fn, args=(), kwargs=None):
    """Runs `fn(*args, **kwargs)` on each replica.

    Args:
      fn: the function to replicate.
      args: positional arguments; `PerReplica` leaves are split by replica.
      kwargs: keyword arguments, likewise.

    Returns:
      What `fn` returned, with per-replica leaves.

    Raises:
      ContextError: as `call_for_each_replica`.
    """
    with self.scope():
      return self._extended.call_for_each_replica(fn, args=args, kwargs=kwargs)

  def reduce(self, reduce_op, value):
    """Reduces a per-replica `value` to one tensor (on the host).

    Args:
      reduce_op: `ReduceOp.SUM` / `MEAN` (or `tf.VariableAggregation`).
      value: a per-replica value (e.g. from `experimental_run`), or a single
        tensor (MEAN gives it back; SUM needs one replica).

    Returns:
      A tensor.

    Raises:
      ContextError: inside a replica.
      InvalidArgumentError: for another reduce op, or SUM of a plain value
        over several replicas.
    """
    require_cross_replica_or_default_context(self._extended, 'reduce')
    reduce_op = reduce_util.as_reduce_op(reduce_op)
    return self._extended._reduce(reduce_op, value)  # pylint: disable=protected-access

  def unwrap(self, value):
    """The per-replica components of `value`, as a tuple.

    Args:
      value: a `PerReplica` / `Mirrored` value (or mirrored variable), or a
        plain value.

    Returns:
      The components in replica order; `(value,)` for a plain value.
    """
    return self._extended._local_results(value)  # pylint: disable=protected-access

  def experimental_local_results(self, value):
    """Same as `unwrap`."""
    return self.unwrap(value)

  def group(self, value, name=None):
    """One op running every component of every leaf of `value`.

    Args:
      value: a nest of per-replica values, tensors or ops.
      name: the name of the grouping op.

    Returns:
      A `tf.Operation`.
    """
    components = []
    for leaf in tf.nest.flatten(value):
      components.extend(c for c in self.unwrap(leaf) if c is not None)
    return tf.group(*components, name=name)

  def configure(self, session_config=None, cluster_spec=None, task_type=None,
                task_id=None):
    """Configures the strategy for a session config and cluster.

    Args:
      session_config: a `ConfigProto` the sessions will use.
      cluster_spec: the cluster (multi-worker strategies only).
      task_type: this task's job name (multi-worker strategies only).
      task_id: this task's index (multi-worker strategies only).

    Raises:
      InvalidArgumentError: for cluster arguments given to a local strategy.
    """
    self._extended._configure(session_config, cluster_spec, task_type,  # pylint: disable=protected-access
                              task_id)

  def update_config_proto(self, config_proto):
    """A copy of `config_proto` with what this strategy needs set.

    Args:
      config_proto: a `tf.compat.v1.ConfigProto`.

    Returns:
      A new `ConfigProto`; the argument is not modified.

    Raises:
      InvalidTypeError: if `config_proto` is not a `ConfigProto`.
    """
    if not isinstance(config_proto, tf1.ConfigProto):
      raise errors.InvalidTypeError(
          'update_config_proto needs a tf.compat.v1.ConfigProto, got {!r}.'
          .format(config_proto))
    return self._extended._update_config_proto(config_proto)  # pylint: disable=protected-access

  def __copy__(self):
    raise errors.ContextError(
        'A {} cannot be shallow-copied: the copy would share its extended '
        'state with the original. Use copy.deepcopy(strategy).'.format(
            type(self).__name__))

  def __deepcopy__(self, memo):
    result = type(self).__new__(type(self))
    memo[id(self)] = result
    for key, value in self.__dict__.items():
      setattr(result, key, copy.deepcopy(value, memo))
    return result


DistributionStrategy = Strategy


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
    context = distribute_context.current_context()
    if context.cross_replica_context is strategy:
      yield  # Entering the scope again: nothing more to push.
      return
    if context.strategy is not _get_default_strategy():
      if context.strategy is not strategy:
        raise _wrong_strategy_error(strategy, context)
      raise errors.ContextError(
          'Strategy.scope() was entered inside a replica (replica {}) of the '
          'same strategy; scopes are cross-replica. Enter the scope before '
          'call_for_each_replica, not inside it.'.format(
              context.replica_context.replica_id_in_sync_group))
    with distribute_context.push_cross_replica(strategy):
      with self._scope_extras():
        yield

  def _scope_extras(self):
    """Context managers a subclass enters inside its scope (variable creators)."""
    return _null_context()

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
    reduce_op = reduce_util.as_reduce_op(reduce_op)
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
      InvalidTypeError: if the pairs are not a list of pairs.
    """
    require_cross_replica_or_default_context(self, 'batch_reduce_to')
    reduce_op = reduce_util.as_reduce_op(reduce_op)
    if not isinstance(value_destination_pairs, (list, tuple)) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2
        for p in value_destination_pairs):
      raise errors.InvalidTypeError(
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
        copies' updates; False to return, per leaf, the tuple of results.

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
    """Where variables not tied to one model variable (e.g. Adam's beta powers) go.

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
    _check_int('iterations', iterations, 1)
    with self._container_strategy().scope():
      return input_lib.run_steps_on_iterator(
          self._container_strategy(), fn, iterator, iterations,
          initial_loop_values)

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


DistributionStrategyExtended = StrategyExtended


def _check_destinations(destinations):
  if destinations is None or (
      isinstance(destinations, (six.string_types, list, tuple)) and
      not destinations):
    raise errors.InvalidArgumentError(
        'destinations is {!r}; name at least one device (a device string, a '
        'list of them, a variable or a distributed value).'.format(
            destinations))


@contextlib.contextmanager
def _null_context():
  yield


# --- ReplicaContext -----------------------------------------------------------


class ReplicaContext(object):
  """The context of one replica, inside `call_for_each_replica`.

  Also a context manager that makes itself the current context.
  """

  def __init__(self, strategy, replica_id_in_sync_group):
    """Builds the context of replica `replica_id_in_sync_group` of `strategy`."""
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
    """Runs `merge_fn(strategy, *args, **kwargs)` once, in cross-replica context.

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
    """Reduces `value` (a nest of tensors) over all replicas; each gets the result.

    Differentiable: the gradient flowing into each replica's input is the
    all-reduce (same op) of the gradients of every replica's output.

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
    reduce_op = reduce_util.as_reduce_op(reduce_op)
    return self._all_reduce(reduce_op, value)

  def _all_reduce(self, reduce_op, value):
    del reduce_op  # One replica: SUM and MEAN are both the identity.
    return tf.nest.map_structure(tf.identity, value)

  def __repr__(self):
    return 'ReplicaContext(replica {} of {})'.format(
        self._replica_id_in_sync_group, _describe(self._strategy))


# --- The default strategy -----------------------------------------------------


class _DefaultExtended(StrategyExtended):
  """One replica on whatever device the caller is on; reductions are identities."""

  @property
  def _num_replicas_in_sync(self):
    return 1

  def _colocate_vars_with(self, colocate_with_variable):
    def creator(next_creator, **kwargs):
      with tf1.colocate_with(colocate_with_variable):
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
    with tf1.colocate_with(var), UpdateContext(var.device):
      result = fn(var, *args, **kwargs)
    if group:
      return result
    return tf.nest.map_structure(lambda r: (r,), result)

  def _non_slot_devices(self, var_list):
    return min(var_list, key=lambda v: v.name)

  def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
    with tf1.colocate_with(colocate_with), UpdateContext(colocate_with.device):
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

  def _make_dataset_iterator(self, dataset):
    return input_lib.DatasetIterator(dataset, devices=None)

  def _make_input_fn_iterator(self, input_fn):
    return input_lib.InputFunctionIterator(input_fn, devices=None)


class _DefaultStrategy(Strategy):
  """The strategy in effect when no other is: one replica, no distribution."""

  def __init__(self):
    super(_DefaultStrategy, self).__init__(_DefaultExtended(self))

  def __deepcopy__(self, memo):
    return self  # There is one default strategy.


class _DefaultReplicaContext(ReplicaContext):

  def _devices(self):
    from replicate import _compat  # pylint: disable=g-import-not-at-top
    return (_compat.current_device(),)


def _make_default_context():
  strategy = _DefaultStrategy()
  return distribute_context._Context(  # pylint: disable=protected-access
      strategy, replica_context=_DefaultReplicaContext(strategy, 0))


# The bottom entry of every thread's stack, made once at import.
_DEFAULT_CONTEXT = _make_default_context()


def _get_default_strategy():
  return _DEFAULT_CONTEXT.strategy


def default_context_entry():
  """The bottom entry of every thread's stack: the default replica context."""
  return _DEFAULT_CONTEXT

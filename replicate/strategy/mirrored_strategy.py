"""`MirroredStrategy`: synchronous data parallelism over the local devices.

Every variable created in the strategy's scope is mirrored (one copy per
device; `synchronization=ON_READ` variables are `SyncOnReadVariable`s).
`call_for_each_replica` calls the replica function once per device
(`replica_loop`); `reduce_to` / `batch_reduce_to` combine per-replica values
through a `CrossTowerOps` (by default `choose_the_best(devices)`). As in TF
1.14, each replica scales its loss to the global batch and gradients are
summed across replicas (`mirrored_gradients`). Graph mode only. Semantics
and differences from TF: docs/mirrored_strategy.md.
"""
import functools
import weakref

import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import device_check
from replicate.core import device_util
from replicate.core import tuning as tuning_lib
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import cross_tower_base
from replicate.cross_tower import one_machine
from replicate.cross_tower import values as values_lib
from replicate.strategy import default_strategy
from replicate.strategy import distribute_context
from replicate.strategy import input_lib
from replicate.strategy import mirrored_run
from replicate.strategy import replica_loop
from replicate.strategy import strategy_base
from replicate.strategy import strategy_extended
from replicate.strategy.mirrored_copies import ReplicaBuild
from replicate.strategy.mirrored_values import MirroredVariable
from replicate.strategy.sync_on_read import SyncOnReadVariable

# Collections variables may add themselves to, whatever they were asked.
_VARIABLE_COLLECTIONS = (tf1.GraphKeys.GLOBAL_VARIABLES,
                         tf1.GraphKeys.TRAINABLE_VARIABLES,
                         tf1.GraphKeys.LOCAL_VARIABLES,
                         tf1.GraphKeys.MODEL_VARIABLES)


def _check_devices(devices):
  """The canonical devices of a valid device list (device_check's rules)."""
  return device_util.canonicalize_all(device_check.check_device_list(devices))


class MirroredExtended(strategy_extended.StrategyExtended):
  """The device-level half of `MirroredStrategy`."""

  # Bookkeeping of variables made in one graph; a deep copy starts empty.
  _NOT_DEEPCOPIED = ('_containers', '_plain_variables')

  def __init__(self, container_strategy, devices, cross_tower_ops,
               replica_build=ReplicaBuild.CALL_PER_REPLICA):
    super(MirroredExtended, self).__init__(container_strategy)
    self._devices = devices
    self._replica_build = replica_build
    self._given_cross_tower_ops = cross_tower_ops
    self._chosen_cross_tower_ops = None
    # Read in the thread that makes the strategy, for the default choice.
    self._tuning = tuning_lib.get_tuning()
    self._session_config = None
    # id(copy) -> its MirroredVariable. An entry goes when its container
    # does; the container holds its copies, so an id is never stale.
    self._containers = weakref.WeakValueDictionary()
    # id(variable) -> variable, for plain variables created in scope.
    self._plain_variables = weakref.WeakValueDictionary()

  # Variables.

  def _scope_extras(self):
    return tf1.variable_creator_scope(self._create_variable)

  def _create_variable(self, next_creator, **kwargs):
    """Creates a mirrored variable, or a plain one where mirroring is wrong."""
    if _unmirrored():
      # Optimizer slots and the like: one variable, next to what is updated.
      variable = next_creator(**kwargs)
      self._plain_variables[id(variable)] = variable
      return variable
    return self._create_mirrored(next_creator, kwargs)

  def _sharing_creator(self, run):
    """The creator on top of each replica thread's copy of the caller's stack
    (as TF's): replica 0 creates, through the stack and this scope's mirroring
    creator; replica i > 0 takes replica 0's of that name, in order."""
    def creator(next_creator, **kwargs):
      replica = default_strategy.get_replica_context()
      replica_id = getattr(replica, '_replica_id_in_sync_group', 0)
      name = kwargs.get('name')
      if _unmirrored() or replica is None:
        return next_creator(**kwargs)
      if replica_id > 0:
        return self._shared_variable(run, replica_id, name)
      variable = next_creator(**kwargs)
      run.created.setdefault(name, []).append(variable)
      return variable
    return creator

  def _shared_variable(self, run, replica_id, name):
    """Replica `replica_id`'s request for the next variable named `name`."""
    taken = run.taken
    key = (replica_id, name)
    index = taken.get(key, 0)
    created = run.created.get(name, [])
    if index >= len(created):
      raise errors.ContextError(
          'Replica {} created variable {!r} (number {} of that name) but '
          'replica 0 created only {}. Every replica must create the same '
          'variables in the same order.'.format(replica_id, name, index + 1,
                                                len(created)))
    taken[key] = index + 1
    return created[index]

  def _create_mirrored(self, next_creator, kwargs):
    if kwargs.get('synchronization') == tf.VariableSynchronization.NONE:
      raise errors.InvalidArgumentError(
          '`NONE` variable synchronization mode is not supported with '
          '`Mirrored` distribution strategy. Please change the '
          '`synchronization` for variable: {}. (Its copies would never be '
          'kept equal: use AUTO, the default, or ON_WRITE, or create it '
          'outside the strategy\'s scope.)'.format(kwargs.get('name')))
    kwargs = dict(kwargs)
    collections = kwargs.get('collections')
    collections = list(collections) if collections is not None else [
        tf1.GraphKeys.GLOBAL_VARIABLES]
    trainable = kwargs.get('trainable')
    if trainable is None:
      trainable = (kwargs.get('synchronization') !=
                   tf.VariableSynchronization.ON_READ)
    if trainable and tf1.GraphKeys.TRAINABLE_VARIABLES not in collections:
      collections.append(tf1.GraphKeys.TRAINABLE_VARIABLES)
    # Copies are resource variables (so a replica's gradient flows to its
    # copy's handle) and are kept out of collections: the MirroredVariable
    # goes there instead.
    kwargs['collections'] = []
    kwargs['use_resource'] = True
    with tf1.get_default_graph().colocate_with(None, ignore_existing=True):
      with tf.device(self._devices[0]):
        primary = next_creator(**kwargs)
      copies = []
      for i, device in enumerate(self._devices[1:], 1):
        with tf.device(device):
          copy_kwargs = dict(kwargs)
          copy_kwargs['name'] = '{}/replica_{}/'.format(primary.op.name, i)
          copy_kwargs['initial_value'] = _initial_value_of(primary)
          copies.append(next_creator(**copy_kwargs))
    index = dict(zip(self._devices, [primary] + copies))
    make = None
    if kwargs.get('synchronization') == tf.VariableSynchronization.ON_READ:
      if tf1.GraphKeys.METRIC_VARIABLES in collections:
        # tf.compat.v1.metrics: mirrored, updated outside the replicas only
        # (sync_on_read.py says why).
        make = functools.partial(MirroredVariable, assign_in_replica=False)
      else:
        make = functools.partial(
            SyncOnReadVariable,
            aggregation=kwargs.get('aggregation') or
            tf.VariableAggregation.NONE)
    return self._mirror(index, collections, make)

  def _mirror(self, index, collections, make=None):
    """Makes copies (one per device) one `MirroredVariable`.

    Args:
      index: {device: copy}, a copy on every device of the strategy.
      collections: the collections the `MirroredVariable` joins; the copies
        leave every variable collection.
      make: `(strategy, index) -> MirroredVariable` (or a subclass); None
        for `MirroredVariable`.

    Returns:
      The `MirroredVariable`.
    """
    mirrored = (make or MirroredVariable)(self._container_strategy(), index)
    copy_ids = set(id(copy) for copy in mirrored.values)
    for copy in mirrored.values:
      self._containers[id(copy)] = mirrored
    # A trainable resource variable adds itself to TRAINABLE_VARIABLES even
    # with collections=[], and a TF 2 `tf.Variable` ignores `collections`
    # (joining GLOBAL_VARIABLES too); take the copies out again.
    for key in set(collections) | set(_VARIABLE_COLLECTIONS):
      members = tf1.get_collection_ref(key)
      members[:] = [v for v in members if id(v) not in copy_ids]
    tf1.add_to_collections(collections, mirrored)
    return mirrored

  def _mirror_slots(self, optimizer, variables):
    """Groups the per-copy slots `optimizer` made for `variables`.

    `apply_gradients_across_replicas` updates each copy of a mirrored
    variable on its own, so the optimizer makes each slot once per copy
    (`w/Momentum`, `w/replica_1/Momentum`, ...). Grouped as a
    `MirroredVariable`, a slot is one variable in `GLOBAL_VARIABLES` and one
    checkpoint key (the primary copy's slot, named as one device names it),
    and a restore sets every copy: checkpoints move between mirrored and
    unreplicated models, and between numbers of devices.

    Args:
      optimizer: the `tf.compat.v1.train.Optimizer` that updated the copies.
      variables: the `MirroredVariable`s it updated.
    """
    get_slot_names = getattr(optimizer, 'get_slot_names', None)
    get_slot = getattr(optimizer, 'get_slot', None)
    if get_slot_names is None or get_slot is None:
      return
    for slot_name in get_slot_names():
      for variable in variables:
        slots = [get_slot(copy, slot_name) for copy in variable.values]
        if any(slot is None for slot in slots) or id(slots[0]) in (
            self._containers):
          continue
        self._mirror(dict(zip(variable.devices, slots)),
                     [tf1.GraphKeys.GLOBAL_VARIABLES])

  def _colocate_vars_with(self, colocate_with_variable):
    if isinstance(colocate_with_variable, MirroredVariable):
      return strategy_extended.null_context()

    def creator(next_creator, **kwargs):
      with distribute_context.unmirrored_variables(), \
          tf1.get_default_graph().colocate_with(colocate_with_variable):
        return next_creator(**kwargs)
    return tf1.variable_creator_scope(creator)

  def _variable_created_in_scope(self, v):
    if isinstance(v, MirroredVariable):
      return v.strategy is self._container_strategy()
    return self._plain_variables.get(id(v)) is v

  def _value_container(self, value):
    return self._containers.get(id(value), value)

  def _read_var(self, v):
    if isinstance(v, SyncOnReadVariable):
      return v.read_value()  # Cross-replica: the copies combined.
    if isinstance(v, MirroredVariable):
      return tf.identity(v.primary)
    return tf.identity(v)

  # Replicas.

  @property
  def _num_replicas_in_sync(self):
    return len(self._devices)

  def _call_for_each_replica(self, fn, args, kwargs):
    _check_not_estimator(fn)
    return replica_loop.call_for_each_replica(
        self._container_strategy(), self._devices, fn, args, kwargs,
        self._sharing_creator, keep=(MirroredVariable,),
        replica_build=self._replica_build,
        mirrored_variables=self._mirrored_variables)

  def _mirrored_variables(self):
    """Every `MirroredVariable` (slots too) of this strategy, once each."""
    return list({id(v): v for v in self._containers.values()}.values())

  # Reductions.

  @property
  def _cross_tower_ops(self):
    if self._given_cross_tower_ops is not None:
      return self._given_cross_tower_ops
    if self._chosen_cross_tower_ops is None:
      self._chosen_cross_tower_ops = one_machine.best_for(
          list(self._devices), self._session_config, self._tuning)
    return self._chosen_cross_tower_ops

  def _destinations(self, destinations):
    if isinstance(destinations, MirroredVariable):
      return list(destinations.devices)
    return destinations

  def _reduce_to(self, reduce_op, value, destinations):
    destinations = self._destinations(destinations)
    if not isinstance(value, values_lib.DistributedValues):
      if reduce_op == ReduceOp.SUM and len(self._devices) > 1:
        raise errors.InvalidArgumentError(
            'A non-DistributedValues value {} cannot be reduced with the '
            'given reduce op ReduceOp.SUM. '  # TF's phrase
            'Cannot SUM the single value {!r} over {} replicas: it is not '
            'per-replica, so its replicas are unknown. Reduce a per-replica '
            'value (e.g. from call_for_each_replica), or use MEAN.'.format(
                value, value, len(self._devices)))
      return self._cross_tower_ops.broadcast(value, destinations)
    return self._cross_tower_ops.reduce(reduce_op, value, destinations)

  def _batch_reduce_to(self, reduce_op, value_destination_pairs):
    pairs = [(v, self._destinations(d)) for v, d in value_destination_pairs]
    if all(isinstance(v, values_lib.DistributedValues) for v, _ in pairs):
      return self._cross_tower_ops.batch_reduce(reduce_op, pairs)
    return [self._reduce_to(reduce_op, v, d) for v, d in pairs]

  def _reduce(self, reduce_op, value):
    if not isinstance(value, values_lib.DistributedValues) and (
        reduce_op == ReduceOp.MEAN or len(self._devices) == 1):
      return value
    host = device_util.canonicalize('/device:CPU:0')
    return self._reduce_to(reduce_op, value, host).get(host)

  def _broadcast_to(self, tensor, destinations):
    return self._cross_tower_ops.broadcast(tensor,
                                           self._destinations(destinations))

  # Updates.

  def _update(self, var, fn, args, kwargs, group):
    if isinstance(var, MirroredVariable):
      if var.strategy is not self._container_strategy():
        raise errors.InvalidArgumentError(
            'update got {!r}, a variable of another strategy; update it with '
            'its own strategy.'.format(var))
      pairs = list(zip(var.devices, var.values))
    elif isinstance(var, tf.Variable):
      device = device_util.resolve(var.device) or self._devices[0]
      pairs = [(device, var)]
    else:
      raise errors.InvalidTypeError(
          'update needs a variable, got {!r} of type {}.'.format(
              var, type(var).__name__))
    results = []
    for i, (device, copy) in enumerate(pairs):
      with tf.device(device), distribute_context.UpdateContext(device), \
          tf1.name_scope('update_{}'.format(i)):
        results.append(fn(copy, *self._select(device, args),
                          **self._select(device, kwargs)))
    return mirrored_run.regroup_updates(
        results, [device for device, _ in pairs], group)

  def _non_slot_devices(self, var_list):
    del var_list  # Every device holds a copy of every non-slot variable.
    return self._devices

  def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
    results = []
    for i, device in enumerate(colocate_with):
      with tf.device(device), distribute_context.UpdateContext(device), \
          tf1.name_scope('update_{}'.format(i)):
        results.append(fn(*self._select(device, args),
                          **self._select(device, kwargs)))
    return mirrored_run.regroup_updates(results, list(colocate_with), group)

  def _select(self, device, structure):
    return mirrored_run.select_replica(device, structure)

  # Devices and input.

  def _worker_devices(self):
    return self._devices

  def _parameter_devices(self):
    return self._devices

  def _configure(self, session_config, cluster_spec, task_type, task_id):
    super(MirroredExtended, self)._configure(session_config, cluster_spec,
                                             task_type, task_id)
    if session_config is not None:
      self._session_config = session_config
      self._chosen_cross_tower_ops = None

  def _make_dataset_iterator(self, dataset, one_shot=False):
    return input_lib.DatasetIterator(dataset, devices=self._devices,
                                     one_shot=one_shot)

  def _make_input_fn_iterator(self, input_fn, one_shot=False):
    return input_lib.InputFunctionIterator(input_fn, devices=self._devices,
                                           one_shot=one_shot)


def _unmirrored():
  """Whether a variable created now is a plain one (a slot or the like)."""
  return (distribute_context.creating_unmirrored_variables() or
          distribute_context.get_update_device() is not None)


def _check_not_estimator(fn):
  """Refuses `Estimator(config=RunConfig(train_distribute=<ours>))` (or
  `eval_distribute`).

  TF's Estimator drives `tf.distribute` strategies through their private
  methods and expects a tensor loss back; with ours it would end in an
  opaque "loss must be Tensor" TypeError.
  """
  if isinstance(getattr(fn, '__self__', None), tf1.estimator.Estimator):
    raise errors.InvalidTypeError(
        'replicate.MirroredStrategy cannot be an Estimator\'s '
        'RunConfig(train_distribute=...) or eval_distribute (TF\'s Estimator '
        'only drives tf.distribute strategies). For an Estimator, wrap its '
        'model_fn: tf.estimator.Estimator(replicate.replicate_model_fn(model_fn, '
        'devices=...)); use replicate.MirroredStrategy in a '
        'tf.compat.v1.Session loop (docs/mirrored_strategy.md).')


def _initial_value_of(primary):
  def initial_value():
    return tf.identity(primary.initial_value)
  return initial_value


class MirroredStrategy(strategy_base.Strategy):
  """Synchronous training with one replica and one variable copy per device.

  Example:

      strategy = replicate.MirroredStrategy(['/cpu:0', '/cpu:1'])
      with strategy.scope():
        w = tf.compat.v1.get_variable('w', ...)      # mirrored
        train_op = strategy.group(strategy.experimental_run(step, iterator))

  Inside the replicas ask `replicate.get_replica_context()`:
  `tf.distribute.get_replica_context()` does not know them and returns TF's
  default one-replica context, whose `all_reduce` reduces nothing. For an
  Estimator use `replicate_model_fn`, not `RunConfig(train_distribute=...)`.
  """

  def __init__(self, devices=None, cross_device_ops=None,
               cross_tower_ops=None,
               replica_build=ReplicaBuild.CALL_PER_REPLICA, num_gpus=None,
               num_gpus_per_worker=None, auto_shard_dataset=False):
    """Builds the strategy.

    Args:
      devices: the local devices, one replica each; None for all local GPUs,
        else the CPU.
      cross_device_ops: the `CrossTowerOps` (TF 1.14+: `CrossDeviceOps`, the
        same class) combining replicas' values; None for
        `cross_tower_ops.choose_the_best(devices)`.
      cross_tower_ops: contrib's name for `cross_device_ops`; give one of the
        two.
      replica_build: a `ReplicaBuild` (mirrored_copies.py): by default one
        call of the function per replica, as in TF; `CLONE` copies replica
        0's graph (`run` raises where copies cannot be shown right).
      num_gpus: contrib's: with `devices` None, GPUs 0 to `num_gpus` - 1
        (the CPU for 0). Keyword only here: the second positional argument
        is TF 1.14's `cross_device_ops`.
      num_gpus_per_worker: contrib's other name for `num_gpus`.
      auto_shard_dataset: contrib's: shards input across workers; one local
        worker has nothing to shard.

    Raises:
      InvalidTypeError: if `devices` is not a list of strings, the
        cross-device ops are not a `CrossTowerOps`, or `replica_build` is
        not a `ReplicaBuild`.
      InvalidArgumentError: if `devices` is empty, a GPU count is negative,
        or both `devices` and a GPU count, or both GPU counts, are given.
      AssertedArgumentError: (also an `AssertionError`, as TF's) if
        `devices` repeats a device, or both `cross_device_ops` and
        `cross_tower_ops` are given.
    """
    if cross_device_ops is not None and cross_tower_ops is not None:
      raise errors.AssertedArgumentError(
          'MirroredStrategy got both cross_device_ops and cross_tower_ops '
          '(the same argument under its TF 1.14 and contrib names); pass '
          'one.')
    if cross_tower_ops is None:
      cross_tower_ops = cross_device_ops
    devices = _check_devices(device_check.devices_or_gpus(
        devices, num_gpus, num_gpus_per_worker))
    if cross_tower_ops is not None and not isinstance(
        cross_tower_ops, cross_tower_base.CrossTowerOps):
      raise errors.InvalidTypeError(
          'cross_tower_ops must be a replicate.cross_tower_ops.CrossTowerOps '
          '(e.g. ReductionToOneDeviceCrossTowerOps()), got {!r}.{}'.format(
              cross_tower_ops, _CONTRIB_ORDER if isinstance(
                  cross_tower_ops, int) else ''))
    if not isinstance(replica_build, ReplicaBuild):
      raise errors.InvalidTypeError(
          'replica_build must be a ReplicaBuild (CALL_PER_REPLICA or CLONE), '
          'got {!r}.{}'.format(replica_build, _CONTRIB_ORDER if isinstance(
              replica_build, cross_tower_base.CrossTowerOps) else ''))
    if not isinstance(auto_shard_dataset, bool):
      raise errors.InvalidTypeError(
          'auto_shard_dataset must be a bool, got {!r}.'.format(
              auto_shard_dataset))
    super(MirroredStrategy, self).__init__(
        MirroredExtended(self, devices, cross_tower_ops, replica_build))


# Appended to a type error where contrib's positional order was likely used.
_CONTRIB_ORDER = (
    ' contrib\'s MirroredStrategy took (devices, num_gpus, '
    'num_gpus_per_worker, cross_device_ops, ...) in that order; here the '
    'order is TF 1.14\'s (devices, cross_device_ops, cross_tower_ops, '
    'replica_build): pass num_gpus= and cross_device_ops= by keyword.')

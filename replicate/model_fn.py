"""`replicate_model_fn`: run an Estimator `model_fn` on several local devices.

The wrapped `model_fn` splits the global batch along dimension 0, builds one
tower per device (variables shared, placed on a parameter device), and
merges the towers' `EstimatorSpec`s:

* TRAIN: the loss is the sum of the (scaled) tower losses; `TowerOptimizer`
  applies the summed gradients once, in the last tower.
* EVAL: summed loss; metric variables of every tower reduced into tower 0's.
* PREDICT: predictions and export outputs concatenated in batch order.
"""
import contextlib
import copy

import tensorflow as tf

from replicate.towers import batch_split
from replicate.core import device_check
from replicate.cluster import placement as cluster_placement
from replicate.towers import device_setter
from replicate import errors
from replicate.gradients import matmul_gradient
from replicate.towers import tower_cloning
from replicate.towers import tower_collections
from replicate.towers import tower_context
from replicate.towers import tower_copier
from replicate.towers import tower_specs
from replicate._compat import EstimatorSpec
from replicate._compat import ModeKeys
from replicate._compat import fn_args
from replicate._compat import tf1
from replicate._compat import variable_store_names
from replicate.towers.device_setter import VariablePlacement
from replicate.towers.tower_cloning import TowerBuild

_SUPPORTED_REDUCTIONS = (
    tf1.losses.Reduction.SUM,
    tf1.losses.Reduction.MEAN,
    tf1.losses.Reduction.SUM_OVER_BATCH_SIZE,
    tf1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS,
)


def replicate_model_fn(model_fn,
                       loss_reduction=tf1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS,
                       devices=None,
                       variable_placement=VariablePlacement.CONSOLIDATION_DEVICE,
                       ps_strategy=None,
                       tower_build=TowerBuild.CLONE):
  """Replicates `model_fn` over local devices: one tower per device.

  Drop-in for contrib's `replicate_model_fn`:

      estimator = tf.estimator.Estimator(
          model_fn=replicate.replicate_model_fn(my_model_fn),
          config=tf.estimator.RunConfig(session_config=...))

  `my_model_fn` must wrap its optimizers in `replicate.TowerOptimizer`. The
  global batch is split along dimension 0 (it must be divisible by the number
  of devices); each tower computes gradients on its shard; the gradients are
  summed per variable and applied once, so training follows the unreplicated
  model on the full batch. Tower 0 is built under no extra name scope, tower
  `i` under `tower_<i>`, and variables are shared, so checkpoints carry the
  names of the unreplicated model and are interchangeable with it. In TRAIN,
  `model_fn` is called once and towers 1..N-1 are copies of tower 0's graph
  where that is right (see `tower_build`).

  Args:
    model_fn: an Estimator `model_fn` taking `features`, `labels`, `mode` and
      optionally `params` and `config`, returning an `EstimatorSpec`.
    loss_reduction: how `model_fn` reduces its loss, a
      `tf.compat.v1.losses.Reduction`. `SUM` adds the tower losses; `MEAN`,
      `SUM_OVER_BATCH_SIZE` and `SUM_BY_NONZERO_WEIGHTS` average them.
    devices: device strings, one tower each. `None`: every local GPU, or the
      CPU if there is none. With one device the model is only placed there.
    variable_placement: a `VariablePlacement`: all variables on the
      consolidation device (the single GPU, else `/device:CPU:0`; the
      default), or round-robin over `devices`. In between-graph training
      (the Estimator's `RunConfig` names a cluster through `TF_CONFIG`),
      towers are built on this task's devices
      (`/job:worker/task:<i>/device:...`), and with a `ps` job in the
      cluster the variables go to the parameter servers
      (`PARAMETER_SERVERS`; also what `CONSOLIDATION_DEVICE` means there).
      See docs/multi_worker.md.
    ps_strategy: with parameter servers, how to choose each variable's ps
      task: `None` for round robin in creation order, or a callable
      `op -> task index` such as `replicate.GreedyLoadBalancingStrategy(
      num_ps, replicate.byte_size_load_fn)`.
    tower_build: a `replicate.TowerBuild`. `CLONE` (the default): in TRAIN,
      call `model_fn` once and copy tower 0's forward pass, loss and
      gradients onto the other devices, which builds the graph several times
      faster; where copying cannot be shown to be right (e.g. `model_fn`
      calls `get_tower_context()`), a warning says why and every tower is
      built by its own call. `CALL_PER_TOWER`: one `model_fn` call per tower
      in every mode, as tf.contrib did. See replicate/tower_cloning.py.

  Returns:
    A `model_fn` with the signature `(features, labels, mode, params, config)`.

  Raises:
    InvalidTypeError: if `model_fn` is not callable or `devices` is not a list
      of strings.
    InvalidArgumentError: if `loss_reduction` is `NONE` or unknown, `devices`
      is empty or repeats a device, `variable_placement` or `tower_build` is
      unknown, or `ps_strategy` comes with `ROUND_ROBIN`. When the model is
      built: `PARAMETER_SERVERS` or `ps_strategy` without a `ps` job in the
      cluster, `ROUND_ROBIN` with one, devices naming a job or task the
      cluster does not have (see `replicate.cluster.placement.placement`), a device the
      session lacks; and a `model_fn` whose towers would differ: trainable
      variables not shared through `tf.compat.v1.get_variable`, a `train_op`
      without `TowerOptimizer`, different optimizer calls or metrics.
    ContextError: when the model is built, if `model_fn` calls
      `get_tower_context()` after its towers were copied (see `tower_build`).
  """
  if not callable(model_fn):
    raise errors.InvalidTypeError(
        'model_fn must be callable, got {!r} of type {}.'.format(
            model_fn, type(model_fn).__name__))
  if loss_reduction == tf1.losses.Reduction.NONE:
    raise errors.InvalidArgumentError(
        'loss_reduction NONE is not supported: every tower must return a '
        'scalar loss to be summed or averaged. Use one of {}.'.format(
            ', '.join(_SUPPORTED_REDUCTIONS)))
  if loss_reduction not in _SUPPORTED_REDUCTIONS:
    raise errors.InvalidArgumentError(
        'Unknown loss_reduction {!r}; use one of {} '
        '(tf.compat.v1.losses.Reduction).'.format(
            loss_reduction, ', '.join(_SUPPORTED_REDUCTIONS)))
  if not isinstance(variable_placement, VariablePlacement):
    raise errors.InvalidArgumentError(
        'variable_placement must be a replicate.VariablePlacement (one of {}), '
        'got {!r}.'.format([p.name for p in VariablePlacement],
                           variable_placement))
  if not isinstance(tower_build, TowerBuild):
    raise errors.InvalidArgumentError(
        'tower_build must be a replicate.TowerBuild (one of {}), got {!r}.'
        .format([b.name for b in TowerBuild], tower_build))
  cluster_placement.check_ps_strategy(ps_strategy, variable_placement)
  if devices is not None:
    devices = _canonical_devices(devices)

  def replicated_model_fn(features, labels, mode, params=None, config=None):
    """The replicated model_fn handed to the Estimator."""
    tower_devices = devices or _default_devices()
    placement = cluster_placement.placement(config, mode, tower_devices,
                                  variable_placement, ps_strategy)
    if placement is None:
      _check_devices_exist(tower_devices, config)
      placement = cluster_placement.Placement(
          tower_devices,
          device_setter.parameter_device_chooser(variable_placement,
                                                 tower_devices),
          device_setter.consolidation_device(tower_devices))
    tf1.logging.info(
        'replicate_model_fn: building %s with %d tower(s) on %s; variables: '
        '%s (aggregation on %s); loss reduction: %s; towers: %s.', mode,
        len(placement.tower_devices), ', '.join(placement.tower_devices),
        variable_placement.value, placement.aggregation_device,
        loss_reduction, tower_build.value)
    spec = _replicate(model_fn, features, labels, mode, params, config,
                      placement, loss_reduction, tower_build)
    if mode == ModeKeys.TRAIN and placement.training_hooks:
      spec = spec._replace(training_hooks=(
          tuple(spec.training_hooks) + placement.training_hooks))
    return spec

  return replicated_model_fn


def _canonical_devices(devices):
  """The user's `devices`, validated (device_check.check_device_list)."""
  return device_check.check_device_list(devices)


def _default_devices():
  return device_check.default_devices()


def _check_devices_exist(devices, config):
  """Fails loudly where soft placement would silently use another device.

  Judged against the devices of the session the Estimator will run: its
  `session_config`, which the Estimator sets to its default
  (`allow_soft_placement: true`) when the user gave none. Only a
  `session_config` of the user's own that asks for soft placement turns the
  error into a WARNING (see `device_check.soft_placement_requested`).
  """
  if not isinstance(config, tf1.estimator.RunConfig):
    return  # Called outside an Estimator: the session is unknown.
  session_config = config.session_config
  device_check.check_devices_exist(
      devices, session_config,
      device_check.soft_placement_requested(config))


def _replicate(model_fn, features, labels, mode, params, config, placement,
               loss_reduction, tower_build):
  """Builds the towers and merges their specs."""
  if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
    raise errors.InvalidArgumentError(
        'Unknown mode {!r}; expected one of tf.estimator.ModeKeys.TRAIN, EVAL '
        'or PREDICT.'.format(mode))
  graph = tf1.get_default_graph()
  num_towers = len(placement.tower_devices)
  replication = tower_context.Replication(graph, num_towers, loss_reduction)
  devices = placement.tower_devices
  choose_parameter_device = placement.choose_parameter_device
  aggregation_device = placement.aggregation_device

  with tower_context.replication_scope(replication):
    if num_towers == 1:
      # One device: no splitting, scaling or aggregation; only placement.
      tower = tower_context.TowerContext(0, 1, devices[0])
      with tower_context.tower_scope(replication, tower), tf1.device(
          device_setter.tower_device_setter(devices[0],
                                            choose_parameter_device)):
        return _call_model_fn(model_fn, features, labels, mode, params, config)

    feature_shards, label_shards = batch_split.split_batch(
        features, labels, num_towers, aggregation_device)
    collections = tower_collections.TowerCollections(
        graph, num_towers,
        share_regularization=loss_reduction != tf1.losses.Reduction.SUM)
    cloner = None
    if mode == ModeKeys.TRAIN and tower_build == TowerBuild.CLONE:
      cloner = tower_copier.TowerCloner(
          graph, devices, len(graph.get_operations()), [
              tf.nest.flatten((f, l), expand_composites=True)
              for f, l in zip(feature_shards, label_shards)
          ])
      replication.cloner = cloner
    specs = []
    metric_variables = []
    try:
      for tower_id, device in enumerate(devices):
        if replication.towers_cloned:
          break
        tower = tower_context.TowerContext(tower_id, num_towers, device)
        trainable_before = _ids(tf1.trainable_variables())
        metrics_before = _ids(graph.get_collection(
            tf1.GraphKeys.METRIC_VARIABLES))
        requested_devices = (
            cloner.requested_devices if replication.cloner else None)
        with _tower_scopes(replication, tower_id), tower_context.tower_scope(
            replication, tower), collections.tower(tower_id), tf1.device(
                device_setter.tower_device_setter(
                    device, choose_parameter_device, requested_devices)), (
                        matmul_gradient.cpu_tower_gradients(
                            graph, device, enabled=mode == ModeKeys.TRAIN)):
          spec = _call_model_fn(model_fn, feature_shards[tower_id],
                                label_shards[tower_id], mode, params, config)
          _check_tower(spec, tower, replication, trainable_before)
          unscaled_loss = spec.loss
          spec = spec._replace(loss=replication.scale_loss(spec.loss))
        replication.cloner = None
        specs.append(spec)
        metric_variables.append([
            v for v in graph.get_collection(tf1.GraphKeys.METRIC_VARIABLES)
            if id(v) not in metrics_before
        ])
      if replication.towers_cloned:
        specs.extend(tower_cloning.copied_specs(
            cloner, replication, specs[0], unscaled_loss, collections))
        metric_variables.extend([] for _ in range(1, num_towers))
      replication.check_same_optimizer_calls()
    finally:
      replication.cloner = None
      collections.finish()
    return tower_specs.merge(mode, specs, metric_variables, aggregation_device,
                             replication.applying_tower_id)


def _ids(items):
  return set(id(item) for item in items)


@contextlib.contextmanager
def _tower_scopes(replication, tower_id):
  """Variable and name scopes of one tower (tower 0: the caller's own).

  Towers after the first reuse tower 0's variables and build under
  `tower_<i>`; tower 0's scopes are recorded so that the gradients can be
  applied under them (unprefixed names, like the unreplicated model).
  """
  with tf1.variable_scope(tf1.get_variable_scope(),
                          reuse=True if tower_id else None,
                          auxiliary_name_scope=False) as var_scope:
    if tower_id:
      with tf1.name_scope('tower_{}'.format(tower_id)):
        yield
    else:
      name_scope = tf1.get_default_graph().get_name_scope()
      replication.first_tower_scopes = (
          var_scope, name_scope + '/' if name_scope else '')
      yield


def _call_model_fn(model_fn, features, labels, mode, params, config):
  """Calls `model_fn` with the arguments its signature asks for."""
  accepted = fn_args(model_fn)
  if 'features' not in accepted:
    raise errors.InvalidArgumentError(
        'model_fn must take a `features` argument; its arguments are {}.'
        .format(list(accepted)))
  kwargs = {'features': features}
  if 'labels' in accepted:
    kwargs['labels'] = labels
  elif labels is not None:
    raise errors.InvalidArgumentError(
        'The input_fn provides labels but model_fn takes no `labels` '
        'argument; add one to model_fn or return no labels.')
  if 'mode' in accepted:
    kwargs['mode'] = mode
  if 'params' in accepted:
    kwargs['params'] = copy.deepcopy(params)
  if 'config' in accepted:
    kwargs['config'] = copy.deepcopy(config)
  spec = model_fn(**kwargs)
  if not isinstance(spec, EstimatorSpec):
    raise errors.InvalidTypeError(
        'model_fn must return a tf.estimator.EstimatorSpec, got {!r} of type '
        '{}.'.format(spec, type(spec).__name__))
  return spec


def _check_tower(spec, tower, replication, trainable_before):
  """Raises on what would make the replicated model differ from the original."""
  if (spec.train_op is not None and
      replication.num_optimizer_calls(tower.tower_id) == 0):
    raise errors.InvalidArgumentError(
        'model_fn returned a train_op but made no TowerOptimizer call in tower '
        '{} of {}. Wrap optimizers with replicate.TowerOptimizer to use '
        'replicate_model_fn with several devices.'.format(
            tower.tower_id, tower.num_towers))
  created = [v for v in tf1.trainable_variables()
             if id(v) not in trainable_before]
  if tower.tower_id:
    unshared = [v.op.name for v in created]
    if unshared:
      raise errors.InvalidArgumentError(
          'Tower {} created trainable variables {} instead of reusing tower '
          "0's, so the towers would train different weights. Create variables "
          'with tf.compat.v1.get_variable or tf.compat.v1.layers (Keras layer '
          'objects created inside model_fn are not shared).'.format(
              tower.tower_id, unshared))
  elif replication.towers_cloned:
    # The copies share whatever tower 0 created, but a model_fn call per
    # tower (EVAL, PREDICT, CALL_PER_TOWER) would not: reject such variables
    # in every mode alike.
    stored = variable_store_names()
    unshareable = [v.op.name for v in created if v.op.name not in stored]
    if unshareable:
      raise errors.InvalidArgumentError(
          'model_fn created trainable variables {} without '
          'tf.compat.v1.get_variable, so towers built by calling model_fn '
          'again (EVAL, PREDICT) would train or read different weights. '
          'Create variables with tf.compat.v1.get_variable or '
          'tf.compat.v1.layers (Keras layer objects created inside model_fn '
          'are not shared).'.format(unshareable))

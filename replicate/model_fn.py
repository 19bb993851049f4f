"""`replicate_model_fn`: run an Estimator `model_fn` on several local devices.

The wrapped `model_fn` splits the global batch along dimension 0, builds one
tower per device (variables shared, placed on a parameter device; `model_fn`
called once, for tower 0, the others copies of it), and merges the towers'
`EstimatorSpec`s (replicate/towers/tower_build.py):

* TRAIN: the loss is the sum of the (scaled) tower losses; `TowerOptimizer`
  applies the summed gradients once.
* EVAL: summed loss; metric variables of every tower reduced into tower 0's.
* PREDICT: predictions and export outputs concatenated in batch order.

A graph the Estimator builds for a SavedModel gets the unreplicated model
instead, which serves on any device (replicate/towers/serving.py).

`TowerOptimizer` is here too, as in contrib's `replicate_model_fn` module.
"""
import functools

from replicate import errors
from replicate._compat import building_saved_model
from replicate._compat import ModeKeys
from replicate._compat import tf1
from replicate.cluster import chief_broadcast
from replicate.cluster import placement as cluster_placement
from replicate.core import device_check
from replicate.core import tuning as tuning_lib
from replicate.cross_tower import across_workers
from replicate.cross_tower import cross_tower_base
from replicate.cross_tower import one_machine
from replicate.cross_tower import replicated_gradients
from replicate.tower_optimizer import TowerOptimizer  # noqa: F401
from replicate.towers import batch_split
from replicate.towers import device_setter
from replicate.towers import replicated_variables
from replicate.towers import serving
from replicate.towers import tower_build as tower_build_lib
from replicate.towers import tower_context
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
                       tower_build=TowerBuild.CLONE,
                       cross_tower_ops=None,
                       unsplit_features=None,
                       tuning=None):
  """Replicates `model_fn` over local devices: one tower per device.

  Drop-in for contrib's `replicate_model_fn`:

      estimator = tf.estimator.Estimator(
          model_fn=replicate.replicate_model_fn(my_model_fn),
          config=tf.estimator.RunConfig(session_config=...))

  `my_model_fn` must wrap its optimizers in `replicate.TowerOptimizer`. The
  global batch, of any size, is split along dimension 0 as evenly as it goes
  (the first `b % N` towers get one more row; see
  replicate/towers/batch_split.py); each tower computes gradients on its
  shard; the gradients are summed per variable and applied once, so training
  follows the unreplicated model on the full batch. Tower 0 is built under no extra name scope, tower
  `i` under `tower_<i>`, and variables are shared, so checkpoints carry the
  names of the unreplicated model and are interchangeable with it. In every
  mode `model_fn` is called once and towers 1..N-1 are copies of tower 0's
  graph where that is right (see `tower_build`), so variables made by Keras
  layer objects inside `model_fn` are shared too. A SavedModel exported from
  the Estimator holds the unreplicated model, unpinned, for any batch size
  (see replicate/towers/serving.py).

  Args:
    model_fn: an Estimator `model_fn` taking `features`, `labels`, `mode` and
      optionally `params` and `config`, returning an `EstimatorSpec`.
    loss_reduction: how `model_fn` reduces its loss, a
      `tf.compat.v1.losses.Reduction`. `SUM` adds the tower losses; `MEAN`,
      `SUM_OVER_BATCH_SIZE` and `SUM_BY_NONZERO_WEIGHTS` average them,
      each weighted by its tower's share of the batch's rows.
    devices: device strings, one tower each. `None`: every local GPU, or the
      CPU if there is none. With one device the model is only placed there.
    variable_placement: a `VariablePlacement`: all variables on the
      consolidation device (the single GPU, else `/device:CPU:0`; the
      default), round-robin over `devices`, or `REPLICATED`: a copy of each
      trainable variable per tower, gradients all-reduced (see
      replicate/towers/replicated_variables.py). In between-graph training
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
    tower_build: a `replicate.TowerBuild`. `CLONE` (the default): call
      `model_fn` once and copy what tower 0 built (TRAIN: forward pass, loss
      and gradients; EVAL: loss and metric updates; PREDICT: predictions and
      export outputs) onto the other devices, doing what another call would
      have built, without running model_fn's Python again, and sharing
      every variable tower 0 made; where copying cannot be shown to be
      right (e.g. `model_fn` calls `get_tower_context()`), a warning says
      why and every tower is built by its own call. `CALL_PER_TOWER`: one
      `model_fn` call per tower in every mode, as tf.contrib did. What a
      copy preserves: docs/replicate_model_fn.md.
    cross_tower_ops: with `REPLICATED` on one machine, the
      `replicate.CrossTowerOps` that all-reduces the gradients (e.g.
      `replicate.NcclAllReduce()`); None chooses:
      `replicate.cross_tower_ops.choose_the_best` for the towers, or (the
      only choice there) collective ops across the tasks of a cluster.
    unsplit_features: names of features (keys of the features dict) that
      every tower gets whole instead of a shard, e.g. a vocabulary tensor
      whose dimension 0 is no batch. Scalars are always given whole.
    tuning: the `replicate.Tuning` the towers' gradient sums and all-reduce
      are sized by; None: the one current (`replicate.tuning_scope`, else
      `replicate.set_tuning`'s) in the thread that calls the returned
      `model_fn`. A `cross_tower_ops` given keeps its own.

  Returns:
    A `model_fn` with the signature `(features, labels, mode, params, config)`.

  Raises:
    InvalidTypeError: if `model_fn` is not callable, `devices` or
      `unsplit_features` is not a list of strings, `cross_tower_ops` is
      not a `CrossTowerOps`, or `tuning` not a `replicate.Tuning`.
    InvalidArgumentError: if `loss_reduction` is `NONE` or unknown, `devices`
      is empty or repeats a device, `variable_placement` or `tower_build` is
      unknown, `ps_strategy` comes with `ROUND_ROBIN` or `REPLICATED`,
      `REPLICATED` with `CALL_PER_TOWER`, or `cross_tower_ops` without
      `REPLICATED`. When the model is built: `unsplit_features` naming a
      feature there is not, a feature or label split whose dimension 0 is
      not the batch's (a run-time assertion where the sizes are not
      static), `PARAMETER_SERVERS` or `ps_strategy` without a `ps` job in
      the cluster, `ROUND_ROBIN` with one, devices naming a job or task the cluster does not have (see
      `replicate.cluster.placement.placement`), a device the session lacks
      where `session_config` does not allow soft placement (with soft
      placement, as the Estimator's default session config has, one WARNING
      says where its tower runs); and a `model_fn` whose towers would
      differ: trainable variables made anew by a tower built by its own
      `model_fn` call (not through `tf.compat.v1.get_variable`), a
      `train_op` without `TowerOptimizer`, different optimizer calls or
      metrics, or a metric whose state cannot be summed across towers.
    ContextError: when the model is built, if `model_fn` calls
      `get_tower_context()` after its towers were copied (see `tower_build`).
  """
  if not callable(model_fn):
    raise errors.InvalidTypeError(
        'model_fn must be callable, got {!r} of type {}.'.format(
            model_fn, type(model_fn).__name__))
  if loss_reduction == tf1.losses.Reduction.NONE:
    raise errors.InvalidArgumentError(
        'Tower losses need to be reduced in some way, yet {} reduction is '
        'specified: loss_reduction NONE is not supported, as every tower '
        'must return a scalar loss to be summed or averaged. Use one of '
        '{}.'.format(loss_reduction, ', '.join(_SUPPORTED_REDUCTIONS)))
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
  _check_cross_tower_ops(cross_tower_ops, variable_placement)
  if variable_placement == VariablePlacement.REPLICATED and ps_strategy:
    raise errors.InvalidArgumentError(
        'ps_strategy={!r} chooses parameter-server tasks, but '
        'variable_placement=REPLICATED keeps the variables on the towers. '
        'Drop ps_strategy, or use VariablePlacement.PARAMETER_SERVERS.'.format(
            ps_strategy))
  if (variable_placement == VariablePlacement.REPLICATED and
      tower_build == TowerBuild.CALL_PER_TOWER):
    raise errors.InvalidArgumentError(
        'variable_placement=REPLICATED gives every tower its own variables by '
        "copying tower 0's graph; it cannot build towers by calling model_fn "
        'once each (tower_build=CALL_PER_TOWER). Use tower_build=TowerBuild.'
        'CLONE, or VariablePlacement.CONSOLIDATION_DEVICE.')
  unsplit_features = batch_split.check_unsplit_features(unsplit_features)
  if tuning is not None:
    tuning_lib.resolve(tuning)  # Checked now; None is read at each build.
  if devices is not None:
    devices = _canonical_devices(devices)
  warned_missing_devices = set()  # warn once per replicate_model_fn

  def replicated_model_fn(features, labels, mode, params=None, config=None):
    """The replicated model_fn handed to the Estimator."""
    if building_saved_model():
      return serving.build_for_export(model_fn, features, labels, mode,
                                      params, config, loss_reduction)
    if tower_context.current_replication() is not None:
      raise errors.InvalidArgumentError(
          'A model_fn wrapped by replicate_model_fn was called inside a tower '
          'of another replicate_model_fn: each tower would split its shard '
          'again. Wrap the model_fn once, with all the devices.')
    build_tuning = tuning_lib.resolve(tuning)
    tower_devices = devices or _default_devices()
    placement = cluster_placement.placement(config, mode, tower_devices,
                                  variable_placement, ps_strategy)
    if placement is None:
      _check_devices_exist(tower_devices, config, warned_missing_devices)
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
    replicated = None
    if cross_tower_ops is not None and placement.num_workers > 1:
      raise errors.InvalidArgumentError(
          'cross_tower_ops={!r} reduces the towers of one task, but this '
          'cluster has {} training tasks that all-reduce together with '
          'collective ops (averaged over the tasks). Drop cross_tower_ops '
          'in a cluster.'.format(cross_tower_ops, placement.num_workers))
    if variable_placement == VariablePlacement.REPLICATED:
      replicated = replicated_variables.ReplicatedVariables(
          functools.partial(
              replicated_gradients.all_reduce_gradients,
              devices=placement.tower_devices,
              cross_tower_ops=(cross_tower_ops or _gradient_all_reduce(
                  placement, config, loss_reduction, build_tuning))),
          placement.tower_devices)
    spec = tower_build_lib.build(model_fn, features, labels, mode, params,
                                 config, placement, loss_reduction,
                                 tower_build, replicated, unsplit_features,
                                 build_tuning)
    if (mode == ModeKeys.TRAIN and replicated is not None and
        placement.num_workers > 1):
      # Every task initializes its own variables, then takes the chief's.
      spec = chief_broadcast.finish_train_spec(
          spec, config, placement.num_workers,
          len(placement.tower_devices))
    if mode == ModeKeys.TRAIN and placement.training_hooks:
      spec = spec._replace(training_hooks=(
          tuple(spec.training_hooks) + placement.training_hooks))
    return spec

  return replicated_model_fn


def _check_cross_tower_ops(cross_tower_ops, variable_placement):
  """Validates `replicate_model_fn`'s `cross_tower_ops` argument."""
  if cross_tower_ops is None:
    return
  if not isinstance(cross_tower_ops, cross_tower_base.CrossTowerOps):
    raise errors.InvalidTypeError(
        'cross_tower_ops must be a replicate.CrossTowerOps (e.g. '
        'replicate.NcclAllReduce()), got {!r} of type {}.'.format(
            cross_tower_ops, type(cross_tower_ops).__name__))
  if variable_placement != VariablePlacement.REPLICATED:
    raise errors.InvalidArgumentError(
        'cross_tower_ops={!r} all-reduces gradients between towers that own '
        'their variables, but variable_placement is {}, where the gradients '
        'are summed on the variables\' device. Pass variable_placement='
        'VariablePlacement.REPLICATED, or drop cross_tower_ops.'.format(
            cross_tower_ops, variable_placement.name))


def _gradient_all_reduce(placement, config, loss_reduction, tuning):
  """The `CrossTowerOps` that all-reduces REPLICATED towers' gradients.

  Across workers (`placement.num_workers > 1`): collective ops on TF's
  runtime. On one machine: `choose_the_best` for the tower devices (NCCL or
  hierarchical copy on GPUs, reduction to one device on CPUs).
  """
  if placement.num_workers > 1:
    return across_workers.gradient_all_reduce(placement.num_workers,
                                                 loss_reduction, tuning)
  session_config = (config.session_config
                    if isinstance(config, tf1.estimator.RunConfig) else None)
  return one_machine.best_for(placement.tower_devices, session_config,
                                 tuning)


def _canonical_devices(devices):
  """The user's `devices`, validated (device_check.check_device_list)."""
  return device_check.check_device_list(devices)


def _default_devices():
  return device_check.default_devices()


def _check_devices_exist(devices, config, warned):
  """Checks the towers' devices against the session the Estimator will run.

  That session's `session_config` is the Estimator's default
  (`allow_soft_placement: true`) when the user gave none: a missing device
  is then logged once per `replicate_model_fn` (`warned` keeps what was
  logged) and its tower runs elsewhere; without soft placement it is an
  error (see `device_check.check_devices_exist`).
  """
  if not isinstance(config, tf1.estimator.RunConfig):
    return  # Called outside an Estimator: the session is unknown.
  device_check.check_devices_exist(devices, config.session_config, warned)

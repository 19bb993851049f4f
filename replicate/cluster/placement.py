"""Placement of replicated towers in a TF cluster (between-graph training).

When an Estimator runs with `TF_CONFIG` naming a cluster, every training task
(`chief`, `worker` or `master`) builds its own graph (between-graph
replication). `replicate_model_fn` then builds its towers on the devices of
*this* task and, when the cluster has a `ps` job, puts the shared variables
on the parameter-server tasks, as `tf.compat.v1.train.replica_device_setter`
does for the unreplicated model:

* tower ops: `/job:<task_type>/task:<task_id>/device:CPU:<k>` (or `GPU:<k>`),
  one tower per local device;
* variables: `/job:ps/task:<j>/device:CPU:0`, `j` chosen round robin in
  creation order, or by a `ps_strategy` such as
  `tf.compat.v1.train.GreedyLoadBalancingStrategy`. Every worker builds the
  same graph in the same order, so every worker makes the same choice.

With `VariablePlacement.REPLICATED` and no `ps` job, every training task
keeps its own variables on its tower 0's device and the towers of all tasks
all-reduce their gradients (`Placement.num_workers` tasks; see
`chief_broadcast`).

This module only reads the Estimator's `RunConfig` (which reads `TF_CONFIG`)
and decides placement; it builds no ops.
"""
import numbers

from replicate import errors
from replicate._compat import ModeKeys
from replicate._compat import tf1
from replicate.cluster import cluster_check
from replicate.cluster import session_configs
from replicate.core import device_util
from replicate.towers import device_setter
from replicate.towers.device_setter import VariablePlacement

PS_JOB = 'ps'
# Jobs whose tasks run the training loop in between-graph replication.
TRAINER_JOBS = ('chief', 'master', 'worker')


class Placement(object):
  """Where one training task builds its towers and keeps its variables.

  Attributes:
    tower_devices: fully qualified devices, one tower each.
    choose_parameter_device: a function `op -> device` for stateful ops.
    aggregation_device: where the batch is split and results are gathered.
    training_hooks: hooks the TRAIN spec needs (cluster checks).
    num_workers: how many training tasks all-reduce their towers' gradients
      together (`VariablePlacement.REPLICATED` across workers); 1 on one
      machine.
  """

  __slots__ = ('tower_devices', 'choose_parameter_device',
               'aggregation_device', 'training_hooks', 'num_workers')

  def __init__(self, tower_devices, choose_parameter_device,
               aggregation_device, training_hooks=(), num_workers=1):
    self.tower_devices = tower_devices
    self.choose_parameter_device = choose_parameter_device
    self.aggregation_device = aggregation_device
    self.training_hooks = tuple(training_hooks)
    self.num_workers = num_workers


def check_ps_strategy(ps_strategy, variable_placement):
  """Validates `replicate_model_fn`'s `ps_strategy` argument.

  Args:
    ps_strategy: `None`, or a callable `op -> ps task index`.
    variable_placement: the `VariablePlacement` it comes with.

  Raises:
    InvalidTypeError: if `ps_strategy` is not callable.
    InvalidArgumentError: if `ps_strategy` comes with `ROUND_ROBIN`, which
      never places variables on parameter servers.
  """
  if ps_strategy is None:
    return
  if not callable(ps_strategy):
    raise errors.InvalidTypeError(
        'ps_strategy must be a callable op -> ps task index, such as '
        'tf.compat.v1.train.GreedyLoadBalancingStrategy(num_ps, load_fn), '
        'got {!r} of type {}.'.format(ps_strategy, type(ps_strategy).__name__))
  if variable_placement == VariablePlacement.ROUND_ROBIN:
    raise errors.InvalidArgumentError(
        'ps_strategy={!r} chooses parameter-server tasks, but '
        'variable_placement=ROUND_ROBIN puts variables on the tower devices; '
        'use variable_placement=VariablePlacement.PARAMETER_SERVERS.'.format(
            ps_strategy))


def cluster_of(config):
  """The `(cluster_spec, task_type, task_id)` of a RunConfig, or `None`.

  Args:
    config: what the Estimator passed as `config` (a `RunConfig` or `None`).

  Returns:
    `None` when `config` names no cluster (local training), else the triple.
  """
  if not isinstance(config, tf1.estimator.RunConfig):
    return None
  cluster_spec = config.cluster_spec
  if not cluster_spec or not cluster_spec.jobs or not config.task_type:
    return None
  return cluster_spec, config.task_type, config.task_id or 0


def placement(config, mode, devices, variable_placement, ps_strategy=None):
  """Decides the placement of a replicated model from the Estimator's config.

  Args:
    config: the `RunConfig` the Estimator passed to `model_fn`, or `None`.
    mode: the `ModeKeys` being built. Only TRAIN graphs run on the cluster:
      an Estimator builds EVAL and PREDICT graphs for a local session.
    devices: canonical tower devices (local ones such as `/device:CPU:1`, or
      fully qualified ones such as `/job:worker/task:1/device:CPU:1`).
    variable_placement: a `VariablePlacement`.
    ps_strategy: `None` (round robin), or a callable `op -> ps task index`.

  Returns:
    A `Placement`, or `None` where the local, single-process placement
    applies (no cluster, or not training).

  Raises:
    InvalidArgumentError: if `PARAMETER_SERVERS` is asked for without a
      cluster that has a `ps` job, `ROUND_ROBIN` is asked for in a cluster
      with one, `REPLICATED` is asked for in a cluster with a `ps` job or,
      across several training tasks, without the collective session config
      (`replicate.multi_worker.all_reduce_run_config`), a device names a job
      or task the cluster does not have, or this task is not a training task.
  """
  cluster = cluster_of(config) if mode == ModeKeys.TRAIN else None
  wants_ps = variable_placement == VariablePlacement.PARAMETER_SERVERS
  if cluster is None:
    if wants_ps and mode == ModeKeys.TRAIN:
      raise errors.InvalidArgumentError(
          'variable_placement=PARAMETER_SERVERS needs a cluster with a "ps" '
          'job, but the RunConfig names no cluster (TF_CONFIG is unset or has '
          'no "cluster"). Set TF_CONFIG, e.g. {"cluster": {"ps": '
          '["host0:2222"], "chief": ["host1:2222"], "worker": '
          '["host2:2222"]}, "task": {"type": "worker", "index": 0}}, before '
          'creating the RunConfig, or use CONSOLIDATION_DEVICE.')
    if ps_strategy is not None and mode == ModeKeys.TRAIN:
      raise errors.InvalidArgumentError(
          'ps_strategy={!r} needs a cluster with a "ps" job, but the RunConfig '
          'names no cluster (TF_CONFIG is unset or has no "cluster"); set '
          'TF_CONFIG or drop ps_strategy.'.format(ps_strategy))
    return None

  cluster_spec, task_type, task_id = cluster
  jobs = sorted(cluster_spec.jobs)
  if task_type not in TRAINER_JOBS:
    raise errors.InvalidArgumentError(
        'This task is {!r} (task {}), which does not train; '
        'replicate_model_fn builds TRAIN graphs only on the {} tasks. Run '
        'parameter servers with tf.compat.v1.train.Server(...).join() and '
        'evaluators with an "evaluator" task outside the cluster.'.format(
            task_type, task_id, '/'.join(TRAINER_JOBS)))
  has_ps = PS_JOB in jobs
  if wants_ps and not has_ps:
    raise errors.InvalidArgumentError(
        'variable_placement=PARAMETER_SERVERS needs a "ps" job in the '
        'cluster, but TF_CONFIG\'s cluster has only the jobs {}. Add '
        '"ps": ["host:port", ...] to the cluster in TF_CONFIG, or use '
        'VariablePlacement.CONSOLIDATION_DEVICE.'.format(jobs))
  if has_ps and variable_placement == VariablePlacement.ROUND_ROBIN:
    raise errors.InvalidArgumentError(
        'variable_placement=ROUND_ROBIN spreads variables over this task\'s '
        'tower devices, but the cluster has a "ps" job, so the variables '
        'must live on the parameter servers to be shared by the workers. Use '
        'VariablePlacement.PARAMETER_SERVERS (with ps_strategy= to balance '
        'them), or remove "ps" from TF_CONFIG.')
  if ps_strategy is not None and not has_ps:
    raise errors.InvalidArgumentError(
        'ps_strategy={!r} needs a "ps" job in the cluster, but TF_CONFIG\'s '
        'cluster has only the jobs {}; add a "ps" job or drop ps_strategy.'
        .format(ps_strategy, jobs))
  replicated = variable_placement == VariablePlacement.REPLICATED
  if replicated and has_ps:
    raise errors.InvalidArgumentError(
        'variable_placement=REPLICATED keeps a copy of every variable on '
        'every training task and all-reduces the gradients, but the cluster '
        'has a "ps" job ({} task(s)), whose variables the workers would '
        'share instead. Remove "ps" from TF_CONFIG\'s cluster to all-reduce '
        'across the chief and workers, or use '
        'VariablePlacement.PARAMETER_SERVERS.'.format(
            cluster_spec.num_tasks(PS_JOB)))

  task_prefix = '/job:{}/task:{}'.format(task_type, task_id)
  tower_devices = [
      qualified_device(d, task_prefix, cluster_spec) for d in devices]
  aggregation_device = _local_consolidation_device(tower_devices, task_prefix)
  if replicated:
    num_workers = len(session_configs.training_tasks(cluster_spec))
    if num_workers > 1:
      session_configs.check_session_config(config, cluster_spec, task_type,
                                             task_id)
    hooks = [cluster_check.make_hook(
        config, tower_devices,
        session_configs.training_tasks(cluster_spec))]
    # Tower 0's device holds the task's own variables; every training task
    # has its own copy, and the towers of all tasks all-reduce gradients.
    return Placement(tower_devices, lambda unused_op: tower_devices[0],
                     aggregation_device, hooks, num_workers=num_workers)
  hooks = [cluster_check.make_hook(config, tower_devices)]
  if not has_ps:
    # No parameter servers: each task keeps its own variables on its own
    # consolidation device (what cross-worker all-reduce strategies build on).
    if variable_placement == VariablePlacement.ROUND_ROBIN:
      choose = device_setter.parameter_device_chooser(variable_placement,
                                                      tower_devices)
    else:
      choose = lambda unused_op: aggregation_device
    return Placement(tower_devices, choose, aggregation_device, hooks)
  num_ps = cluster_spec.num_tasks(PS_JOB)
  return Placement(tower_devices, ParameterServerChooser(num_ps, ps_strategy),
                   aggregation_device, hooks)


def _local_consolidation_device(tower_devices, task_prefix):
  local = device_setter.consolidation_device(
      [_strip_task(d) for d in tower_devices])
  return device_util.normalize(task_prefix + local)


def _strip_task(device):
  spec = device_util.parse(device)
  return tf1.DeviceSpec(device_type=spec.device_type,
                        device_index=spec.device_index).to_string()


def qualified_device(device, task_prefix, cluster_spec):
  """Qualifies a local device with this task, or checks a qualified one.

  Args:
    device: a canonical device string.
    task_prefix: `/job:<type>/task:<id>` of this task.
    cluster_spec: the cluster.

  Returns:
    The fully qualified device string.

  Raises:
    InvalidArgumentError: if `device` names a job or task the cluster lacks.
  """
  spec = device_util.parse(device)
  if spec.job is None:
    return device_util.normalize(task_prefix + device)
  jobs = sorted(cluster_spec.jobs)
  if spec.job not in jobs:
    raise errors.InvalidArgumentError(
        'Device {!r} names the job {!r}, which is not in the cluster (its '
        'jobs are {}). Use a local device such as "/device:CPU:0" (placed on '
        'this task) or one of the cluster\'s jobs, and check TF_CONFIG.'
        .format(device, spec.job, jobs))
  if spec.job == PS_JOB:
    raise errors.InvalidArgumentError(
        'Device {!r} puts a tower on a parameter server; towers run on the '
        'training tasks ({}). Pass local devices such as "/device:CPU:0".'
        .format(device, '/'.join(TRAINER_JOBS)))
  num_tasks = cluster_spec.num_tasks(spec.job)
  if spec.task is None or not 0 <= spec.task < num_tasks:
    raise errors.InvalidArgumentError(
        'Device {!r} needs a task index of job {!r} in [0, {}) (the cluster '
        'has {} {!r} task(s)); write e.g. "/job:{}/task:0/device:CPU:0".'
        .format(device, spec.job, num_tasks, num_tasks, spec.job, spec.job))
  return spec.to_string()


class ParameterServerChooser(object):
  """Chooses a parameter-server task for each stateful op.

  Round robin over the `ps` tasks in creation order, or the task returned by
  `ps_strategy(op)`. Every variable lives on `/job:ps/task:<j>/device:CPU:0`.
  """

  def __init__(self, num_ps, ps_strategy=None):
    self._num_ps = num_ps
    self._ps_strategy = ps_strategy
    self._next = 0

  def __call__(self, op):
    """Returns the device of `op`.

    Args:
      op: the stateful `Operation` (or `NodeDef`) being placed.

    Returns:
      A device string `/job:ps/task:<j>/device:CPU:0`.

    Raises:
      InvalidArgumentError: if `ps_strategy` returns no valid task index.
    """
    if self._ps_strategy is None:
      task = self._next
      self._next = (self._next + 1) % self._num_ps
    else:
      task = self._ps_strategy(op)
      # Accepts NumPy integers too: GreedyLoadBalancingStrategy returns one.
      if (isinstance(task, bool) or not isinstance(task, numbers.Integral) or
          not 0 <= task < self._num_ps):
        raise errors.InvalidArgumentError(
            'ps_strategy returned {!r} for op {!r}; it must return a ps task '
            'index in [0, {}) (the cluster has {} ps task(s)).'.format(
                task, op.name, self._num_ps, self._num_ps))
    return '/job:{}/task:{}/device:CPU:0'.format(PS_JOB, int(task))


def byte_size_load_fn(op):
  """The bytes a variable op holds, for `GreedyLoadBalancingStrategy`.

  Args:
    op: a variable `Operation` (`VariableV2`, `VarHandleOp`, ...) with `shape`
      and `dtype` attributes.

  Returns:
    The number of bytes (unknown dimensions count as 1).

  Raises:
    InvalidArgumentError: if `op` has no `shape` and `dtype` attributes.
  """
  try:
    shape = tf1.TensorShape(op.get_attr('shape'))
    dtype = tf1.as_dtype(op.get_attr('dtype'))
  except (ValueError, AttributeError) as e:
    raise errors.InvalidArgumentError(
        'byte_size_load_fn weighs variable ops with shape and dtype '
        'attributes, but op {!r} of type {!r} has none ({}); pass a load_fn '
        'that handles it.'.format(getattr(op, 'name', op),
                                  getattr(op, 'type', None), e))
  num_elements = 1
  for dim in (shape.as_list() if shape.rank is not None else []):
    num_elements *= dim or 1
  return num_elements * dtype.size


class GreedyLoadBalancingStrategy(object):
  """A `ps_strategy`: each variable goes to the least loaded ps task.

  Same name and signature as the one TF 1.x contrib.training had. Every worker builds the
  same graph in the same order, so every worker makes the same choices.

      replicate.replicate_model_fn(
          model_fn,
          variable_placement=replicate.VariablePlacement.PARAMETER_SERVERS,
          ps_strategy=replicate.GreedyLoadBalancingStrategy(
              num_tasks=2, load_fn=replicate.byte_size_load_fn))
  """

  def __init__(self, num_tasks, load_fn=byte_size_load_fn):
    """Creates the strategy.

    Args:
      num_tasks: how many ps tasks the cluster has.
      load_fn: a function `op -> load` (a number), e.g. `byte_size_load_fn`.

    Raises:
      InvalidArgumentError: if `num_tasks` is not a positive integer.
      InvalidTypeError: if `load_fn` is not callable.
    """
    if (isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or
        num_tasks < 1):
      raise errors.InvalidArgumentError(
          'num_tasks must be a positive integer (the number of ps tasks), got '
          '{!r}.'.format(num_tasks))
    if not callable(load_fn):
      raise errors.InvalidTypeError(
          'load_fn must be a callable op -> load, such as '
          'replicate.byte_size_load_fn, got {!r}.'.format(load_fn))
    self._load_fn = load_fn
    self._loads = [0] * num_tasks

  def __call__(self, op):
    """Returns the least loaded task (the lowest index on ties) and loads it."""
    task = min(range(len(self._loads)), key=lambda i: (self._loads[i], i))
    self._loads[task] += self._load_fn(op)
    return task

"""Devices and session configs for all-reduce across the workers of a cluster.

Two ways to run `MirroredStrategy` over several workers:

* **In-graph** (one client drives every worker): a `MirroredStrategy` over
  `worker_devices(cluster_spec, n)`, the devices of all workers, with
  `MultiWorkerAllReduce(worker_tasks(cluster_spec), ...)` as its
  cross_tower_ops. One session, on any worker.
* **Between-graph** (each worker runs its own client, as with TF_CONFIG): on
  worker `i`, a `MirroredStrategy` over `worker_devices(cluster_spec, n,
  task_id=i)` with `CollectiveAllReduce(num_workers=...)`; the workers'
  collective ops meet at run time. Each worker's servers and sessions need
  `collective_config(cluster_spec, 'worker', i)`: the same group leader
  everywhere, and device filters that keep each worker's session to its own
  task (without them one worker's end-of-step cleanup aborts the other
  worker's collectives on TF 1.15). Variables are not broadcast: every worker
  must start from the same values (deterministic or seeded initializers, or a
  checkpoint).

For Estimators, `replicate_model_fn(...,
variable_placement=VariablePlacement.REPLICATED)` in a `TF_CONFIG` cluster
without a `ps` job all-reduces across the chief and workers (between-graph);
`all_reduce_run_config` and `all_reduce_server` give each task the session
and server config that needs.

These helpers compute names and protos and build no ops, except
`wait_for_tasks`, which waits (for a bounded time) until tasks of a cluster
answer as TensorFlow servers, as `replicate_model_fn`'s `ClusterCheckHook`
does before a training session is created, and `all_reduce_server`, which
starts a server. `gradient_all_reduce` (re-exported from
replicate/cross_tower/across_workers.py) is the `CrossTowerOps` that
`replicate_model_fn` uses across tasks (packed collectives, averaged over
tasks).
"""



from replicate import errors
from replicate._compat import tf1
from replicate.cluster import cluster_check
from replicate.cluster import session_configs
from replicate.cross_tower import across_workers


def _check_job(cluster_spec, job):
  if not isinstance(cluster_spec, tf1.train.ClusterSpec):
    raise errors.InvalidTypeError(
        'cluster_spec must be a tf.compat.v1.train.ClusterSpec, got {!r} of '
        'type {}; build one with tf.compat.v1.train.ClusterSpec({{"worker": '
        '[...]}}).'.format(cluster_spec, type(cluster_spec).__name__))
  jobs = sorted(cluster_spec.jobs)
  if not isinstance(job, str) or job not in jobs:
    raise errors.InvalidArgumentError(
        'Job {!r} is not in the cluster (its jobs are {}); pass one of them, '
        'or add the job to the cluster spec (TF_CONFIG).'.format(job, jobs))
  return cluster_spec.task_indices(job)


def worker_tasks(cluster_spec, job='worker'):
  """The task names of a job: `['/job:worker/task:0', ...]`.

  This is what `MultiWorkerAllReduce(worker_devices=...)` takes.

  Args:
    cluster_spec: a `tf.compat.v1.train.ClusterSpec`.
    job: the job whose tasks train.

  Returns:
    A list of strings, in task order.

  Raises:
    InvalidTypeError: if `cluster_spec` is not a `ClusterSpec`.
    InvalidArgumentError: if `job` is not in the cluster.
  """
  return ['/job:{}/task:{}'.format(job, i)
          for i in _check_job(cluster_spec, job)]


def worker_devices(cluster_spec, num_devices_per_worker, device_type='CPU',
                   job='worker', task_id=None):
  """Fully qualified devices of a job's tasks, `num_devices_per_worker` each.

  Args:
    cluster_spec: a `tf.compat.v1.train.ClusterSpec`.
    num_devices_per_worker: devices per task, e.g. its number of GPUs.
    device_type: `'GPU'` or `'CPU'`.
    job: the job whose tasks train.
    task_id: `None` for every task (in-graph), or one task (between-graph).

  Returns:
    A list such as `['/job:worker/task:0/device:GPU:0', ...]`, task-major.

  Raises:
    InvalidTypeError: if `cluster_spec` is not a `ClusterSpec`.
    InvalidArgumentError: if `job` or `task_id` is not in the cluster, or
      `num_devices_per_worker` is not a positive integer, or `device_type`
      is neither CPU nor GPU.
  """
  tasks = _check_job(cluster_spec, job)
  if (isinstance(num_devices_per_worker, bool) or
      not isinstance(num_devices_per_worker, int) or
      num_devices_per_worker < 1):
    raise errors.InvalidArgumentError(
        'num_devices_per_worker must be a positive integer, got {!r}.'.format(
            num_devices_per_worker))
  if device_type not in ('CPU', 'GPU'):
    raise errors.InvalidArgumentError(
        'device_type must be "CPU" or "GPU", got {!r}.'.format(device_type))
  if task_id is not None:
    if task_id not in tasks:
      raise errors.InvalidArgumentError(
          'task_id {!r} is not a task of job {!r} (its tasks are {}).'.format(
              task_id, job, list(tasks)))
    tasks = [task_id]
  return ['/job:{}/task:{}/device:{}:{}'.format(job, t, device_type, d)
          for t in tasks for d in range(num_devices_per_worker)]


def collective_config(cluster_spec, job, task_id, config=None):
  """The session/server config of one worker using `CollectiveAllReduce`.

  Pass it both to the worker's `tf.compat.v1.train.Server(config=...)` and
  to its sessions (or `RunConfig(session_config=...)`).

  Args:
    cluster_spec: a `tf.compat.v1.train.ClusterSpec`.
    job: this worker's job.
    task_id: this worker's task index.
    config: a `ConfigProto` to start from (not modified), e.g. one with
      `device_count`; `None` for an empty one.

  Returns:
    A new `ConfigProto` whose collective group leader is task 0 of `job`
    and whose device filters keep the session to this task.

  Raises:
    InvalidTypeError: if `cluster_spec` is not a `ClusterSpec`.
    InvalidArgumentError: if `job` or `task_id` is not in the cluster.
  """
  tasks = _check_job(cluster_spec, job)
  if task_id not in tasks:
    raise errors.InvalidArgumentError(
        'task_id {!r} is not a task of job {!r} (its tasks are {}).'.format(
            task_id, job, list(tasks)))
  result = tf1.ConfigProto()
  if config is not None:
    result.CopyFrom(config)
  result.experimental.collective_group_leader = (
      '/job:{}/replica:0/task:{}'.format(job, min(tasks)))
  del result.device_filters[:]
  result.device_filters.append('/job:{}/task:{}'.format(job, task_id))
  return result


def wait_for_tasks(cluster_spec, tasks, timeout_secs):
  """Waits until tasks of a cluster answer as TF servers, or raises.

  A task answers when its port accepts connections and a TensorFlow session
  on it lists its devices, so a task that is down, a wrong port, and another
  program on the port all fail, each by the deadline. Use it before a raw
  session on a remote task, whose creation TF does not bound (e.g. a
  worker that waits for the chief's initialization on the ps, as
  examples/local_cluster.py does).

  Args:
    cluster_spec: a `tf.compat.v1.train.ClusterSpec`.
    tasks: `(job, task_index)` pairs, e.g. `[('ps', 0)]`.
    timeout_secs: how long to wait in all, e.g.
      `session_config.operation_timeout_in_ms / 1000`.

  Raises:
    InvalidTypeError: if `cluster_spec` is not a `ClusterSpec`.
    InvalidArgumentError: if a task is not in the cluster, or
      `timeout_secs` is not a positive number.
    UnavailableError: naming each task that did not answer by the deadline,
      its address and what went wrong.
  """
  for job, index in tasks:
    if index not in _check_job(cluster_spec, job):
      raise errors.InvalidArgumentError(
          'Task {!r} of job {!r} is not in the cluster (its tasks are '
          '{}).'.format(index, job, list(cluster_spec.task_indices(job))))
  if (isinstance(timeout_secs, bool) or
      not isinstance(timeout_secs, (int, float)) or timeout_secs <= 0):
    raise errors.InvalidArgumentError(
        'timeout_secs must be a positive number of seconds, got {!r}.'.format(
            timeout_secs))
  cluster_check.wait_for_tasks(cluster_spec, list(tasks), timeout_secs)


def _check_run_config(run_config):
  if not isinstance(run_config, tf1.estimator.RunConfig):
    raise errors.InvalidTypeError(
        'run_config must be a tf.compat.v1.estimator.RunConfig, got {!r} of '
        'type {}.'.format(run_config, type(run_config).__name__))
  cluster_spec = run_config.cluster_spec
  if (not cluster_spec or not cluster_spec.jobs or
      run_config.task_type not in ('chief', 'master', 'worker')):
    raise errors.InvalidArgumentError(
        'All-reduce across tasks needs a RunConfig of a training task of a '
        'cluster (TF_CONFIG with a "cluster" and a "task" of type chief, '
        'master or worker, set before the RunConfig is created); this one '
        'has cluster {} and task type {!r}.'.format(
            cluster_spec.as_dict() if cluster_spec else {},
            run_config.task_type))
  return cluster_spec


def all_reduce_run_config(run_config=None):
  """A RunConfig whose sessions can all-reduce with the other tasks.

  For `replicate_model_fn(..., variable_placement=REPLICATED)` in a cluster
  without a `ps` job. The session config (the RunConfig's, or the
  Estimator's default for clusters) gets the collective group leader every
  task names (the chief, else the first worker), device filters that keep
  the session to this task, and `operation_timeout_in_ms` (60 s where it has
  none) so that a lost task ends training with an error, not a hang.

      run_config = replicate.multi_worker.all_reduce_run_config(
          tf.compat.v1.estimator.RunConfig(session_creation_timeout_secs=600))
      server = replicate.multi_worker.all_reduce_server(run_config)
      estimator = tf.compat.v1.estimator.Estimator(model_fn, config=run_config)
      estimator.train(input_fn, max_steps=...)

  Args:
    run_config: a `RunConfig` that read `TF_CONFIG`; `None` for
      `RunConfig()`.

  Returns:
    A new `RunConfig` (`run_config.replace(session_config=...)`).

  Raises:
    InvalidTypeError: if `run_config` is not a `RunConfig`.
    InvalidArgumentError: if it names no cluster or is not a training task.
  """
  if run_config is None:
    run_config = tf1.estimator.RunConfig()
  cluster_spec = _check_run_config(run_config)
  return run_config.replace(
      session_config=session_configs.all_reduce_session_config(
          cluster_spec, run_config.task_type, run_config.task_id or 0,
          run_config.session_config))


def all_reduce_server(run_config):
  """Starts this task's server with the config collectives need.

  TF resolves collective groups with the server's own config, so the
  server needs the group leader too; `tf.estimator.train_and_evaluate`
  starts servers without it, so start the server with this and call
  `Estimator.train` (keep the returned server alive while training).

  Args:
    run_config: the `RunConfig` from `all_reduce_run_config`.

  Returns:
    A started `tf.compat.v1.train.Server`.

  Raises:
    InvalidTypeError: if `run_config` is not a `RunConfig`.
    InvalidArgumentError: if it names no cluster, is not a training task, or
      its session config names no collective group leader.
  """
  cluster_spec = _check_run_config(run_config)
  session_config = run_config.session_config
  if (session_config is None or
      not session_config.experimental.collective_group_leader):
    raise errors.InvalidArgumentError(
        'The RunConfig\'s session config names no collective group leader; '
        'pass the RunConfig through '
        'replicate.multi_worker.all_reduce_run_config first.')
  return tf1.train.Server(
      cluster_spec, job_name=run_config.task_type,
      task_index=run_config.task_id or 0, config=session_config,
      protocol=run_config.protocol)


# The cross-task all-reduce lives with the other reductions; users reach it
# here, next to the configs it needs.
gradient_all_reduce = across_workers.gradient_all_reduce
WorkerAllReduce = across_workers.WorkerAllReduce

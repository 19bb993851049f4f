"""Session configs for training tasks that all-reduce without parameter servers.

With `VariablePlacement.REPLICATED` in a cluster without a `ps` job, every
training task (chief or master, and the workers) runs its own graph, and the
towers of all tasks meet in TF collective ops. Two settings make that work;
without them the collectives wait forever:

* `experimental.collective_group_leader` names the same task on every task,
  in the session config AND in the config of the task's
  `tf.compat.v1.train.Server` (the server resolves collective groups with
  its own config): here the first training task, `/job:chief/replica:0/
  task:0` when there is a chief;
* `device_filters` keep each task's session to its own task: without them,
  on TF 1.15, one task's end-of-step cleanup aborts another task's
  collectives.

This module computes and checks those settings; it builds no ops.
"""
from replicate import errors
from replicate._compat import tf1
from replicate.core import device_util

# Training jobs in the order their first task becomes the group leader and
# the source of the initial values.
_LEADER_JOBS = ('chief', 'master', 'worker')
# The operation timeout all_reduce_session_config sets where none is given.
DEFAULT_OPERATION_TIMEOUT_MS = 60000


def training_tasks(cluster_spec):
  """The `(job, index)` pairs of a cluster's training tasks, leader first.

  Args:
    cluster_spec: a `tf.compat.v1.train.ClusterSpec`.

  Returns:
    A list of pairs: chief, master, then worker tasks, each job in task order.
  """
  jobs = set(cluster_spec.jobs)
  return [(job, index) for job in _LEADER_JOBS if job in jobs
          for index in sorted(cluster_spec.task_indices(job))]


def group_leader(cluster_spec):
  """The collective group leader every training task must name.

  Args:
    cluster_spec: a `tf.compat.v1.train.ClusterSpec` with a training task.

  Returns:
    A string such as `'/job:chief/replica:0/task:0'`.

  Raises:
    InvalidArgumentError: if the cluster has no training task.
  """
  tasks = training_tasks(cluster_spec)
  if not tasks:
    raise errors.InvalidArgumentError(
        'The cluster has no training task (jobs {}); all-reduce across '
        'tasks needs a "chief" or "worker" job in TF_CONFIG.'.format(
            sorted(cluster_spec.jobs)))
  return '/job:{}/replica:0/task:{}'.format(*tasks[0])


def all_reduce_session_config(cluster_spec, task_type, task_id, config=None):
  """The session (and server) config of one task that all-reduces.

  Args:
    cluster_spec: the `tf.compat.v1.train.ClusterSpec`.
    task_type: this task's job.
    task_id: this task's index.
    config: a `ConfigProto` to start from (not modified); `None` for the
      Estimator's default for clusters (soft placement allowed).

  Returns:
    A new `ConfigProto` naming the group leader, filtered to this task, and
    with `operation_timeout_in_ms` set (`DEFAULT_OPERATION_TIMEOUT_MS` where
    `config` has none) so that a lost task ends in an error, not a hang.
  """
  result = tf1.ConfigProto(allow_soft_placement=True)
  if config is not None:
    result.CopyFrom(config)
  result.experimental.collective_group_leader = group_leader(cluster_spec)
  del result.device_filters[:]
  result.device_filters.append('/job:{}/task:{}'.format(task_type, task_id))
  if result.operation_timeout_in_ms <= 0:
    result.operation_timeout_in_ms = DEFAULT_OPERATION_TIMEOUT_MS
  return result


def check_session_config(config, cluster_spec, task_type, task_id):
  """Raises unless the RunConfig's session config lets collectives meet.

  Args:
    config: the Estimator's `RunConfig`.
    cluster_spec: its cluster.
    task_type: this task's job.
    task_id: this task's index.

  Raises:
    InvalidArgumentError: if the session config names no group leader, or
      another one than the first training task, or lets the session reach
      other training tasks; the message names the helper that fixes it.
  """
  session_config = config.session_config or tf1.ConfigProto()
  expected = group_leader(cluster_spec)
  leader = session_config.experimental.collective_group_leader
  fix = (
      'Build the RunConfig with replicate.multi_worker.all_reduce_run_config('
      'tf.compat.v1.estimator.RunConfig(...)) and start this task\'s server '
      'with replicate.multi_worker.all_reduce_server(run_config) (the '
      'server needs the same config: tf.estimator.train_and_evaluate starts '
      'servers without it).')
  if not leader:
    raise errors.InvalidArgumentError(
        'variable_placement=REPLICATED across {} training tasks all-reduces '
        'with TF collective ops, which need session_config.experimental.'
        'collective_group_leader to name the same task on every task '
        '(without it they wait forever); the RunConfig\'s session config '
        'names none. {}'.format(len(training_tasks(cluster_spec)), fix))
  if not _same_task(leader, expected):
    raise errors.InvalidArgumentError(
        'session_config.experimental.collective_group_leader is {!r}, but '
        'every training task must name the first one, {!r} (the chief, '
        'else the first worker), or the tasks\' collectives never meet. '
        '{}'.format(leader, expected, fix))
  others = [t for t in training_tasks(cluster_spec)
            if t != (task_type, task_id)]
  filters = list(session_config.device_filters)
  reached = [t for t in others
             if not filters or any(_matches(f, *t) for f in filters)]
  if reached:
    raise errors.InvalidArgumentError(
        'session_config.device_filters {} let the session of /job:{}/task:{} '
        'reach the training task(s) {}; with all-reduce each task\'s session '
        'must be filtered to its own task (else, on TF 1.15, one task\'s '
        'end-of-step cleanup aborts the others\' collectives). {}'.format(
            filters, task_type, task_id,
            ', '.join('/job:{}/task:{}'.format(*t) for t in reached), fix))


def _same_task(a, b):
  spec_a = device_util.parse(a, 'collective_group_leader')
  spec_b = device_util.parse(b, 'collective_group_leader')
  return (spec_a.job, spec_a.task) == (spec_b.job, spec_b.task)


def _matches(device_filter, job, index):
  spec = device_util.parse(device_filter, 'device filter')
  return ((spec.job is None or spec.job == job) and
          (spec.task is None or spec.task == index))

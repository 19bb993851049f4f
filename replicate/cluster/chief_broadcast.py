"""The TRAIN spec of a task that all-reduces with other tasks (no ps).

With `VariablePlacement.REPLICATED` in a cluster without parameter servers,
every training task builds its own graph and keeps its own variables, on its
own task. TF's `MonitoredTrainingSession` assumes that the chief
initializes (or restores) the model's global variables for everybody and
that the other workers wait until they are ready, which here they never
would be: nobody but the task itself can initialize its variables. So the
scaffold of every task's TRAIN spec gets a `local_init_op` (which both the
chief's and the workers' session creation run, after the chief's restore or
initialization and before any hook's `after_create_session`) that

* on a non-chief task, initializes the task's own global variables; its
  `ready_for_local_init_op` is empty, so that it runs at once;
* on every task, then broadcasts the first training task's (the chief's)
  global variables to all tasks: trained variables, optimizer slots and the
  global step, restored from a checkpoint or freshly initialized. The
  broadcast is one collective all-reduce of every value (cast to float64,
  which holds every float32, int32 and int64 below 2**53 exactly) where the
  chief gives its values and the others zeros. It also carries each task's
  number of towers: tasks that differ there would otherwise first meet in
  the gradients' all-reduce, with TF's "has group_size 2 ... but that group
  has size 4" on one task and a timeout on the other.

The global steps then start equal and advance in lockstep (every step's
gradients are all-reduced over all tasks), before any hook reads them (a
`StopAtStepHook(num_steps=...)` included). Checkpoints and summaries are the
chief's: `MonitoredTrainingSession` writes them on the chief only.

A lost task makes the others' collectives fail: after
`operation_timeout_in_ms` with a `DeadlineExceededError` (TF 1.15), or at once
with an `UnavailableError` (TF 2.15). `MonitoredSession` takes the latter for
a preemption and creates the session again, forever, while TF's collective
executor stays aborted for the life of the process. So the `local_init_op`
first runs a guard (a `py_func`, in this process) that lets the session be
created once per graph: a second creation raises `UnavailableError` naming
the training tasks that no longer accept connections. Restarting every task
resumes from the chief's last checkpoint.
"""
import hashlib

import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.cluster import cluster_check
from replicate.cluster import session_configs
from replicate.core import logs as logging

# Collective keys of the broadcast: far from those `CollectiveKeys` hands
# out to the gradients' all-reduce (group keys from 1, instance keys from
# 100), equal on every task.
BROADCAST_GROUP_KEY = 1 << 30
BROADCAST_INSTANCE_KEY = 1 << 30
_CASTABLE = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8,
             tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.bool)


def finish_train_spec(spec, config, num_workers, num_towers):
  """Gives a TRAIN `EstimatorSpec` the scaffold of an all-reducing task.

  Call it at the end of `model_fn`, once every global variable exists.

  Args:
    spec: the TRAIN `EstimatorSpec` of this task's replicated model.
    config: the Estimator's `RunConfig` (a training task of a cluster).
    num_workers: how many training tasks all-reduce together (> 1).
    num_towers: how many towers this task has (every task must have as
      many).

  Returns:
    The spec with a new scaffold (the spec's own fields kept, its
    `local_init_op` run after the broadcast).
  """
  cluster_spec = config.cluster_spec
  task = (config.task_type, config.task_id or 0)
  training_tasks = session_configs.training_tasks(cluster_spec)
  is_source = task == training_tasks[0]
  device = '/job:{}/task:{}/device:CPU:0'.format(*task)
  variables = tf1.global_variables()
  scaffold = spec.scaffold or tf1.train.Scaffold()
  with tf1.name_scope('replicate_all_reduce_start'):
    with tf1.device(device):
      guard = tf1.py_func(
          _OneSession(cluster_spec, task), [], tf.bool, stateful=True,
          name='one_session_per_graph')
    with tf1.control_dependencies([guard]):
      initialize = tf.no_op()
      if not config.is_chief:
        initialize = tf1.variables_initializer(variables,
                                               name='own_variables')
      broadcast = broadcast_variables(
          variables, is_source, device, num_workers, after=initialize,
          towers=(training_tasks.index(task), num_towers))
    local_init = scaffold.local_init_op
    if local_init is None:
      local_init = tf1.train.Scaffold.default_local_init_op()
    with tf1.control_dependencies([broadcast]):
      local_init_op = tf.group(local_init, name='local_init')
    ready_for_local_init_op = None
    if not config.is_chief:
      # Nobody else initializes this task's variables: run at once.
      ready_for_local_init_op = tf.constant([], tf.string,
                                            name='ready_for_local_init')
  return spec._replace(scaffold=tf1.train.Scaffold(
      local_init_op=local_init_op,
      ready_for_local_init_op=ready_for_local_init_op,
      copy_from_scaffold=scaffold))


class _OneSession(object):
  """The `py_func` that lets a task's training session be created once.

  Raises `UnavailableError` (an `errors.UnavailableError`, which TF's
  `py_func` reports as an `UnknownError` that `MonitoredSession` does not
  retry) from the second call on.
  """

  def __init__(self, cluster_spec, task):
    self._cluster_spec = cluster_spec
    self._task = task
    self._calls = 0

  def __call__(self):
    self._calls += 1
    if self._calls == 1:
      return True
    others = [t for t in session_configs.training_tasks(self._cluster_spec)
              if t != self._task]
    lost = cluster_check.unreachable_tasks(self._cluster_spec, others)
    message = (
        'The training session of /job:{}/task:{} is being created again after '
        'an error (TF retries UnavailableError and AbortedError, e.g. when a '
        'task of the cluster is lost). Training that all-reduces across '
        'tasks cannot resume in this process: TF\'s collective executor stays '
        'aborted after such an error. {} Restart every task; training resumes '
        'from the chief\'s last checkpoint.'.format(
            self._task[0], self._task[1],
            'Tasks that no longer accept connections: {}.'.format(', '.join(
                '/job:{}/task:{} at {}'.format(
                    job, index, self._cluster_spec.task_address(job, index))
                for job, index in lost)) if lost else
            'Every other training task still accepts connections.'))
    logging.log(logging.ERROR, '%s', message)
    raise errors.UnavailableError(message)


def model_fingerprint(variables):
  """A 52-bit hash of the variables' names, shapes and dtypes, in order
  (held exactly by a float64)."""
  described = '|'.join('{}:{}:{}'.format(
      v.op.name, v.shape.as_list(), v.dtype.base_dtype.name)
                       for v in variables)
  return float(int(hashlib.sha256(described.encode()).hexdigest()[:13], 16))


def broadcast_variables(variables, is_source, device, group_size,
                        after=None, towers=None):
  """An op setting `variables` to the source task's values on every task.

  Every task must call it with the same variables in the same order (the
  same graph) and run it at the same time; the op fails on a task whose
  variables' names, shapes, dtypes or order differ from the source's, and,
  given `towers`, on every task when the tasks' numbers of towers differ.

  Args:
    variables: this task's variables.
    is_source: whether this task's values are the ones everybody takes.
    device: this task's CPU, where the collective runs.
    group_size: how many tasks take part.
    after: an op the assignments wait for (this task's initializer), or
      None.
    towers: (this task's index among the `group_size` tasks, its number of
      towers), or None to check no tower counts.

  Returns:
    An op.
  """
  kept = [v for v in variables
          if v.dtype.base_dtype in _CASTABLE and v.shape.is_fully_defined()]
  skipped = [v.op.name for v in variables if v not in kept]
  if skipped:
    logging.warning(
        'All-reduce training: variables %s have a dtype or shape a broadcast '
        'cannot carry; they keep each task\'s own initial values.', skipped)
  if not kept:
    return tf.no_op()
  # The source's fingerprint of its variables travels first: the values
  # are matched by position, so tasks that made the same variables in
  # another order would silently take each other's (the gradients'
  # all-reduce matches by position too).
  fingerprint = model_fingerprint(kept)
  # Then one slot per task, where each task puts its number of towers.
  counts = []
  if towers is not None:
    index, num_towers = towers
    counts = [float(num_towers) if i == index else 0.
              for i in range(group_size)]
  header = [fingerprint if is_source else 0.] + counts
  with tf1.device(device):
    if is_source:
      values = [tf.reshape(tf.cast(v.read_value(), tf.float64), [-1])
                for v in kept]
    else:
      values = [tf.zeros([sum(v.shape.num_elements() for v in kept)],
                         tf.float64)]
    flat = tf.concat([tf.constant(header, tf.float64)] + values, axis=0)
    total = _compat.collective_all_reduce(
        flat, group_size, BROADCAST_GROUP_KEY, BROADCAST_INSTANCE_KEY, 'Add',
        'Id')
    checks = []
    if towers is not None:
      checks.append(tf1.assert_equal(
          total[1:1 + group_size],
          tf.fill([group_size], tf.constant(counts[index], tf.float64)),
          message=(
              'The training tasks have different numbers of towers (x: the '
              'towers of each task, chief first; this task has {}). Their '
              'gradients are all-reduced over every tower of every task, so '
              'every task must pass replicate_model_fn the same number of '
              'devices.'.format(num_towers))))
    with tf1.control_dependencies(checks):
      checks.append(tf1.assert_equal(
          total[0], tf.constant(fingerprint, tf.float64), message=(
              'The training tasks built different models: the chief made '
              'its variables with other names, shapes or dtypes, or in '
              'another order, than this task ({} variables, first {}). '
              'Every task must build the same model, making its variables '
              'in the same order (e.g. not by iterating over a set).'.format(
                  len(kept), kept[0].op.name))))
    pieces = tf.split(total[len(header):],
                      [v.shape.num_elements() for v in kept])
  dependencies = checks + ([after] if after is not None else [])
  assigns = []
  with tf1.control_dependencies(dependencies):
    for variable, piece in zip(kept, pieces):
      value = tf.reshape(tf.cast(piece, variable.dtype.base_dtype),
                         variable.shape)
      assigns.append(variable.assign(value, read_value=False))
  return tf.group(*assigns, name='broadcast')

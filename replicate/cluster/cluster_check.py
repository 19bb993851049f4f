"""Checks that turn cluster mistakes into clear errors instead of hangs.

Three mistakes are silent in TF's distributed runtime:

* a task that is down, a wrong port in `TF_CONFIG`, or another program on a
  task's port: creating the session waits for that task forever
  ("CreateSession still waiting for response from worker"), or until
  `operation_timeout_in_ms` with a `DeadlineExceededError` that names
  neither the task nor its address;
* a tower device the task's server does not have (e.g. a server started
  without `device_count={'CPU': 2}`): soft placement quietly runs the tower
  on another device;
* a training loop that ends before its last step without an error: a queue
  closed under it (e.g. by a parameter server that restarted) raises
  `OutOfRangeError`, which `MonitoredSession` takes for the end of the input,
  so `Estimator.train` returns as if it had finished.

`ClusterCheckHook`, which `replicate_model_fn` adds to the training hooks of
a model built for a cluster, checks all three: before the session is created
it waits, for a bounded time, until every task the session needs answers as
a TensorFlow server; once the session exists it checks that every tower
device is one of the session's devices; at the end it checks that the
global step reached the Estimator's target.
"""
import socket
import threading
import time

import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import logs as logging

_POLL_SECS = 0.2
# One TF probe of a task waits at most this long (and never past the
# deadline, but at least _MIN_PROBE_SECS).
_PROBE_SECS = 10.0
_MIN_PROBE_SECS = 0.5


def needed_tasks(cluster_spec, device_filters):
  """The `(job, task)` pairs a session with these device filters contacts.

  Args:
    cluster_spec: a `tf.train.ClusterSpec`.
    device_filters: the session's `ConfigProto.device_filters` (may be
      empty: every task).

  Returns:
    A sorted list of `(job, task_index)` pairs.
  """
  tasks = []
  for job in sorted(cluster_spec.jobs):
    for index in cluster_spec.task_indices(job):
      if not device_filters or any(
          _matches(f, job, index) for f in device_filters):
        tasks.append((job, index))
  return tasks


def _matches(device_filter, job, index):
  spec = device_util.parse(device_filter, 'device filter')
  return ((spec.job is None or spec.job == job) and
          (spec.task is None or spec.task == index))


def _host_port(address):
  host, _, port = address.rpartition(':')
  return host.strip('[]'), int(port)


def wait_for_tasks(cluster_spec, tasks, timeout_secs):
  """Waits until every task answers as a TF server, at most `timeout_secs`.

  A task passes when its port accepts TCP connections and a TensorFlow
  session on it lists its devices (so a program that is not a TF server,
  or a TF server that does not answer, fails too). Every wait, the TF
  probe's included, is bounded by the deadline.

  Args:
    cluster_spec: a `tf.train.ClusterSpec`.
    tasks: `(job, task_index)` pairs, from `needed_tasks`.
    timeout_secs: how long to wait in all.

  Raises:
    UnavailableError: naming every task that had not answered at the
      deadline, with its address and what went wrong.
  """
  deadline = time.time() + timeout_secs
  pending = list(tasks)
  reasons = {}
  while True:
    still = []
    for task in pending:
      reason = _check_task(cluster_spec, task, deadline)
      if reason is not None:
        reasons[task] = reason
        still.append(task)
    pending = still
    if not pending:
      return
    if time.time() >= deadline:
      raise errors.UnavailableError(
          'Cluster task(s) did not answer as TensorFlow servers within {:g} '
          's: {}. A task is down, TF_CONFIG names a wrong address or port, or '
          'another program holds the port (then the task\'s own log says '
          '"Could not start gRPC server"); start every task of the cluster '
          '(parameter servers run tf.compat.v1.train.Server(...).join()) and '
          'check TF_CONFIG. The wait is bounded by '
          'session_config.operation_timeout_in_ms.'.format(
              timeout_secs, '; '.join(
                  '/job:{}/task:{} at {} {}'.format(
                      job, index, cluster_spec.task_address(job, index),
                      reasons[(job, index)])
                  for job, index in pending)))
    time.sleep(_POLL_SECS)


def _check_task(cluster_spec, task, deadline):
  """None if `task` answers as a TF server, else why not."""
  if not _accepts(cluster_spec, task):
    return 'did not accept connections'
  probe_secs = min(_PROBE_SECS, max(deadline - time.time(), _MIN_PROBE_SECS))
  try:
    _list_devices(cluster_spec, task, probe_secs)
  except tf.errors.OpError as e:
    return ('accepts connections but did not answer as a TensorFlow server '
            '({}: {})'.format(type(e).__name__,
                              (e.message or '').splitlines()[0][:200]))
  return None


def unreachable_tasks(cluster_spec, tasks):
  """The `(job, index)` pairs of `tasks` whose port refuses connections now.

  One TCP connection attempt per task (at most 1 s each).

  Args:
    cluster_spec: a `tf.train.ClusterSpec`.
    tasks: `(job, task_index)` pairs.

  Returns:
    A list of the pairs, in the order given.
  """
  return [t for t in tasks if not _accepts(cluster_spec, t)]


def _accepts(cluster_spec, task):
  host, port = _host_port(cluster_spec.task_address(*task))
  try:
    with socket.create_connection((host, port), timeout=1.0):
      return True
  except (OSError, ValueError):
    return False


def _list_devices(cluster_spec, task, timeout_secs):
  """Lists the devices of one task through a session on it (bounded)."""
  job, index = task
  config = tf1.ConfigProto(
      operation_timeout_in_ms=max(1, int(timeout_secs * 1000)),
      device_filters=['/job:{}/task:{}'.format(job, index)])
  with tf.Graph().as_default():
    with tf1.Session('grpc://' + cluster_spec.task_address(job, index),
                     config=config) as session:
      return session.list_devices()


def check_devices(tower_devices, session_devices):
  """Raises unless every tower device is one of the session's devices.

  Args:
    tower_devices: fully qualified tower device strings.
    session_devices: device names from `Session.list_devices()`.

  Raises:
    InvalidArgumentError: naming the missing devices and the way out.
  """
  available = set(_key(d) for d in session_devices)
  missing = [d for d in tower_devices if _key(d) not in available]
  if missing:
    raise errors.InvalidArgumentError(
        'Tower device(s) {} do not exist in the cluster session, so their '
        'towers would silently run elsewhere. The session has {}. Start each '
        'task\'s server with enough devices, e.g. tf.compat.v1.train.Server('
        'cluster, job_name, task_index, config=tf.compat.v1.ConfigProto('
        'device_count={{"CPU": 2}})) for two virtual CPUs, or pass fewer '
        'devices to replicate_model_fn.'.format(
            missing, sorted(session_devices)))


def _key(device):
  return device_util.canonicalize(device)


class ClusterCheckHook(tf1.train.SessionRunHook):
  """Fails fast, with a clear error, on an unreachable task or missing device.

  `begin` (before the session is created) waits until the tasks the session
  needs answer as TF servers; `after_create_session` checks the tower
  devices and starts watching the cluster's tasks: a task whose port stops
  accepting connections during training is logged as an ERROR naming it
  (TF's own `DeadlineExceededError` for the ops waiting on it names no
  task). `end` logs an ERROR if training ended below the step the
  Estimator's `train(steps=..., max_steps=...)` asked for.
  """

  def __init__(self, cluster_spec, device_filters, tower_devices,
               timeout_secs, stop_hooks=(), tasks=None):
    """Creates the hook.

    Args:
      cluster_spec: the `tf.train.ClusterSpec` of the run.
      device_filters: the session's device filters (empty: all tasks).
      tower_devices: the fully qualified tower devices.
      timeout_secs: how long to wait for the tasks; `None` waits as long as
        TF does (forever), logging every 30 s.
      stop_hooks: the `StopAtStepHook`s of the `Estimator.train` call (see
        `_compat.estimator_stop_hooks`): their last step is the target.
      tasks: the `(job, index)` pairs to wait for; `None` for those the
        session's device filters name. Tasks that all-reduce together need
        each other although their sessions are filtered to themselves.
    """
    self._cluster_spec = cluster_spec
    self._tasks = (needed_tasks(cluster_spec, list(device_filters))
                   if tasks is None else sorted(tasks))
    self._tower_devices = list(tower_devices)
    self._timeout_secs = timeout_secs
    self._stop_hooks = list(stop_hooks)
    self._global_step = None
    self._watcher = None

  def begin(self):
    self._global_step = tf1.train.get_global_step()
    if self._timeout_secs is not None:
      wait_for_tasks(self._cluster_spec, self._tasks, self._timeout_secs)
      return
    while True:
      try:
        wait_for_tasks(self._cluster_spec, self._tasks, 30.0)
        return
      except errors.UnavailableError as e:
        logging.warning('Still waiting for the cluster: %s', e)

  def after_create_session(self, session, coord):
    del coord  # Unused.
    check_devices(self._tower_devices,
                  [d.name for d in session.list_devices()])
    if self._watcher is not None:
      self._watcher.stop()
    self._watcher = TaskWatcher(self._cluster_spec, session)
    self._watcher.start()

  def end(self, session):
    if self._watcher is not None:
      self._watcher.stop()
    check_reached_target(session, self._global_step, self._target_step(),
                         self._watcher.lost if self._watcher else ())

  def _target_step(self):
    targets = [_compat.stop_hook_last_step(h) for h in self._stop_hooks]
    targets = [t for t in targets if t is not None]
    return min(targets) if targets else None


def check_reached_target(session, global_step, target, lost_tasks=()):
  """Logs an ERROR if training ended below its target step.

  `MonitoredSession` ends without an error on an `OutOfRangeError`, which
  is how it learns that the input ran out, but a queue closed under a
  session raises it too: on TF 2.15, a worker whose parameter server
  restarted has returned from `Estimator.train` at step 12 of 40 that way.
  This tells such a run from a finished one.

  Args:
    session: the training session (its last moment, from a hook's `end`).
    global_step: the global step tensor, or None (nothing is checked).
    target: the step training should have reached, or None.
    lost_tasks: names of tasks found lost during training, for the message.

  Returns:
    The global step read, or None when nothing was checked or it could not
    be read (also logged as an ERROR).
  """
  if global_step is None or target is None:
    return None
  try:
    step = int(session.run(global_step))
  except tf.errors.OpError as e:
    logging.log(
        logging.ERROR,
        'Training ended without an error, but its global_step could not be '
        'read to check that it reached its target step %d (%s: %s). Treat '
        'the run as unfinished: run train again, which resumes from the '
        'last checkpoint.', target, type(e).__name__, e.message)
    return None
  if step < target:
    logging.log(
        logging.ERROR,
        'Training ended at global_step %d, before its target step %d, '
        'without an error: the model is NOT trained to step %d. TF\'s '
        'MonitoredSession ends quietly on an OutOfRangeError, which means '
        'that the input_fn ran out of data, or that a queue was closed under '
        'the session (e.g. SyncReplicasOptimizer\'s queues when a parameter '
        'server restarted%s). Run train again (it resumes from the last '
        'checkpoint), or make the input repeat.', step, target, target,
        '; lost during training: ' + ', '.join(lost_tasks)
        if lost_tasks else '')
  return step


class TaskWatcher(object):
  """Watches the cluster's tasks during training; logs the ones lost.

  A daemon thread tries a TCP connection to every task every
  `interval_secs`; a task that accepted connections and stops is logged
  once, as an ERROR naming the task and its address. The thread ends with
  `stop()`, or once the session is closed.
  """

  def __init__(self, cluster_spec, session=None, interval_secs=1.0):
    self._cluster_spec = cluster_spec
    self._session = session
    self._interval_secs = interval_secs
    self._stopped = threading.Event()
    self._thread = None
    self.lost = []

  def start(self):
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name='replicate-cluster-watcher')
    self._thread.start()

  def stop(self):
    self._stopped.set()

  def _watch(self):
    tasks = needed_tasks(self._cluster_spec, [])
    alive = set(t for t in tasks if _accepts(self._cluster_spec, t))
    while not self._stopped.wait(self._interval_secs):
      if self._session is not None and _compat.session_closed(self._session):
        return
      for task in sorted(alive):
        if _accepts(self._cluster_spec, task):
          continue
        alive.discard(task)
        name = '/job:{}/task:{} at {}'.format(
            task[0], task[1], self._cluster_spec.task_address(*task))
        self.lost.append(name)
        logging.log(
            logging.ERROR,
            'Cluster task %s stopped accepting connections during training '
            '(its process ended?). Ops that wait for it (its gradients, its '
            'variables) fail after session_config.operation_timeout_in_ms '
            'with a DeadlineExceededError, which TF does not say is about '
            'this task.', name)


def make_hook(config, tower_devices, tasks=None):
  """The `ClusterCheckHook` of a training task, from its `RunConfig`.

  Args:
    config: the Estimator's `RunConfig` (it names a cluster).
    tower_devices: the fully qualified tower devices.
    tasks: the `(job, index)` pairs to wait for before the session is
      created; `None` for those the session's device filters name.

  Returns:
    A `ClusterCheckHook`.
  """
  session_config = config.session_config or tf1.ConfigProto()
  timeout_ms = session_config.operation_timeout_in_ms
  return ClusterCheckHook(
      config.cluster_spec, session_config.device_filters, tower_devices,
      timeout_ms / 1000.0 if timeout_ms > 0 else None,
      _compat.estimator_stop_hooks(), tasks)


"""Checks that turn cluster mistakes into clear errors instead of hangs.

Two mistakes are silent in TF's distributed runtime:

* a task that is down, or a wrong port in `TF_CONFIG`: creating the session
  waits for that task forever ("CreateSession still waiting for response
  from worker");
* a tower device the task's server does not have (e.g. a server started
  without `device_count={'CPU': 2}`): soft placement quietly runs the tower
  on another device.

`ClusterCheckHook`, which `replicate_model_fn` adds to the training hooks of
a model built for a cluster, checks both: before the session is created it
waits, for a bounded time, until every task the session needs accepts TCP
connections; once the session exists it checks that every tower device is
one of the session's devices.
"""
import socket
import time

from replicate.core import logs as logging

from replicate import errors
from replicate._compat import tf1

_POLL_SECS = 0.2


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
  spec = tf1.DeviceSpec.from_string(device_filter)
  return ((spec.job is None or spec.job == job) and
          (spec.task is None or spec.task == index))


def _host_port(address):
  host, _, port = address.rpartition(':')
  return host.strip('[]'), int(port)


def wait_for_tasks(cluster_spec, tasks, timeout_secs):
  """Waits until every task accepts TCP connections, at most `timeout_secs`.

  Args:
    cluster_spec: a `tf.train.ClusterSpec`.
    tasks: `(job, task_index)` pairs, from `needed_tasks`.
    timeout_secs: how long to wait in all.

  Raises:
    UnavailableError: naming every task still unreachable at the deadline,
      with its address.
  """
  deadline = time.time() + timeout_secs
  pending = list(tasks)
  while True:
    pending = [t for t in pending if not _accepts(cluster_spec, t)]
    if not pending:
      return
    if time.time() >= deadline:
      raise errors.UnavailableError(
          'Cluster task(s) {} did not accept connections within {:g} s. A '
          'task is down or TF_CONFIG names a wrong address or port; start '
          'every task of the cluster (parameter servers run '
          'tf.compat.v1.train.Server(...).join()) and check TF_CONFIG. The '
          'wait is bounded by session_config.operation_timeout_in_ms.'.format(
              ', '.join('/job:{}/task:{} at {}'.format(
                  job, index, cluster_spec.task_address(job, index))
                        for job, index in pending), timeout_secs))
    time.sleep(_POLL_SECS)


def _accepts(cluster_spec, task):
  host, port = _host_port(cluster_spec.task_address(*task))
  try:
    with socket.create_connection((host, port), timeout=1.0):
      return True
  except (OSError, ValueError):
    return False


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
  spec = tf1.DeviceSpec.from_string(device)
  return (spec.job, spec.task or 0, (spec.device_type or '').upper(),
          spec.device_index or 0)


class ClusterCheckHook(tf1.train.SessionRunHook):
  """Fails fast, with a clear error, on an unreachable task or missing device.

  `begin` (before the session is created) waits until the tasks the session
  needs accept connections; `after_create_session` checks the tower devices.
  """

  def __init__(self, cluster_spec, device_filters, tower_devices,
               timeout_secs):
    """Creates the hook.

    Args:
      cluster_spec: the `tf.train.ClusterSpec` of the run.
      device_filters: the session's device filters (empty: all tasks).
      tower_devices: the fully qualified tower devices.
      timeout_secs: how long to wait for the tasks; `None` waits as long as
        TF does (forever), logging every 30 s.
    """
    self._cluster_spec = cluster_spec
    self._tasks = needed_tasks(cluster_spec, list(device_filters))
    self._tower_devices = list(tower_devices)
    self._timeout_secs = timeout_secs

  def begin(self):
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


def make_hook(config, tower_devices):
  """The `ClusterCheckHook` of a training task, from its `RunConfig`.

  Args:
    config: the Estimator's `RunConfig` (it names a cluster).
    tower_devices: the fully qualified tower devices.

  Returns:
    A `ClusterCheckHook`.
  """
  session_config = config.session_config or tf1.ConfigProto()
  timeout_ms = session_config.operation_timeout_in_ms
  return ClusterCheckHook(
      config.cluster_spec, session_config.device_filters, tower_devices,
      timeout_ms / 1000.0 if timeout_ms > 0 else None)


"""Cluster faults end, within their bound, in errors that name the task.

In-process TF servers on 127.0.0.1 and plain sockets standing for programs
that are not TF servers (or for a task whose process ends). Every wait is
bounded: `operation_timeout_in_ms`, thread joins, socket timeouts.
"""
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.cluster import cluster_check
from replicate.cluster import placement as cluster_placement

_JOIN_SECS = 60
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_X = (np.arange(16, dtype=np.float32).reshape(8, 2) / 10.).astype(np.float32)
_Y = _X.sum(axis=1, keepdims=True)


def _address():
  return '127.0.0.1:%d' % replicate.testing.pick_unused_port()


def _listener(host='127.0.0.1', family=socket.AF_INET):
  """A bound, listening socket (accepts into the backlog; never answers)."""
  s = socket.socket(family)
  s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  s.bind((host, 0))
  s.listen(16)
  return s


@contextlib.contextmanager
def _errors_logged():
  """The messages of the ERROR records logged inside the block (a handler
  on the root logger: whatever verbosity earlier tests left TF's logger at,
  and with none logged at all, where `assertLogs` would fail)."""
  errors = []
  handler = logging.Handler(logging.ERROR)
  handler.emit = lambda record: errors.append(record.getMessage())
  logging.getLogger().addHandler(handler)
  try:
    yield errors
  finally:
    logging.getLogger().removeHandler(handler)


class _NotATfServer(object):
  """A TCP listener that accepts connections and never answers."""

  def __init__(self):
    self.address = _address()
    self._socket = socket.socket()
    self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    self._socket.bind(('127.0.0.1', int(self.address.split(':')[1])))
    self._socket.listen(16)
    self._socket.settimeout(0.2)
    self._connections = []
    self._closed = threading.Event()
    self._thread = threading.Thread(target=self._accept, daemon=True)
    self._thread.start()

  def _accept(self):
    while not self._closed.is_set():
      try:
        self._connections.append(self._socket.accept()[0])
      except (socket.timeout, OSError):
        pass

  def close(self):
    self._closed.set()
    self._thread.join(5)
    for connection in self._connections:
      connection.close()
    self._socket.close()


def _server(cluster, job, num_cpus=2):
  return tf1.train.Server(tf1.train.ClusterSpec(cluster), job_name=job,
                          task_index=0,
                          config=tf1.ConfigProto(device_count={'CPU': num_cpus}))


def _run_config(cluster, task_type, **session_kwargs):
  old = os.environ.get('TF_CONFIG')
  os.environ['TF_CONFIG'] = json.dumps(
      {'cluster': cluster, 'task': {'type': task_type, 'index': 0}})
  try:
    return tf1.estimator.RunConfig(
        session_config=tf1.ConfigProto(device_count={'CPU': 2},
                                       **session_kwargs),
        save_checkpoints_steps=None, save_checkpoints_secs=None,
        save_summary_steps=None, log_step_count_steps=None)
  finally:
    if old is None:
      del os.environ['TF_CONFIG']
    else:
      os.environ['TF_CONFIG'] = old


def _model_fn(features, labels, mode, params, config):
  predictions = tf1.layers.dense(
      features, 1, kernel_initializer=tf1.zeros_initializer())
  loss = tf1.losses.mean_squared_error(labels, predictions)
  optimizer = tf1.train.GradientDescentOptimizer(0.1)
  hooks = []
  if params.get('sync_workers'):
    optimizer = tf1.train.SyncReplicasOptimizer(
        optimizer, replicas_to_aggregate=params['sync_workers'],
        total_num_replicas=params['sync_workers'])
    hooks.append(optimizer.make_session_run_hook(config.is_chief,
                                                 num_tokens=0))
  optimizer = replicate.TowerOptimizer(optimizer)
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                     training_hooks=hooks)


def _input_fn(num_batches=None):
  def input_fn():
    dataset = tf.data.Dataset.from_tensors((_X, _Y))
    return dataset.repeat(num_batches)
  return input_fn


def _train(config, result, params=None, **train_kwargs):
  """Estimator.train in a daemon thread; what it raised goes to `result`."""
  estimator = tf1.estimator.Estimator(
      replicate.replicate_model_fn(_model_fn, devices=['/cpu:0', '/cpu:1']),
      model_dir=tempfile.mkdtemp(), config=config, params=params or {})

  def train():
    try:
      estimator.train(**train_kwargs)
    except Exception as e:  # pylint: disable=broad-except
      result['error'] = e

  thread = threading.Thread(target=train, daemon=True)
  thread.start()
  return thread


class NotATfServerTest(tf.test.TestCase):

  def test_wait_for_tasks_probes_tensorflow(self):
    fake = _NotATfServer()
    try:
      spec = tf1.train.ClusterSpec({'ps': [fake.address]})
      start = time.time()
      with self.assertRaisesRegex(
          replicate.errors.UnavailableError,
          r'/job:ps/task:0 at %s accepts connections but did not answer as '
          r'a TensorFlow server' % fake.address):
        cluster_check.wait_for_tasks(spec, [('ps', 0)], 1.0)
      self.assertLess(time.time() - start, 10)
    finally:
      fake.close()

  def test_real_server_passes(self):
    cluster = {'ps': [_address()]}
    _server(cluster, 'ps', num_cpus=1)
    spec = tf1.train.ClusterSpec(cluster)
    cluster_check.wait_for_tasks(spec, [('ps', 0)], 10.0)
    replicate.multi_worker.wait_for_tasks(spec, [('ps', 0)], 10)

  def test_public_wait_for_tasks_arguments(self):
    spec = tf1.train.ClusterSpec({'ps': ['127.0.0.1:1']})
    with self.assertRaisesRegex(replicate.errors.InvalidArgumentError,
                                'Task 1 of job .ps. is not in the cluster'):
      replicate.multi_worker.wait_for_tasks(spec, [('ps', 1)], 1)
    with self.assertRaisesRegex(replicate.errors.InvalidArgumentError,
                                "Job 'worker' is not in the cluster"):
      replicate.multi_worker.wait_for_tasks(spec, [('worker', 0)], 1)
    with self.assertRaisesRegex(replicate.errors.InvalidArgumentError,
                                'timeout_secs must be a positive number'):
      replicate.multi_worker.wait_for_tasks(spec, [('ps', 0)], 0)

  def test_estimator_fails_naming_task_and_address(self):
    # Before: the hook saw the port accept TCP and passed; the chief then
    # ended with DeadlineExceeded naming neither the task nor the address.
    fake = _NotATfServer()
    try:
      cluster = {'ps': [fake.address], 'chief': [_address()]}
      _server(cluster, 'chief')
      result = {}
      start = time.time()
      thread = _train(_run_config(cluster, 'chief',
                                  operation_timeout_in_ms=2000), result,
                      input_fn=_input_fn(), max_steps=2)
      thread.join(_JOIN_SECS)
      self.assertFalse(thread.is_alive())
      self.assertIsInstance(result.get('error'),
                            replicate.errors.UnavailableError)
      self.assertRegex(
          str(result['error']),
          r'/job:ps/task:0 at %s accepts connections but did not answer as a '
          r'TensorFlow server' % fake.address)
      self.assertIn('within 2 s', str(result['error']))
      self.assertLess(time.time() - start, 30)
    finally:
      fake.close()


class EndedEarlyTest(tf.test.TestCase):

  def _train_chief_only(self, **train_kwargs):
    # A cluster of one task runs locally: add a ps (variables go there).
    cluster = {'ps': [_address()], 'chief': [_address()]}
    _server(cluster, 'ps', num_cpus=1)
    _server(cluster, 'chief')
    result = {}
    thread = _train(_run_config(cluster, 'chief',
                                operation_timeout_in_ms=10000), result,
                    **train_kwargs)
    thread.join(_JOIN_SECS)
    self.assertFalse(thread.is_alive())
    self.assertNotIn('error', result)

  def test_train_that_returns_below_its_target_logs_an_error(self):
    # An OutOfRangeError ends MonitoredSession quietly: here the input runs
    # out at step 3 of 10; a queue closed by a restarted ps does the same.
    with self.assertLogs(level='ERROR') as logs:
      self._train_chief_only(input_fn=_input_fn(3), max_steps=10)
    self.assertRegex('\n'.join(logs.output),
                     'Training ended at global_step 3, before its target '
                     'step 10.*NOT trained to step 10')

  def test_relative_steps_target(self):
    with self.assertLogs(level='ERROR') as logs:
      self._train_chief_only(input_fn=_input_fn(2), steps=5)
    self.assertRegex('\n'.join(logs.output),
                     'Training ended at global_step 2, before its target '
                     'step 5')

  def test_finished_training_logs_no_error(self):
    with _errors_logged() as errors:
      self._train_chief_only(input_fn=_input_fn(), max_steps=3)
    self.assertEqual([], [e for e in errors if 'Training ended' in e])


class LostTaskTest(tf.test.TestCase):

  def test_lost_worker_is_named(self):
    # The worker's process ends (here: a plain socket closes) while the
    # chief waits for its gradients: TF's DeadlineExceededError names no
    # task; the watcher logs which one was lost.
    worker = _NotATfServer()
    cluster = {'ps': [_address()], 'chief': [_address()],
               'worker': [worker.address]}
    ps = _server(cluster, 'ps', num_cpus=1)
    _server(cluster, 'chief')
    result = {}
    start = time.time()
    with self.assertLogs(level='ERROR') as logs:
      thread = _train(
          _run_config(cluster, 'chief', operation_timeout_in_ms=8000,
                      device_filters=['/job:ps', '/job:chief']),
          result, params={'sync_workers': 2}, input_fn=_input_fn(),
          max_steps=3)
      # The chief's session exists (it initialized the model), so its
      # watcher has seen the worker up; then the worker's process ends.
      while _read_global_step(ps.target) is None:
        self.assertLess(time.time() - start, _JOIN_SECS, result)
        time.sleep(0.1)
      time.sleep(2)
      worker.close()
      thread.join(_JOIN_SECS)
    self.assertFalse(thread.is_alive())
    self.assertIsInstance(result.get('error'), tf.errors.DeadlineExceededError)
    self.assertRegex('\n'.join(logs.output),
                     'Cluster task /job:worker/task:0 at %s stopped accepting '
                     'connections' % worker.address)
    self.assertLess(time.time() - start, 45)


class ExampleStartUpTest(tf.test.TestCase):
  """examples/local_cluster.py's non-chief worker, with its ps port taken."""

  def test_worker_fails_within_the_operation_timeout(self):
    # Before: it blocked in a raw session on the ps until its 240 s watchdog.
    fake = _NotATfServer()
    try:
      cluster = {'ps': [fake.address], 'chief': [_address()],
                 'worker': [_address()]}
      env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL='2',
                 TF_CONFIG=json.dumps({'cluster': cluster,
                                       'task': {'type': 'worker',
                                                'index': 0}}))
      start = time.time()
      result = subprocess.run(
          [sys.executable, os.path.join(_ROOT, 'examples', 'local_cluster.py'),
           '--child', '--steps', '3', '--out_dir', tempfile.mkdtemp(),
           '--timeout_secs', '240'],
          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
          timeout=90, check=False)
      elapsed = time.time() - start
    finally:
      fake.close()
    output = result.stdout.decode('utf-8', 'replace')
    self.assertEqual(1, result.returncode, output[-3000:])
    self.assertRegex(output, r'worker: FAILED: UnavailableError: .*/job:ps/'
                     r'task:0 at %s accepts connections but did not answer '
                     r'as a TensorFlow server' % fake.address)
    self.assertLess(elapsed, 60, output[-3000:])


def _read_global_step(ps_target):
  """The global step on the ps, or None before the chief initialized it."""
  with tf.Graph().as_default():
    with tf1.device('/job:ps/task:0'):
      step = tf1.get_variable('global_step', [], tf.int64, trainable=False)
      ready = tf1.is_variable_initialized(step)
    # Filtered to the ps: a session that needs another task waits for it
    # without bound.
    with tf1.Session(ps_target, config=tf1.ConfigProto(
        operation_timeout_in_ms=5000, device_filters=['/job:ps'])) as sess:
      return sess.run(step) if sess.run(ready) else None


def _close_sync_token_queue(ps_target):
  """Closes SyncReplicasOptimizer's token queue on the ps under the workers."""
  with tf.Graph().as_default():
    with tf1.device('/job:ps/task:0'):
      queue = tf1.FIFOQueue(-1, tf.int64, shapes=(), name='sync_token_q',
                            shared_name='sync_token_q')
      close = queue.close(cancel_pending_enqueues=True)
    with tf1.Session(ps_target, config=tf1.ConfigProto(
        operation_timeout_in_ms=5000, device_filters=['/job:ps'])) as sess:
      sess.run(close)


class ClosedQueueTest(tf.test.TestCase):
  """The mechanism of the ps-restart false success, made deterministic.

  When a parameter server restarts, SyncReplicasOptimizer's queues can be
  closed under a worker's session; the worker's dequeue then raises
  OutOfRangeError, which MonitoredSession takes for the end of the input:
  `Estimator.train` returns normally, below its target. (Whether a real
  restart does that depends on when it falls in a step, so it is not
  reproduced here; closing the token queue is.)
  """

  def test_worker_returning_early_logs_an_error(self):
    cluster = {'ps': [_address()], 'chief': [_address()],
               'worker': [_address()]}
    ps = _server(cluster, 'ps', num_cpus=1)
    _server(cluster, 'chief')
    _server(cluster, 'worker')
    target = 100000
    results = {'chief': {}, 'worker': {}}
    filters = {task: ['/job:ps', '/job:%s/task:0' % task]
               for task in ('chief', 'worker')}
    with self.assertLogs(level='ERROR') as logs:
      chief = _train(
          _run_config(cluster, 'chief', operation_timeout_in_ms=5000,
                      device_filters=filters['chief']),
          results['chief'], params={'sync_workers': 2},
          input_fn=_input_fn(), max_steps=target)
      deadline = time.time() + _JOIN_SECS
      while _read_global_step(ps.target) is None:
        self.assertLess(time.time(), deadline, 'the chief never initialized')
        time.sleep(0.1)
      worker = _train(
          _run_config(cluster, 'worker', operation_timeout_in_ms=5000,
                      device_filters=filters['worker']),
          results['worker'], params={'sync_workers': 2},
          input_fn=_input_fn(), max_steps=target)
      while (_read_global_step(ps.target) or 0) < 2:
        self.assertLess(time.time(), deadline, 'training never started')
        self.assertFalse(results['worker'] or results['chief'], results)
        time.sleep(0.1)
      _close_sync_token_queue(ps.target)
      worker.join(_JOIN_SECS)
      chief.join(_JOIN_SECS)
    self.assertFalse(worker.is_alive() or chief.is_alive())
    # TF's behaviour: the worker's train returned without an error...
    self.assertNotIn('error', results['worker'])
    # ... and the hook says that it did not finish.
    self.assertRegex('\n'.join(logs.output),
                     r'Training ended at global_step \d+, before its target '
                     r'step %d' % target)


class AddressTest(tf.test.TestCase):

  def test_bracketed_ipv6_address_is_probed(self):
    # TF_CONFIG writes IPv6 hosts in brackets ('[::1]:2222'); the TCP probe
    # must connect to ::1, not fail to resolve '[::1]'.
    try:
      listener = _listener('::1', socket.AF_INET6)
    except OSError:
      self.skipTest('no IPv6 loopback here')
    self.addCleanup(listener.close)
    up = '[::1]:%d' % listener.getsockname()[1]
    down = '[::1]:%d' % replicate.testing.pick_unused_port()
    spec = tf1.train.ClusterSpec({'ps': [up, down]})
    self.assertEqual([('ps', 1)], cluster_check.unreachable_tasks(
        spec, [('ps', 0), ('ps', 1)]))


class TaskWatcherTest(tf.test.TestCase):

  def test_logs_each_task_that_was_up_once(self):
    # a/task:0 accepts connections, then stops; a/task:1 never did (it is
    # not "lost during training"); b/task:0 stays up.
    first, stays = _listener(), _listener()
    self.addCleanup(stays.close)
    first_address = '127.0.0.1:%d' % first.getsockname()[1]
    spec = tf1.train.ClusterSpec({
        'a': [first_address, _address()],
        'b': ['127.0.0.1:%d' % stays.getsockname()[1]]})
    watcher = cluster_check.TaskWatcher(spec, interval_secs=0.05)
    with self.assertLogs(level='ERROR') as logs:
      watcher.start()
      self.addCleanup(watcher.stop)
      time.sleep(0.5)
      first.close()
      deadline = time.time() + 10
      while not watcher.lost and time.time() < deadline:
        time.sleep(0.05)
      time.sleep(0.5)  # Ten more rounds: nothing more is lost.
      watcher.stop()
    self.assertEqual(['/job:a/task:0 at ' + first_address], watcher.lost)
    self.assertLen([line for line in logs.output
                    if 'stopped accepting connections' in line], 1)


class TargetStepTest(tf.test.TestCase):

  def _end_logs(self, step, stop_hooks):
    """The ERROR lines of the hook's `end` with the global step at `step`."""
    spec = tf1.train.ClusterSpec({'chief': [_address()]})
    with tf.Graph().as_default():
      global_step = tf1.train.get_or_create_global_step()
      hook = cluster_check.ClusterCheckHook(
          spec, [], [], 1.0, stop_hooks=stop_hooks, tasks=[])
      hook.begin()  # No task to wait for.
      with tf1.Session() as session:
        session.run(global_step.assign(step))
        with _errors_logged() as errors:
          hook.end(session)
    return errors

  def test_the_first_stop_hook_to_fire_is_the_target(self):
    # Estimator.train(hooks=[StopAtStepHook(last_step=3)], max_steps=10)
    # ends at 3, as asked: the target is the smallest last step.
    hooks = [tf1.train.StopAtStepHook(last_step=10),
             tf1.train.StopAtStepHook(last_step=3)]
    self.assertEqual([], self._end_logs(3, hooks))
    errors = self._end_logs(2, hooks)
    self.assertLen(errors, 1)
    self.assertIn('Training ended at global_step 2, before its target step 3',
                  errors[0])


class WhatTheHookWaitsForTest(tf.test.TestCase):

  def test_no_operation_timeout_waits_for_a_late_task(self):
    # operation_timeout_in_ms unset (0, TF's default: wait forever): the
    # hook waits for a ps that starts 1 s after it, instead of failing.
    cluster = {'ps': [_address()], 'chief': [_address()]}
    spec = tf1.train.ClusterSpec(cluster)
    tf1.train.Server(spec, job_name='chief', task_index=0)
    hook = cluster_check.make_hook(_run_config(cluster, 'chief'),
                                   ['/job:chief/task:0/device:CPU:0'])
    result = {}

    def begin():
      try:
        with tf.Graph().as_default():
          hook.begin()
        result['done'] = True
      except Exception as e:  # pylint: disable=broad-except
        result['error'] = e

    thread = threading.Thread(target=begin, daemon=True)
    thread.start()
    time.sleep(1.0)
    self.assertNotIn('error', result)
    tf1.train.Server(spec, job_name='ps', task_index=0)
    thread.join(_JOIN_SECS)
    self.assertFalse(thread.is_alive())
    self.assertEqual({'done': True}, result)

  def test_all_reduce_hook_waits_for_every_training_task(self):
    # REPLICATED across chief and worker: each session is filtered to its
    # own task, but the collectives need the other task, so the chief's
    # hook waits for the worker too and names it when it is down.
    cluster = {'chief': [_address()], 'worker': [_address()]}
    spec = tf1.train.ClusterSpec(cluster)
    tf1.train.Server(spec, job_name='chief', task_index=0)
    config = replicate.multi_worker.all_reduce_run_config(_run_config(
        cluster, 'chief', operation_timeout_in_ms=1000))
    with tf.Graph().as_default():
      placement = cluster_placement.placement(
          config, tf1.estimator.ModeKeys.TRAIN, ['/device:CPU:0'],
          replicate.VariablePlacement.REPLICATED)
      hook, = [h for h in placement.training_hooks
               if isinstance(h, cluster_check.ClusterCheckHook)]
      start = time.time()
      with self.assertRaisesRegex(
          replicate.errors.UnavailableError,
          r'within 1 s: /job:worker/task:0 at %s did not accept '
          r'connections' % cluster['worker'][0]):
        hook.begin()
      self.assertLess(time.time() - start, 10)


if __name__ == '__main__':
  tf.test.main()

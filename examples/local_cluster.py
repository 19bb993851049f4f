"""Synchronous multi-worker training on a local TF cluster, a process a task.

Run:

    python examples/local_cluster.py [--mode ps|allreduce] [--steps 20]
        [--out_dir /tmp/local_cluster]

The script starts a cluster on 127.0.0.1 as separate processes (free ports
found by binding port 0). `chief` and `worker` are two training tasks, each
with two virtual CPUs and a `replicate_model_fn` tower on each, trained by
`tf.estimator` reading `TF_CONFIG`, exactly as on real machines. Every step
applies the gradients of both workers (4 towers in all):

* `--mode ps` (default): a third process, `ps`, holds the variables;
  `TowerOptimizer` wraps a `SyncReplicasOptimizer`, which applies the
  workers' averaged gradients once a step.
* `--mode allreduce`: no ps. `variable_placement=REPLICATED`: each task
  keeps its own copy of the variables (initialized from the chief's) and
  the towers of both tasks all-reduce their gradients with TF collective
  ops (`replicate.multi_worker.all_reduce_run_config` and
  `all_reduce_server` give each task the config that needs).

Each training task writes the variables it ends with to
`<out_dir>/<task>.json`; a last process trains the same model in one process
on the two workers' batches together (`reference.json`). The parent compares
them and prints whether all workers ended with the same variables, equal to
the one-process training (exit status 1 if not). Every child process is
bounded by `--timeout_secs`, and the parent kills its children when it
exits, whatever the reason.

See docs/multi_worker.md for running the same model on real machines.
"""
import argparse
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # Run from a source checkout.

_NUM_CPUS = 2
_BATCH_PER_WORKER = 8  # 4 rows per tower.
_LEARNING_RATE = 0.05
# Bounds every blocking op and every wait for another task.
_OPERATION_TIMEOUT_MS = 10000
# With all-reduce it also bounds each task's first wait for the other (the
# broadcast of the chief's variables), which covers the other's start-up.
_ALL_REDUCE_OPERATION_TIMEOUT_MS = 30000
# The one-process result may differ from the workers' by float rounding.
_REFERENCE_TOLERANCE = 1e-5
# How long a worker waits for the chief to start and initialize the model
# (the chief's process imports TensorFlow first).
_CHIEF_START_SECS = 120


def _parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--mode', choices=('ps', 'allreduce'), default='ps',
                      help='ps: a parameter server holds the variables; '
                      'allreduce: no ps, each worker keeps a copy and the '
                      'gradients are all-reduced')
  parser.add_argument('--steps', type=int, default=20,
                      help='synchronous training steps (global steps) to run')
  parser.add_argument('--out_dir', default='/tmp/replicate_local_cluster',
                      help='where the model (model/) and each task\'s final '
                      'variables (<task>.json) go')
  parser.add_argument('--timeout_secs', type=float, default=240.,
                      help='the most seconds any task process may run')
  parser.add_argument('--child', action='store_true',
                      help='internal: run the task named by TF_CONFIG')
  parser.add_argument('--reference', action='store_true',
                      help='internal: train the model in one process')
  return parser.parse_args()


# ----------------------------------------------------------------- parent ---


def _free_port():
  # The parent stays free of TensorFlow (and so of replicate, which imports
  # it); this mirrors replicate.testing.pick_unused_port.
  sock = socket.socket()
  try:
    sock.bind(('127.0.0.1', 0))
    return sock.getsockname()[1]
  finally:
    sock.close()


def _run_cluster(args):
  """Starts the cluster's processes; compares their final variables."""
  cluster = {'chief': ['127.0.0.1:%d' % _free_port()],
             'worker': ['127.0.0.1:%d' % _free_port()]}
  if args.mode == 'ps':
    cluster['ps'] = ['127.0.0.1:%d' % _free_port()]
  print('Mode: %s' % args.mode, flush=True)
  print('Cluster: %s' % json.dumps(cluster), flush=True)
  os.makedirs(args.out_dir, exist_ok=True)
  # A checkpoint left by an earlier run would make training start finished.
  shutil.rmtree(os.path.join(args.out_dir, 'model'), ignore_errors=True)
  for task in ('chief', 'worker', 'reference'):
    path = os.path.join(args.out_dir, task + '.json')
    if os.path.exists(path):
      os.remove(path)

  children = {}

  def kill_children():
    for child in children.values():
      if child.poll() is None:
        child.kill()
        child.wait()

  atexit.register(kill_children)
  # SIGTERM (e.g. from a test runner's timeout) still runs the atexit hook.
  signal.signal(signal.SIGTERM, lambda *unused: sys.exit(1))

  deadline = time.time() + args.timeout_secs
  command = [sys.executable, os.path.abspath(__file__), '--mode', args.mode,
             '--steps', str(args.steps), '--out_dir', args.out_dir,
             '--timeout_secs', str(args.timeout_secs)]
  for job in sorted(cluster):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {'cluster': cluster, 'task': {'type': job, 'index': 0}}))
    env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    children[job] = subprocess.Popen(command + ['--child'], env=env)

  try:
    for job in ('chief', 'worker'):
      remaining = max(1., deadline - time.time())
      try:
        code = children[job].wait(timeout=remaining)
      except subprocess.TimeoutExpired:
        print('FAILED: %s did not finish within %g s.' %
              (job, args.timeout_secs), flush=True)
        return 1
      if code != 0:
        print('FAILED: %s exited with status %d.' % (job, code), flush=True)
        return 1
    kill_children()  # The ps.
    env = {k: v for k, v in os.environ.items() if k != 'TF_CONFIG'}
    env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    reference = subprocess.run(command + ['--child', '--reference'], env=env,
                               timeout=max(1., deadline - time.time()))
    if reference.returncode != 0:
      print('FAILED: the one-process reference exited with status %d.' %
            reference.returncode, flush=True)
      return 1
  except subprocess.TimeoutExpired:
    print('FAILED: the one-process reference did not finish in time.',
          flush=True)
    return 1
  finally:
    kill_children()
  return _compare(args.out_dir)


def _compare(out_dir):
  finals = {}
  for task in ('chief', 'worker', 'reference'):
    with open(os.path.join(out_dir, task + '.json')) as f:
      finals[task] = json.load(f)
  for task in ('chief', 'worker'):
    final = finals[task]
    print('%-6s: global_step %d after %d local steps; its loss %.4f -> %.4f; '
          'variables on %s' % (
              task, final['global_step'], final['steps'], final['first_loss'],
              final['last_loss'], sorted(set(final['devices'].values()))),
          flush=True)
  chief, worker = finals['chief']['variables'], finals['worker']['variables']
  for name in sorted(chief):
    flat_chief = _flatten(chief[name])
    flat_worker = _flatten(worker.get(name, []))
    print('  %-15s chief %s  worker %s  max |difference| %g' % (
        name, _head(flat_chief), _head(flat_worker),
        max(abs(a - b) for a, b in zip(flat_chief, flat_worker))
        if len(flat_chief) == len(flat_worker) else float('inf')))
  if chief != worker:
    print('FAILED: workers end with different variables.', flush=True)
    return 1
  print('All workers end with the same variables.', flush=True)
  reference = finals['reference']['variables']
  worst = max(
      abs(a - b) / max(1., abs(b))
      for name in reference
      for a, b in zip(_flatten(chief.get(name, [])), _flatten(reference[name])))
  if sorted(chief) != sorted(reference) or worst > _REFERENCE_TOLERANCE:
    print('FAILED: they differ from one process training on both workers\' '
          'batches (largest relative difference %g).' % worst, flush=True)
    return 1
  print('They equal one process training on both workers\' batches '
        '(largest relative difference %g).' % worst, flush=True)
  return 0


def _flatten(value):
  if isinstance(value, list):
    return [x for item in value for x in _flatten(item)]
  return [value]


def _head(values):
  return '[' + ', '.join('%+.5f' % v for v in values[:3]) + ', ...]'


# ------------------------------------------------------------------ tasks ---


def _child(args):
  """Runs the task named by TF_CONFIG: a ps, or a training worker."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf1.logging.set_verbosity(tf1.logging.ERROR)

  deadline = time.time() + args.timeout_secs
  if args.reference:
    _exit_at(deadline, {'type': 'reference'})
    return _train_one_process(args, tf, tf1)
  tf_config = json.loads(os.environ['TF_CONFIG'])
  task = tf_config['task']
  _exit_at(deadline, task)
  if args.mode == 'allreduce':
    return _train_all_reduce(args, tf, tf1, task, deadline)
  # Servers are started here rather than by tf.estimator.train_and_evaluate,
  # which starts them without the session config's device_count, i.e. with
  # one CPU. (On machines with real GPUs, train_and_evaluate is fine.)
  server = tf1.train.Server(
      tf1.train.ClusterSpec(tf_config['cluster']), job_name=task['type'],
      task_index=task['index'],
      config=tf1.ConfigProto(device_count={
          'CPU': 1 if task['type'] == 'ps' else _NUM_CPUS}))
  if task['type'] == 'ps':
    server.join()  # Until the parent kills it, or the watchdog ends it.
    return 0
  return _train(args, tf, tf1, server, task, deadline)


def _exit_at(deadline, task):
  """Ends this process at `deadline` even if TF blocks, or the parent died."""

  def watchdog():
    time.sleep(max(0., deadline - time.time()))
    print('%s: timed out, exiting.' % task['type'], flush=True)
    os._exit(3)  # pylint: disable=protected-access

  threading.Thread(target=watchdog, daemon=True).start()


def _make_model_fn(tf, tf1, out_path, mode='ps'):
  """A small regression model; the final hook writes what the worker reads.

  `mode`: 'ps' or 'allreduce' (replicated over this task's two CPUs), or
  'reference' (the unreplicated model_fn). Seeded initializers give every
  mode the same initial values.
  """
  import replicate  # pylint: disable=g-import-not-at-top

  class FinalValuesHook(tf1.train.SessionRunHook):
    """Counts local steps and losses; saves the variables read from the ps."""

    def __init__(self, loss):
      self._loss = loss
      self._losses = []

    def before_run(self, run_context):
      return tf1.train.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
      self._losses.append(float(run_values.results))

    def end(self, session):
      variables = tf1.trainable_variables()
      values = session.run(variables)
      with open(out_path, 'w') as f:
        json.dump({
            'global_step': int(session.run(tf1.train.get_global_step())),
            'steps': len(self._losses),
            'first_loss': self._losses[0] if self._losses else None,
            'last_loss': self._losses[-1] if self._losses else None,
            'variables': {v.op.name: value.tolist()
                          for v, value in zip(variables, values)},
            'devices': {v.op.name: v.device for v in variables},
        }, f)

  def model_fn(features, labels, mode, params, config):
    hidden = tf1.layers.dense(
        features, 8, activation=tf.nn.tanh,
        kernel_initializer=tf1.glorot_uniform_initializer(seed=1))
    predictions = tf1.layers.dense(
        hidden, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
    loss = tf1.losses.mean_squared_error(labels, predictions)
    optimizer = tf1.train.GradientDescentOptimizer(_LEARNING_RATE)
    hooks = []
    if params['mode'] == 'ps':
      optimizer = replicate.TowerOptimizer(tf1.train.SyncReplicasOptimizer(
          optimizer, replicas_to_aggregate=params['num_workers'],
          total_num_replicas=params['num_workers']))
      # num_tokens=0: every worker contributes exactly one gradient a step.
      hooks.append(
          optimizer.make_session_run_hook(config.is_chief, num_tokens=0))
    elif params['mode'] == 'allreduce':
      optimizer = replicate.TowerOptimizer(optimizer)
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    hooks.append(FinalValuesHook(loss))
    return tf1.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op, training_hooks=hooks,
        predictions=predictions)

  if mode == 'reference':
    return model_fn
  # Towers on this task's two CPUs; variables on the ps (the default in a
  # cluster with a ps job; PARAMETER_SERVERS makes it a requirement), or a
  # copy on each task (REPLICATED, in a cluster without a ps job).
  return replicate.replicate_model_fn(
      model_fn,
      devices=['/device:CPU:%d' % i for i in range(_NUM_CPUS)],
      variable_placement=(replicate.VariablePlacement.PARAMETER_SERVERS
                          if mode == 'ps' else
                          replicate.VariablePlacement.REPLICATED))


def _worker_dataset(tf, worker_index, num_workers):
  """Worker `worker_index`'s shard of a fixed synthetic data set, batched."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  x = rng.uniform(-1., 1., size=(256, 4)).astype(np.float32)
  y = (np.sin(x).sum(axis=1, keepdims=True)).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices((x, y))
  dataset = dataset.shard(num_workers, worker_index)
  return dataset.batch(_BATCH_PER_WORKER, drop_remainder=True).repeat()


def _input_fn(tf, worker_index, num_workers):
  """Each worker reads its own shard of a fixed synthetic data set."""
  return lambda: _worker_dataset(tf, worker_index, num_workers)


def _train_one_process(args, tf, tf1):
  """The reference: one process, every step on both workers' batches."""

  def input_fn():
    both = tf.data.Dataset.zip((_worker_dataset(tf, 0, 2),
                                _worker_dataset(tf, 1, 2)))
    return both.map(lambda a, b: (tf.concat([a[0], b[0]], 0),
                                  tf.concat([a[1], b[1]], 0)))

  model_dir = os.path.join(args.out_dir, 'reference_model')
  shutil.rmtree(model_dir, ignore_errors=True)
  estimator = tf1.estimator.Estimator(
      _make_model_fn(tf, tf1, os.path.join(args.out_dir, 'reference.json'),
                     mode='reference'),
      model_dir=model_dir, params={'mode': 'reference', 'num_workers': 1},
      config=tf1.estimator.RunConfig(log_step_count_steps=None))
  estimator.train(input_fn, max_steps=args.steps)
  return 0


def _train_all_reduce(args, tf, tf1, task, deadline):
  """A task of the all-reduce cluster: its server, then Estimator.train."""
  del deadline  # The session config's operation timeout bounds the waits.
  import replicate  # pylint: disable=g-import-not-at-top
  # The collective group leader (the chief), device filters keeping the
  # session to this task, and the operation timeout; the server gets the
  # same config (its device_count gives it two CPUs).
  config = replicate.multi_worker.all_reduce_run_config(
      tf1.estimator.RunConfig(
          session_config=tf1.ConfigProto(
              device_count={'CPU': _NUM_CPUS},
              operation_timeout_in_ms=_ALL_REDUCE_OPERATION_TIMEOUT_MS),
          save_checkpoints_steps=None, save_checkpoints_secs=None,
          log_step_count_steps=None))
  server = replicate.multi_worker.all_reduce_server(config)
  print('%s: master %s, no ps, %d training tasks, chief: %s' % (
      task['type'], config.master, config.num_worker_replicas,
      config.is_chief), flush=True)
  estimator = tf1.estimator.Estimator(
      _make_model_fn(tf, tf1, os.path.join(args.out_dir,
                                           task['type'] + '.json'),
                     mode='allreduce'),
      config=config, model_dir=os.path.join(args.out_dir, 'model'),
      params={'mode': 'allreduce', 'num_workers': config.num_worker_replicas})
  worker_index = 0 if config.is_chief else 1 + config.task_id
  estimator.train(
      _input_fn(tf, worker_index, config.num_worker_replicas),
      max_steps=args.steps)
  del server
  print('%s: done' % task['type'], flush=True)
  return 0


def _wait_for_chief(tf, tf1, cluster, deadline):
  """Waits until the chief has initialized the model on the ps.

  A non-chief worker that finds the model uninitialized sleeps 30 s before
  looking again (tf1.train.SessionManager's recovery_wait_secs); waiting
  here first saves that on a short run. Every wait is bounded by the
  operation timeout: TF does not bound the creation of a session on a ps
  that is down or whose port another program holds, so the ps is first
  checked to answer as a TF server (a clear error naming it otherwise); the
  session then lives on the ps itself, and each of its runs is bounded by
  operation_timeout_in_ms.
  """
  import replicate  # pylint: disable=g-import-not-at-top
  spec = tf1.train.ClusterSpec(cluster)
  replicate.multi_worker.wait_for_tasks(spec, [('ps', 0)],
                                        _OPERATION_TIMEOUT_MS / 1000.)
  with tf.Graph().as_default():
    with tf1.device('/job:ps/task:0'):
      step = tf1.get_variable('global_step', [], tf.int64, trainable=False)
      ready = tf1.is_variable_initialized(step)
    config = tf1.ConfigProto(operation_timeout_in_ms=_OPERATION_TIMEOUT_MS,
                             device_filters=['/job:ps/task:0'])
    with tf1.Session('grpc://' + spec.task_address('ps', 0),
                     config=config) as sess:
      while not sess.run(ready):
        if time.time() > deadline:
          raise RuntimeError('The chief did not initialize the model in time.')
        time.sleep(0.2)


def _train(args, tf, tf1, server, task, deadline):
  """Trains this task's share: Estimator.train, RunConfig reads TF_CONFIG."""
  del server  # The caller keeps it serving this task.
  out_path = os.path.join(args.out_dir, task['type'] + '.json')
  session_config = tf1.ConfigProto(
      device_count={'CPU': _NUM_CPUS},
      # Bounds every blocking op (a lost worker fails, never hangs), the wait
      # for the cluster at start, and the chief's final wait for gradients
      # that no longer come (SyncReplicasOptimizer's queue runner).
      operation_timeout_in_ms=_OPERATION_TIMEOUT_MS,
      device_filters=['/job:ps', '/job:%s/task:%d' % (task['type'],
                                                        task['index'])])
  config = tf1.estimator.RunConfig(
      session_config=session_config, save_checkpoints_steps=None,
      save_checkpoints_secs=None, log_step_count_steps=None,
      # Bounds the wait of a non-chief worker's session for the chief's
      # initialization (TF's default: 2 hours).
      session_creation_timeout_secs=_CHIEF_START_SECS)
  print('%s: master %s, %d ps, %d workers, chief: %s' % (
      task['type'], config.master, config.num_ps_replicas,
      config.num_worker_replicas, config.is_chief), flush=True)
  estimator = tf1.estimator.Estimator(
      _make_model_fn(tf, tf1, out_path), config=config,
      model_dir=os.path.join(args.out_dir, 'model'),
      params={'mode': 'ps', 'num_workers': config.num_worker_replicas})
  if not config.is_chief:
    _wait_for_chief(tf, tf1, json.loads(os.environ['TF_CONFIG'])['cluster'],
                    min(deadline, time.time() + _CHIEF_START_SECS))
  worker_index = 0 if config.is_chief else 1 + config.task_id
  estimator.train(
      _input_fn(tf, worker_index, config.num_worker_replicas),
      max_steps=args.steps)
  print('%s: done' % task['type'], flush=True)
  return 0


def main():
  args = _parse_args()
  if args.child:
    try:
      code = _child(args)
    except Exception as e:  # pylint: disable=broad-except
      print('%s: FAILED: %s: %s' % (
          json.loads(os.environ['TF_CONFIG'])['task']['type'],
          type(e).__name__, e), flush=True)
      code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # A TF server cannot be stopped; skip the interpreter teardown, where
    # TF 1.15's Server.__del__ prints a spurious AttributeError.
    os._exit(code)  # pylint: disable=protected-access
  return _run_cluster(args)


if __name__ == '__main__':
  sys.exit(main())

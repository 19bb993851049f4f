"""Multi-worker training on one machine: all-reduce, parameter servers, Horovod.

Trains the wide and deep models of estimator_bench.py (global batch 256 a
step, gradient descent) with Estimators, each route's training tasks as
separate processes on 127.0.0.1, one tower (one CPU device) per process:

  one_process   the unreplicated model in one process (batch 256)
  allreduce     replicate_model_fn(variable_placement=REPLICATED), chief +
                worker, no ps: collective all-reduce of the gradients
                (replicate.multi_worker.all_reduce_run_config / _server)
  ps            replicate_model_fn(variable_placement=PARAMETER_SERVERS) +
                TowerOptimizer(SyncReplicasOptimizer): ps + chief + worker
  horovod       hvd.DistributedOptimizer over Gloo, 2 ranks (horovodrun),
                BroadcastGlobalVariablesHook(0); only where Horovod imports
                in --horovod_python, a venv of its own:
                  python3.7 -m venv /tmp/hvd && /tmp/hvd/bin/pip install
                    tensorflow==1.15.5 'protobuf<3.21' 'numpy<1.19' cmake
                    cloudpickle psutil pyyaml packaging cffi
                  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
                    HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1
                    HOROVOD_WITHOUT_MXNET=1 /tmp/hvd/bin/pip install
                    --no-build-isolation horovod==0.28.1

Each training process takes 128 rows a step. examples/s = 256 / the median
wall time between consecutive steps of the chief (rank 0) after a warm-up;
start-up is not counted. The machine's 2 cores are shared by the processes
of a route, so below one_process is expected; the rows compare the routes.
Rounds alternate the order of the routes; the summary is the median.

Usage:
  python benchmarks/multi_worker_bench.py [--models wide,deep]
      [--routes one_process,allreduce,ps,horovod] [--rounds 3]
      [--horovod_python /tmp/hvd/bin/python] [--json out.json] [--quick]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import bench_util
import estimator_bench

GLOBAL_BATCH = estimator_bench.GLOBAL_BATCH
NUM_TASKS = 2
ROUTES = ('one_process', 'allreduce', 'ps', 'horovod')
STEPS = {'wide': (10, 50), 'deep': (20, 300)}
QUICK_STEPS = {'wide': (2, 5), 'deep': (3, 10)}
_OPERATION_TIMEOUT_MS = 60000
_CHILD_TIMEOUT_S = 400


# ----------------------------------------------------------------- child ---


def _timing_hook(tf1, warmup, exit_at_end=None):
  class TimingHook(tf1.train.SessionRunHook):
    """Records the wall time of every step's end.

    With `exit_at_end` (a cluster task), `end` prints the result (the
    chief's) and ends the process: the ps route's chief would otherwise
    wait for its queue runner's operation timeout.
    """

    def __init__(self):
      self.ends = []

    def after_run(self, run_context, run_values):
      self.ends.append(time.perf_counter())

    def end(self, session):
      if exit_at_end is None:
        return
      if exit_at_end == 'chief':
        bench_util.emit(self.result(GLOBAL_BATCH))
      sys.stdout.flush()
      os._exit(0)  # pylint: disable=protected-access

    def result(self, batch):
      gaps = [b - a for a, b in zip(self.ends[warmup:], self.ends[warmup + 1:])]
      step = bench_util.median(gaps)
      return {'status': 'ok', 'examples_per_s': batch / step,
              'step_s_median': step, 'timed_steps': len(gaps)}

  return TimingHook()


def _model_fn(tf, model, wrap_optimizer, extra_hooks=None):
  tf1 = tf.compat.v1

  def model_fn(features, labels, mode, config):
    logits = estimator_bench._logits(tf, model, features)  # pylint: disable=protected-access
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = wrap_optimizer(tf1.train.GradientDescentOptimizer(0.01))
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    hooks = extra_hooks(optimizer, config) if extra_hooks else []
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                       training_hooks=hooks)

  return model_fn


def _input_fn(tf, model, batch):
  import numpy as np  # pylint: disable=g-import-not-at-top
  width, classes = estimator_bench._model_spec(model)  # pylint: disable=protected-access
  rng = np.random.RandomState(0)
  x = rng.standard_normal((batch, width)).astype(np.float32)
  y = rng.randint(0, classes, size=(batch,)).astype(np.int32)
  return lambda: tf.data.Dataset.from_tensors((x, y)).repeat()


def _run_config(tf1, session_config, **kwargs):
  return tf1.estimator.RunConfig(
      session_config=session_config, save_checkpoints_steps=None,
      save_checkpoints_secs=None, save_summary_steps=None,
      log_step_count_steps=None, **kwargs)


def _child(args):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  warmup, steps = (QUICK_STEPS if args.quick else STEPS)[args.model]
  hook = _timing_hook(tf1, warmup)
  model_dir = tempfile.mkdtemp(prefix='mwbench_')
  per_task = GLOBAL_BATCH // NUM_TASKS
  if args.route == 'one_process':
    estimator = tf1.estimator.Estimator(
        _model_fn(tf, args.model, lambda opt: opt), model_dir=model_dir,
        config=_run_config(tf1, tf1.ConfigProto()))
    estimator.train(_input_fn(tf, args.model, GLOBAL_BATCH),
                    max_steps=warmup + steps + 1, hooks=[hook])
    return hook.result(GLOBAL_BATCH)
  if args.route == 'horovod':
    import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
    hvd.init()
    estimator = tf1.estimator.Estimator(
        _model_fn(tf, args.model, hvd.DistributedOptimizer),
        model_dir=model_dir if hvd.rank() == 0 else model_dir + '_r1',
        config=_run_config(tf1, tf1.ConfigProto()))
    estimator.train(_input_fn(tf, args.model, per_task),
                    max_steps=warmup + steps + 1,
                    hooks=[hook, hvd.BroadcastGlobalVariablesHook(0)])
    return hook.result(GLOBAL_BATCH) if hvd.rank() == 0 else None
  import replicate  # pylint: disable=g-import-not-at-top
  task = json.loads(os.environ['TF_CONFIG'])['task']
  hook = _timing_hook(tf1, warmup, exit_at_end=task['type'])
  cluster = tf1.train.ClusterSpec(
      json.loads(os.environ['TF_CONFIG'])['cluster'])
  if args.route == 'allreduce':
    config = replicate.multi_worker.all_reduce_run_config(_run_config(
        tf1, tf1.ConfigProto(operation_timeout_in_ms=_OPERATION_TIMEOUT_MS)))
    server = replicate.multi_worker.all_reduce_server(config)
    model_fn = replicate.replicate_model_fn(
        _model_fn(tf, args.model, replicate.TowerOptimizer),
        devices=['/device:CPU:0'],
        variable_placement=replicate.VariablePlacement.REPLICATED)
  else:
    server = tf1.train.Server(cluster, task['type'], task['index'],
                              config=tf1.ConfigProto())
    if task['type'] == 'ps':
      server.join()
    config = _run_config(
        tf1, tf1.ConfigProto(
            operation_timeout_in_ms=_OPERATION_TIMEOUT_MS,
            device_filters=['/job:ps', '/job:%s/task:%d' % (
                task['type'], task['index'])]),
        session_creation_timeout_secs=_CHILD_TIMEOUT_S)

    def sync(optimizer):
      return replicate.TowerOptimizer(tf1.train.SyncReplicasOptimizer(
          optimizer, replicas_to_aggregate=NUM_TASKS,
          total_num_replicas=NUM_TASKS))

    model_fn = replicate.replicate_model_fn(
        _model_fn(tf, args.model, sync,
                  lambda opt, config: [opt.make_session_run_hook(
                      config.is_chief, num_tokens=0)]),
        devices=['/device:CPU:0'],
        variable_placement=replicate.VariablePlacement.PARAMETER_SERVERS)
  estimator = tf1.estimator.Estimator(model_fn, model_dir=model_dir,
                                      config=config)
  # The ps route's worker waits (up to 30 s, TF's recovery_wait_secs) for
  # the chief's initialization; the chief's warm-up steps wait for it.
  estimator.train(_input_fn(tf, args.model, per_task),
                  max_steps=warmup + steps + 1, hooks=[hook])
  del server
  return hook.result(GLOBAL_BATCH) if task['type'] == 'chief' else None


# ---------------------------------------------------------------- parent ---


def horovod_python(path):
  """`path` if Horovod's TensorFlow module imports there, else None."""
  if not path or not os.path.exists(path):
    return None
  ok = subprocess.run(
      [path, '-c', 'import horovod.tensorflow'], stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL, env=bench_util.child_env()).returncode == 0
  return path if ok else None


def _launch(route, model, quick, hvd_python):
  """Runs one route; returns the result dict of its chief / rank 0."""
  child = [os.path.abspath(__file__), '--child', '--route', route,
           '--model', model] + (['--quick'] if quick else [])
  if route == 'one_process':
    return bench_util.run_child(child[0], child[1:], _CHILD_TIMEOUT_S)
  start = time.time()
  if route == 'horovod':
    horovodrun = os.path.join(os.path.dirname(hvd_python), 'horovodrun')
    try:
      out = subprocess.run(
          [horovodrun, '-np', str(NUM_TASKS), '-H', 'localhost:%d' % NUM_TASKS,
           '--gloo', hvd_python] + child, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, env=bench_util.child_env(),
          cwd=bench_util.ROOT, timeout=_CHILD_TIMEOUT_S).stdout.decode(
              'utf-8', 'replace')
    except subprocess.TimeoutExpired as e:
      out = (e.output or b'').decode('utf-8', 'replace')
    return _result(out, start)
  # Distinct ports: one closed at once can be handed out again, and two
  # tasks on one port (gRPC binds with SO_REUSEPORT) hang.
  ports = bench_util.free_ports(3 if route == 'ps' else 2)
  jobs = {'chief': ['127.0.0.1:%d' % ports[0]],
          'worker': ['127.0.0.1:%d' % ports[1]]}
  if route == 'ps':
    jobs['ps'] = ['127.0.0.1:%d' % ports[2]]
  procs = {}
  with tempfile.TemporaryDirectory() as logs:
    for job in sorted(jobs):
      env = dict(bench_util.child_env(), TF_CONFIG=json.dumps(
          {'cluster': jobs, 'task': {'type': job, 'index': 0}}))
      out = open(os.path.join(logs, job), 'w')
      procs[job] = subprocess.Popen([sys.executable] + child, env=env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    cwd=bench_util.ROOT)
      out.close()
    try:
      procs['chief'].wait(timeout=_CHILD_TIMEOUT_S)
      procs['worker'].wait(timeout=60)
    except subprocess.TimeoutExpired:
      pass
    finally:
      for proc in procs.values():
        if proc.poll() is None:
          proc.kill()
          proc.wait()
    with open(os.path.join(logs, 'chief')) as f:
      return _result(f.read(), start)


def _result(out, start):
  """The result line in a child's output (horovodrun prefixes its lines)."""
  for line in reversed(out.splitlines()):
    at = line.find(bench_util.RESULT_PREFIX + '{')
    if at >= 0:
      result = json.loads(line[at + len(bench_util.RESULT_PREFIX):])
      result['process_s'] = round(time.time() - start, 2)
      return result
  return {'status': 'error', 'reason': '\n'.join(out.splitlines()[-15:])}


def run_all(models, routes, rounds, quick, hvd_python, log=print):
  runs = []
  for r in range(rounds):
    for model in models:
      for route in (routes if r % 2 == 0 else routes[::-1]):
        res = _launch(route, model, quick, hvd_python)
        res.update(model=model, route=route, round=r,
                   load_avg=os.getloadavg()[0])
        runs.append(res)
        if res.get('status') == 'ok':
          log('[multi_worker r{}] {:5s} {:12s} {:9.1f} ex/s  ({:.0f} s, load '
              '{:.1f})'.format(r, model, route, res['examples_per_s'],
                               res.get('process_s', 0), res['load_avg']))
        else:
          log('[multi_worker r{}] {:5s} {:12s} error: {}'.format(
              r, model, route, res.get('reason', '')[-600:]))
  summary = {}
  for model in models:
    for route in routes:
      values = [x['examples_per_s'] for x in runs
                if x['model'] == model and x['route'] == route and
                x.get('status') == 'ok']
      summary['{}/{}'.format(model, route)] = {
          'examples_per_s': bench_util.median(values) if values else None,
          'all': values}
  return {'runs': runs, 'summary': summary}


def _table(results, models, routes, hvd_note):
  lines = ['| model | ' + ' | '.join(routes) + ' |',
           '|---|' + '---|' * len(routes)]
  for model in models:
    cells = []
    for route in routes:
      value = results['summary']['{}/{}'.format(model, route)]
      cells.append('{:,.0f}'.format(value['examples_per_s'])
                   if value['examples_per_s'] else 'n/a')
    lines.append('| {} | {} |'.format(model, ' | '.join(cells)))
  if hvd_note:
    lines.append('')
    lines.append(hvd_note)
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='wide,deep')
  parser.add_argument('--routes', default=','.join(ROUTES))
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--quick', action='store_true',
                      help='a few steps, for a smoke test')
  parser.add_argument('--horovod_python',
                      default=os.environ.get('HOROVOD_PYTHON',
                                             '/tmp/hvd/bin/python'),
                      help='a Python whose venv has horovod[tensorflow]')
  parser.add_argument('--json', default=None, help='write the runs here')
  parser.add_argument('--markdown', default=None,
                      help='write the table (medians, every round, load '
                      'averages) here, e.g. benchmarks/results/multi_worker.md')
  parser.add_argument('--child', action='store_true')
  parser.add_argument('--route', default='one_process')
  parser.add_argument('--model', default='wide')
  args = parser.parse_args(argv)
  if args.child:
    try:
      result = _child(args)
    except Exception as e:  # pylint: disable=broad-except
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
      result = {'status': 'error', 'reason': '{}: {}'.format(
          type(e).__name__, e)}
    if result is not None:
      bench_util.emit(result)
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access
  models = [m for m in args.models.split(',') if m]
  routes = [r for r in args.routes.split(',') if r]
  hvd_python = horovod_python(args.horovod_python)
  hvd_note = None
  if 'horovod' in routes and hvd_python is None:
    routes.remove('horovod')
    hvd_note = ('Horovod: not importable with {}; its row is left out '
                '(this script\'s docstring says how to install it).'.format(
                    args.horovod_python))
    print(hvd_note, flush=True)
  results = run_all(models, routes, 1 if args.quick else args.rounds,
                    args.quick, hvd_python)
  results.update(git=bench_util.git_describe(), routes=routes,
                 horovod_python=hvd_python)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1, sort_keys=True)
  print(_table(results, models, routes, hvd_note))
  if args.markdown:
    write_markdown(args.markdown, results, models, routes, hvd_note)
  return 0


def write_markdown(path, results, models, routes, hvd_note):
  """The results file: medians, each round's value and its load average."""
  lines = [
      '# Multi-worker training on one machine (benchmarks/multi_worker_bench.py)',
      '',
      'Commit: {}. Examples/s of the chief (rank 0), global batch {}, one '
      'tower per training process, {} training processes on this machine\'s '
      '2 cores; medians of {} alternating rounds.'.format(
          results['git'], GLOBAL_BATCH, NUM_TASKS,
          max(r['round'] for r in results['runs']) + 1),
      '', _table(results, models, routes, hvd_note), '',
      '| round | model | route | examples/s | load average (1 min) |',
      '|---|---|---|---|---|']
  for run in results['runs']:
    lines.append('| {} | {} | {} | {} | {:.1f} |'.format(
        run['round'], run['model'], run['route'],
        '{:,.0f}'.format(run['examples_per_s'])
        if run.get('status') == 'ok' else 'error', run['load_avg']))
  with open(path, 'w') as f:
    f.write('\n'.join(lines) + '\n')


if __name__ == '__main__':
  sys.exit(main())

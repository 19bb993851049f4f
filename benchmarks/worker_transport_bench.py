"""Transport of an all-reduce across tasks on one machine (issue 34).

The all-reduce across workers (`VariablePlacement.REPLICATED` without a ps)
runs TF's collective ops, whose ring moves its chunks with gRPC `RecvBuf`
calls. This script times, alone, what one step's exchange of a float32
tensor costs between task processes on 127.0.0.1, by three transports:

  collective  TF's `CollectiveReduce` (replicate's `WorkerAllReduce` path):
              gRPC RecvBuf, the tensor copied into and out of protobuf
              messages on the way
  queues      a ring all-reduce in the graph: each task splits the tensor
              into one chunk per task and passes chunks to the next task's
              `FIFOQueue` (shared by name), N-1 hops to sum, N-1 to gather.
              The tensors travel by TF's RecvTensor, the path of a
              parameter server's variables
  horovod     `hvd.allreduce` over Gloo, in --horovod_python (a venv of its
              own, see multi_worker_bench.py)

Every task process builds its own graph (between-graph, as Estimators do),
checks the sum once, then times --steps session runs of the exchange alone
(a variable read times a fed scale, the all-reduce, a sum of the result).
Figures: the chief's (task 0) median and best ms per exchange. Rounds
alternate the order of the transports; the summary is the median over
rounds.

Usage:
  python benchmarks/worker_transport_bench.py [--mb 1,4,23] [--tasks 2]
      [--transports collective,queues,horovod] [--rounds 3] [--steps 30]
      [--horovod_python /tmp/hvd/bin/python] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import bench_util

TRANSPORTS = ('collective', 'queues', 'horovod')
_TIMEOUT_S = 300


def _ring_all_reduce(tf, tensor, task, tasks):
  """Sum of `tensor` over `tasks` task processes by a ring of FIFOQueues.

  Task t's queue lives on task t; task t only ever enqueues to task t + 1's
  queue, so one FIFO queue per task keeps every hop in order. Reduce-scatter:
  at hop h task t sends its running sum of chunk (t - h) and adds what it
  receives to chunk (t - h - 1); after N-1 hops it holds the full sum of
  chunk (t + 1). All-gather: N-1 more hops pass the summed chunks on.
  """
  tf1 = tf.compat.v1
  n = len(tasks)
  size = tensor.shape.num_elements()
  base = size // n
  sizes = [base] * (n - 1) + [size - base * (n - 1)]
  chunks = tf.split(tensor, sizes)

  def queue(owner, hop):
    with tf1.device(tasks[owner]):
      return tf1.FIFOQueue(
          2, [tensor.dtype], [[sizes[(owner - 1 - hop) % n]]],
          shared_name='ring_{}_{}'.format(owner, hop),
          name='ring_{}_{}'.format(owner, hop))

  nxt = (task + 1) % n
  chunks = list(chunks)
  for hop in range(n - 1):
    sent = queue(nxt, hop).enqueue(chunks[(task - hop) % n])
    index = (task - hop - 1) % n
    with tf.control_dependencies([sent]):
      chunks[index] = chunks[index] + queue(task, hop).dequeue()
  for hop in range(n - 1):
    index = (task + 1 - hop) % n
    sent = queue(nxt, n - 1 + hop).enqueue(chunks[index])
    with tf.control_dependencies([sent]):
      chunks[(index - 1) % n] = queue(task, n - 1 + hop).dequeue()
  return tf.concat(chunks, 0)


def _child(args):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf1.disable_eager_execution()
  elements = int(args.mb * 1e6 / 4)
  if args.transport == 'horovod':
    import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
    hvd.init()
    task, tasks = hvd.rank(), hvd.size()
    target, config = '', tf1.ConfigProto()
  else:
    ports = args.ports.split(',')
    task, tasks = args.task, len(ports)
    cluster = tf1.train.ClusterSpec(
        {'worker': ['127.0.0.1:' + p for p in ports]})
    config = tf1.ConfigProto()
    config.experimental.collective_group_leader = (
        '/job:worker/replica:0/task:0')
    if args.transport == 'collective':
      # As replicate's all_reduce_session_config: each session kept to its
      # own task.
      config.device_filters.append('/job:worker/task:{}'.format(task))
    server = tf1.train.Server(cluster, 'worker', task, config=config)
    target = server.target
  me = '/job:worker/task:{}/device:CPU:0'.format(task)
  graph = tf.Graph()
  with graph.as_default(), tf1.device(me if args.transport != 'horovod'
                                      else '/cpu:0'):
    # Task t holds t + 1 everywhere: the sum is N(N+1)/2, exact in float32.
    v = tf1.get_variable('v', [elements], use_resource=True,
                         initializer=tf1.constant_initializer(task + 1.0))
    scale = tf1.placeholder(tf.float32, [])
    value = v.read_value() * scale
    if args.transport == 'collective':
      from replicate import _compat  # pylint: disable=g-import-not-at-top
      total = _compat.collective_all_reduce(value, tasks, 1, 1, 'Add', 'Id')
    elif args.transport == 'queues':
      total = _ring_all_reduce(
          tf, value, task,
          ['/job:worker/task:{}/device:CPU:0'.format(t)
           for t in range(tasks)])
    else:
      total = hvd.allreduce(value, average=False)
    checked = [tf.reduce_min(total), tf.reduce_max(total)]
    init = tf1.global_variables_initializer()
  sess = tf1.Session(target, graph=graph, config=config)
  sess.run(init)
  expected = tasks * (tasks + 1) / 2.0
  lo, hi = sess.run(checked, {scale: 1.0})
  if lo != expected or hi != expected:
    raise AssertionError('sum {}..{}, expected {}'.format(lo, hi, expected))
  for _ in range(3):
    sess.run(checked[0], {scale: 1.0})
  times = []
  for _ in range(args.steps):
    start = time.perf_counter()
    sess.run(checked[0], {scale: 1.0})
    times.append(time.perf_counter() - start)
  if task == 0:
    bench_util.emit({'status': 'ok',
                     'median_ms': 1e3 * float(np.median(times)),
                     'best_ms': 1e3 * min(times)})
  else:
    # Task 0's last run may still reach this task's server (its queue):
    # stay up a moment. Nobody closes the sessions: a session closing
    # towards a task that is gone waits for gRPC's deadline.
    time.sleep(3)
  sys.stdout.flush()
  os._exit(0)  # pylint: disable=protected-access


def _launch(transport, mb, tasks, steps, hvd_python):
  child = [os.path.abspath(__file__), '--child', '--transport', transport,
           '--mb', str(mb), '--steps', str(steps)]
  if transport == 'horovod':
    horovodrun = os.path.join(os.path.dirname(hvd_python), 'horovodrun')
    cmds = [[horovodrun, '-np', str(tasks), '-H', 'localhost:%d' % tasks,
             '--gloo', hvd_python] + child]
  else:
    ports = ','.join(str(port) for port in bench_util.free_ports(tasks))
    cmds = [[sys.executable] + child + ['--task', str(t), '--ports', ports]
            for t in range(tasks)]
  procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=bench_util.child_env(),
                            cwd=bench_util.ROOT) for cmd in cmds]
  outs = []
  for proc in procs:
    try:
      outs.append(proc.communicate(timeout=_TIMEOUT_S)[0].decode(
          'utf-8', 'replace'))
    except subprocess.TimeoutExpired:
      proc.kill()
      outs.append(proc.communicate()[0].decode('utf-8', 'replace'))
  for line in outs[0].splitlines():
    # horovodrun prefixes its ranks' lines with "[0]<stdout>:".
    line = line.split('<stdout>:', 1)[-1]
    if line.startswith(bench_util.RESULT_PREFIX):
      return json.loads(line[len(bench_util.RESULT_PREFIX):])
  return {'status': 'error',
          'reason': '\n'.join('\n'.join(o.splitlines()[-8:]) for o in outs)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--mb', default='1,4,23')
  parser.add_argument('--tasks', type=int, default=2)
  parser.add_argument('--transports', default=','.join(TRANSPORTS))
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=30)
  parser.add_argument('--horovod_python', default=None)
  parser.add_argument('--json', default=None)
  parser.add_argument('--child', action='store_true')
  parser.add_argument('--transport', default='collective')
  parser.add_argument('--task', type=int, default=0)
  parser.add_argument('--ports', default='')
  args, _ = parser.parse_known_args()
  if args.child:
    args.mb = float(args.mb)
    _child(args)
    return
  transports = [t for t in args.transports.split(',') if t]
  if 'horovod' in transports and not args.horovod_python:
    print('horovod skipped: pass --horovod_python')
    transports.remove('horovod')
  runs = []
  for r in range(args.rounds):
    for mb in [float(m) for m in args.mb.split(',')]:
      for transport in (transports if r % 2 == 0 else transports[::-1]):
        res = _launch(transport, mb, args.tasks, args.steps,
                      args.horovod_python)
        res.update(round=r, mb=mb, transport=transport,
                   load=os.getloadavg()[0])
        runs.append(res)
        print('round {} {:>5} MB {:<10} {}'.format(
            r, mb, transport, '{:.1f} ms (best {:.1f})'.format(
                res['median_ms'], res['best_ms'])
            if res['status'] == 'ok' else res['reason'][-600:]), flush=True)
  print('\nmedian over rounds of the median ms per exchange, {} tasks, TF '
        'of {}:'.format(args.tasks, sys.executable))
  print('| MB | ' + ' | '.join(transports) + ' | collective / queues |')
  print('|---:|' + '---:|' * (len(transports) + 1))
  summary = {}
  for mb in sorted({run['mb'] for run in runs}):
    row = {}
    for transport in transports:
      row[transport] = bench_util.median(
          [run['median_ms'] for run in runs if run['mb'] == mb and
           run['transport'] == transport and run['status'] == 'ok'])
    summary[str(mb)] = row
    ratio = (row['collective'] / row['queues']
             if 'collective' in row and 'queues' in row else float('nan'))
    print('| {:g} | '.format(mb) + ' | '.join(
        '{:.1f}'.format(row[t]) for t in transports) +
          ' | {:.2f}x |'.format(ratio))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'runs': runs, 'summary': summary, 'tasks': args.tasks,
                 'git': bench_util.git_describe()}, f, indent=1)


if __name__ == '__main__':
  main()

"""`replicate.MirroredStrategy` in a session loop against one device.

Runs, each in a process of its own, the deep model (100 dense layers of 64
units, tanh, 64 classes; Momentum; global batch 256; 4 virtual CPUs):

  single        the model built once on /device:CPU:0, a plain Session loop
  clone         replicate.MirroredStrategy(replica_build=CLONE), the opt-in:
                the step function runs once, replicas 1..3 are copies
  per_replica   replicate.MirroredStrategy (CALL_PER_REPLICA, the default):
                the step function runs once per replica, as TF's does

The strategies use the loop of docs/mirrored_strategy.md
(`experimental_distribute_dataset`, `strategy.run`, `strategy.group`,
`replicate.TowerOptimizer`). Measured: graph build (from the first op to
the train op), session creation plus variable initialization, ops in the
graph, and examples/s (global batch / median step time after the warm-up).
Rounds alternate the configurations; the table gives medians and each
configuration's ratio to `single`, with the load average. `--baseline DIR`
also runs the `--baseline-configs` from another checkout (e.g. the commit
before a change, `git archive HEAD~1 | tar -x -C DIR`), as `<config>@base`
rows of the same run: before and after, side by side on a noisy machine.

Usage:
  python benchmarks/mirrored_bench.py [--rounds 3] [--steps 200]
  python benchmarks/mirrored_bench.py --baseline /tmp/base --configs single,clone
  python benchmarks/mirrored_bench.py --child --config clone
"""
import argparse
import os
import sys
import time

import bench_util

CONFIGS = ('single', 'clone', 'per_replica')
GLOBAL_BATCH = 256
WIDTH = CLASSES = 64
LAYERS = 100


def _logits(tf, features):
  tf1 = tf.compat.v1
  h = features
  for i in range(LAYERS):
    h = tf1.layers.dense(h, WIDTH, activation=tf.nn.tanh if i < LAYERS - 1
                         else None, name='dense_{}'.format(i))
  return h


def run_one(config, warmup, steps):
  """Builds and trains one configuration here; returns its result dict."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  import replicate  # pylint: disable=g-import-not-at-top
  from replicate.strategy import mirrored_copies  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  x = rng.standard_normal((GLOBAL_BATCH, WIDTH)).astype(np.float32)
  y = rng.randint(0, CLASSES, size=(GLOBAL_BATCH,)).astype(np.int32)
  replicas = 1 if config == 'single' else bench_util.NUM_DEVICES

  def step(inputs):
    features, labels = inputs
    loss = tf1.losses.sparse_softmax_cross_entropy(
        labels, _logits(tf, features)) / float(replicas)
    optimizer = tf1.train.MomentumOptimizer(0.01, 0.9)
    if config != 'single':
      optimizer = replicate.TowerOptimizer(optimizer)
    return optimizer.minimize(loss, tf1.train.get_or_create_global_step())

  graph = tf.Graph()
  with graph.as_default():
    start = time.perf_counter()
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    if config == 'single':
      with tf1.device('/device:CPU:0'):
        iterator = tf1.data.make_initializable_iterator(dataset)
        train_op = step(iterator.get_next())
    else:
      build = (mirrored_copies.ReplicaBuild.CLONE if config == 'clone' else
               mirrored_copies.ReplicaBuild.CALL_PER_REPLICA)
      strategy = replicate.MirroredStrategy(
          devices=list(bench_util.DEVICES), replica_build=build)
      with strategy.scope():
        # Each element is a global batch; replica i takes its i-th quarter.
        iterator = strategy.experimental_distribute_dataset(
            dataset).make_initializable_iterator()
        train_op = strategy.group(strategy.run(step,
                                               args=(iterator.get_next(),)))
    build_s = time.perf_counter() - start
    ops = len(graph.get_operations())
    start = time.perf_counter()
    config_proto = tf1.ConfigProto(
        device_count={'CPU': bench_util.NUM_DEVICES})
    with tf1.Session(config=config_proto) as sess:
      sess.run([tf1.global_variables_initializer(), iterator.initializer])
      session_s = time.perf_counter() - start
      for _ in range(warmup):
        sess.run(train_op)
      times = []
      for _ in range(steps):
        begin = time.perf_counter()
        sess.run(train_op)
        times.append(time.perf_counter() - begin)
  return {'config': config, 'status': 'ok', 'build_s': build_s,
          'session_s': session_s, 'ops': ops, 'tf_version': tf.__version__,
          'examples_per_s': GLOBAL_BATCH / bench_util.median(times)}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--warmup', type=int, default=10)
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--configs', default=','.join(CONFIGS))
  parser.add_argument('--child', action='store_true')
  parser.add_argument('--config', default='single')
  parser.add_argument('--baseline', default=None,
                      help='another checkout whose configs run as <c>@base')
  parser.add_argument('--baseline-configs', default='clone')
  args = parser.parse_args(argv)
  if args.child:
    bench_util.emit(run_one(args.config, args.warmup, args.steps))
    return
  here = os.path.abspath(__file__)
  scripts = {c: here for c in args.configs.split(',')}
  if args.baseline:
    there = os.path.join(os.path.abspath(args.baseline), 'benchmarks',
                         os.path.basename(here))
    scripts.update((c + '@base', there)
                   for c in args.baseline_configs.split(','))
  configs = list(scripts)
  runs = {c: [] for c in configs}
  loads = []
  for round_index in range(args.rounds):
    order = configs if round_index % 2 == 0 else configs[::-1]
    for config in order:
      loads.append(os.getloadavg()[0])
      result = bench_util.run_child(
          scripts[config],
          ['--child', '--config', config.split('@')[0], '--warmup',
           str(args.warmup), '--steps', str(args.steps)], timeout_s=900)
      if result.get('status') != 'ok':
        print(config, result, file=sys.stderr)
        continue
      runs[config].append(result)
  print('# {}; {} rounds; load average (1 min) {:.1f}-{:.1f}'.format(
      bench_util.git_describe(), args.rounds, min(loads), max(loads)))
  keys = ('build_s', 'session_s', 'ops', 'examples_per_s')
  medians = {c: {k: bench_util.median([r[k] for r in runs[c]]) for k in keys}
             for c in configs if runs[c]}
  base = medians.get('single')
  print('| config | build s | session+init s | ops | examples/s | build '
        'ratio | examples/s ratio |')
  print('|---|---|---|---|---|---|---|')
  for config, m in medians.items():
    ratios = ('{:.2f}x'.format(m['build_s'] / base['build_s']),
              '{:.2f}x'.format(m['examples_per_s'] / base['examples_per_s'])
              ) if base else ('-', '-')
    print('| {} | {:.2f} | {:.2f} | {:,.0f} | {:,.0f} | {} | {} |'.format(
        config, m['build_s'], m['session_s'], m['ops'], m['examples_per_s'],
        *ratios))


if __name__ == '__main__':
  main()

"""What GPU users wait for, measured graph-only (issue 34, item 6).

Builds the training graph of ResNet-50, a Transformer-like encoder and a wide
& deep model (benchmarks/graph_models.py) for '/gpu:i' towers on this CPU
machine and runs nothing: graph construction is host-side Python whatever
the device. Every (model, configuration, tower count) is built in a fresh
child process (same Python, or `--python`), so that its RSS is its own:

  single       the plain model_fn under tf.device('/gpu:0')
  replicate    replicate.replicate_model_fn(model_fn, devices=GPUs)
  replicated   the same with VariablePlacement.REPLICATED and
               AllReduceCrossTowerOps('nccl') at its defaults
  contrib      tf.contrib.estimator.replicate_model_fn (TF 1.15 only)
  tf_mirrored  tf.distribute.MirroredStrategy(GPUs, NcclAllReduce()) in graph
               mode: model_fn per replica by call_for_each_replica, each
               replica's shard of the batch sliced on /cpu:0

Each child creates the global step, builds the global batch's input on
/cpu:0 (as the Estimator's input_fn), takes `ru_maxrss` as its baseline, then
calls the (wrapped) model_fn once under TRAIN -- no Estimator, no session run
-- and reports:

  build CPU s    process CPU time of that call (`time.process_time`: the
                 machine is shared, CPU time is what the build costs)
  RSS MB         `ru_maxrss` growth over the baseline
  session s      tf.compat.v1.Session(graph) creation plus one run of a tiny
                 constant added after the build, so that the whole GraphDef is
                 handed over to the C++ session (TF's graph extension);
                 `place_pruned_graph` keeps the placer to that constant, since
                 on a CPU-only machine soft placement would move a GPU graph
                 to the CPU and NCCL ops have no CPU kernel
  ops, graph MB  operations and `as_graph_def().ByteSize()`
  bytes / step   tests/graph_metrics.py's `bytes_per_link` on the cone of the
                 train op (MEASUREMENTS.md's method), by link: host<->GPU,
                 GPU<->GPU, NCCL ring (2(N-1) x bytes per member set); vs the
                 ring floor 2(N-1) x P, P the bytes of the trainable
                 variables' gradients (n/a for one tower)
  collectives    distinct all-reduce launches per step, and the share of the
                 all-reduced bytes ready before the last one (overlappable),
                 from graph_metrics' `overlap_report`

tests/graph_metrics.py holds the analysis so that its unit tests
(tests/test_graph_metrics.py) check the very code that makes these numbers;
the children import it by putting tests/ on sys.path.

Rounds (`--rounds`, default 2) alternate the order; ratios are taken against
`single` of the same round, and the median over rounds is reported.

  python benchmarks/gpu_graph_bench.py --models resnet50 --towers 1,8,16 \\
      --configs single,replicate,replicated,contrib --rounds 1
  python benchmarks/gpu_graph_bench.py --python .venv/tf2/bin/python --append
  python benchmarks/gpu_graph_bench.py --quick     # resnet50, 1,8; tmp dir

Writes DIR/gpu_graph.md, DIR/gpu_graph.json and DIR/gpu_graph.png (matplotlib
in this Python or $BENCH_PLOT_PYTHON); DIR is benchmarks/results
(results/tmp for --quick). `--append` keeps the JSON's sections of the other
TF version, and of other `--label`s (e.g. a run of more configurations at
fewer tower counts beside the main one).
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import datetime
import gc
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time

import bench_util

MODELS = ('resnet50', 'transformer', 'wide_deep')
CONFIGS = ('single', 'replicate', 'replicated', 'contrib', 'tf_mirrored')
TOWERS = (1, 2, 4, 8, 16)
LINK_KEYS = ('host<->GPU', 'GPU<->GPU', 'NCCL ring')
MB = 1e6


def _maxrss_mb():
  """Peak RSS of this process so far, MB."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ----------------------------------------------------------------------------
# Child: build one (model, config, towers) graph in this process.
# ----------------------------------------------------------------------------


def _builders(tf, replicate):
  """`{config: build(model_fn, features, labels, gpus) -> train_op}`."""
  tf1 = tf.compat.v1
  train = tf1.estimator.ModeKeys.TRAIN

  def single(model_fn, features, labels, gpus):
    del gpus
    with tf.device('/gpu:0'):
      return model_fn(features, labels, train,
                      {'wrap_optimizer': lambda o: o}).train_op

  def replicate_default(model_fn, features, labels, gpus):
    return replicate.replicate_model_fn(model_fn, devices=gpus)(
        features, labels, train,
        {'wrap_optimizer': replicate.TowerOptimizer}, None).train_op

  def replicated(model_fn, features, labels, gpus):
    return replicate.replicate_model_fn(
        model_fn, devices=gpus,
        variable_placement=replicate.VariablePlacement.REPLICATED,
        cross_tower_ops=replicate.cross_tower_ops.AllReduceCrossTowerOps(
            'nccl'))(features, labels, train,
                     {'wrap_optimizer': replicate.TowerOptimizer},
                     None).train_op

  def contrib(model_fn, features, labels, gpus):
    estimator = tf.contrib.estimator
    return estimator.replicate_model_fn(model_fn, devices=gpus)(
        features, labels, train,
        {'wrap_optimizer': estimator.TowerOptimizer}, None).train_op

  def tf_mirrored(model_fn, features, labels, gpus):
    strategy = tf.distribute.MirroredStrategy(
        devices=gpus, cross_device_ops=tf.distribute.NcclAllReduce())
    n = len(gpus)

    def step_fn():
      context = tf.distribute.get_replica_context()
      index = tf.get_static_value(context.replica_id_in_sync_group)
      with tf.device('/cpu:0'):
        shard = lambda t: t[index * (t.shape[0] // n):
                            (index + 1) * (t.shape[0] // n)]
        shards = tf.nest.map_structure(shard, (features, labels))
      return model_fn(shards[0], shards[1], train,
                      {'wrap_optimizer': lambda o: o}).train_op

    with strategy.scope():
      tf1.train.get_or_create_global_step()
      per_replica = strategy.extended.call_for_each_replica(step_fn)
      return tf.group(strategy.experimental_local_results(per_replica))

  return {'single': single, 'replicate': replicate_default,
          'replicated': replicated, 'contrib': contrib,
          'tf_mirrored': tf_mirrored}


def _gradient_bytes(tf):
  """P: bytes of the trainable variables, each tower's copy counted once."""
  sizes = {}
  for var in tf.compat.v1.trainable_variables():
    name = re.sub(r'^tower_\d+/', '', var.op.name)
    name = re.sub(r'/replica_\d+', '', name)
    sizes[name] = var.shape.num_elements() * var.dtype.base_dtype.size
  return sum(sizes.values())


def run_one(model, config, towers):
  """Builds one configuration's graph here; returns its result dict."""
  sys.path.insert(0, os.path.join(bench_util.ROOT, 'tests'))
  import graph_metrics  # pylint: disable=g-import-not-at-top
  import graph_models  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import replicate  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  result = {'model': model, 'config': config, 'towers': towers,
            'tf_version': tf.__version__}
  if config == 'contrib':
    if not hasattr(tf, 'contrib'):
      return dict(result, status='n/a', reason='no tf.contrib in TF ' +
                  tf.__version__)
    tf.contrib.estimator  # pylint: disable=pointless-statement
  model_fn, make_input, batch = graph_models.MODELS[model]
  build = _builders(tf, replicate)[config]
  gpus = ['/gpu:{}'.format(i) for i in range(towers)]
  graph = tf.Graph()
  with graph.as_default():
    if config != 'tf_mirrored':  # MirroredStrategy makes its own.
      tf1.train.get_or_create_global_step()
    with tf.device('/cpu:0'):
      features, labels = make_input(batch)
    gc.collect()
    rss_base = _maxrss_mb()
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
      train_op = build(model_fn, features, labels, gpus)
    except Exception as e:  # pylint: disable=broad-except
      first = (str(e).strip().splitlines() or [''])[0]
      return dict(result, status='n/a', reason='{}: {}'.format(
          type(e).__name__, first[:300]))
    result.update(build_s=time.perf_counter() - start,
                  build_cpu_s=time.process_time() - start_cpu,
                  rss_mb=_maxrss_mb() - rss_base, rss_base_mb=rss_base,
                  ops=len(graph.get_operations()),
                  graph_mb=graph.as_graph_def().ByteSize() / MB)
    size = _gradient_bytes(tf)
    links = graph_metrics.bytes_per_link([train_op])
    floor = graph_metrics.ring_floor(towers, size)
    overlap = graph_metrics.overlap_report(graph, size)
    result.update(
        gradient_mb=size / MB,
        links_mb={k: links[k] / MB for k in LINK_KEYS},
        host_host_mb=links['host<->host'] / MB,
        bytes_mb=links['total'] / MB,
        vs_floor=links['total'] / floor if floor else None,
        unknown_tensors=links['unknown_tensors'],
        unplaced_ops=links['unplaced_ops'],
        collectives=overlap['collectives'],
        overlappable=overlap['overlappable'])
    probe = tf.constant(0, name='session_probe')
  session_config = tf1.ConfigProto(allow_soft_placement=True)
  session_config.graph_options.place_pruned_graph = True
  start, start_cpu = time.perf_counter(), time.process_time()
  with tf1.Session(graph=graph, config=session_config) as sess:
    sess.run(probe)
    result.update(session_s=time.perf_counter() - start,
                  session_cpu_s=time.process_time() - start_cpu)
  result['status'] = 'ok'
  return result


# ----------------------------------------------------------------------------
# Parent: every configuration in its own process, rounds alternating.
# ----------------------------------------------------------------------------


def _plan(models, configs, towers, rounds):
  """[(round, model, config, towers)]: `single` once per model and round."""
  plan = []
  for r in range(rounds):
    one = []
    for model in models:
      if 'single' in configs:
        one.append((model, 'single', 1))
      for n in towers:
        one.extend((model, c, n) for c in configs if c != 'single')
    plan.extend((r,) + item for item in (one if r % 2 == 0 else one[::-1]))
  return plan


def run_section(models, configs, towers, rounds, python, timeout_s):
  """Runs the plan with `python`; returns one section of the report."""
  runs = []
  started = datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC')
  load_before = os.getloadavg()
  for r, model, config, n in _plan(models, configs, towers, rounds):
    res = bench_util.run_child(
        os.path.abspath(__file__),
        ['--child', '--model', model, '--config', config, '--n', str(n)],
        timeout_s, python=python)
    res.update(round=r, model=model, config=config, towers=n)
    runs.append(res)
    if res.get('status') == 'ok':
      print('[gpu_graph {}] r{} {:11s} {:11s} {:2d}: build CPU {:6.2f}s rss '
            '{:6.0f} MB session {:5.2f}s ops {:6d} bytes {:8.1f} MB '
            '({:.0f}s)'.format(res['tf_version'], r, model, config, n,
                               res['build_cpu_s'], res['rss_mb'],
                               res['session_s'], res['ops'], res['bytes_mb'],
                               res['process_s']))
    else:
      print('[gpu_graph] r{} {} {} {}: {} {}'.format(
          r, model, config, n, res.get('status'),
          res.get('reason', '')[-400:]))
    sys.stdout.flush()
  tf_version = next((r['tf_version'] for r in runs if 'tf_version' in r),
                    'unknown')
  return {'tf_version': tf_version, 'python': python, 'started': started,
          'loadavg_before': load_before, 'loadavg_after': os.getloadavg(),
          'models': list(models), 'configs': list(configs),
          'towers': list(towers), 'rounds': rounds, 'runs': runs,
          'git': bench_util.git_describe(), 'platform': platform.platform()}


def _ok(section, model, config, n):
  """The successful runs of one row, by round."""
  return {r['round']: r for r in section['runs']
          if r['model'] == model and r['config'] == config
          and r['towers'] == n and r.get('status') == 'ok'}


def ratio(section, model, config, n, metric):
  """Median over rounds of `metric` / `single`'s in the same round."""
  single = _ok(section, model, 'single', 1)
  vals = [r[metric] / single[k][metric]
          for k, r in _ok(section, model, config, n).items()
          if k in single and single[k][metric]]
  return bench_util.median(vals) if vals else None


def _med(runs, key):
  """Median over rounds of `key(run)`, None where it is None."""
  vals = [key(r) for r in runs.values()]
  vals = [v for v in vals if v is not None]
  return bench_util.median(vals) if vals else None


def _fmt(value, spec, suffix=''):
  """`spec.format(value)` + suffix, or n/a."""
  return 'n/a' if value is None else spec.format(value) + suffix


def _rows(section, model):
  """(config, towers) in the table's order: single, then by tower count."""
  rows = [('single', 1)] if 'single' in section['configs'] else []
  for n in section['towers']:
    rows.extend((c, n) for c in section['configs'] if c != 'single')
  return rows


def section_md(section):
  """Markdown tables of one section (one TF version), one per model."""
  lines = ['### TF {}{} ({}; {} round(s); load average {:.1f} before, '
           '{:.1f} after)'.format(section['tf_version'],
                                  ', ' + section['label'] if section.get(
                                      'label') else '', section['started'],
                           section['rounds'], section['loadavg_before'][0],
                           section['loadavg_after'][0]), '']
  for model in section['models']:
    gradient = [r['gradient_mb'] for r in section['runs']
                if r['model'] == model and r.get('status') == 'ok']
    lines.append('**{}** (P = {} MB of gradients)\n'.format(
        model, _fmt(gradient[0] if gradient else None, '{:.1f}')))
    lines.append('| config | towers | build CPU s | build ratio | RSS MB | '
                 'RSS ratio | session s | ops | graph MB | host<->GPU MB | '
                 'GPU<->GPU MB | NCCL ring MB | vs floor | collectives | '
                 'overlappable |')
    lines.append('|---|---:' + '|---:' * 13 + '|')
    for config, n in _rows(section, model):
      runs = _ok(section, model, config, n)
      if not runs:
        why = [r for r in section['runs'] if r['model'] == model and
               r['config'] == config and r['towers'] == n]
        reason = why[0].get('reason', '')[:120].replace('|', '/') if why \
            else ''
        lines.append('| {} | {} | n/a ({}) |'.format(config, n, reason))
        continue
      link = lambda k: _fmt(_med(runs, lambda r: r['links_mb'][k]), '{:.1f}')
      lines.append('| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | '
                   '{} | {} | {} | {} |'.format(
                       config, n,
                       _fmt(_med(runs, lambda r: r['build_cpu_s']), '{:.2f}'),
                       _fmt(ratio(section, model, config, n, 'build_cpu_s'),
                            '{:.2f}', 'x'),
                       _fmt(_med(runs, lambda r: r['rss_mb']), '{:.0f}'),
                       _fmt(ratio(section, model, config, n, 'rss_mb'),
                            '{:.2f}', 'x'),
                       _fmt(_med(runs, lambda r: r['session_s']), '{:.2f}'),
                       _fmt(_med(runs, lambda r: r['ops']), '{:.0f}'),
                       _fmt(_med(runs, lambda r: r['graph_mb']), '{:.1f}'),
                       link('host<->GPU'), link('GPU<->GPU'),
                       link('NCCL ring'),
                       _fmt(_med(runs, lambda r: r['vs_floor']), '{:.3f}',
                            'x'),
                       _fmt(_med(runs, lambda r: r['collectives']), '{:.0f}'),
                       _fmt(_med(runs, lambda r: r['overlappable']),
                            '{:.2f}')))
    unknown = max([r.get('unknown_tensors', 0) for r in section['runs']
                   if r['model'] == model] or [0])
    unplaced = max([r.get('unplaced_ops', 0) for r in section['runs']
                    if r['model'] == model] or [0])
    lines.append('\nCrossing tensors of unknown static size (counted as 0 '
                 'bytes): at most {}; ops of the train cone with no device '
                 '(put on GPU:0): at most {}.\n'.format(unknown, unplaced))
  return '\n'.join(lines)


def write_report(report, out_dir):
  """Writes gpu_graph.md and .json under `out_dir`; returns the md text."""
  md = ['# GPU towers, graph only', '',
        'Generated by `benchmarks/gpu_graph_bench.py` ({}) on a {}-core CPU '
        'machine shared with other work: graphs built for `/gpu:i` towers, '
        'nothing run. Build is process CPU time; ratios are against `single` '
        '(the plain model_fn on one GPU) of the same round, medians over '
        'rounds. Bytes per step by link from `tests/graph_metrics.py` '
        '(MEASUREMENTS.md\'s method), vs the ring floor 2(N-1)P, P counting '
        'every trainable variable dense: a model whose embeddings get '
        'sparse (IndexedSlices) gradients can move less than the floor, and '
        'crossing tensors of unknown static size (sparse gradients\' rows) '
        'count 0 bytes, as the note under each table says.'.format(
            report['sections'][-1]['git'], os.cpu_count()), '']
  md.extend(section_md(s) for s in report['sections'])
  text = '\n'.join(md) + '\n'
  with open(os.path.join(out_dir, 'gpu_graph.md'), 'w') as f:
    f.write(text)
  with open(os.path.join(out_dir, 'gpu_graph.json'), 'w') as f:
    json.dump(report, f, indent=1, sort_keys=True)
  return text


def plot(report, path):
  """Build and RSS ratio vs towers, per config, one column per model.

  Colour: configuration; solid TF 1.15, dashed TF 2.15; crosses: labelled
  sections (runs beside the main one). Log scales on both axes.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  models = sorted({m for s in report['sections'] for m in s['models']},
                  key=MODELS.index)
  colours = dict(zip(CONFIGS, plt.get_cmap('tab10').colors))
  fig, grid = plt.subplots(2, len(models), figsize=(5.5 * len(models), 8),
                           squeeze=False)
  for col, model in enumerate(models):
    for row, (metric, label) in enumerate((('build_cpu_s', 'build CPU'),
                                           ('rss_mb', 'RSS growth'))):
      ax = grid[row][col]
      for section in report['sections']:
        if model not in section['models']:
          continue
        tf2 = not section['tf_version'].startswith('1.')
        for config in section['configs']:
          if config == 'single':
            continue
          pts = [(n, ratio(section, model, config, n, metric))
                 for n in section['towers']]
          pts = [p for p in pts if p[1] is not None]
          if not pts:
            continue
          extra = section.get('label')
          ax.plot([p[0] for p in pts], [p[1] for p in pts],
                  '--' if tf2 else '-', color=colours[config],
                  marker='x' if extra else 'o', ms=8 if extra else 5,
                  lw=0 if extra else 1.5,
                  label='{} TF {}{}'.format(config, section['tf_version'],
                                            ' ({})'.format(extra) if extra
                                            else ''))
      ax.set_xscale('log', base=2)
      ax.set_yscale('log')
      ax.set_xlabel('GPU towers (graph only)')
      ax.set_title('{}: {} / one GPU'.format(model, label), fontsize=10)
      ax.axhline(1.0, color='grey', lw=0.5)
      ax.grid(alpha=0.3, which='both')
      ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=90)


def _draw(json_path, png_path):
  """Draws the plot here or with $BENCH_PLOT_PYTHON; False if neither can."""
  try:
    import matplotlib  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    other = os.environ.get('BENCH_PLOT_PYTHON')
    if not other:
      return False
    return subprocess.call([other, os.path.abspath(__file__), '--plot',
                            json_path, png_path], env=bench_util.child_env(),
                           cwd=bench_util.ROOT) == 0
  with open(json_path) as f:
    plot(json.load(f), png_path)
  return True


def main(argv=None):
  """Parent (plan, children, report), --child or --plot."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default=None)
  parser.add_argument('--configs', default=None)
  parser.add_argument('--towers', default=None)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--quick', action='store_true',
                      help='resnet50, towers 1,8, 1 round; results/tmp')
  parser.add_argument('--python', default=None,
                      help='Python of the children (default: this one)')
  parser.add_argument('--append', action='store_true',
                      help="keep the JSON's sections of other TF versions")
  parser.add_argument('--out', default=None, help='output directory')
  parser.add_argument('--label', default='',
                      help='names this run\'s section: --append replaces only '
                      'the section of the same TF version and label')
  parser.add_argument('--timeout', type=int, default=1800)
  parser.add_argument('--child', action='store_true')
  parser.add_argument('--model', default='resnet50')
  parser.add_argument('--config', default='single')
  parser.add_argument('--n', type=int, default=1)
  parser.add_argument('--plot', nargs=2, metavar=('JSON', 'PNG'))
  args = parser.parse_args(argv)
  if args.plot:
    with open(args.plot[0]) as f:
      plot(json.load(f), args.plot[1])
    return 0
  if args.child:
    try:
      res = run_one(args.model, args.config, args.n)
    except Exception as e:  # pylint: disable=broad-except
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
      res = {'status': 'error', 'reason': '{}: {}'.format(type(e).__name__, e)}
    bench_util.emit(res)
    return 0
  models = args.models.split(',') if args.models else (
      ['resnet50'] if args.quick else list(MODELS))
  configs = args.configs.split(',') if args.configs else list(CONFIGS)
  towers = [int(t) for t in args.towers.split(',')] if args.towers else (
      [1, 8] if args.quick else list(TOWERS))
  rounds = 1 if args.quick else args.rounds
  out_dir = args.out or os.path.join(bench_util.RESULTS_DIR,
                                     'tmp' if args.quick else '')
  if not os.path.isdir(out_dir):
    os.makedirs(out_dir)
  python = os.path.abspath(args.python) if args.python else sys.executable
  section = run_section(models, configs, towers, rounds, python, args.timeout)
  section['label'] = args.label
  json_path = os.path.join(out_dir, 'gpu_graph.json')
  sections = []
  if args.append and os.path.exists(json_path):
    with open(json_path) as f:
      sections = [s for s in json.load(f)['sections']
                  if (s['tf_version'], s.get('label', '')) !=
                  (section['tf_version'], section['label'])]
  sections.append(section)
  sections.sort(key=lambda s: (s.get('label', ''), s['tf_version']))
  write_report({'sections': sections}, out_dir)
  drawn = _draw(json_path, os.path.join(out_dir, 'gpu_graph.png'))
  print(section_md(section))
  print('wrote {}/gpu_graph.md, gpu_graph.json{}'.format(
      out_dir, ', gpu_graph.png' if drawn else
      ' (no matplotlib here or in $BENCH_PLOT_PYTHON: no plot)'))
  return 0


if __name__ == '__main__':
  sys.exit(main())

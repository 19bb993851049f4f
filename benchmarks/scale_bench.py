"""Scale: what 1 to 32 towers cost against one device (issue 26).

For every tower count (virtual CPUs, `replicate.testing.virtual_cpu_config`)
and model, one Estimator training run in a process of its own, with the
unreplicated model_fn on one device measured in the same run (before and
after the towers, the median of the two is the baseline):

  graph build     `Estimator.train()` call to the hook's `begin()`: input_fn,
                  model_fn of every tower, gradients, train_op, the
                  Estimator's bookkeeping
  session         `begin()` to `after_create_session()`: finalize, session
                  creation, variable initialization (TF places the whole
                  graph on the first run, the initializer)
  first step      session created to the end of step 0 (pruning, Grappler,
                  partitioning and executors of the train subgraph, then one
                  step)
  examples/s      global batch / median step time after the warm-up steps
  peak RSS        `ru_maxrss` of the child (also after each phase)

Models: `deep` (estimator_bench.py's 100 dense layers of 64, 200 variables)
and `vars1000` (500 chained dense layers of 16, 1,000 variables); global batch
256 for every tower count (8 rows a tower at 32).

  python benchmarks/scale_bench.py                       # full, ~25 min
  python benchmarks/scale_bench.py --quick               # 1,4,16 deep, 5 steps
  python benchmarks/scale_bench.py --towers 1,4,16 --models deep --steps 5
  .venv/tf2/bin/python benchmarks/scale_bench.py --append --towers 1,4,16
  python benchmarks/scale_bench.py --quick --variants pack_small_bytes=0
      (beside each tower count, the same with a replicate.Tuning A/B)

Children run with this Python (`--python` picks another, e.g. the TF 2.15
venv's, while this one draws the plot). `--append` keeps the sections of the
other TF versions already in the JSON, so TF 1.15 and TF 2.15 share one
report; ratios are only ever taken within one section (one run). Writes
DIR/scale.md, DIR/scale.json (not committed) and DIR/scale.png (if
matplotlib is importable); DIR is benchmarks/results, results/tmp for --quick.

Profiling one configuration (item 2 of the issue):
  python benchmarks/scale_bench.py --child --model deep --towers 16 \\
      --config replicate --cprofile /tmp/x.prof [--tracemalloc] \\
      [--grappler off]
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
import resource
import shutil
import sys
import tempfile
import time

import bench_util
import estimator_bench

MODELS = ('deep', 'vars1000')
TOWERS = (1, 2, 4, 8, 16, 32)
QUICK_TOWERS = (1, 4, 16)
# (warm-up steps, timed steps) per model.
STEPS = {'deep': (5, 30), 'vars1000': (2, 4)}
METRICS = (('graph_build_s', 'graph build (s)', '{:.2f}'),
           ('graph_build_cpu_s', 'build CPU (s)', '{:.2f}'),
           ('session_s', 'session (s)', '{:.2f}'),
           ('first_step_s', 'first step (s)', '{:.2f}'),
           ('first_step_cpu_s', 'first step CPU (s)', '{:.2f}'),
           ('examples_per_s', 'examples/s', '{:.0f}'),
           ('peak_rss_mb', 'peak RSS (MB)', '{:.0f}'))


def _maxrss_mb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ----------------------------------------------------------------------------
# Child: one (model, tower count) in this process.
# ----------------------------------------------------------------------------


def _gc_recorder():
  """Counts and times the garbage collections (gc.callbacks)."""
  stats = {'count': [0, 0, 0], 'seconds': 0.0}
  started = []

  def callback(phase, info):
    if phase == 'start':
      started.append(time.perf_counter())
    elif started:
      stats['seconds'] += time.perf_counter() - started.pop()
      stats['count'][info['generation']] += 1
  gc.callbacks.append(callback)
  return stats


def run_one(model, config, towers, warmup, steps, grappler=True,
            cprofile=None, trace_malloc=False, rewrite=(), knobs=()):
  """Trains one configuration in this process; returns its result dict.

  `grappler=False` turns TF's graph optimizer off; `rewrite` holds
  `(field, value)` pairs of `RewriterConfig` (e.g. `('constant_folding',
  'OFF')`, `('memory_optimization', 'NO_MEM_OPT')`): Grappler A/B runs.
  `knobs` holds `(field, value)` pairs of `replicate.Tuning` (ints as
  strings): A/B runs of the library's knobs.
  """
  result = {'model': model, 'config': config, 'towers': towers,
            'warmup': warmup, 'steps': steps,
            'global_batch': estimator_bench.GLOBAL_BATCH,
            'rss_import_mb': None}
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import replicate  # pylint: disable=g-import-not-at-top
  from replicate import testing  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  result['tf_version'] = tf.__version__
  if knobs:
    replicate.set_tuning(replicate.get_tuning().replace(**{
        field: int(value) for field, value in knobs}))
  result['tuning'] = dict(knobs)
  result['rss_import_mb'] = _maxrss_mb()
  gc_stats = _gc_recorder()
  timings = {}
  if trace_malloc:
    import tracemalloc  # pylint: disable=g-import-not-at-top
    tracemalloc.start(1)
  base = type(estimator_bench._make_hook(tf, []))  # pylint: disable=protected-access

  class ScaleHook(base):
    """estimator_bench's timing hook plus RSS, op count and gc per phase."""

    def begin(self):
      super(ScaleHook, self).begin()
      graph = tf1.get_default_graph()
      result['ops'] = len(graph.get_operations())
      result['rss_build_mb'] = _maxrss_mb()
      result['gc_build'] = {'count': list(gc_stats['count']),
                            'seconds': gc_stats['seconds']}
      if trace_malloc:
        snap = tracemalloc.take_snapshot()
        result['tracemalloc_build_mb'] = sum(
            s.size for s in snap.statistics('filename')) / 2.0**20
        result['tracemalloc_top'] = [
            '{:.1f} MB {:d} blocks {}'.format(s.size / 2.0**20, s.count,
                                               s.traceback)
            for s in snap.statistics('lineno')[:15]]
        tracemalloc.stop()

    def after_create_session(self, session, coord):
      super(ScaleHook, self).after_create_session(session, coord)
      result['rss_session_mb'] = _maxrss_mb()
      self.session_cpu = time.process_time()

    def after_run(self, run_context, run_values):
      super(ScaleHook, self).after_run(run_context, run_values)
      if len(self.step_end) == 1:
        result['rss_first_step_mb'] = _maxrss_mb()
        result['first_step_cpu_s'] = self.step_cpu[0] - self.session_cpu

  hook = ScaleHook()
  identity = lambda opt: opt
  if config == 'single':
    model_fn, timed = estimator_bench._make_model_fn(  # pylint: disable=protected-access
        tf, model, identity, timings)
    model_fn = timed(model_fn)
    session_config = testing.virtual_cpu_config(1)
  else:
    inner, timed = estimator_bench._make_model_fn(  # pylint: disable=protected-access
        tf, model, replicate.TowerOptimizer, timings)
    model_fn = timed(replicate.replicate_model_fn(
        inner, devices=testing.virtual_cpu_devices(towers)))
    session_config = testing.virtual_cpu_config(towers)
  rewrite_options = session_config.graph_options.rewrite_options
  if not grappler:
    rewrite_options.disable_meta_optimizer = True
  for field, value in rewrite:
    setattr(rewrite_options, field, getattr(type(rewrite_options), value))
  result['rewrite'] = dict(rewrite)
  model_dir = tempfile.mkdtemp(prefix='bench_scale_')
  total = warmup + steps
  profiler = None
  try:
    run_config = tf1.estimator.RunConfig(
        model_dir=model_dir, session_config=session_config,
        save_summary_steps=None, save_checkpoints_steps=None,
        save_checkpoints_secs=None, log_step_count_steps=None)
    estimator = tf1.estimator.Estimator(model_fn, config=run_config)
    input_fn = estimator_bench._make_input_fn(tf, model)  # pylint: disable=protected-access
    if cprofile:
      import cProfile  # pylint: disable=g-import-not-at-top
      profiler = cProfile.Profile()
      profiler.enable()
    start, start_cpu = time.perf_counter(), time.process_time()
    estimator.train(input_fn, steps=total, hooks=[hook])
    if profiler is not None:
      profiler.disable()
      profiler.dump_stats(cprofile)
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  ends = hook.step_end
  first = max(1, warmup)
  step_s = [ends[i] - ends[i - 1] for i in range(first, total)]
  med = bench_util.median(step_s)
  result.update(
      status='ok',
      graph_build_s=hook.begin_time - start,
      graph_build_cpu_s=hook.begin_cpu - start_cpu,
      model_fn_s=timings.get('model_fn_s'),
      session_s=hook.session_time - hook.begin_time,
      session_cpu_s=hook.session_cpu - hook.begin_cpu,
      first_step_s=ends[0] - hook.session_time,
      step_s_median=med,
      examples_per_s=estimator_bench.GLOBAL_BATCH / med,
      peak_rss_mb=_maxrss_mb(),
      gc_total={'count': list(gc_stats['count']),
                'seconds': gc_stats['seconds']},
      grappler=grappler)
  return result


# ----------------------------------------------------------------------------
# Parent: every configuration in its own process.
# ----------------------------------------------------------------------------


def _plan(models, towers, variants=()):
  """(model, config, towers): one device before and after the towers.

  A variant (`replicate@field=value,...`, a `Tuning` A/B) runs right after
  the default at each tower count above 1.
  """
  plan = []
  for model in models:
    plan.append((model, 'single', 1))
    for n in towers:
      plan.append((model, 'replicate', n))
      if n > 1:
        plan.extend((model, 'replicate@' + v, n) for v in variants)
    plan.append((model, 'single', 1))
  return plan


def run_section(models, towers, step_table, python, timeout_s, log=print,
                variants=()):
  """Runs the plan with `python`; returns one section of the report."""
  runs = []
  load_before = os.getloadavg()
  started = datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC')
  for model, config, n in _plan(models, towers, variants):
    warmup, steps = step_table[model]
    base, _, knobs = config.partition('@')
    args = ['--child', '--model', model, '--config', base, '--towers',
            str(n), '--warmup', str(warmup), '--steps', str(steps)]
    if knobs:
      args += ['--tuning', knobs]
    res = bench_util.run_child(os.path.abspath(__file__), args, timeout_s,
                               python=python)
    res.update(model=model, config=config, towers=n)
    runs.append(res)
    if res.get('status') == 'ok':
      log('[scale {}] {:8s} {:9s} {:2d}: build {:6.2f}s session {:6.2f}s '
          'first {:6.2f}s {:8.0f} ex/s rss {:5.0f} MB ops {} ({:.0f}s)'.format(
              res['tf_version'], model, config, n, res['graph_build_s'],
              res['session_s'], res['first_step_s'], res['examples_per_s'],
              res['peak_rss_mb'], res['ops'], res['process_s']))
    else:
      log('[scale] {} {} {}: {}'.format(model, config, n,
                                        res.get('reason', '')[-500:]))
  tf_version = next((r['tf_version'] for r in runs if 'tf_version' in r),
                    'unknown')
  return {'tf_version': tf_version, 'python': python, 'started': started,
          'loadavg_before': load_before, 'loadavg_after': os.getloadavg(),
          'models': list(models), 'towers': list(towers),
          'steps': {m: step_table[m] for m in models}, 'runs': runs,
          'git': bench_util.git_describe()}


def _single(section, model, metric):
  vals = [r[metric] for r in section['runs']
          if r['model'] == model and r['config'] == 'single'
          and r.get('status') == 'ok']
  return bench_util.median(vals) if vals else None


def section_md(section):
  """Markdown table(s) of one section: values and ratios to one device."""
  lines = ['### TF {} ({} ; load average {:.1f} before, {:.1f} after)'.format(
      section['tf_version'], section['started'],
      section['loadavg_before'][0], section['loadavg_after'][0]), '']
  for model in section['models']:
    warmup, steps = section['steps'][model]
    lines.append('**{}** ({} warm-up + {} timed steps; one device: median of '
                 'the runs before and after the towers)\n'.format(
                     model, warmup, steps))
    head = '| towers | ops |'
    for _, label, _ in METRICS:
      head += ' {} | vs one device |'.format(label)
    lines.append(head)
    lines.append('|---' * (2 + 2 * len(METRICS)) + '|')
    singles = [r for r in section['runs'] if r['model'] == model
               and r['config'] == 'single' and r.get('status') == 'ok']
    row = '| one device | {} |'.format(singles[0]['ops'] if singles else 'n/a')
    for metric, _, spec in METRICS:
      v = _single(section, model, metric)
      row += ' {} | 1.00x |'.format(spec.format(v) if v is not None else 'n/a')
    lines.append(row)
    for r in section['runs']:
      if r['model'] != model or not r['config'].startswith('replicate'):
        continue
      label = '{}{}'.format(r['towers'], r['config'][len('replicate'):])
      if r.get('status') != 'ok':
        lines.append('| {} | {} |'.format(label, r.get('status')))
        continue
      row = '| {} | {} |'.format(label, r['ops'])
      for metric, _, spec in METRICS:
        base = _single(section, model, metric)
        ratio = '{:.2f}x'.format(r[metric] / base) if base else 'n/a'
        row += ' {} | {} |'.format(spec.format(r[metric]), ratio)
      lines.append(row)
    lines.append('')
  return '\n'.join(lines)


def write_report(report, out_dir):
  md = ['# Scale benchmark', '',
        'Generated by `benchmarks/scale_bench.py` ({}). Global batch 256 for '
        'every tower count; virtual CPU devices on a {}-core machine shared '
        'with other work: compare ratios within one section (one run), not '
        'across sections.'.format(report['sections'][0]['git'],
                                  os.cpu_count()), '']
  for section in report['sections']:
    md.append(section_md(section))
  with open(os.path.join(out_dir, 'scale.md'), 'w') as f:
    f.write('\n'.join(md) + '\n')
  with open(os.path.join(out_dir, 'scale.json'), 'w') as f:
    json.dump(report, f, indent=1, sort_keys=True)
  return plot(report, os.path.join(out_dir, 'scale.png'))


def plot(report, path):
  """Ratios to one device against tower count; False without matplotlib."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  cols = 4
  rows = (len(METRICS) + cols - 1) // cols
  fig, grid = plt.subplots(rows, cols, figsize=(4 * cols, 3.4 * rows))
  axes = list(grid.flat)
  for ax in axes[len(METRICS):]:
    ax.axis('off')
  for ax, (metric, label, _) in zip(axes, METRICS):
    for section in report['sections']:
      for model in section['models']:
        base = _single(section, model, metric)
        pts = [(r['towers'], r[metric] / base) for r in section['runs']
               if r['model'] == model and r['config'] == 'replicate'
               and r.get('status') == 'ok' and base]
        if pts:
          ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o',
                  label='{} TF {}'.format(model, section['tf_version']))
    ax.set_xscale('log', base=2) if _mpl_new(matplotlib) else ax.set_xscale(
        'log', basex=2)
    ax.set_xlabel('towers')
    ax.set_title(label + ' / one device', fontsize=9)
    ax.axhline(1.0, color='grey', lw=0.5)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  return True


def _mpl_new(matplotlib):
  return tuple(int(x) for x in matplotlib.__version__.split('.')[:2]) >= (3, 3)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='towers 1,4,16, deep only, 5 steps; results/tmp')
  parser.add_argument('--models', default=None)
  parser.add_argument('--towers', default=None)
  parser.add_argument('--steps', type=int, default=None,
                      help='timed steps of every model (warm-up: 2)')
  parser.add_argument('--python', default=None,
                      help='Python of the children (default: this one)')
  parser.add_argument('--append', action='store_true',
                      help="keep the JSON's sections of other TF versions")
  parser.add_argument('--out-dir', default=None)
  parser.add_argument('--timeout', type=int, default=1800)
  parser.add_argument('--child', action='store_true')
  parser.add_argument('--model', default='deep')
  parser.add_argument('--config', default='replicate')
  parser.add_argument('--warmup', type=int, default=None)
  parser.add_argument('--grappler', default='on', choices=('on', 'off'))
  parser.add_argument('--rewrite', default='',
                      help='child: RewriterConfig field=VALUE,... (A/B)')
  parser.add_argument('--tuning', default='',
                      help='child: replicate.Tuning field=value,... (A/B)')
  parser.add_argument('--variants', default='',
                      help='Tuning A/Bs run beside replicate at each tower '
                      'count, separated by ";" (e.g. pack_small_bytes=0)')
  parser.add_argument('--cprofile', default=None)
  parser.add_argument('--tracemalloc', action='store_true')
  args = parser.parse_args(argv)
  if args.child:
    n = int(args.towers or 1)
    warmup, steps = STEPS[args.model]
    warmup = warmup if args.warmup is None else args.warmup
    steps = steps if args.steps is None else args.steps
    try:
      res = run_one(args.model, args.config, n, warmup, steps,
                    grappler=args.grappler == 'on', cprofile=args.cprofile,
                    trace_malloc=args.tracemalloc,
                    rewrite=[kv.split('=', 1) for kv in
                             args.rewrite.split(',') if kv],
                    knobs=[kv.split('=', 1) for kv in
                           args.tuning.split(',') if kv])
    except Exception as e:  # pylint: disable=broad-except
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
      res = {'status': 'error', 'reason': '{}: {}'.format(type(e).__name__, e)}
    bench_util.emit(res)
    return 0
  models = (args.models.split(',') if args.models
            else ['deep'] if args.quick else list(MODELS))
  towers = ([int(t) for t in args.towers.split(',')] if args.towers
            else QUICK_TOWERS if args.quick else TOWERS)
  step_table = dict(STEPS)
  if args.quick and args.steps is None:
    args.steps = 5
  if args.steps is not None:
    step_table = {m: (2, args.steps) for m in STEPS}
  out_dir = args.out_dir or os.path.join(
      bench_util.RESULTS_DIR, 'tmp' if args.quick else '')
  if not os.path.isdir(out_dir):
    os.makedirs(out_dir)
  python = os.path.abspath(args.python) if args.python else sys.executable
  section = run_section(models, towers, step_table, python, args.timeout,
                        variants=[v for v in args.variants.split(';') if v])
  section['platform'] = platform.platform()
  sections = []
  json_path = os.path.join(out_dir, 'scale.json')
  if args.append and os.path.exists(json_path):
    with open(json_path) as f:
      sections = [s for s in json.load(f)['sections']
                  if s['tf_version'] != section['tf_version']]
  sections.append(section)
  sections.sort(key=lambda s: s['tf_version'])
  report = {'sections': sections}
  plotted = write_report(report, out_dir)
  print(section_md(section))
  print('wrote {}/scale.md, scale.json{}'.format(
      out_dir, ', scale.png' if plotted else ' (no matplotlib: no plot)'))
  return 0


if __name__ == '__main__':
  sys.exit(main())

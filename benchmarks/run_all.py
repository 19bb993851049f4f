"""Runs every benchmark and writes the report: `make bench`.

  python benchmarks/run_all.py [--quick] [--rounds N] [--target-rounds N]
      [--skip-estimator] [--skip-reduction] [--out-dir DIR] [--python PY]

`--python PY` runs the whole benchmark with another interpreter, e.g. the
TF 2.15 venv's (`--python .venv/tf2/bin/python`, `make bench-tf2`): the
report then has TF 2.15 rows (contrib's are n/a there, it has no contrib);
give it its own `--out-dir` to keep the TF 1.15 report.

Writes DIR/latest.md (markdown tables, ratios vs single device and vs
tf.contrib), DIR/latest.json (every raw number) and DIR/latest.png (bar
plots; drawn by any Python that has matplotlib: this one, $BENCH_PLOT_PYTHON,
or /tmp/venvs/bench/bin/python). DIR is benchmarks/results, or
benchmarks/results/tmp for --quick so that a smoke run never overwrites the
committed results.
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import bench_util
import estimator_bench
import reduction_bench

# (metric, model, numerator, denominator, bound, kind) for the targets.
TARGETS = [
    ('examples/s', 'wide', 'replicate', 'contrib', 1.35, '>='),
    ('examples/s', 'deep', 'replicate', 'contrib', 1.10, '>='),
    ('examples/s', 'wide', 'replicate', 'single', 0.85, '>='),
    ('examples/s', 'deep', 'replicate', 'single', 0.95, '>='),
    ('graph build', 'deep', 'replicate', 'single', 1.30, '<='),
]


def _cpu_model():
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or 'unknown'


def _fmt(x, spec='{:.1f}'):
  return spec.format(x) if x is not None else 'n/a'


def _ratio(a, b):
  if a is None or b is None or not b:
    return None
  return a / b


def _estimator_md(est):
  summary = est['summary']
  models, configs = est['models'], est['configs']
  labels = estimator_bench.CONFIG_LABELS
  lines = []
  for model in models:
    lines.append('\n#### {} model\n'.format(model))
    lines.append('| configuration | examples/s | vs single | vs contrib | '
                 'CPU ms/step | CPU efficiency vs single | graph build (s) | '
                 'build vs single | startup (s) | examples/s, every round |')
    lines.append('|---|---:|---:|---:|---:|---:|---:|---:|---:|---|')
    base = summary.get('{}/single'.format(model), {})
    contrib = summary.get('{}/contrib'.format(model), {})
    for config in configs:
      v = summary.get('{}/{}'.format(model, config), {})
      if v.get('status') != 'ok':
        lines.append('| {} | n/a | | | | | | | | {} |'.format(
            labels.get(config, config),
            (v.get('reason') or 'not run').replace('|', '/').replace(
                '\n', ' ')[:200]))
        continue
      eps = v['examples_per_s']
      lines.append(
          '| {} | {:.0f} | {} | {} | {:.1f} | {} | {:.2f} | {} | {} | {} |'
          .format(
              labels.get(config, config), eps,
              _fmt(_ratio(eps, base.get('examples_per_s')), '{:.2f}x'),
              _fmt(_ratio(eps, contrib.get('examples_per_s')), '{:.2f}x'),
              v.get('cpu_s_per_step', float('nan')) * 1e3,
              _fmt(_ratio(base.get('cpu_s_per_step'),
                          v.get('cpu_s_per_step')), '{:.2f}x'),
              v['graph_build_s'],
              _fmt(_ratio(v['graph_build_s'], base.get('graph_build_s')),
                   '{:.2f}x'),
              _fmt(v.get('startup_s'), '{:.2f}'),
              ', '.join('{:.0f}'.format(x) for x in v['examples_per_s_all'])))
  return '\n'.join(lines)


def _targets_md(est):
  """The issue's targets, next to what independent towers reach.

  The reference is the `independent` configuration's examples/s over the
  same denominator: four unreplicated models, one per device, that never
  exchange a gradient.
  """
  summary = est['summary']
  lines = ['| target | measured (wall) | met | by CPU time (per step; build: '
           'its CPU seconds) | round by round: median (min-max, rounds) | '
           'bound | reference: independent models |',
           '|---|---:|:---:|---:|---:|---:|---:|']
  for metric, model, num, den, bound, kind in TARGETS:
    key = 'examples_per_s' if metric == 'examples/s' else 'graph_build_s'
    a = summary.get('{}/{}'.format(model, num), {})
    b = summary.get('{}/{}'.format(model, den), {})
    r = _ratio(a.get(key), b.get(key))
    met = 'n/a' if r is None else (
        'yes' if (r >= bound if kind == '>=' else r <= bound) else 'NO')
    # Throughput by CPU time: the denominator's CPU/step over the numerator's;
    # the build by CPU time: the numerator's CPU seconds over the
    # denominator's (single-threaded Python: its wall time less the time
    # other processes held the core).
    if key == 'examples_per_s':
      cpu = _ratio(b.get('cpu_s_per_step'), a.get('cpu_s_per_step'))
    else:
      cpu = _ratio(a.get('graph_build_cpu_s'), b.get('graph_build_cpu_s'))
    reference = None
    if key == 'examples_per_s':
      reference = _ratio(
          summary.get('{}/independent'.format(model), {}).get(key),
          b.get(key))
    lines.append('| {} {}: {} / {} | {} | {} | {} | {} | {} {:.2f} | {} |'
                 .format(model, metric, num, den, _fmt(r, '{:.2f}x'), met,
                         _fmt(cpu, '{:.2f}x'),
                         _paired_md(est['runs'], model, num, den, key),
                         kind, bound, _fmt(reference, '{:.2f}x')))
  lines += ['', 'Measured: the ratio of the two rows\' medians (what `met` '
            'judges). Round by round: the ratio within each round, where the '
            'two configurations ran one shortly after the other, so a slow '
            'phase of the machine moves both; its spread shows how far one '
            'round can be trusted.', '',
            'Reference: four unreplicated models, one per device on a '
            'quarter of the batch each, that never exchange a gradient '
            '(`independent` above): the towers\' work with no reads across '
            'devices and no sums. On deep, where replicate\'s towers run '
            'the same ops as these, a replication can beat it only by the '
            'updates it shares (one instead of four); on wide, replicate\'s '
            'CPU towers compute cheaper gradients than TF\'s (see '
            'profile_notes.md, section 4), so it is no bound there.']
  return '\n'.join(lines)


def _paired_md(runs, model, num, den, key):
  """Per-round ratios `num / den` of `key`: 'median (min-max, n)'."""
  by_round = {}
  for run in runs:
    if (run.get('model') == model and run.get('status') == 'ok' and
        run.get('config') in (num, den) and run.get(key)):
      by_round.setdefault(run['round'], {})[run['config']] = run[key]
  ratios = sorted(values[num] / values[den] for values in by_round.values()
                  if num in values and den in values)
  if not ratios:
    return 'n/a'
  return '{:.2f}x ({:.2f}-{:.2f}, {})'.format(
      bench_util.median(ratios), ratios[0], ratios[-1], len(ratios))


def _reduction_md(red):
  summary = red['summary']
  lines = []
  for set_name, desc in (('wide', 'wide model gradient set (6 tensors, '
                          '5.83 M floats per device)'),
                         ('small', '200 small tensors (100 x [64x64, 64])')):
    lines.append('\n#### {}\n'.format(desc))
    lines.append('| implementation | ms | vs NumPy floor | vs tf.add_n | '
                 'graph ops | build (ms) | max abs err |')
    lines.append('|---|---:|---:|---:|---:|---:|---:|')
    floor = summary.get('{}/numpy'.format(set_name), {}).get('ms')
    addn = summary.get('{}/tf_add_n'.format(set_name), {}).get('ms')
    for impl in red['impls']:
      v = summary.get('{}/{}'.format(set_name, impl), {})
      if v.get('status') != 'ok':
        lines.append('| {} | n/a | | | | | {} |'.format(
            impl, (v.get('reason') or '').replace('|', '/')[:160]))
        continue
      lines.append('| {} | {:.2f} | {} | {} | {} | {:.0f} | {} |'.format(
          impl, v['ms'], _fmt(_ratio(v['ms'], floor), '{:.2f}x'),
          _fmt(_ratio(v['ms'], addn), '{:.2f}x'), v['num_ops'],
          v['build_s'] * 1e3, _fmt(v.get('max_abs_err'), '{:.1e}')))
  return '\n'.join(lines)


def _rounds_md(est):
  """How many rounds the Estimator rows ran, for the report's header."""
  if not est:
    return ''
  rounds = est['rounds']
  target_rounds = est.get('target_rounds', rounds)
  if target_rounds == rounds:
    return ' ({} each)'.format(rounds)
  return (' ({} for the rows the targets compare: {}; {} for the '
          'others)'.format(target_rounds, ', '.join(
              est.get('labels', {}).get(c, c)
              for c in estimator_bench.TARGET_CONFIGS), rounds))


def write_markdown(results, path):
  est, red = results.get('estimator'), results.get('reduction')
  out = ['# replicate benchmarks: latest results', '',
         '- When: {} ({:.0f} s in all)'.format(results['when'],
                                              results['elapsed_s']),
         '- Machine: {} logical CPUs ({}), load average at start {}'.format(
             results['ncpu'], results['cpu_model'], results['loadavg']),
         '- TensorFlow {}, Python {}; tree: {}'.format(
             results['tf_version'], results['python'], results['git']),
         '- Mode: {}; 4 virtual CPU devices '
         '(`ConfigProto(device_count={{"CPU": 4}})`), every configuration in '
         'a process of its own, rounds interleaved (every other round in '
         'reverse order); each number is the median '
         'over rounds{}.'.format('QUICK (smoke test, not a measurement)'
                                 if results['quick'] else 'full',
                                 _rounds_md(est)),
         '- Rerun: `make bench` (or `python benchmarks/run_all.py`; '
         '`--quick` for a smoke run).', '']
  if est:
    out += ['## Estimator training, global batch 256', '',
            'examples/s = 256 / median wall time of one training step after '
            '{} warm-up steps (wide/deep), over {} steps (wide) / {} steps '
            '(deep), hooks '
            'and MonitoredSession included. CPU ms/step = process CPU time '
            '(all threads) per step over the same window; CPU efficiency = '
            'single device\'s CPU ms/step / this one (less sensitive to other '
            'load on the machine than wall time). graph build = seconds from '
            '`Estimator.train()` (session loops: from the first graph op) to '
            'the first hook\'s `begin()`: input_fn + model_fn of every tower + '
            'gradients + train_op + bookkeeping, no session (wall time; the '
            'targets table also gives its CPU time). startup = from '
            'the same start to the end of the first step (adds session '
            'creation, variable initialization, Grappler and the first run). '
            'Ratios are taken within this run.'.format(
                '/'.join(str(est['steps'][m][0]) for m in ('wide', 'deep')
                         if m in est['steps']),
                est['steps']['wide'][1] if 'wide' in est['steps'] else '-',
                est['steps']['deep'][1] if 'deep' in est['steps'] else '-'),
            _estimator_md(est), '', '### Targets (issue 6)', '',
            _targets_md(est), '']
  if red:
    out += ['## batch_reduce micro-benchmark (SUM of 4 per-device copies)',
            '', 'ms = median wall time of one `session.run` of the reduction '
            '(destinations: all 4 devices unless marked), next to a NumPy sum '
            'of the same arrays (the memory-bandwidth floor).',
            _reduction_md(red), '']
  with open(path, 'w') as f:
    f.write('\n'.join(out) + '\n')


def _plot_python():
  try:
    import matplotlib  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    return sys.executable
  except ImportError:
    pass
  for cand in (os.environ.get('BENCH_PLOT_PYTHON'),
               '/tmp/venvs/bench/bin/python'):
    if cand and os.path.exists(cand):
      return cand
  return None


_REEXEC_ENV = 'REPLICATE_BENCH_RUN_ALL_PYTHON'


def _rerun_with(python, argv):
  """Runs this script with `python` (and `argv` less `--python`)."""
  rest, skip = [], False
  for arg in argv:
    if skip:
      skip = False
    elif arg == '--python':
      skip = True
    elif not arg.startswith('--python='):
      rest.append(arg)
  env = dict(os.environ)
  env[_REEXEC_ENV] = python
  return subprocess.call([python, os.path.abspath(__file__)] + rest, env=env)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--rounds', type=int, default=None,
                      help='interleaved rounds of every configuration '
                      '(default 3, quick 1)')
  parser.add_argument('--target-rounds', type=int, default=None,
                      help='rounds of the configurations the targets compare '
                      '(default {}, quick: --rounds)'.format(
                          estimator_bench.TARGET_ROUNDS))
  parser.add_argument('--models', default=','.join(estimator_bench.MODELS))
  parser.add_argument('--configs', default=','.join(estimator_bench.CONFIGS))
  parser.add_argument('--impls', default=','.join(reduction_bench.IMPL_NAMES))
  parser.add_argument('--skip-estimator', action='store_true')
  parser.add_argument('--skip-reduction', action='store_true')
  parser.add_argument('--out-dir', default=None)
  parser.add_argument('--python', default=None,
                      help='run everything with this Python (e.g. '
                      '.venv/tf2/bin/python: TF 2.15)')
  args = parser.parse_args(argv)
  if args.python and not os.environ.get(_REEXEC_ENV):
    return _rerun_with(args.python, sys.argv[1:] if argv is None else argv)
  out_dir = args.out_dir or (os.path.join(bench_util.RESULTS_DIR, 'tmp')
                             if args.quick else bench_util.RESULTS_DIR)
  if not os.path.isdir(out_dir):
    os.makedirs(out_dir)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  start = time.time()
  results = {
      'when': datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC'),
      'quick': args.quick, 'ncpu': os.cpu_count(), 'cpu_model': _cpu_model(),
      'loadavg': ' '.join('{:.2f}'.format(x) for x in os.getloadavg()),
      'tf_version': tf.__version__, 'python': platform.python_version(),
      'git': bench_util.git_describe()}
  if not args.skip_estimator:
    models = [m for m in args.models.split(',') if m]
    configs = [c for c in args.configs.split(',') if c]
    rounds, target_rounds = estimator_bench.round_counts(
        args.quick, args.rounds, args.target_rounds)
    est = estimator_bench.run_all(models, configs, args.quick, rounds,
                                  target_rounds=target_rounds)
    est.update(models=models, configs=configs,
               labels=estimator_bench.CONFIG_LABELS,
               steps=dict((m, (estimator_bench.QUICK_STEPS if args.quick else
                               estimator_bench.FULL_STEPS)[m]) for m in models))
    results['estimator'] = est
  if not args.skip_reduction:
    impls = [i for i in args.impls.split(',') if i]
    red = reduction_bench.run_all(impls, args.quick,
                                  args.rounds or (1 if args.quick else 2))
    red['impls'] = impls
    results['reduction'] = red
  results['elapsed_s'] = time.time() - start
  json_path = os.path.join(out_dir, 'latest.json')
  md_path = os.path.join(out_dir, 'latest.md')
  png_path = os.path.join(out_dir, 'latest.png')
  with open(json_path, 'w') as f:
    json.dump(results, f, indent=1, sort_keys=True)
  write_markdown(results, md_path)
  print('wrote', md_path, json_path)
  plot_python = _plot_python()
  if plot_python is None:
    print('matplotlib not found (pip install matplotlib, or set '
          'BENCH_PLOT_PYTHON): no PNG written')
  else:
    rc = subprocess.call([plot_python, os.path.join(bench_util.HERE,
                                                    'plot_results.py'),
                          json_path, png_path])
    print('wrote' if rc == 0 else 'FAILED to write', png_path)
  with open(md_path) as f:
    print(f.read())
  return 0


if __name__ == '__main__':
  sys.exit(main())

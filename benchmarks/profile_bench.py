"""Where does a training step's time go? Step stats of traced steps.

Runs configurations of estimator_bench.py (each in its own process) with
`RunOptions(trace_level=FULL_TRACE)` on a few steps after the timed window,
writes Chrome traces (open in chrome://tracing or Perfetto) and prints, per
configuration: nodes executed per step, cross-device transfers (_Send/_Recv
pairs), and the summed kernel time of the main op types.

  python benchmarks/profile_bench.py [--models deep,wide]
      [--configs single,contrib,replicate] [--out DIR] [--markdown FILE]

Kernel times on a loaded 2-core machine include time spent waiting for a
core, so compare node and transfer counts first, then times within one run.
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import json
import os
import sys

import bench_util

_MAIN_OPS = ('MatMul', '_FusedMatMul', 'AddN', 'ConcatV2', 'SplitV', 'Split',
             'ApplyGradientDescent', 'BiasAddGrad', 'ReluGrad', 'TanhGrad',
             'Tanh', 'Identity')


def profile(models, configs, out_dir, warmup=5, steps=10):
  rows = []
  script = os.path.join(bench_util.HERE, 'estimator_bench.py')
  for model in models:
    for config in configs:
      res = bench_util.run_child(
          script, ['--child', '--model', model, '--config', config,
                   '--warmup', str(warmup), '--steps', str(steps),
                   '--trace-dir', out_dir], timeout_s=900)
      row = {'model': model, 'config': config, 'status': res.get('status'),
             'reason': res.get('reason')}
      ops_path = os.path.join(out_dir, '{}_{}.ops.json'.format(model, config))
      if res.get('status') == 'ok' and os.path.exists(ops_path):
        with open(ops_path) as f:
          summary = json.load(f)
        devices = dict((d, ops) for d, ops in summary['ops'].items()
                       if d != 'host')
        host = summary['ops'].get('host', {})
        totals = {}
        for ops in devices.values():
          for op, v in ops.items():
            t = totals.setdefault(op, [0.0, 0.0])
            t[0] += v['count']
            t[1] += v['us']
        row.update(
            examples_per_s=res['examples_per_s'],
            step_ms=res['step_s_median'] * 1e3,
            cpu_ms=res['cpu_s_per_step'] * 1e3,
            traced_step_ms=bench_util.median(summary['wall_us']) / 1e3,
            nodes=sum(v[0] for v in totals.values()),
            nodes_per_device=dict((d, sum(v['count'] for v in ops.values()))
                                  for d, ops in devices.items()),
            transfers=host.get('_Recv', {}).get('count', 0),
            send_us=host.get('_Send', {}).get('us', 0),
            recv_us=host.get('_Recv', {}).get('us', 0),
            kernel_us=sum(v[1] for v in totals.values()),
            ops=dict((op, totals[op]) for op in _MAIN_OPS if op in totals),
            trace=res.get('trace'))
      rows.append(row)
      print(format_row(row))
      sys.stdout.flush()
  return rows


def format_row(row):
  if row.get('status') != 'ok':
    return '{model}/{config}: {status} {reason}'.format(**row)
  op_text = ', '.join('{} {:.0f}x {:.1f}ms'.format(op, c, us / 1e3)
                  for op, (c, us) in sorted(row['ops'].items(),
                                            key=lambda kv: -kv[1][1]))
  return ('{model}/{config}: {examples_per_s:.0f} ex/s, step {step_ms:.1f} ms '
          '(cpu {cpu_ms:.1f} ms, traced {traced_step_ms:.1f} ms); {nodes:.0f} '
          'nodes/step, {transfers:.0f} _Send/_Recv pairs (send {send_us:.0f} '
          'us, recv {recv_us:.0f} us); kernel time {kernel_ms:.1f} ms: '
          '{op_text}'.format(kernel_ms=row['kernel_us'] / 1e3,
                             op_text=op_text, **row))


def to_markdown(rows):
  lines = ['| model/config | examples/s | step ms | cpu ms/step | nodes/step '
           '| _Send/_Recv pairs | send+recv ms | AddN (n, ms) | '
           'ConcatV2+Split (n, ms) | MatMul+_FusedMatMul ms | Apply ms |',
           '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for r in rows:
    if r.get('status') != 'ok':
      lines.append('| {}/{} | {} | | | | | | | | | |'.format(
          r['model'], r['config'], r.get('status')))
      continue
    ops = r['ops']
    get = lambda k: ops.get(k, [0, 0])
    pack_n = get('ConcatV2')[0] + get('SplitV')[0] + get('Split')[0]
    pack_ms = (get('ConcatV2')[1] + get('SplitV')[1] + get('Split')[1]) / 1e3
    lines.append(
        '| {}/{} | {:.0f} | {:.1f} | {:.1f} | {:.0f} | {:.0f} | {:.1f} | '
        '{:.0f}, {:.1f} | {:.0f}, {:.1f} | {:.1f} | {:.1f} |'.format(
            r['model'], r['config'], r['examples_per_s'], r['step_ms'],
            r['cpu_ms'], r['nodes'], r['transfers'],
            (r['send_us'] + r['recv_us']) / 1e3, get('AddN')[0],
            get('AddN')[1] / 1e3, pack_n, pack_ms,
            (get('MatMul')[1] + get('_FusedMatMul')[1]) / 1e3,
            get('ApplyGradientDescent')[1] / 1e3))
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='deep,wide')
  parser.add_argument('--configs', default='single,contrib,replicate')
  parser.add_argument('--out', default=os.path.join(bench_util.RESULTS_DIR,
                                                    'tmp', 'traces'))
  parser.add_argument('--markdown', default=None)
  parser.add_argument('--warmup', type=int, default=5)
  parser.add_argument('--steps', type=int, default=10)
  args = parser.parse_args(argv)
  if not os.path.isdir(args.out):
    os.makedirs(args.out)
  rows = profile([m for m in args.models.split(',') if m],
                 [c for c in args.configs.split(',') if c], args.out,
                 args.warmup, args.steps)
  md = to_markdown(rows)
  print(md)
  if args.markdown:
    with open(args.markdown, 'w') as f:
      f.write(md + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())

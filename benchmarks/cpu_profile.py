"""Where does a training step's CPU time go? Linux `perf` samples, by kind.

Runs configurations of estimator_bench.py, each in its own process under
`perf record` (sampling every thread of the process at `--frequency` Hz,
clock CLOCK_MONOTONIC), keeps the samples taken inside the child's timed
window of training steps (estimator_bench reports it in `time.perf_counter()`
seconds, the same clock), sorts their symbols into a few kinds of work and
prints them as milliseconds of CPU per step, side by side:

  python benchmarks/cpu_profile.py [--model deep]
      [--configs single,replicate] [--steps 600] [--frequency 2000]
      [--markdown FILE] [--keep DIR]

Step stats (profile_bench.py) time whole kernels; this shows what the CPU
does inside and between them: e.g. that TF 1.15's `MatMul` spends a fixed
~3 us per call laying out a transposed 64 x 64 operand element by element,
or how much time idle thread-pool threads spend spinning. Needs `perf`
(linux-tools) allowed to sample its own children. The shares are of
samples, so compare configurations within one run; the total is the
child's measured process CPU time per step.
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

import bench_util

# (kind, test on (shared object, symbol)), first match wins.
_KINDS = (
    ('MatMul: laying out a transposed right-hand side',
     lambda dso, sym: 'gemm_pack_colmajor_block' in sym and
     'SubMapper<float, long, 1,' in sym),
    ('MatMul: laying out a transposed left-hand side',
     lambda dso, sym: 'gemm_pack_colmajor_block' in sym),
    ('MatMul: sgemm kernels (JIT code)', lambda dso, sym: dso == '[JIT]'),
    ('MatMul: other (blocking, plain packing, op)',
     lambda dso, sym: re.search(r'mkldnn|Contraction|gemm|gebp|MatMul',
                                sym) is not None),
    ('thread pools: spinning and waking, kernel',
     lambda dso, sym: dso == '[kernel]' or 'WorkerLoop' in sym or
     'futex' in sym),
    ('TF executor (scheduling, activation, op context)',
     lambda dso, sym: re.search(
         r'ExecutorState|ExecutorImpl|OpKernelContext|Rendezvous|'
         r'ThreadPool::Schedule|nsync', sym) is not None),
    ('allocation (malloc, free, tensor buffers)',
     lambda dso, sym: re.search(
         r'malloc|free|consolidate|unlink_chunk|memalign|Allocator|'
         r'Tensor::~Tensor|TensorBuffer|operator new|operator delete',
         sym) is not None),
    ('memcpy, memset', lambda dso, sym: re.search(r'mem(move|cpy|set)',
                                                  sym) is not None),
    ('element-wise kernels (tanh, adds, ...)',
     lambda dso, sym: re.search(r'TensorExecutor|TensorEvaluator|'
                                r'_Function_handler<void \(long, long\)|'
                                r'tanh', sym) is not None),
    ('Python', lambda dso, sym: 'python' in dso),
)
_OTHER = 'other'


def perf_available():
  """Why `perf` cannot be used here, or None when it can."""
  if shutil.which('perf') is None:
    return 'perf is not installed (linux-tools)'
  try:
    proc = subprocess.run(['perf', 'record', '-q', '-o', os.devnull, '--',
                           'true'], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=60)
  except (OSError, subprocess.TimeoutExpired) as e:
    return 'perf record failed: {}'.format(e)
  if proc.returncode:
    return 'perf record failed: {}'.format(
        proc.stdout.decode('utf-8', 'replace').strip()[-300:])
  return None


def record(model, config, steps, frequency, data_path):
  """Trains one configuration under `perf record`; returns its result."""
  script = os.path.join(bench_util.HERE, 'estimator_bench.py')
  perf = ['perf', 'record', '-q', '-k', 'CLOCK_MONOTONIC', '-F',
          str(frequency), '-o', data_path, '--']
  return bench_util.run_child(
      script, ['--child', '--model', model, '--config', config,
               '--warmup', '10', '--steps', str(steps)],
      timeout_s=900, command_prefix=perf)


def kinds(data_path, window):
  """Samples taken in `window` (seconds), by kind of work.

  Returns:
    `(counts, total)`: a Counter of samples per kind, and their sum.
  """
  start, end = window
  out = subprocess.run(
      ['perf', 'report', '-i', data_path, '--no-children', '--stdio', '-n',
       '--sort', 'dso,symbol', '-g', 'none', '--percent-limit', '0',
       '--time', '{:.6f},{:.6f}'.format(start, end)],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode(
          'utf-8', 'replace')
  counts = collections.Counter()
  for line in out.splitlines():
    parsed = _parse_line(line)
    if parsed is not None:
      samples, dso, symbol = parsed
      counts[_kind(dso, symbol)] += samples
  return counts, sum(counts.values())


def _parse_line(line):
  """`(samples, dso, symbol)` of one `perf report --stdio -n` row, or None."""
  match = re.match(r'\s*[\d.]+%\s+(\d+)\s+(.*?)\s+\[(.)\]\s+(.*\S)', line)
  if match is None:
    return None
  dso = match.group(2)
  if dso.startswith('[JIT]'):
    dso = '[JIT]'
  elif match.group(3) == 'k':
    dso = '[kernel]'
  return int(match.group(1)), dso, match.group(4)


def _kind(dso, symbol):
  for name, test in _KINDS:
    if test(dso, symbol):
      return name
  return _OTHER


def to_markdown(rows):
  """A table: kinds of work as rows, configurations as columns (ms/step)."""
  configs = [row['config'] for row in rows]
  names = [name for name, _ in _KINDS] + [_OTHER]
  lines = ['| kind of work (ms of CPU per step) | ' + ' | '.join(configs) +
           ' |', '|---|' + '---:|' * len(configs)]
  for name in names:
    lines.append('| {} | {} |'.format(name, ' | '.join(
        '{:.2f}'.format(row['ms'].get(name, 0.0)) for row in rows)))
  lines.append('| **process CPU per step** | {} |'.format(' | '.join(
      '**{:.2f}**'.format(row['cpu_ms']) for row in rows)))
  lines.append('| examples/s in the window | {} |'.format(' | '.join(
      '{:.0f}'.format(row['examples_per_s']) for row in rows)))
  lines.append('| samples in the window | {} |'.format(' | '.join(
      str(row['samples']) for row in rows)))
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='deep', choices=('deep', 'wide'))
  parser.add_argument('--configs', default='single,replicate')
  parser.add_argument('--steps', type=int, default=600,
                      help='timed steps per configuration')
  parser.add_argument('--frequency', type=int, default=2000,
                      help='samples per second and thread')
  parser.add_argument('--markdown', help='also write the table here')
  parser.add_argument('--keep', help='keep the perf.data files here')
  args = parser.parse_args(argv)
  reason = perf_available()
  if reason is not None:
    print('cpu_profile: cannot sample: {}'.format(reason))
    return 1
  out_dir = args.keep or tempfile.mkdtemp(prefix='cpu_profile_')
  if not os.path.isdir(out_dir):
    os.makedirs(out_dir)
  rows = []
  try:
    for config in args.configs.split(','):
      data_path = os.path.join(out_dir, '{}_{}.perf.data'.format(
          args.model, config))
      result = record(args.model, config, args.steps, args.frequency,
                      data_path)
      if result.get('status') != 'ok':
        print('{}: {}: {}'.format(config, result.get('status'),
                                  result.get('reason')))
        continue
      counts, total = kinds(data_path, result['window_s'])
      cpu_ms = result['cpu_s_per_step'] * 1e3
      rows.append({
          'config': config,
          'cpu_ms': cpu_ms,
          'examples_per_s': result['examples_per_s'],
          'samples': total,
          'ms': dict((name, count / max(total, 1) * cpu_ms)
                     for name, count in counts.items()),
      })
  finally:
    if not args.keep:
      shutil.rmtree(out_dir, ignore_errors=True)
  if not rows:
    return 1
  table = to_markdown(rows)
  print(table)
  if args.markdown:
    with open(args.markdown, 'w') as f:
      f.write(table + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())

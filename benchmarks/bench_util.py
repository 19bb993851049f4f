"""Shared helpers of the benchmark scripts (not part of the library).

Every benchmark runs each configuration in a child process of its own (so that
graph, session and thread pools never leak between configurations) and the
child prints one line `RESULT <json>` that the parent parses.
"""
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS_DIR = os.path.join(HERE, 'results')
RESULT_PREFIX = 'RESULT '
NUM_DEVICES = 4

# The benchmarks measure the `replicate` of this tree, installed or not.
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
DEVICES = ['/device:CPU:{}'.format(i) for i in range(NUM_DEVICES)]


def child_env():
  """Environment for a child: the worktree importable, TF logs quiet."""
  env = dict(os.environ)
  path = env.get('PYTHONPATH', '')
  env['PYTHONPATH'] = ROOT + (os.pathsep + path if path else '')
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  env.setdefault('PYTHONWARNINGS', 'ignore')
  return env


def emit(result):
  """Prints the machine-readable result line of a child process."""
  sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True) + '\n')
  sys.stdout.flush()


def run_child(script, args, timeout_s, python=None, command_prefix=()):
  """Runs `python script args` in a fresh process and returns its result dict.

  A child that crashes, times out or prints no result line gives a dict with
  `status: 'error'` and the tail of its output, so one broken configuration
  never stops the whole run. `command_prefix` (e.g. a profiler's command
  line) runs the child under another program.
  """
  cmd = list(command_prefix) + [python or sys.executable, script] + list(args)
  start = time.time()
  try:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=child_env(), timeout=timeout_s, cwd=ROOT)
    out = proc.stdout.decode('utf-8', 'replace')
    rc = proc.returncode
  except subprocess.TimeoutExpired as e:
    out = (e.output or b'').decode('utf-8', 'replace')
    rc = 'timeout after {}s'.format(timeout_s)
  for line in reversed(out.splitlines()):
    if line.startswith(RESULT_PREFIX):
      result = json.loads(line[len(RESULT_PREFIX):])
      result['process_s'] = round(time.time() - start, 2)
      return result
  tail = '\n'.join(out.splitlines()[-15:])
  return {'status': 'error', 'reason': 'child exited with {}: {}'.format(
      rc, tail), 'process_s': round(time.time() - start, 2)}


def median(values):
  values = sorted(values)
  n = len(values)
  if not n:
    return float('nan')
  mid = n // 2
  return values[mid] if n % 2 else 0.5 * (values[mid - 1] + values[mid])


def git_describe():
  try:
    out = subprocess.run(['git', '-C', ROOT, 'log', '-1', '--format=%h %s'],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return out.stdout.decode().strip()
  except OSError:
    return 'unknown'


def free_ports(count):
  """`count` distinct free ports (all held open until every one is
  chosen: a port closed at once can be handed out again)."""
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(('127.0.0.1', 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()

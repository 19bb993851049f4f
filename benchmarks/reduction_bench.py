"""Reduction micro-benchmark: `batch_reduce` of per-device gradient sets.

Two gradient sets, four per-device copies each, on four virtual CPU devices:
  wide   the shapes of the wide model's variables (784x2048, 2048, 2048x2048,
         2048, 2048x10, 10: 5.83 M floats, 23.3 MB per device)
  small  200 small tensors: the deep model's shapes (100 x (64x64, 64))

Implementations (each in a process of its own, both sets per process):
  numpy                 NumPy sum of the same arrays (o = a + b; o += c;
                        o += d): the memory-bandwidth floor of this machine
  tf_inputs_only        reads the inputs and sums nothing: the per-step
                        overhead (variable reads, session.run) in every TF row
  tf_add_n              one tf.add_n per tensor on /device:CPU:0 (baseline)
  tf_add_n_packed       concat per device, one add_n, split back (baseline)
  replicate.sum_gradients_by_variable   what TowerOptimizer runs (with and
                        without packing), sums on /device:CPU:0
  tf.<name>             TF 1.15's own tf.distribute cross-device ops
  replicate.<name>      every replicate.cross_tower_ops implementation x
                        packing found in this tree (n/a when absent)

Every per-device value is a (ref) variable's snapshot on its device, so a step
re-reads real memory and nothing is constant-folded; the fetched op is a
`tf.group` of the reduced outputs (no host transfer of the results).
Destinations: all four devices (the MirroredStrategy case), plus reduce to
/device:CPU:0 only for reduction-to-one-device (the replicate_model_fn case).

Usage:
  python benchmarks/reduction_bench.py [--quick] [--impls a,b] [--json out]
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import json
import os
import sys
import time

import bench_util

WIDE_SHAPES = [(784, 2048), (2048,), (2048, 2048), (2048,), (2048, 10), (10,)]
SMALL_SHAPES = [(64, 64), (64,)] * 100
SETS = {'wide': WIDE_SHAPES, 'small': SMALL_SHAPES}

# name -> (description, kind, kwargs). kind: which library and class.
IMPLS = [
    ('numpy', 'NumPy sum (floor)', None, None, None),
    ('tf_inputs_only', 'only reads the per-device inputs (overhead every TF '
     'row includes)', None, None, None),
    ('tf_add_n', 'tf.add_n per tensor on CPU:0', None, None, None),
    ('tf_add_n_packed', 'concat + one tf.add_n + split on CPU:0', None, None,
     None),
    ('replicate.sum_gradients_by_variable', 'TowerOptimizer aggregation '
     '(packs small tensors), sum on CPU:0', 'aggregation', None, {}),
    ('replicate.sum_gradients_by_variable(pack=0)', 'TowerOptimizer '
     'aggregation, one add_n per variable, on CPU:0', 'aggregation', None,
     {'pack_max_bytes': 0}),
    ('tf.ReductionToOneDevice', 'TF 1.15 ReductionToOneDevice', 'tf',
     'ReductionToOneDevice', {}),
    ('tf.HierarchicalCopy(packs=1)', 'TF 1.15 HierarchicalCopyAllReduce',
     'tf', 'HierarchicalCopyAllReduce', {'num_packs': 1}),
    ('tf.HierarchicalCopy(packs=0)', 'TF 1.15 HierarchicalCopyAllReduce',
     'tf', 'HierarchicalCopyAllReduce', {'num_packs': 0}),
    ('replicate.ReductionToOneDevice', '', 'replicate',
     'ReductionToOneDeviceCrossTowerOps', {}),
    ('replicate.ReductionToOneDevice(dest=CPU:0)', '', 'replicate',
     'ReductionToOneDeviceCrossTowerOps', {'_dest': 'one'}),
    ('replicate.HierarchicalCopy(packs=1)', '', 'replicate',
     'AllReduceCrossTowerOps', {'all_reduce_alg': 'hierarchical_copy',
                                'num_packs': 1}),
    ('replicate.HierarchicalCopy(packs=4)', '', 'replicate',
     'AllReduceCrossTowerOps', {'all_reduce_alg': 'hierarchical_copy',
                                'num_packs': 4}),
    ('replicate.HierarchicalCopy(packs=0)', '', 'replicate',
     'AllReduceCrossTowerOps', {'all_reduce_alg': 'hierarchical_copy',
                                'num_packs': 0}),
    ('replicate.HierarchicalCopy(small<=32KB x10)', '', 'replicate',
     'AllReduceCrossTowerOps', {'all_reduce_alg': 'hierarchical_copy',
                                'num_packs': 0,
                                'agg_small_grads_max_bytes': 32768,
                                'agg_small_grads_max_group': 10}),
    ('replicate.Nccl', '', 'replicate', 'AllReduceCrossTowerOps',
     {'all_reduce_alg': 'nccl', 'num_packs': 1}),
]
IMPL_NAMES = [i[0] for i in IMPLS]


class NotApplicable(Exception):
  pass


def _arrays(shapes, seed):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  return [[rng.standard_normal(s).astype(np.float32)
           for s in shapes] for _ in range(bench_util.NUM_DEVICES)]


def _time_numpy(shapes, iters, warmup):
  import numpy as np  # pylint: disable=g-import-not-at-top
  per_dev = _arrays(shapes, 0)
  outs = [np.empty(s, np.float32) for s in shapes]

  def step():
    for j, out in enumerate(outs):
      np.add(per_dev[0][j], per_dev[1][j], out=out)
      for d in range(2, len(per_dev)):
        np.add(out, per_dev[d][j], out=out)

  times = []
  for i in range(warmup + iters):
    t = time.perf_counter()
    step()
    if i >= warmup:
      times.append(time.perf_counter() - t)
  return {'build_s': 0.0, 'ms': bench_util.median(times) * 1e3,
          'ms_min': min(times) * 1e3, 'num_ops': 0}


def _make_reducer(tf, name, kind, cls_name, kwargs):
  """Returns fn(per_device_lists) -> list of output tensors."""
  tf1 = tf.compat.v1
  devices = bench_util.DEVICES
  kwargs = dict(kwargs or {})
  dest = kwargs.pop('_dest', 'all')
  if name == 'tf_inputs_only':
    def reduce_fn(per_dev):
      return [t for tensors in per_dev for t in tensors]
    return reduce_fn
  if name == 'tf_add_n':
    def reduce_fn(per_dev):
      with tf1.device(devices[0]):
        return [tf.add_n([per_dev[d][j] for d in range(len(devices))])
                for j in range(len(per_dev[0]))]
    return reduce_fn
  if name == 'tf_add_n_packed':
    def reduce_fn(per_dev):
      shapes = [t.shape for t in per_dev[0]]
      sizes = [s.num_elements() for s in shapes]
      flat = []
      for d, dev in enumerate(devices):
        with tf1.device(dev):
          flat.append(tf.concat([tf.reshape(t, [-1]) for t in per_dev[d]], 0))
      with tf1.device(devices[0]):
        total = tf.add_n(flat)
        parts = tf.split(total, sizes)
        return [tf.reshape(p, s) for p, s in zip(parts, shapes)]
    return reduce_fn
  if kind == 'aggregation':
    from replicate.core import tuning as tuning_lib  # pylint: disable=g-import-not-at-top
    from replicate.gradients import gradient_aggregation  # pylint: disable=g-import-not-at-top

    def reduce_fn(per_dev):
      with tf1.device(devices[0]):
        variables = [tf1.Variable(tf.zeros(t.shape), use_resource=False,
                                  name='target_{}'.format(j))
                     for j, t in enumerate(per_dev[0])]
      tower_grads = [list(zip(per_dev[d], variables))
                     for d in range(len(devices))]
      return [g for g, _ in gradient_aggregation.sum_gradients_by_variable(
          tower_grads, tuning_lib.get_tuning(), **kwargs)]
    return reduce_fn
  if kind == 'tf':
    from tensorflow.python.distribute import values as tf_values  # pylint: disable=g-import-not-at-top
    ops = getattr(tf.distribute, cls_name)(**kwargs)
    device_map = tf_values.ReplicaDeviceMap(devices)

    def reduce_fn(per_dev):
      pairs = []
      for j in range(len(per_dev[0])):
        pv = tf_values.PerReplica(device_map,
                                  tuple(per_dev[d][j]
                                        for d in range(len(devices))))
        pairs.append((pv, pv if dest == 'all' else devices[0]))
      out = ops.batch_reduce(tf.distribute.ReduceOp.SUM, pairs)
      return [t for m in out for t in m.values]
    return reduce_fn
  # Ours.
  try:
    from replicate import cross_tower_ops  # pylint: disable=g-import-not-at-top
    from replicate.cross_tower import values as r_values  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise NotApplicable('replicate.cross_tower_ops is not in this tree '
                        '({})'.format(e))
  cls = getattr(cross_tower_ops, cls_name, None)
  if cls is None:
    raise NotApplicable('replicate.cross_tower_ops.{} is not in this '
                        'tree'.format(cls_name))
  if kwargs.get('all_reduce_alg') == 'nccl':
    raise NotApplicable('NCCL needs 2+ GPUs; this benchmark runs on '
                        'virtual CPUs')
  ops = cls(**kwargs)
  import replicate  # pylint: disable=g-import-not-at-top
  reduce_op = getattr(replicate, 'ReduceOp', None)
  reduce_op = reduce_op.SUM if reduce_op is not None else (
      tf.VariableAggregation.SUM)

  def reduce_fn(per_dev):
    pairs = []
    for j in range(len(per_dev[0])):
      pv = r_values.PerDevice({devices[d]: per_dev[d][j]
                               for d in range(len(devices))})
      pairs.append((pv, list(devices) if dest == 'all' else devices[0]))
    out = ops.batch_reduce(reduce_op, pairs)
    return [m.get(dev) for m in out for dev in m.devices]
  return reduce_fn


def _session_config(tf):
  """4 virtual CPUs; Grappler's dependency optimizer off.

  The fetched op is a `tf.group` of the reduced tensors, i.e. they only feed
  control edges, and the dependency optimizer turns such stateless ops into
  NoOps: with it on, nothing would be summed at all.
  """
  from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=g-import-not-at-top
  config = tf.compat.v1.ConfigProto(
      device_count={'CPU': bench_util.NUM_DEVICES})
  config.graph_options.rewrite_options.dependency_optimization = (
      rewriter_config_pb2.RewriterConfig.OFF)
  return config


def _time_tf(name, kind, cls_name, kwargs, shapes, iters, warmup):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  devices = bench_util.DEVICES
  reducer = _make_reducer(tf, name, kind, cls_name, kwargs)
  arrays = _arrays(shapes, 0)
  with tf.Graph().as_default() as graph:
    per_dev = []
    for d, dev in enumerate(devices):
      with tf1.device(dev):
        per_dev.append([
            tf1.Variable(a, use_resource=False, name='g{}_{}'.format(d, j))
            .value() for j, a in enumerate(arrays[d])])
    num_before = len(graph.get_operations())
    start = time.perf_counter()
    outputs = reducer(per_dev)
    build_s = time.perf_counter() - start
    num_ops = len(graph.get_operations()) - num_before
    step = tf.group(*outputs)
    check = outputs[0]
    init = tf1.global_variables_initializer()
    with tf1.Session(config=_session_config(tf)) as sess:
      sess.run(init)
      got = sess.run(check)
      want = sum(arrays[d][0] for d in range(len(devices)))
      max_err = (None if name == 'tf_inputs_only' else
                 float(abs(got - want).max()))
      times = []
      for i in range(warmup + iters):
        t = time.perf_counter()
        sess.run(step)
        if i >= warmup:
          times.append(time.perf_counter() - t)
  return {'build_s': build_s, 'ms': bench_util.median(times) * 1e3,
          'ms_min': min(times) * 1e3, 'num_ops': num_ops,
          'max_abs_err': max_err}


def run_impl(name, iters, warmup):
  spec = dict((i[0], i) for i in IMPLS)[name]
  _, desc, kind, cls_name, kwargs = spec
  result = {'impl': name, 'desc': desc, 'sets': {}}
  for set_name, shapes in sorted(SETS.items()):
    n_iters = iters if set_name == 'wide' else iters * 2
    try:
      if name == 'numpy':
        r = _time_numpy(shapes, n_iters, warmup)
      else:
        r = _time_tf(name, kind, cls_name, kwargs, shapes, n_iters, warmup)
      r['status'] = 'ok'
    except NotApplicable as e:
      r = {'status': 'n/a', 'reason': str(e)}
    result['sets'][set_name] = r
  return result


def run_all(impls, quick, rounds, timeout_s=600, log=print):
  iters, warmup = (5, 2) if quick else (20, 5)
  runs = []
  for r in range(rounds):
    for name in impls:
      res = bench_util.run_child(
          os.path.abspath(__file__),
          ['--child', '--impl', name, '--iters', str(iters),
           '--warmup', str(warmup)], timeout_s)
      res.setdefault('impl', name)
      res['round'] = r
      runs.append(res)
      sets = res.get('sets', {})
      parts = []
      for s in sorted(SETS):
        v = sets.get(s, {})
        parts.append('{} {}'.format(
            s, '{:8.2f} ms'.format(v['ms']) if v.get('status') == 'ok'
            else v.get('status', res.get('status', '?'))))
      log('[reduction r{}] {:44s} {}'.format(r, name, '  '.join(parts)))
      if res.get('status') == 'error':
        log(res.get('reason', '')[-400:])
  return {'runs': runs, 'summary': summarize(runs, impls), 'quick': quick,
          'rounds': rounds}


def summarize(runs, impls):
  out = {}
  for name in impls:
    mine = [r for r in runs if r.get('impl') == name]
    for set_name in sorted(SETS):
      key = '{}/{}'.format(set_name, name)
      oks = [r['sets'][set_name] for r in mine
             if r.get('sets', {}).get(set_name, {}).get('status') == 'ok']
      if not oks:
        reason = 'not run'
        for r in mine:
          v = r.get('sets', {}).get(set_name)
          reason = (v or {}).get('reason') or r.get('reason') or reason
        out[key] = {'status': 'n/a' if mine and mine[0].get(
            'status') != 'error' else 'error', 'reason': reason}
        continue
      out[key] = {'status': 'ok',
                  'ms': bench_util.median([v['ms'] for v in oks]),
                  'ms_all': [v['ms'] for v in oks],
                  'build_s': bench_util.median([v['build_s'] for v in oks]),
                  'num_ops': oks[0]['num_ops'],
                  'max_abs_err': max([v['max_abs_err'] for v in oks
                                      if v.get('max_abs_err') is not None] or
                                     [None])}
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--impls', default=','.join(IMPL_NAMES))
  parser.add_argument('--rounds', type=int, default=None)
  parser.add_argument('--json', default=None)
  parser.add_argument('--child', action='store_true')
  parser.add_argument('--impl', default='numpy')
  parser.add_argument('--iters', type=int, default=20)
  parser.add_argument('--warmup', type=int, default=5)
  args = parser.parse_args(argv)
  if args.child:
    try:
      res = run_impl(args.impl, args.iters, args.warmup)
      res['status'] = 'ok'
    except Exception as e:  # pylint: disable=broad-except
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
      res = {'impl': args.impl, 'status': 'error',
             'reason': '{}: {}'.format(type(e).__name__, e)}
    bench_util.emit(res)
    return 0
  impls = [i for i in args.impls.split(',') if i]
  unknown = [i for i in impls if i not in IMPL_NAMES]
  if unknown:
    parser.error('unknown implementations {}; known: {}'.format(
        unknown, IMPL_NAMES))
  results = run_all(impls, args.quick, args.rounds or (1 if args.quick else 2))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1, sort_keys=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())

"""Tests for MultiWorkerAllReduce and CollectiveAllReduce.

The multi-worker cases run on an in-process cluster: two `tf.train.Server`s
on 127.0.0.1 (free ports picked by binding port 0), each with two virtual
CPUs. Every `Session.run` has a timeout and every thread a bounded join, so a
failure fails instead of hanging.
"""
import atexit
import threading

from absl.testing import parameterized
import ctops_testlib as lib
import numpy as np
import tensorflow as tf

import replicate
from replicate import _compat
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import multi_worker_ops
from replicate.cross_tower import values

_TIMEOUT_MS = 20000
_WORKERS = ['/job:worker/task:0', '/job:worker/task:1']
_CLUSTER_DEVICES = ['/job:worker/task:%d/device:CPU:%d' % (w, c)
                    for w in range(2) for c in range(2)]
_CLUSTER = {}




def _server_config():
  config = tf1.ConfigProto(device_count={'CPU': 2})
  config.experimental.collective_group_leader = '/job:worker/replica:0/task:0'
  return config


def _cluster():
  """The two in-process servers, started once for the whole module."""
  if not _CLUSTER:
    spec = tf1.train.ClusterSpec(
        {'worker': ['127.0.0.1:%d' % replicate.testing.pick_unused_port() for _ in range(2)]})
    _CLUSTER['servers'] = [
        tf1.train.Server(spec, job_name='worker', task_index=i,
                         config=_server_config(), start=True)
        for i in range(2)]
    # Drop the servers while TF's modules are still loaded: their destructor
    # needs them.
    atexit.register(_CLUSTER.clear)
  return _CLUSTER['servers']


def _run(target, fetches, config=None, graph=None):
  with tf1.Session(target, graph=graph,
                   config=config or _server_config()) as sess:
    return sess.run(fetches,
                    options=tf1.RunOptions(timeout_in_ms=_TIMEOUT_MS))


def _run_bounded(fns):
  """Runs each of `fns` in its own daemon thread; returns their results.

  TF 1.15 does not always cancel a stuck collective at the RunOptions
  deadline, so the threads are also joined with a timeout.

  Raises:
    AssertionError: if a thread is still running after the timeout.
    Exception: the first exception a function raised.
  """
  results = [None] * len(fns)

  def call(i):
    try:
      results[i] = (True, fns[i]())
    except Exception as e:  # pylint: disable=broad-except
      results[i] = (False, e)

  threads = [threading.Thread(target=call, args=(i,)) for i in range(len(fns))]
  for t in threads:
    t.daemon = True
    t.start()
  for t in threads:
    t.join(2 * _TIMEOUT_MS / 1000.)
  if any(t.is_alive() for t in threads):
    raise AssertionError('A collective did not finish within {} s.'.format(
        2 * _TIMEOUT_MS / 1000.))
  for ok, value in results:
    if not ok:
      raise value
  return [value for _, value in results]


_SPECS = {
    'pscpu_pscpu': ('pscpu/pscpu', 2, -1),
    'pscpu': ('pscpu', 1, -1),
    'xring': ('xring', 3, -1),
    # Tensors up to 64 bytes by ring, larger ones by two-level shuffle.
    'xring_then_pscpu': [('xring', 1, 64), ('pscpu/pscpu', 2, -1)],
}
_PACKINGS = {
    'no_packing': dict(num_packs=0),
    'two_packs': dict(num_packs=2),
    'small_tensors': dict(agg_small_grads_max_bytes=64,
                          agg_small_grads_max_group=2),
    'no_groups': dict(agg_small_grads_max_bytes=64,
                      agg_small_grads_max_group=0),
}


class MultiWorkerAllReduceTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.product(spec=sorted(_SPECS), packing=sorted(_PACKINGS),
                         reduce_op=[ReduceOp.SUM, ReduceOp.MEAN])
  def test_numerics_and_placement(self, spec, packing, reduce_op):
    servers = _cluster()
    mean = reduce_op == ReduceOp.MEAN
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(_CLUSTER_DEVICES, lib.SMALL_SHAPES,
                                       tf.float32)
      ops = replicate.MultiWorkerAllReduce(
          _WORKERS, 0, all_reduce_spec=_SPECS[spec], **_PACKINGS[packing])
      results = ops.batch_reduce(reduce_op, [(v, v) for v in inputs])
      for result in results:
        self.assertEqual(result.devices,
                         tuple(device_util.canonicalize_all(_CLUSTER_DEVICES)))
        for d, t in zip(result.devices, result.values):
          self.assertEqual(device_util.canonicalize(t.device), d)
      got = _run(servers[0].target, [r.values for r in results])
    for column, per_device in zip(arrays, got):
      for v in per_device:
        # 2 workers x 2 CPUs: SUM of 4 towers, MEAN = SUM / 4.
        self.assertAllClose(v, lib.expected(column, mean))

  @parameterized.parameters(tf.float16, tf.float64)
  def test_dtypes_and_large_tensor(self, dtype):
    servers = _cluster()
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(_CLUSTER_DEVICES, lib.SHAPES, dtype)
      ops = replicate.MultiWorkerAllReduce(_WORKERS, 0)
      results = ops.batch_reduce(ReduceOp.MEAN, [(v, v) for v in inputs])
      got = _run(servers[0].target, [r.values for r in results])
    for column, per_device in zip(arrays, got):
      for v in per_device:
        self.assertAllClose(v, lib.expected(column, mean=True),
                            atol=lib.tolerance(dtype))

  def test_spec_chosen_by_size(self):
    ops = replicate.MultiWorkerAllReduce(
        _WORKERS, 0, all_reduce_spec=_SPECS['xring_then_pscpu'])
    with tf.Graph().as_default():
      small = tf.zeros([16])  # 64 bytes: ring
      large = tf.zeros([17])  # 68 bytes: two-level shuffle
      # pylint: disable=protected-access
      self.assertEqual(ops._spec_for(small).alg, 'xring')
      self.assertEqual(ops._spec_for(large).alg, 'pscpu/pscpu')
      # pylint: enable=protected-access
    self.assertEqual(ops.all_reduce_spec[0],
                     multi_worker_ops.AllReduceSpecTuple('xring', 1, 64))

  def test_sparse_falls_back_with_one_warning(self):
    servers = _cluster()
    with tf.Graph().as_default():
      index = {}
      for i, d in enumerate(_CLUSTER_DEVICES):
        with tf.device(d):
          index[d] = tf.IndexedSlices(tf.constant([[1.]]), tf.constant([i]),
                                      tf.constant([4, 1]))
      sparse = values.PerDevice(index)
      ops = replicate.MultiWorkerAllReduce(_WORKERS, 0)
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        result = ops.reduce(ReduceOp.SUM, sparse, sparse)
      self.assertLen(logs.records, 1)
      self.assertRegex(logs.output[0], 'IndexedSlices are not all-reduced')
      got = _run(servers[0].target, tf.convert_to_tensor(result.values[3]))
    self.assertAllClose(got, [[1.], [1.], [1.], [1.]])  # one row per tower

  def test_nccl_specs_build_one_nccl_op_per_gpu(self):
    gpus = ['/job:worker/task:%d/device:GPU:%d' % (w, g)
            for w in range(2) for g in range(2)]
    for alg in ('nccl', 'nccl/xring', 'nccl/rechd', 'nccl/pscpu'):
      with tf.Graph().as_default() as graph:
        inputs, _ = lib.make_inputs(gpus, [(5,)], tf.float32)
        ops = replicate.MultiWorkerAllReduce(
            _WORKERS, 2, all_reduce_spec=(alg, 1, -1))
        result = ops.reduce(ReduceOp.SUM, inputs[0], inputs[0])
        nccl = [op for op in graph.get_operations()
                if op.type == 'NcclAllReduce']
        self.assertLen(nccl, 4, alg)  # one per GPU
        for d, t in zip(result.devices, result.values):
          self.assertEqual(device_util.canonicalize(t.device), d)

  def test_short_specs_complete_like_tf(self):
    # TF 1.15 reads an algorithm alone, (alg,) and (alg, shards) as one shard
    # and no size limit where they are missing.
    tuple_ = multi_worker_ops.AllReduceSpecTuple
    cases = [
        ('pscpu', [tuple_('pscpu', 1, -1)]),
        (('pscpu',), [tuple_('pscpu', 1, -1)]),
        (('pscpu', 2), [tuple_('pscpu', 2, -1)]),
        ([('xring', 1, 64), ('pscpu', 3)],
         [tuple_('xring', 1, 64), tuple_('pscpu', 3, -1)]),
        (['pscpu/pscpu'], [tuple_('pscpu/pscpu', 1, -1)]),
    ]
    for spec, expected in cases:
      ops = replicate.MultiWorkerAllReduce(_WORKERS, 0, all_reduce_spec=spec)
      self.assertEqual(expected, ops.all_reduce_spec, spec)

  def test_errors(self):
    bad_specs = [
        (('ring', 1, -1), "Unknown all-reduce algorithm 'ring'"),
        (('nccl', 1, -1), "'nccl' needs GPUs, but num_gpus_per_worker is 0"),
        (('pscpu', 0, -1), 'all_reduce_spec shards must be an integer >= 1'),
        (('pscpu', 1, 0), 'limit must be a positive number of bytes or -1'),
        ([('pscpu', 1, 100)], 'limits must increase and end with -1'),
        ([('pscpu', 1, 100), ('xring', 1, 50), ('pscpu', 1, -1)],
         'limits must increase'),
        ([], 'must be an \\(alg, shards, limit\\) tuple or a non-empty list'),
        ([('pscpu', 1, -1, 7)], 'Each all_reduce_spec item must be an'),
        ([5], 'Each all_reduce_spec item must be an'),
    ]
    for spec, message in bad_specs:
      with self.assertRaisesRegex(errors.InvalidArgumentError, message):
        replicate.MultiWorkerAllReduce(_WORKERS, 0, all_reduce_spec=spec)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                '"nccl/rechd" needs a power-of-two number of '
                                'workers, got 3'):
      replicate.MultiWorkerAllReduce(_WORKERS + ['/job:worker/task:2'], 1,
                                     all_reduce_spec=('nccl/rechd', 1, -1))
    for workers in ([], '/job:worker/task:0', None):
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'worker_devices must be a non-empty list'):
        replicate.MultiWorkerAllReduce(workers, 0)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'num_gpus_per_worker must be an integer >= 0'):
      replicate.MultiWorkerAllReduce(_WORKERS, -1)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'num_packs must be an integer >= 0'):
      replicate.MultiWorkerAllReduce(_WORKERS, 0, num_packs=-2)
    with tf.Graph().as_default():
      inputs, _ = lib.make_inputs(_CLUSTER_DEVICES, [(2,)], tf.float32)
      ops = replicate.MultiWorkerAllReduce(_WORKERS[:1], 0)
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'Values live on workers '
                                  '/job:worker/replica:0/task:1 that are not '
                                  'in worker_devices'):
        ops.reduce(ReduceOp.SUM, inputs[0], inputs[0])


def _collective_worker(task, target, reduce_op):
  """Builds and runs worker `task`'s own graph (between-graph replication)."""
  with tf.Graph().as_default():
    devices = _CLUSTER_DEVICES[2 * task:2 * task + 2]
    inputs, _ = lib.make_inputs(devices, lib.SMALL_SHAPES, tf.float32,
                                seed=task)
    ops = replicate.CollectiveAllReduce(num_workers=2)
    reduced = ops.batch_reduce(reduce_op, [(v, v) for v in inputs])
    placements = [[(d, device_util.canonicalize(t.device))
                   for d, t in zip(r.devices, r.values)] for r in reduced]
    return _run(target, [r.values for r in reduced]), placements


class ShuffleThenShuffleGraphTest(tf.test.TestCase):

  def test_second_level_gathers_on_every_listed_worker(self):
    # Three listed workers; the value lives on two CPUs of tasks 0 and 1.
    # As TF's 'pscpu/pscpu' (whose second level gathers on every listed
    # worker's CPU), a chunk is summed on task 2's CPU too. Graph only: the
    # workers need not exist to build.
    workers = ['/job:worker/task:%d' % t for t in range(3)]
    ops = replicate.MultiWorkerAllReduce(
        workers, 0, all_reduce_spec=('pscpu/pscpu', 1, -1))
    with tf.Graph().as_default() as graph:
      index = {}
      for w in range(2):
        for c in range(2):
          device = '/job:worker/task:%d/device:CPU:%d' % (w, c)
          with tf.device(device):
            index[device] = tf.constant([1., 2., 3., 4., 5., 6.])
      value = values.PerDevice(index)
      result = ops.reduce(ReduceOp.SUM, value, value)
      add_devices = set(device_util.canonicalize(op.device)
                        for op in graph.get_operations()
                        if op.type in ('Add', 'AddV2', 'AddN'))
    self.assertIn(
        device_util.canonicalize('/job:worker/task:2/device:CPU:0'),
        add_devices)
    self.assertEqual(set(value.devices), set(result.devices))
    for d, t in zip(result.devices, result.values):
      self.assertEqual(d, device_util.canonicalize(t.device))


class CollectiveAllReduceTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(ReduceOp.SUM, ReduceOp.MEAN)
  def test_two_workers_between_graph(self, reduce_op):
    servers = _cluster()
    results = _run_bounded([
        lambda task=task: _collective_worker(task, servers[task].target,
                                             reduce_op)
        for task in range(2)])
    # Each worker made its inputs with seed = task: recompute them.
    arrays = [lib.make_inputs_arrays(2, lib.SMALL_SHAPES, np.float32, seed=t)
              for t in range(2)]
    for task in range(2):
      got, placements = results[task]
      for k, per_device in enumerate(got):
        column = arrays[0][k] + arrays[1][k]
        for v in per_device:
          self.assertAllClose(
              v, lib.expected(column, reduce_op == ReduceOp.MEAN))
      for placement in placements:
        for wanted, placed in placement:
          self.assertEqual(wanted, placed)

  @parameterized.parameters(
      d for d in (tf.float16, tf.float32, tf.float64)
      if d in _compat.collective_dtypes())
  def test_one_worker_local(self, dtype):
    devices = testing.virtual_cpu_devices(3)
    with tf.Graph().as_default():
      inputs, arrays = lib.make_inputs(devices, lib.SHAPES, dtype)
      ops = replicate.CollectiveAllReduce()
      results = ops.batch_reduce(ReduceOp.MEAN, [(v, v) for v in inputs])
      # Other destinations get copies of the all-reduced value; fetching
      # only /cpu:0 and /cpu:3 still runs the members on /cpu:1 and /cpu:2.
      copied = ops.reduce(ReduceOp.SUM, inputs[1], ['/cpu:0', '/cpu:3'])
      self.assertEqual(device_util.canonicalize(copied.values[1].device),
                       device_util.canonicalize('/cpu:3'))
      for r in results:
        for d, t in zip(r.devices, r.values):
          self.assertEqual(device_util.canonicalize(t.device), d)
      fetches = ([r.values for r in results], copied.values)
      graph = tf1.get_default_graph()
      got, got_copied = _run_bounded(
          [lambda: _run('', fetches, testing.virtual_cpu_config(4), graph)])[0]
    for column, per_device in zip(arrays, got):
      for v in per_device:
        self.assertAllClose(v, lib.expected(column, mean=True),
                            atol=lib.tolerance(dtype))
    for v in got_copied:
      self.assertAllClose(v, lib.expected(arrays[1], mean=False))

  def test_one_device_and_values_on_other_devices(self):
    # A collective of one value is an error in TF's ops: the value itself is
    # the sum and the mean. Values on different sets of devices are reduced
    # as separate batches, in their order (TF reduces them one at a time).
    devices = testing.virtual_cpu_devices(3)
    with tf.Graph().as_default():
      two, two_arrays = lib.make_inputs(devices[:2], [(2,)], tf.float32)
      one, one_arrays = lib.make_inputs(devices[2:], [(2,)], tf.float32,
                                        seed=1)
      ops = replicate.CollectiveAllReduce()
      single = ops.reduce(ReduceOp.MEAN, one[0], devices[2])
      mixed = ops.batch_reduce(ReduceOp.SUM, [(one[0], devices[2]),
                                              (two[0], two[0])])
      self.assertEqual(device_util.canonicalize(single.values[0].device),
                       device_util.canonicalize(devices[2]))
      fetches = (single.values, [r.values for r in mixed])
      graph = tf1.get_default_graph()
      got_single, got_mixed = _run_bounded(
          [lambda: _run('', fetches, testing.virtual_cpu_config(4),
                        graph)])[0]
    self.assertAllClose(got_single[0], one_arrays[0][0])
    self.assertAllClose(got_mixed[0][0], one_arrays[0][0])
    for v in got_mixed[1]:
      self.assertAllClose(v, lib.expected(two_arrays[0], mean=False))

  def test_merge_scope_groups_reductions(self):
    with tf.Graph().as_default() as graph:
      inputs, _ = lib.make_inputs(testing.virtual_cpu_devices(2),
                                  lib.SMALL_SHAPES, tf.float32)
      replicate.CollectiveAllReduce(all_reduce_merge_scope=2).batch_reduce(
          ReduceOp.SUM, [(v, v) for v in inputs])
      scopes = sorted(set(op.name.split('/')[0]
                          for op in graph.get_operations()
                          if op.type == 'CollectiveReduce'))
    # Three values in groups of two: two scopes.
    self.assertEqual(scopes, ['allreduce', 'allreduce_1'])

  def test_errors(self):
    with tf.Graph().as_default():
      devices = testing.virtual_cpu_devices(2)
      inputs, _ = lib.make_inputs(devices, [(2,)], tf.float32)
      others, _ = lib.make_inputs(testing.virtual_cpu_devices(3), [(2,)],
                                  tf.float32)
      index = {}
      for d in devices:
        with tf.device(d):
          index[d] = tf.IndexedSlices(tf.constant([[1.]]), tf.constant([0]))
      ops = replicate.CollectiveAllReduce()
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'cannot reduce IndexedSlices'):
        ops.reduce(ReduceOp.SUM, values.PerDevice(index), devices)
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'num_gpus_per_worker is 4 but the values '
                                  'live on 2 devices'):
        replicate.CollectiveAllReduce(num_gpus_per_worker=4).reduce(
            ReduceOp.SUM, inputs[0], devices)
    unsupported = [d for d in (tf.float16, tf.float32, tf.float64)
                   if d not in _compat.collective_dtypes()]
    for dtype in unsupported:  # float16 on TF 1.15
      with tf.Graph().as_default():
        inputs, _ = lib.make_inputs(devices, [(2,)], dtype)
        with self.assertRaisesRegex(errors.InvalidTypeError,
                                    'cannot reduce {} values with TensorFlow'
                                    .format(dtype.name)):
          replicate.CollectiveAllReduce().reduce(ReduceOp.SUM, inputs[0],
                                                 devices)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'num_workers must be an integer >= 1, got 0'):
      replicate.CollectiveAllReduce(num_workers=0)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'all_reduce_merge_scope must be an integer'):
      replicate.CollectiveAllReduce(all_reduce_merge_scope=0)
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'collective_keys must be a CollectiveKeys'):
      replicate.CollectiveAllReduce(collective_keys={})

  def test_collective_keys(self):
    keys = replicate.CollectiveKeys(group_key_start=5, instance_key_start=50)
    # Group keys depend on the local devices only, not on the worker.
    first = keys.get_group_key(['/job:worker/task:0/cpu:0',
                                '/job:worker/task:0/cpu:1'])
    self.assertEqual(first, 5)
    self.assertEqual(keys.get_group_key(['/job:worker/task:1/cpu:1',
                                         '/job:worker/task:1/cpu:0']), 5)
    self.assertEqual(keys.get_group_key(['/gpu:0']), 6)
    self.assertEqual([keys.get_instance_key() for _ in range(3)], [50, 51, 52])
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'group_key_start must be an integer >= 1'):
      replicate.CollectiveKeys(group_key_start=0)

  def test_collective_keys_take_contrib_third_argument(self):
    # contrib's CollectiveKeys(group_key_start, instance_key_start,
    # instance_key_with_id_start): keys without an id count from the second,
    # keys with an id from the third, one key per id however often asked.
    keys = replicate.CollectiveKeys(3, 30, 3000)
    self.assertEqual(keys.get_group_key(['/cpu:0', '/cpu:1']), 3)
    self.assertEqual(keys.get_instance_key(), 30)
    self.assertEqual(keys.get_instance_key('variable_a'), 3000)
    self.assertEqual(keys.get_instance_key('variable_b'), 3001)
    self.assertEqual(keys.get_instance_key('variable_a'), 3000)
    self.assertEqual(keys.get_instance_key(), 31)
    self.assertEqual(
        replicate.CollectiveKeys(
            group_key_start=7, instance_key_start=70,
            instance_key_with_id_start=7000).get_instance_key(key_id='v'),
        7000)
    # Equal starts are accepted, as contrib's own tests pass them (keys of
    # one kind only are drawn there).
    self.assertEqual(replicate.CollectiveKeys(1, 50, 50).get_instance_key(),
                     50)
    with self.assertRaisesRegex(
        errors.InvalidTypeError,
        r"instance_key_with_id_start must be an integer >= 1, got '9'"):
      replicate.CollectiveKeys(1, 50, '9')


if __name__ == '__main__':
  tf.test.main()

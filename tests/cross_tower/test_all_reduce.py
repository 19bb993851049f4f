"""Tests for the all-reduce graph builders (virtual CPUs; NCCL graphs only)."""
import unittest

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import op_kinds
from replicate.cross_tower import algorithms

_CPUS = testing.virtual_cpu_devices(4)
_NUM_GPUS = len(_compat.local_gpu_devices())


def _inputs(devices, shape, dtype=tf.float32, seed=0):
  rng = np.random.RandomState(seed)
  tensors, arrays = [], []
  for d in devices:
    a = rng.randint(-8, 8, size=shape).astype(dtype.as_numpy_dtype)
    with tf.device(d):
      tensors.append(tf.constant(a))
    arrays.append(a)
  return tensors, arrays


def _run(outputs, num_cpus=4):
  with tf1.Session(config=testing.virtual_cpu_config(num_cpus)) as sess:
    return sess.run(outputs)


def _builders():
  return {
      'ring': algorithms.build_ring_all_reduce,
      'ring_subchunks': lambda ts, **kw: algorithms.build_ring_all_reduce(
          ts, num_subchunks=3, **kw),
      'recursive_hd': algorithms.build_recursive_hd_all_reduce,
      'shuffle': lambda ts, **kw: algorithms.build_shuffle_all_reduce(
          ts, _CPUS[:3], **kw),
      'hierarchical_copy': algorithms.build_hierarchical_copy_all_reduce,
      'hierarchical_copy_offset': lambda ts, **kw: (
          algorithms.build_hierarchical_copy_all_reduce(
              ts, leader_offset=1, **kw)),
  }


class AllReduceBuildersTest(parameterized.TestCase, tf.test.TestCase):

  # Recursive halving-doubling needs a power of two: no 3-device case (its
  # error is tested below).
  @parameterized.parameters(
      (name, num_devices, shape, dtype)
      for name in sorted(_builders())
      for num_devices in (1, 2, 3, 4)
      for shape in ((), (13,), (5, 7))
      for dtype in (tf.float16, tf.float64)
      if not (name == 'recursive_hd' and num_devices == 3))
  def test_sum_matches_numpy_and_placement(self, name, num_devices, shape,
                                           dtype):
    with tf.Graph().as_default():
      tensors, arrays = _inputs(_CPUS[:num_devices], shape, dtype)
      outputs = _builders()[name](tensors)
      self.assertLen(outputs, num_devices)
      for t, out in zip(tensors, outputs):
        self.assertEqual(out.device, t.device)
        self.assertEqual(out.dtype, dtype)
        self.assertEqual(out.shape, shape)
      got = _run(outputs)
    for g in got:
      # Sum of small integers: exact in float16 too.
      self.assertAllEqual(g, np.sum(arrays, axis=0))

  @parameterized.parameters('ring', 'recursive_hd', 'shuffle',
                            'hierarchical_copy')
  def test_other_red_op_and_un_op(self, name):
    with tf.Graph().as_default():
      tensors, arrays = _inputs(_CPUS, (6,), tf.float32)
      outputs = _builders()[name](tensors, red_op=tf.maximum,
                                  un_op=lambda t: t * 2.)
      for t, out in zip(tensors, outputs):
        self.assertEqual(out.device, t.device)  # un_op's too
      got = _run(outputs)
    for g in got:
      self.assertAllEqual(g, 2. * np.max(arrays, axis=0))  # 2 * max

  # 4 devices, halves [0, 1] and [2, 3]. Value `offset` sums its halves on
  # their devices offset % 2 and the two sums on the half holding device
  # offset % 4, as TF's hierarchical copy spreads the work: offset 1 on
  # /cpu:1 and /cpu:3, its total on /cpu:1; offset 2 on /cpu:0 and /cpu:2,
  # its total on /cpu:2.
  @parameterized.parameters((0, 0, 2, 0), (1, 1, 3, 1), (2, 0, 2, 2),
                            (3, 1, 3, 3), (5, 1, 3, 1))
  def test_hierarchical_copy_spreads_leaders_and_total(
      self, offset, first_leader, second_leader, total_on):
    with tf.Graph().as_default() as graph:
      tensors, arrays = _inputs(_CPUS, (5,))
      outputs = algorithms.build_hierarchical_copy_all_reduce(
          tensors, leader_offset=offset)
      adds = sorted(device_util.canonicalize(op.device)
                    for op in graph.get_operations()
                    if op.type in ('Add', 'AddV2'))
      self.assertEqual(
          sorted(device_util.canonicalize(_CPUS[i])
                 for i in (first_leader, second_leader, total_on)), adds)
      # Each device copies the total from its own half's leader.
      for i, out in enumerate(outputs):
        leader = first_leader if i < 2 else second_leader
        self.assertEqual(device_util.canonicalize(_CPUS[leader]),
                         device_util.canonicalize(out.op.inputs[0].device))
        self.assertEqual(out.device, tensors[i].device)
      got = _run(outputs)
    for g in got:
      self.assertAllEqual(g, np.sum(arrays, axis=0))

  def test_large_tensor(self):
    with tf.Graph().as_default():
      tensors, arrays = _inputs(_CPUS, (1000, 129), tf.float32)
      outputs = algorithms.build_ring_all_reduce(tensors, num_subchunks=2)
      got = _run(outputs)
    for g in got:
      self.assertAllEqual(g, np.sum(arrays, axis=0))

  def test_shuffle_gathers_on_gather_devices(self):
    with tf.Graph().as_default() as graph:
      tensors, _ = _inputs(_CPUS[:2], (4,))
      algorithms.build_shuffle_all_reduce(tensors, ['/cpu:2', '/cpu:3'])
      add_devices = {device_util.canonicalize(op.device)
                     for op in graph.get_operations() if op.type == 'AddV2' or
                     op.type == 'Add'}
    self.assertEqual(add_devices,
                     {device_util.canonicalize(d) for d in _CPUS[2:]})

  def test_shuffle_then_shuffle_on_workers(self):
    # Two "workers" in one process: /job:localhost tasks cannot differ, so
    # check the graph's structure with worker device strings only.
    with tf.Graph().as_default():
      tensors = []
      for w in range(2):
        for c in range(2):
          with tf.device('/job:worker/task:%d/device:CPU:%d' % (w, c)):
            tensors.append(tf.constant([1., 2., 3.]))
      cpus = ['/job:worker/task:0/device:CPU:0',
              '/job:worker/task:1/device:CPU:0']
      outputs = algorithms.build_shuffle_then_shuffle(tensors, cpus, cpus)
      self.assertEqual([o.device for o in outputs], [t.device for t in tensors])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'one first-level gather device per worker: '
                                  '2 workers, 1 devices'):
        algorithms.build_shuffle_then_shuffle(tensors, cpus[:1], cpus)

  def test_errors(self):
    with tf.Graph().as_default():
      tensors, _ = _inputs(_CPUS[:3], (2,))
      other, _ = _inputs(_CPUS[:1], (3,))
      unknown = tf1.placeholder(tf.float32, [None])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'power-of-two number of devices, got 3'):
        algorithms.build_recursive_hd_all_reduce(tensors)
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'needs at least one input tensor'):
        algorithms.build_ring_all_reduce([])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'share one shape and dtype; got \\(2,\\) '
                                  'float32 and \\(3,\\) float32'):
        algorithms.build_hierarchical_copy_all_reduce(tensors + other)
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'needs a fully defined shape'):
        algorithms.build_ring_all_reduce([unknown, unknown])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'num_subchunks must be at least 1'):
        algorithms.build_ring_all_reduce(tensors, num_subchunks=0)
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'needs at least one gather device'):
        algorithms.build_shuffle_all_reduce(tensors, [])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'NCCL all-reduce only sums here'):
        algorithms.build_nccl_all_reduce(tensors, red_op=tf.maximum)


def _gpu_inputs(num_workers, num_gpus):
  tensors = []
  for w in range(num_workers):
    for g in range(num_gpus):
      with tf.device('/job:worker/task:%d/device:GPU:%d' % (w, g)):
        tensors.append(tf.constant([1., 2., 3.]))
  return tensors


class NcclGraphTest(parameterized.TestCase, tf.test.TestCase):
  """NCCL graphs are built (not run) on CPU: one NCCL op per GPU."""

  def _nccl_ops(self, graph):
    return [op for op in graph.get_operations() if op.type == 'NcclAllReduce']

  def test_nccl_one_op_per_device(self):
    with tf.Graph().as_default() as graph:
      tensors = _gpu_inputs(1, 4)
      outputs = algorithms.build_nccl_all_reduce(tensors)
      nccl = self._nccl_ops(graph)
    self.assertLen(nccl, 4)
    self.assertEqual(sorted(op.device for op in nccl),
                     sorted(t.device for t in tensors))
    self.assertEqual([o.device for o in outputs], [t.device for t in tensors])
    # Each output waits for every NCCL op (its own as data input, the others
    # as control inputs), so fetching one runs them all.
    for o in outputs:
      waits_for = set(o.op.control_inputs) | {i.op for i in o.op.inputs}
      self.assertEqual(waits_for, set(nccl))

  @parameterized.parameters(
      (lambda ts: algorithms.build_nccl_then_ring(ts), 'ring'),
      (lambda ts: algorithms.build_nccl_then_recursive_hd(ts), 'rechd'),
      (lambda ts: algorithms.build_nccl_then_shuffle(
          ts, ['/job:worker/task:0/cpu:0', '/job:worker/task:1/cpu:0']),
       'shuffle'))
  def test_nccl_hybrids_one_op_per_device(self, build, _):
    with tf.Graph().as_default() as graph:
      tensors = _gpu_inputs(2, 2)
      outputs = build(tensors)
      nccl = self._nccl_ops(graph)
    # 2 workers x 2 GPUs: one NCCL op per GPU, within each worker.
    self.assertLen(nccl, 4)
    self.assertEqual([o.device for o in outputs], [t.device for t in tensors])

  @unittest.skipIf(_NUM_GPUS < 2, 'NCCL numerics need 2+ visible GPUs.')
  def test_nccl_numerics_on_gpus(self):
    gpus = _compat.local_gpu_devices()
    with tf.Graph().as_default():
      tensors, arrays = _inputs(gpus, (5, 7), tf.float32)
      outputs = algorithms.build_nccl_all_reduce(tensors)
      with tf1.Session() as sess:
        got = sess.run(outputs)
    for g in got:
      self.assertAllClose(g, np.sum(arrays, axis=0))


def _on(devices, dtypes=None, shape=(2,)):
  tensors = []
  for i, d in enumerate(devices):
    dtype = dtypes[i] if dtypes else tf.float32
    with tf.device(d):
      tensors.append(tf.constant(np.full(shape, i + 1.), dtype=dtype))
  return tensors


class BuilderErrorsTest(tf.test.TestCase):
  """The errors the builders promise, before any op is built."""

  def test_mismatched_dtypes_are_refused_by_name(self):
    # Same shape (2,), float32 on /cpu:0 and float64 on /cpu:1: the builders'
    # own error, naming both dtypes, before any op is built.
    with tf.Graph().as_default():
      tensors = _on(_CPUS[:2], [tf.float32, tf.float64])
      for build in (algorithms.build_hierarchical_copy_all_reduce,
                    algorithms.build_ring_all_reduce,
                    algorithms.build_nccl_all_reduce):
        with self.assertRaisesRegex(
            errors.InvalidArgumentError,
            r'share one shape and dtype; got \(2,\) float32 and \(2,\) '
            r'float64'):
          build(tensors)

  def test_recursive_hd_refuses_six_devices(self):
    # 6 is even but not a power of two (6 & 5 = 4): the promised error, not
    # an IndexError from the partner arithmetic (i ^ 3 = 7 for i = 4).
    with tf.Graph().as_default():
      tensors = _on(['/cpu:%d' % i for i in range(6)])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'power-of-two number of devices, got 6'):
        algorithms.build_recursive_hd_all_reduce(tensors)

  def test_shuffle_then_shuffle_refuses_extra_first_gather_devices(self):
    # Two workers, three first-level gather devices: an error, not the third
    # device silently dropped.
    with tf.Graph().as_default():
      tensors = _on(['/job:worker/task:%d/device:CPU:%d' % (w, c)
                     for w in range(2) for c in range(2)])
      cpus = ['/job:worker/task:%d/device:CPU:0' % w for w in range(3)]
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'one first-level gather device per worker: '
                                  '2 workers, 3 devices'):
        algorithms.build_shuffle_then_shuffle(tensors, cpus, cpus[:2])


class UnplacedInputsTest(tf.test.TestCase):

  def test_ops_of_unplaced_inputs_are_colocated_with_them(self):
    # Inputs built outside any device scope: each output is colocated with
    # its own input (the builders' documented fallback), and still sums:
    # 1 + 2 + 3 = 6 in every element.
    with tf.Graph().as_default():
      tensors = [tf.constant(np.full((5,), i + 1., np.float32), name='in%d' % i)
                 for i in range(3)]
      outputs = algorithms.build_ring_all_reduce(tensors)
      for t, out in zip(tensors, outputs):
        self.assertEqual(t.op.colocation_groups(), out.op.colocation_groups())
      with tf1.Session(config=testing.virtual_cpu_config(4)) as sess:
        got = sess.run(outputs)
    for g in got:
      self.assertAllEqual(np.full((5,), 6.), g)


class ShuffleThenShuffleTest(tf.test.TestCase):

  def test_each_worker_sums_on_its_first_gather_device(self):
    # 2 workers x 2 CPUs (graph only: /job:worker devices), first-level
    # gather devices CPU:1 of each worker, second level CPU:0: each worker's
    # own tensors are added on its CPU:1.
    with tf.Graph().as_default() as graph:
      tensors = _on(['/job:worker/task:%d/device:CPU:%d' % (w, c)
                     for w in range(2) for c in range(2)])
      first = ['/job:worker/task:%d/device:CPU:1' % w for w in range(2)]
      second = ['/job:worker/task:%d/device:CPU:0' % w for w in range(2)]
      algorithms.build_shuffle_then_shuffle(tensors, first, second)
      inputs = {t.op for t in tensors}
      first_level = [op for op in graph.get_operations()
                     if op.type in ('Add', 'AddV2') and
                     all(i.op in inputs for i in op.inputs)]
    self.assertLen(first_level, 2)
    self.assertEqual(
        sorted(device_util.canonicalize(d) for d in first),
        sorted(device_util.canonicalize(op.device) for op in first_level))
    for op in first_level:
      # Both inputs come from the worker the add runs on.
      worker = device_util.worker_of(op.device)
      for i in op.inputs:
        self.assertEqual(worker, device_util.worker_of(i.device))


class NcclHybridWaitsTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.named_parameters(
      ('ring', lambda ts: algorithms.build_nccl_then_ring(ts)),
      ('rechd', lambda ts: algorithms.build_nccl_then_recursive_hd(ts)),
      ('shuffle', lambda ts: algorithms.build_nccl_then_shuffle(
          ts, ['/job:worker/task:0/cpu:0', '/job:worker/task:1/cpu:0'])))
  def test_each_output_waits_for_every_nccl_op_of_its_worker(self, build):
    # 2 workers x 3 GPUs. Only GPU 0's NCCL sum feeds the cross-worker
    # level, so GPUs 1 and 2 of a worker must wait for the NCCL ops of the
    # others explicitly, or fetching one of them leaves its collective
    # members unrun (a hang).
    with tf.Graph().as_default() as graph:
      tensors = _gpu_inputs(2, 3)
      outputs = build(tensors)
      nccl = [op for op in graph.get_operations()
              if op.type == 'NcclAllReduce']
    self.assertLen(nccl, 6)
    for i, out in enumerate(outputs):
      worker = '/job:worker/task:%d/' % (i // 3)
      own = {op for op in nccl if op.device.startswith(worker)}
      self.assertLen(own, 3)
      self.assertContainsSubset(own, op_kinds.backward_cone([out.op]))

  def test_nccl_then_ring_runs_its_ring_in_subchunks(self):
    # 2 workers x 2 GPUs, num_subchunks=3: the cross-worker ring splits each
    # worker's sum into 2 devices x 3 subchunks = 6 chunks.
    with tf.Graph().as_default() as graph:
      algorithms.build_nccl_then_ring(_gpu_inputs(2, 2), num_subchunks=3)
      splits = [op.get_attr('num_split') for op in graph.get_operations()
                if op.type == 'Split']
    self.assertEqual([6, 6], splits)


if __name__ == '__main__':
  tf.test.main()

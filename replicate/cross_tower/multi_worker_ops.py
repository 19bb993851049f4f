"""CrossTowerOps across workers: `MultiWorkerAllReduce`, `CollectiveAllReduce`.

`MultiWorkerAllReduce` builds, in one graph (in-graph replication), an
all-reduce over the devices of several workers, chosen per tensor size by an
all-reduce spec. `CollectiveAllReduce` uses TF's collective ops, so each
worker builds its own graph (between-graph replication) and the workers meet
at run time.
"""
import collections
import threading

import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate.core import device_util
from replicate.core.checks import check_int
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import algorithms
from replicate.cross_tower import cross_tower_base
from replicate.cross_tower import values as values_lib
from replicate.cross_tower.fast_path import BatchAllReduceBase
from replicate.cross_tower.fast_path import placed_on

# Algorithm names of the all-reduce spec. A "/" means two levels: within a
# worker, then across workers.
ALL_REDUCE_ALGORITHMS = ('nccl', 'nccl/xring', 'nccl/rechd', 'nccl/pscpu',
                         'xring', 'pscpu', 'psgpu', 'pscpu/pscpu')
_NEEDS_GPUS = ('nccl', 'nccl/xring', 'nccl/rechd', 'nccl/pscpu', 'psgpu')

AllReduceSpecTuple = collections.namedtuple(
    'AllReduceSpecTuple', ['alg', 'shards', 'limit'])


def parse_all_reduce_spec(all_reduce_spec, num_workers, num_gpus_per_worker):
  """Validates an all-reduce spec; returns a list of `AllReduceSpecTuple`.

  Args:
    all_reduce_spec: an `(alg, shards, limit)` tuple or a list of them. `alg`
      is one of `ALL_REDUCE_ALGORITHMS`; `shards` (>= 1) is how many pieces
      each tensor is split into and all-reduced side by side; `limit` is the
      largest tensor size in bytes the tuple applies to. Limits increase and
      the last is -1 (no limit). As in TF, `alg` alone, `(alg,)` and
      `(alg, shards)` stand for `(alg, 1, -1)` and `(alg, shards, -1)`.
    num_workers: number of workers (recursive halving-doubling needs a power
      of two).
    num_gpus_per_worker: GPUs per worker (NCCL and psgpu need at least one).

  Returns:
    A list of `AllReduceSpecTuple`.

  Raises:
    InvalidArgumentError: if the spec breaks any rule above.
  """
  spec = all_reduce_spec
  if isinstance(spec, str) or (
      isinstance(spec, tuple) and spec and
      isinstance(spec[0], str)):
    spec = [spec]
  if not isinstance(spec, (list, tuple)) or not spec:
    raise errors.InvalidArgumentError(
        'all_reduce_spec must be an (alg, shards, limit) tuple or a non-empty '
        'list of them, got {!r}.'.format(all_reduce_spec))
  result = []
  for item in spec:
    if isinstance(item, str):
      item = (item,)
    if not isinstance(item, (list, tuple)) or not 1 <= len(item) <= 3:
      raise errors.InvalidArgumentError(
          'Each all_reduce_spec item must be an (alg, shards, limit) tuple '
          '(or alg, (alg,), (alg, shards)), got {!r} in {!r}.'.format(
              item, all_reduce_spec))
    alg, shards, limit = tuple(item) + (1, -1)[len(item) - 1:]
    if alg not in ALL_REDUCE_ALGORITHMS:
      raise errors.InvalidArgumentError(
          'Unknown all-reduce algorithm {!r} in all_reduce_spec; use one of '
          '{}.'.format(alg, ', '.join(ALL_REDUCE_ALGORITHMS)))
    if alg in _NEEDS_GPUS and num_gpus_per_worker < 1:
      raise errors.InvalidArgumentError(
          'All-reduce algorithm {!r} needs GPUs, but num_gpus_per_worker is '
          '{}; use "pscpu", "xring" or "pscpu/pscpu".'.format(
              alg, num_gpus_per_worker))
    if alg in ('nccl/rechd',) and num_workers & (num_workers - 1):
      raise errors.InvalidArgumentError(
          '"nccl/rechd" needs a power-of-two number of workers, got {}; use '
          '"nccl/xring" or "nccl/pscpu".'.format(num_workers))
    check_int('all_reduce_spec shards', shards, 1)
    if not isinstance(limit, int) or isinstance(limit, bool) or (
        limit < 1 and limit != -1):
      raise errors.InvalidArgumentError(
          'all_reduce_spec limit must be a positive number of bytes or -1 '
          '(no limit), got {!r}.'.format(limit))
    result.append(AllReduceSpecTuple(alg, shards, limit))
  limits = [s.limit for s in result]
  if limits[-1] != -1 or -1 in limits[:-1] or limits[:-1] != sorted(
      set(limits[:-1])):
    raise errors.InvalidArgumentError(
        'all_reduce_spec limits must increase and end with -1 (no limit), got '
        '{}.'.format(limits))
  return result


def _sharded(build, tensors, num_shards):
  """Splits each of `tensors` into `num_shards` pieces, `build`s each piece."""
  size = tensors[0].shape.num_elements()
  num_shards = max(1, min(num_shards, size))
  if num_shards == 1:
    return build(tensors)
  sizes = [size // num_shards + (1 if i < size % num_shards else 0)
           for i in range(num_shards)]
  pieces = []
  for t in tensors:
    with tf.device(t.device):
      pieces.append(tf.split(tf.reshape(t, [-1]), sizes, axis=0))
  reduced = [build([p[s] for p in pieces]) for s in range(num_shards)]
  outputs = []
  for k, t in enumerate(tensors):
    with tf.device(t.device):
      outputs.append(tf.reshape(tf.concat([r[k] for r in reduced], 0),
                                t.shape))
  return outputs


class MultiWorkerAllReduce(BatchAllReduceBase):
  """In-graph all-reduce over the devices of several workers.

  Each tensor (after optional repacking, as in `AllReduceCrossTowerOps`,
  except that `num_packs` defaults to 0) is all-reduced with the first
  algorithm of `all_reduce_spec` whose size limit it fits.
  """

  def __init__(self, worker_devices, num_gpus_per_worker,
               all_reduce_spec=('pscpu/pscpu', 2, -1), num_packs=0,
               agg_small_grads_max_bytes=0, agg_small_grads_max_group=10):
    """Builds the object.

    Args:
      worker_devices: non-empty list of worker device strings, e.g.
        `['/job:worker/task:0', '/job:worker/task:1']`.
      num_gpus_per_worker: int >= 0.
      all_reduce_spec: see `parse_all_reduce_spec`.
      num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group: as in
        `AllReduceCrossTowerOps`.

    Raises:
      InvalidArgumentError: for empty `worker_devices`, a bad spec, or a knob
        out of range.
      InvalidTypeError: if a worker device is not a string.
    """
    super(MultiWorkerAllReduce, self).__init__()
    if isinstance(worker_devices, str) or not worker_devices:
      raise errors.InvalidArgumentError(
          'worker_devices must be a non-empty list of worker device strings '
          'such as "/job:worker/task:0", got {!r}.'.format(worker_devices))
    self._workers = tuple(device_util.worker_of(w) for w in worker_devices)
    check_int('num_gpus_per_worker', num_gpus_per_worker, 0)
    check_int('num_packs', num_packs, 0)
    check_int('agg_small_grads_max_bytes', agg_small_grads_max_bytes, 0)
    check_int('agg_small_grads_max_group', agg_small_grads_max_group, 0)
    self._num_gpus_per_worker = num_gpus_per_worker
    self._spec = parse_all_reduce_spec(all_reduce_spec, len(self._workers),
                                       num_gpus_per_worker)
    self._num_packs = num_packs
    self._agg_small_grads_max_bytes = agg_small_grads_max_bytes
    self._agg_small_grads_max_group = agg_small_grads_max_group
    self._cpus = ['{}/device:CPU:0'.format(w) for w in self._workers]
    self._gpus = ['{}/device:GPU:{}'.format(w, i) for w in self._workers
                  for i in range(num_gpus_per_worker)]

  @property
  def all_reduce_spec(self):
    """The validated spec, a list of `AllReduceSpecTuple`."""
    return list(self._spec)

  def _fast_path_refusal(self, value, destinations, devices):
    reason = super(MultiWorkerAllReduce, self)._fast_path_refusal(
        value, destinations, devices)
    if reason is None and not all(
        isinstance(t, tf.Tensor) and t.shape.is_fully_defined()
        for t in value.values):
      reason = 'shapes are not fully defined'
    return reason

  def _all_reduce_per_device(self, reduce_op, devices, tensors):
    strangers = sorted(set(device_util.worker_of(d) for d in devices) -
                       set(self._workers))
    if strangers:
      raise errors.InvalidArgumentError(
          'Values live on workers {} that are not in worker_devices ({}); '
          'list every worker in worker_devices.'.format(
              ', '.join(strangers), ', '.join(self._workers)))
    return super(MultiWorkerAllReduce, self)._all_reduce_per_device(
        reduce_op, devices, tensors)

  def _spec_for(self, tensor):
    size = tensor.shape.num_elements() * tensor.dtype.size
    for spec in self._spec:
      if spec.limit == -1 or size <= spec.limit:
        return spec
    return self._spec[-1]

  def _builder(self, alg, tensors):
    """A function building `alg` over a list of tensors like `tensors`."""
    workers = []
    for t in tensors:
      w = device_util.worker_of(t.device)
      if w not in workers:
        workers.append(w)
    worker_cpus = ['{}/device:CPU:0'.format(w) for w in workers]
    builders = {
        'nccl': algorithms.build_nccl_all_reduce,
        'nccl/xring': algorithms.build_nccl_then_ring,
        'nccl/rechd': algorithms.build_nccl_then_recursive_hd,
        'nccl/pscpu': lambda ts: algorithms.build_nccl_then_shuffle(
            ts, self._cpus),
        'xring': algorithms.build_ring_all_reduce,
        'pscpu': lambda ts: algorithms.build_shuffle_all_reduce(
            ts, self._cpus),
        'psgpu': lambda ts: algorithms.build_shuffle_all_reduce(
            ts, self._gpus),
        'pscpu/pscpu': lambda ts: algorithms.build_shuffle_then_shuffle(
            ts, worker_cpus, self._cpus),
    }
    return builders[alg]

  def _all_reduce(self, tensors, index):
    spec = self._spec_for(tensors[0])
    return _sharded(self._builder(spec.alg, tensors), tensors, spec.shards)


class CollectiveKeys(object):
  """Hands out the integer keys collective ops meet by.

  Every worker must build its reductions in the same order, so that its
  `CollectiveKeys` hands out the same keys for the same reductions. Group
  keys depend only on the device types and indices of the local devices
  (not on the worker), so all workers get equal group keys.
  """

  def __init__(self, group_key_start=1, instance_key_start=100,
               instance_key_with_id_start=10000):
    """Builds the key source.

    Args:
      group_key_start: first group key (int >= 1).
      instance_key_start: first instance key handed out without a key id
        (int >= 1).
      instance_key_with_id_start: first instance key handed out for a key id
        (int >= 1); contrib's third argument. The library's reductions draw
        no keys by id; where both kinds are drawn, the ranges must not
        overlap (contrib's own tests start both at the same key and draw
        one kind).

    Raises:
      InvalidTypeError: if a start is not an int.
      InvalidArgumentError: if a start is below 1.
    """
    check_int('group_key_start', group_key_start, 1)
    check_int('instance_key_start', instance_key_start, 1)
    check_int('instance_key_with_id_start', instance_key_with_id_start, 1)
    self._lock = threading.Lock()
    self._next_group_key = group_key_start
    self._next_instance_key = instance_key_start
    self._next_instance_key_with_id = instance_key_with_id_start
    self._group_keys = {}
    self._instance_keys_by_id = {}

  def get_group_key(self, devices):
    """The group key of the collective group of `devices` (local devices)."""
    # '/job:worker/replica:0/task:1/device:CPU:0' -> 'CPU:0'.
    key = tuple(sorted(device_util.canonicalize(d).split('/device:')[-1]
                       for d in devices))
    with self._lock:
      if key not in self._group_keys:
        self._group_keys[key] = self._next_group_key
        self._next_group_key += 1
      return self._group_keys[key]

  def get_instance_key(self, key_id=None):
    """An instance key: a new one per call, or one per `key_id`.

    Args:
      key_id: optional string; every call with the same `key_id` gets the
        same key (drawn from `instance_key_with_id_start` on), so that
        workers agree on a key by name rather than by call order.
    """
    with self._lock:
      if key_id:
        if key_id not in self._instance_keys_by_id:
          self._instance_keys_by_id[key_id] = self._next_instance_key_with_id
          self._next_instance_key_with_id += 1
        return self._instance_keys_by_id[key_id]
      key = self._next_instance_key
      self._next_instance_key += 1
      return key


class CollectiveAllReduce(cross_tower_base.CrossTowerOps):
  """All-reduce with TF collective ops, across workers (between-graph).

  Each worker reduces the values on its own devices; the collective ops of
  all `num_workers` workers meet at run time. Sessions need a
  `ConfigProto` whose `experimental.collective_group_leader` names the same
  worker on every worker when `num_workers > 1`. The outputs live on the
  values' devices; other destinations get copies of the result.
  `IndexedSlices` are not supported, nor float16 on TF 1.15.
  """

  def __init__(self, num_workers=1, num_gpus_per_worker=0,
               all_reduce_merge_scope=32, collective_keys=None):
    """Builds the object.

    Args:
      num_workers: int >= 1, how many workers take part.
      num_gpus_per_worker: int >= 0; when positive, each worker's values must
        be on exactly that many devices.
      all_reduce_merge_scope: int >= 1; reductions are built in groups of
        this many, each in its own name scope (so that the runtime can merge
        their buffers).
      collective_keys: a `CollectiveKeys`; default a new one.

    Raises:
      InvalidArgumentError: for a knob out of range.
      InvalidTypeError: if `collective_keys` is not a `CollectiveKeys`.
    """
    check_int('num_workers', num_workers, 1)
    check_int('num_gpus_per_worker', num_gpus_per_worker, 0)
    check_int('all_reduce_merge_scope', all_reduce_merge_scope, 1)
    if collective_keys is None:
      collective_keys = CollectiveKeys()
    if not isinstance(collective_keys, CollectiveKeys):
      raise errors.InvalidTypeError(
          'collective_keys must be a CollectiveKeys, got {!r}.'.format(
              collective_keys))
    super(CollectiveAllReduce, self).__init__()
    self._num_workers = num_workers
    self._num_gpus_per_worker = num_gpus_per_worker
    self._merge_scope = all_reduce_merge_scope
    self._keys = collective_keys

  def _reduce(self, reduce_op, per_device_value, destinations):
    return self._batch_reduce(reduce_op, [(per_device_value, destinations)])[0]

  def _batch_reduce(self, reduce_op, value_destination_pairs):
    # Values on different sets of devices form groups of their own, each
    # reduced as one batch (TF reduces such values one at a time).
    groups = collections.OrderedDict()
    for position, (value, _) in enumerate(value_destination_pairs):
      groups.setdefault(frozenset(value.devices), []).append(position)
    if len(groups) > 1:
      results = [None] * len(value_destination_pairs)
      for positions in groups.values():
        reduced = self._batch_reduce_on_devices(
            reduce_op, [value_destination_pairs[i] for i in positions])
        for position, result in zip(positions, reduced):
          results[position] = result
      return results
    return self._batch_reduce_on_devices(reduce_op, value_destination_pairs)

  def _batch_reduce_on_devices(self, reduce_op, value_destination_pairs):
    """`_batch_reduce` of values that all live on the same devices."""
    devices = value_destination_pairs[0][0].devices
    for value, _ in value_destination_pairs:
      if cross_tower_base.is_sparse(value):
        raise errors.InvalidArgumentError(
            'CollectiveAllReduce cannot reduce IndexedSlices (collective ops '
            'are dense); convert them with tf.convert_to_tensor or use '
            'ReductionToOneDeviceCrossTowerOps for sparse values.')
      dtype = value.values[0].dtype.base_dtype
      if dtype not in _compat.collective_dtypes():
        raise errors.InvalidTypeError(
            'CollectiveAllReduce cannot reduce {} values with TensorFlow {} '
            '(collective ops take {}); cast them, or use '
            'MultiWorkerAllReduce or ReductionToOneDeviceCrossTowerOps.'
            .format(dtype.name, tf.__version__, ', '.join(
                d.name for d in _compat.collective_dtypes())))
    if self._num_gpus_per_worker and len(devices) != self._num_gpus_per_worker:
      raise errors.InvalidArgumentError(
          'num_gpus_per_worker is {} but the values live on {} devices ({}); '
          'pass values on every local GPU.'.format(
              self._num_gpus_per_worker, len(devices), ', '.join(devices)))
    group_size = len(devices) * self._num_workers
    group_key = self._keys.get_group_key(devices)
    final_op = 'Div' if reduce_op == ReduceOp.MEAN else 'Id'
    results = []
    for start in range(0, len(value_destination_pairs), self._merge_scope):
      with tf.name_scope('allreduce'):
        for value, destinations in value_destination_pairs[
            start:start + self._merge_scope]:
          if group_size == 1:
            # One value in all: its sum and its mean are itself (a
            # collective of one is an error in TF).
            with tf.device(devices[0]):
              reduced = {devices[0]: tf.identity(
                  placed_on(value.get(devices[0]), devices[0]))}
          else:
            instance_key = self._keys.get_instance_key()
            members = []
            for d in devices:
              with tf.device(d):
                members.append(_compat.collective_all_reduce(
                    placed_on(value.get(d), d), group_size, group_key,
                    instance_key, 'Add', final_op))
            # Fetching any output must run every local member of the
            # collective, or the members that ran would wait forever.
            reduced = dict(zip(devices, algorithms.tie_together(members)))
          results.append(values_lib.Mirrored({
              d: reduced[d] if d in reduced
              else cross_tower_base.copy_to_device(reduced[devices[0]], d)
              for d in destinations}))
    return results

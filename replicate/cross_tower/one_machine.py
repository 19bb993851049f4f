"""All-reduce within one machine (`AllReduceCrossTowerOps`) and the choice of
cross-tower ops for a set of local devices (`choose_the_best`).
"""
import enum

import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate.core import device_util
from replicate.core import logs as logging
from replicate.core.checks import check_int
from replicate.cross_tower import algorithms
from replicate.cross_tower import values as values_lib
from replicate.cross_tower.cross_tower_base import (
  ReductionToOneDeviceCrossTowerOps,
)
from replicate.cross_tower.fast_path import BatchAllReduceBase


class AllReduceAlgorithm(enum.Enum):
  """The all-reduce algorithms of `AllReduceCrossTowerOps`."""
  NCCL = 'nccl'
  HIERARCHICAL_COPY = 'hierarchical_copy'


class AllReduceCrossTowerOps(BatchAllReduceBase):
  """All-reduce among the devices of one machine, after optional repacking.

  By default (`num_packs=None`) each device's tensors go in buckets filled
  in the order they become ready, the last layer's gradients first
  (`Tuning.all_reduce_bucket_bytes`, `all_reduce_min_buckets`), one
  all-reduce per bucket, so that all-reduces start while back-propagation
  still runs. contrib's knobs, when given, keep contrib's meaning:
  `num_packs > 0`: each device's tensors are concatenated and split into
  `num_packs` packs (`num_packs=1`, contrib's default: one all-reduce that
  waits for every tensor); else, with `agg_small_grads_max_bytes > 0`, runs
  of small tensors are grouped; else tensors are all-reduced one by one.
  `agg_small_grads_max_bytes` without `num_packs` is contrib's default
  `num_packs=1`. `IndexedSlices`, and destinations other than the values'
  own devices, are reduced to one device instead, with one warning.
  """

  def __init__(self, all_reduce_alg='nccl', num_packs=None,
               agg_small_grads_max_bytes=0, agg_small_grads_max_group=10,
               tuning=None):
    """Builds the object.

    Args:
      all_reduce_alg: `'nccl'` or `'hierarchical_copy'` (or an
        `AllReduceAlgorithm`).
      num_packs: None (buckets in the order the tensors become ready) or
        an int >= 0, see the class docstring.
      agg_small_grads_max_bytes: int >= 0, largest tensor (bytes) grouped.
      agg_small_grads_max_group: int >= 0, most tensors in a group (no
        groups unless both this and `agg_small_grads_max_bytes` are > 0).
      tuning: the `replicate.Tuning` that sizes the buckets (and the packs
        of values reduced to one device instead); None: the calling
        thread's current one.

    Raises:
      InvalidArgumentError: for an unknown algorithm or a knob out of range.
      InvalidTypeError: if `tuning` is neither None nor a `Tuning`.
    """
    super(AllReduceCrossTowerOps, self).__init__(tuning=tuning)
    try:
      self._algorithm = AllReduceAlgorithm(
          all_reduce_alg.value if isinstance(all_reduce_alg, AllReduceAlgorithm)
          else all_reduce_alg)
    except ValueError:
      raise errors.InvalidArgumentError(
          'Unknown all_reduce_alg {!r}; use one of {}.'.format(
              all_reduce_alg, ', '.join(repr(a.value)
                                        for a in AllReduceAlgorithm)))
    if num_packs is not None:
      check_int('num_packs', num_packs, 0)
    check_int('agg_small_grads_max_bytes', agg_small_grads_max_bytes, 0)
    check_int('agg_small_grads_max_group', agg_small_grads_max_group, 0)
    self._num_packs = num_packs
    self._agg_small_grads_max_bytes = agg_small_grads_max_bytes
    self._agg_small_grads_max_group = agg_small_grads_max_group

  @property
  def all_reduce_alg(self):
    """The `AllReduceAlgorithm`."""
    return self._algorithm

  def _all_reduce_per_device(self, reduce_op, devices, tensors):
    # One device has nothing to all-reduce (the base class copies it), on
    # any device type.
    if self._algorithm == AllReduceAlgorithm.NCCL and len(devices) > 1:
      not_gpus = [d for d in devices if device_util.device_type_of(d) != 'GPU']
      if not_gpus:
        raise errors.InvalidArgumentError(
            'NCCL all-reduce runs on GPUs only, got {}; use '
            'all_reduce_alg="hierarchical_copy" or '
            'ReductionToOneDeviceCrossTowerOps.'.format(', '.join(not_gpus)))
    return super(AllReduceCrossTowerOps, self)._all_reduce_per_device(
        reduce_op, devices, tensors)

  def _all_reduce(self, tensors, index):
    if self._algorithm == AllReduceAlgorithm.NCCL:
      return algorithms.build_nccl_all_reduce(tensors)
    return algorithms.build_hierarchical_copy_all_reduce(
        tensors, leader_offset=index)


def has_dgx1_like_links(gpu_links):
  """Whether GPUs are linked like a DGX-1 (two linked quads, i <-> i+4).

  Args:
    gpu_links: for each GPU, the list of GPU indices it has a direct link to.

  Returns:
    True when there are at least 8 GPUs and GPU i of the first 8 is linked to
    the other three of its quad and to GPU i + 4 (mod 8).
  """
  if len(gpu_links) < 8:
    return False
  for i in range(8):
    quad = i // 4 * 4
    needed = {j for j in range(quad, quad + 4) if j != i} | {(i + 4) % 8}
    if not needed <= set(gpu_links[i]):
      return False
  return True


def choose_for(devices, local_devices, tuning=None):
  """`choose_the_best` given a description of the local devices.

  Args:
    devices: canonical device strings requested.
    local_devices: `(name, device_type, links)` of each local device.
    tuning: the chosen object's `Tuning` (None: the current one).

  Returns:
    A `CrossTowerOps`.
  """
  local = {device_util.canonicalize(name): (kind, links)
           for name, kind, links in local_devices}
  if any(device_util.device_type_of(d) != 'GPU' for d in devices):
    logging.info('Not all of %s are GPUs: reducing to one device.',
                 ', '.join(devices))
    return ReductionToOneDeviceCrossTowerOps(tuning=tuning)
  missing = [d for d in devices if d not in local]
  if missing:
    logging.warning('GPUs %s are not visible to this process: reducing to one '
                    'device instead of all-reducing.', ', '.join(missing))
    return ReductionToOneDeviceCrossTowerOps(tuning=tuning)
  gpu_links = [local[name][1] for name in sorted(
      (n for n, (kind, _) in local.items() if kind == 'GPU'),
      key=lambda n: tf.compat.v1.DeviceSpec.from_string(n).device_index)]
  if len(devices) == len(gpu_links) and has_dgx1_like_links(gpu_links):
    return AllReduceCrossTowerOps('hierarchical_copy', tuning=tuning)
  return AllReduceCrossTowerOps('nccl', tuning=tuning)


def choose_the_best(devices, session_config=None):
  """The best `CrossTowerOps` for `devices` on this machine.

  If every requested device is a GPU visible to this process, all-reduce:
  hierarchical copy when all GPUs of a DGX-1-like topology are used, NCCL
  otherwise. Else (CPUs, or GPUs not visible), reduction to one device.

  Args:
    devices: a device string or a list of them.
    session_config: optional `ConfigProto` used to list the local devices.

  Returns:
    A `CrossTowerOps`.

  Raises:
    InvalidArgumentError: for empty or None `devices`.
  """
  return best_for(devices, session_config, None)


def best_for(devices, session_config, tuning):
  """`choose_the_best(devices, session_config)`, made with `tuning`.

  Raises:
    InvalidArgumentError: for empty or None `devices`.
    InvalidTypeError: if `tuning` is neither None nor a `Tuning`.
  """
  devices = values_lib.get_devices_from(devices)
  if any(device_util.device_type_of(d) != 'GPU' for d in devices):
    return choose_for(devices, [], tuning)
  return choose_for(devices, _compat.local_device_attributes(session_config),
                    tuning)

"""The all-reduce fast path shared by the all-reduce CrossTowerOps.

`BatchAllReduceBase` sends dense values whose destinations are their own
devices through packing and a subclass's all-reduce; everything else goes to
reduction to one device, with one warning per call that says why.
"""
import tensorflow as tf

from replicate import errors
from replicate.core import buckets
from replicate.core import device_util
from replicate.core import logs as logging
from replicate.core import packing
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import cross_tower_base
from replicate.cross_tower import values as values_lib
from replicate.cross_tower.cross_tower_base import CrossTowerOps
from replicate.cross_tower.cross_tower_base import (
  ReductionToOneDeviceCrossTowerOps,
)


def make_packer(num_packs, agg_small_grads_max_bytes,
                agg_small_grads_max_group, tuning):
  """The packer the knobs ask for, or None (no repacking).

  `num_packs=None` (replicate's default) packs in buckets filled in the
  order the values become ready (`replicate.core.buckets`), unless
  `agg_small_grads_max_bytes` is set: then contrib's default, one pack.
  `num_packs > 0` concatenates and splits into that many packs; else
  `agg_small_grads_max_bytes > 0` groups small tensors; else no packer.
  Buckets are sized by the `Tuning` `tuning`.
  """
  if num_packs is None:
    if agg_small_grads_max_bytes <= 0:
      return buckets.BucketPacker(tuning)
    num_packs = 1  # contrib's default, under which agg_small_* is unused.
  if num_packs > 0:
    return packing.ConcatAndSplitPacker(num_packs)
  if agg_small_grads_max_bytes > 0 and agg_small_grads_max_group > 0:
    return packing.AggregateSmallTensorPacker(agg_small_grads_max_bytes,
                                              agg_small_grads_max_group)
  return None


def placed_on(tensor, device):
  """`tensor` if it is on `device`, else a copy placed there."""
  if device_util.resolve(tensor.device) == device:
    return tensor
  with tf.device(device):
    return tf.identity(tensor)


class BatchAllReduceBase(CrossTowerOps):
  """Shared by the all-reduce implementations: fast path or one fallback.

  Values that are dense, and whose destinations are exactly their own
  devices (the same devices for every value), are all-reduced together by
  `_all_reduce_device_grads`; all others go, in one batch, to reduction to
  one device (which packs them as its own `batch_reduce` does), with one
  warning per call that says why.
  """

  def __init__(self, tuning=None):
    super(BatchAllReduceBase, self).__init__(tuning=tuning)
    self._fallback = ReductionToOneDeviceCrossTowerOps(tuning=self.tuning)

  def _reduce(self, reduce_op, per_device_value, destinations):
    return self._batch_reduce(reduce_op, [(per_device_value, destinations)])[0]

  def _fast_path_refusal(self, value, destinations, devices):
    """Why `value` cannot take the all-reduce path (None if it can)."""
    if cross_tower_base.is_sparse(value):
      return 'IndexedSlices are not all-reduced'
    if set(destinations) != set(value.devices):
      return 'destinations differ from the devices of the values'
    if set(value.devices) != set(devices):
      return 'values live on different sets of devices'
    return None

  def _batch_reduce(self, reduce_op, value_destination_pairs):
    devices = value_destination_pairs[0][0].devices
    fast, slow, reasons = [], [], []
    for i, (value, destinations) in enumerate(value_destination_pairs):
      reason = self._fast_path_refusal(value, destinations, devices)
      if reason is None:
        fast.append(i)
      else:
        slow.append(i)
        if reason not in reasons:
          reasons.append(reason)
    results = [None] * len(value_destination_pairs)
    if slow:
      logging.warning(
          '%s: %d of %d values are reduced to one device instead of '
          'all-reduced: %s.', type(self).__name__, len(slow),
          len(value_destination_pairs), '; '.join(reasons))
      reduced = self._fallback._batch_reduce(  # pylint: disable=protected-access
          reduce_op, [value_destination_pairs[i] for i in slow])
      for i, result in zip(slow, reduced):
        results[i] = result
    if fast:
      tensors = [[placed_on(value_destination_pairs[i][0].get(d), d)
                  for i in fast] for d in devices]
      reduced = self._all_reduce_per_device(reduce_op, devices, tensors)
      for k, i in enumerate(fast):
        by_device = dict(zip(devices, (grads[k] for grads in reduced)))
        results[i] = values_lib.Mirrored(
            {d: by_device[d] for d in value_destination_pairs[i][1]})
    return results

  def _all_reduce_per_device(self, reduce_op, devices, tensors):
    """Packs, all-reduces, unpacks and means `tensors[device][value]`.

    Raises:
      InvalidArgumentError: if a value's static shapes differ between devices.
    """
    if len(devices) == 1:
      with tf.device(devices[0]):
        return [[tf.identity(t) for t in tensors[0]]]
    for index in range(len(tensors[0])):
      shapes = [per_device[index].shape for per_device in tensors]
      if any(not shape.is_compatible_with(shapes[0]) for shape in shapes[1:]):
        raise errors.InvalidArgumentError(
            'All-reduce needs one shape on every device, but value {} of the '
            'batch has shapes {} on {}; reduce values of equal shapes.'.format(
                index, ', '.join(str(shape) for shape in shapes),
                ', '.join(devices)))
    device_grads = [[(t, None) for t in ts] for ts in tensors]
    packer = self._packer_for(tensors[0])
    if packer is not None:
      device_grads = packer.pack(device_grads)
    per_value = list(zip(*[[g for g, _ in grads] for grads in device_grads]))
    reduced = [self._all_reduce(list(ts), i) for i, ts in enumerate(per_value)]
    reduced_grads = [[(r[k], None) for r in reduced]
                     for k in range(len(devices))]
    if packer is not None:
      reduced_grads = packer.unpack(reduced_grads)
    result = []
    for grads in reduced_grads:
      if reduce_op == ReduceOp.MEAN:
        result.append([_placed_divide(g, len(devices)) for g, _ in grads])
      else:
        result.append([g for g, _ in grads])
    return result

  def _packer_for(self, tensors):
    packer = make_packer(self._num_packs, self._agg_small_grads_max_bytes,
                         self._agg_small_grads_max_group, self.tuning)
    if packer is not None and not all(
        t.shape.is_fully_defined() for t in tensors):
      logging.warning(
          '%s: tensors are not repacked because some shapes are not fully '
          'defined.', type(self).__name__)
      return None
    return packer

  def _all_reduce(self, tensors, index):
    """All-sums `tensors` (one per device); `index` numbers the tensor."""
    raise NotImplementedError


def _placed_divide(tensor, count):
  with tf.device(tensor.device):
    return cross_tower_base.divide_by(tensor, count)

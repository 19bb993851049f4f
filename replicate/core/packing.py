"""Packers: regroup per-device gradients into fewer, larger tensors.

A packer works on `device_grads`, a list over devices of lists of
`(grad, var)` pairs (the same variables, in the same order, on every device).
`pack(device_grads)` returns `(packed_device_grads, pack_info)`; the caller
reduces the packed tensors, then `unpack(reduced_device_grads, pack_info)`
returns the original structure. Nothing is stored between the two calls.

The ops a packer adds for a device are colocated with that device's first
gradient, so they run where the gradients are.
"""
import collections

import tensorflow as tf

from replicate import errors

_Group = collections.namedtuple('_Group', ['positions', 'shapes', 'sizes'])
# What a packer's `unpack` needs: each device's variables, the pack plan.
PackInfo = collections.namedtuple('PackInfo', ['device_vars', 'plan'])


def concat_group_key(tensor, device, max_bytes):
  """The group a tensor is concatenated with along dimension 0, or None.

  Tensors of one group -- same device, dtype and static shape after
  dimension 0 -- concatenate along dimension 0 without any reshape, and
  `tf.split` takes them apart again by aliasing the buffer.

  Args:
    tensor: a dense `Tensor`.
    device: the device the concatenation would run on.
    max_bytes: the largest tensor worth copying into a concatenation.

  Returns:
    `(device, dtype, shape[1:])`, or None when the static shape is not fully
    known or of rank 0, or the tensor is larger than `max_bytes`.
  """
  shape = tensor.shape
  if shape.rank is None or shape.rank < 1 or not shape.is_fully_defined():
    return None
  if num_bytes(tensor) > max_bytes:
    return None
  return (device, tensor.dtype, tuple(shape.as_list()[1:]))


def num_bytes(tensor):
  """The size of a tensor of fully known static shape, in bytes."""
  return tensor.shape.num_elements() * tensor.dtype.size


def pack_chunks(sizes, max_count, small_bytes):
  """Splits one packing group into packs, keeping the group's order.

  A pack takes values until it holds `max_count` of them, and beyond that
  for as long as it stays within `small_bytes`. Tiny values (the biases of a
  deep model) thus share one pack whatever their number: copying a few KB
  costs less than the concat, transfer, sum and split per device that
  another pack adds. Larger values come `max_count` to a pack, so that a
  pack is ready, and what waits for it runs, while the rest of the group is
  still being computed.

  Args:
    sizes: the size in bytes of each value of the group, in order.
    max_count: the most values of a pack beyond `small_bytes`; >= 1.
    small_bytes: a pack of at most this many bytes takes any number of
      values; 0 caps every pack at `max_count`.

  Returns:
    A list of packs, each a list of indices into `sizes`, in order.

  Raises:
    ValueError: if `max_count` is not an int >= 1 or `small_bytes` is
      negative.
  """
  if isinstance(max_count, bool) or not isinstance(max_count, int) or (
      max_count < 1):
    raise ValueError('max_count must be an int >= 1, got {!r}.'.format(
        max_count))
  if small_bytes < 0:
    raise ValueError('small_bytes must be >= 0 (0: at most max_count values '
                     'a pack), got {!r}.'.format(small_bytes))
  packs = []
  current = []
  current_bytes = 0
  for index, size in enumerate(sizes):
    if (current and len(current) >= max_count and
        current_bytes + size > small_bytes):
      packs.append(current)
      current, current_bytes = [], 0
    current.append(index)
    current_bytes += size
  if current:
    packs.append(current)
  return packs


def reduce_concatenated(per_value_tensors, sources, reduce_fn, destinations,
                        name='packed'):
  """Reduces values packed along dimension 0: the core of every small pack.

  Each source device concatenates its tensor of every value (one group of
  `concat_group_key`) with `tf.concat`, `reduce_fn` combines the
  concatenations into one tensor, and each destination splits it back
  (aliasing the buffer).

  Args:
    per_value_tensors: for each value, its tensors in the order of
      `sources`; one dtype, one static shape after dimension 0, dimension 0
      known.
    sources: the device each position's concatenation runs on.
    reduce_fn: takes the list of concatenations and returns one tensor,
      placed where it chooses.
    destinations: the devices the result is split on.
    name: the name of the concatenations (the splits are 'un' + name).

  Returns:
    For each destination, the list of the values' reduced tensors.
  """
  packs = []
  for position, source in enumerate(sources):
    with tf.device(source):
      packs.append(tf.concat(
          [tensors[position] for tensors in per_value_tensors], axis=0,
          name=name))
  reduced = reduce_fn(packs)
  sizes = [tensors[0].shape.as_list()[0] for tensors in per_value_tensors]
  pieces = []
  for destination in destinations:
    with tf.device(destination):
      pieces.append(tf.split(reduced, sizes, axis=0, name='un' + name))
  return pieces


def check_device_grads(device_grads):
  """Validates the `[[(grad, var), ...] per device]` structure."""
  if not isinstance(device_grads, (list, tuple)) or not device_grads:
    raise errors.InvalidArgumentError(
        'device_grads must be a non-empty list (one item per device) of '
        'lists of (grad, var) pairs, got {!r}.'.format(device_grads))
  count = len(device_grads[0])
  for grads in device_grads:
    if len(grads) != count:
      raise errors.InvalidArgumentError(
          'Every device must have the same number of (grad, var) pairs; got '
          '{} and {}. Pass the gradients of the same variables on every '
          'device.'.format(count, len(grads)))
  for grad, _ in device_grads[0]:
    if isinstance(grad, tf.IndexedSlices):
      raise errors.InvalidTypeError(
          'Packing needs dense gradients, got IndexedSlices {}; reduce sparse '
          'gradients without packing.'.format(grad.name))
    if not grad.shape.is_fully_defined():
      raise errors.InvalidArgumentError(
          'Packing needs fully defined shapes, got {} with shape {}; give '
          'the tensor a static shape or do not pack.'.format(
              grad.name, grad.shape))


def _num_elements(grad):
  return grad.shape.num_elements()


def concat_flat(grads):
  """The flattened `grads`, concatenated (one dtype)."""
  return tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)


def split_back(flat, shapes, sizes):
  """Inverts `concat_flat`: pieces of `sizes` elements, reshaped."""
  return [tf.reshape(t, shape)
          for t, shape in zip(tf.split(flat, sizes, axis=0), shapes)]


def _chunk_sizes(total, num_chunks):
  num_chunks = max(1, min(num_chunks, total))
  base, extra = divmod(total, num_chunks)
  return [base + 1] * extra + [base] * (num_chunks - extra)


class ConcatAndSplitPacker(object):
  """Concatenates all gradients of a device, then splits into `num_packs`.

  Gradients of different dtypes are packed separately (one concatenation
  per dtype, each split into at most `num_packs` packs).
  """

  def __init__(self, num_packs=1):
    """Builds the packer.

    Args:
      num_packs: a positive int, how many packs each dtype is split into.

    Raises:
      InvalidArgumentError: if `num_packs` is not a positive int.
    """
    if (not isinstance(num_packs, int) or isinstance(num_packs, bool) or
        num_packs < 1):
      raise errors.InvalidArgumentError(
          'num_packs must be a positive integer, got {!r}; use 1 to '
          'concatenate everything into one pack.'.format(num_packs))
    self.num_packs = num_packs

  def pack(self, device_grads):
    """Packs `device_grads`; returns `(packed_device_grads, pack_info)`.

    Raises:
      InvalidArgumentError: if devices hold different numbers of gradients,
        or a shape is not fully defined.
      InvalidTypeError: if a gradient is an `IndexedSlices`.
    """
    check_device_grads(device_grads)
    by_dtype = collections.OrderedDict()
    for position, (grad, _) in enumerate(device_grads[0]):
      by_dtype.setdefault(grad.dtype.base_dtype, []).append(position)
    plan = []
    for positions in by_dtype.values():
      grads = [device_grads[0][p][0] for p in positions]
      sizes = [_num_elements(g) for g in grads]
      plan.append((_Group(tuple(positions), tuple(g.shape for g in grads),
                          tuple(sizes)),
                   _chunk_sizes(sum(sizes), self.num_packs)))
    packed = []
    for grads in device_grads:
      device_packed = []
      with placed_with(grads[0][0]):
        for group, chunk_sizes in plan:
          flat = concat_flat([grads[p][0] for p in group.positions])
          device_packed.extend(
              (chunk, None) for chunk in tf.split(flat, chunk_sizes, axis=0))
      packed.append(device_packed)
    info = PackInfo([[v for _, v in grads] for grads in device_grads], plan)
    return packed, info

  def unpack(self, summed_device_grads, pack_info):
    """Inverts `pack`: `summed_device_grads` has the packed structure."""
    result = []
    for packs, device_vars in zip(summed_device_grads, pack_info.device_vars):
      grads = [None] * len(device_vars)
      offset = 0
      with placed_with(packs[0][0]):
        for group, chunk_sizes in pack_info.plan:
          chunks = [g for g, _ in packs[offset:offset + len(chunk_sizes)]]
          offset += len(chunk_sizes)
          flat = chunks[0] if len(chunks) == 1 else tf.concat(chunks, axis=0)
          for position, grad in zip(
              group.positions, split_back(flat, group.shapes, group.sizes)):
            grads[position] = grad
      result.append(list(zip(grads, device_vars)))
    return result


class AggregateSmallTensorPacker(object):
  """Concatenates runs of small gradients; large ones are left alone.

  Consecutive gradients of one dtype, each at most
  `agg_small_grads_max_bytes` bytes, are concatenated in groups of at most
  `agg_small_grads_max_group`.
  """

  def __init__(self, agg_small_grads_max_bytes=0, agg_small_grads_max_group=10):
    """Builds the packer.

    Args:
      agg_small_grads_max_bytes: a positive int, the largest size (bytes) of
        a gradient that is grouped.
      agg_small_grads_max_group: a positive int, the most gradients in a
        group.

    Raises:
      InvalidArgumentError: if either is not a positive int.
    """
    knobs = (('agg_small_grads_max_bytes', agg_small_grads_max_bytes),
             ('agg_small_grads_max_group', agg_small_grads_max_group))
    for name, value in knobs:
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise errors.InvalidArgumentError(
            '{} must be a positive integer, got {!r}.'.format(name, value))
    self.agg_small_grads_max_bytes = agg_small_grads_max_bytes
    self.agg_small_grads_max_group = agg_small_grads_max_group

  def _plan(self, grads):
    """A list of position tuples: one per packed tensor, in order."""
    plan, run = [], []
    for position, grad in enumerate(grads):
      small = (_num_elements(grad) * grad.dtype.size <=
               self.agg_small_grads_max_bytes)
      if run and (not small or len(run) == self.agg_small_grads_max_group or
                  grads[run[0]].dtype != grad.dtype):
        plan.append(tuple(run))
        run = []
      if small:
        run.append(position)
      else:
        plan.append((position,))
    if run:
      plan.append(tuple(run))
    return plan

  def pack(self, device_grads):
    """Packs `device_grads`; returns `(packed_device_grads, pack_info)`.

    Raises:
      InvalidArgumentError: if devices hold different numbers of gradients,
        or a shape is not fully defined.
      InvalidTypeError: if a gradient is an `IndexedSlices`.
    """
    check_device_grads(device_grads)
    first = [g for g, _ in device_grads[0]]
    plan = []
    for positions in self._plan(first):
      grads = [first[p] for p in positions]
      plan.append(_Group(positions, tuple(g.shape for g in grads),
                         tuple(_num_elements(g) for g in grads)))
    packed = []
    for grads in device_grads:
      device_packed = []
      with placed_with(grads[0][0]):
        for group in plan:
          if len(group.positions) == 1:
            position = group.positions[0]
            device_packed.append(grads[position])
          else:
            device_packed.append(
                (concat_flat([grads[p][0] for p in group.positions]), None))
      packed.append(device_packed)
    info = PackInfo([[v for _, v in grads] for grads in device_grads], plan)
    return packed, info

  def unpack(self, summed_device_grads, pack_info):
    """Inverts `pack`: `summed_device_grads` has the packed structure."""
    result = []
    for packs, device_vars in zip(summed_device_grads, pack_info.device_vars):
      grads = [None] * len(device_vars)
      with placed_with(packs[0][0]):
        for (packed, _), group in zip(packs, pack_info.plan):
          if len(group.positions) == 1:
            grads[group.positions[0]] = packed
          else:
            for position, grad in zip(
                group.positions,
                split_back(packed, group.shapes, group.sizes)):
              grads[position] = grad
      result.append(list(zip(grads, device_vars)))
    return result


def placed_with(tensor):
  """Colocates the ops created in the scope with `tensor`'s device.

  Uses the tensor's device as a device scope when it has one (so the new ops
  carry that device), else plain colocation.
  """
  if tensor.device:
    return tf.device(tensor.device)
  return tf.compat.v1.colocate_with(tensor)

"""Packers: regroup per-device gradients into fewer, larger tensors.

A packer works on `device_grads`, a list over devices of lists of
`(grad, var)` pairs (the same variables, in the same order, on every device).
`pack(device_grads)` returns the packed lists; the caller reduces the packed
tensors, then `unpack(reduced_device_grads)` returns the original structure.
As in contrib, the packer keeps its latest plan between the two calls, so a
reduction makes a packer of its own. Each packer is defined once: contrib's
two here, the bucket packer in `buckets`; `replicate.cross_tower_ops`
re-exports contrib's.

The ops a packer adds for a device are colocated with that device's first
gradient, so they run where the gradients are.
"""
import collections

import tensorflow as tf

from replicate import errors

# A pack plan's entry: which gradients, their shapes and sizes (elements),
# the sizes the concatenation is split into (None: not split) and the
# variable the pack is paired with.
_Group = collections.namedtuple(
    '_Group', ['positions', 'shapes', 'sizes', 'splits', 'var'])


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
  """The flattened `grads`, concatenated (one dtype).

  A vector is already flat: only the others are reshaped, all by one shape
  constant (a graph of many towers and buckets would otherwise hold a
  `Reshape` and a `Const` per gradient and device).
  """
  flat_shape = None
  pieces = []
  for grad in grads:
    if grad.shape.rank != 1:
      if flat_shape is None:
        flat_shape = tf.constant([-1], name='flat_shape')
      grad = tf.reshape(grad, flat_shape)
    pieces.append(grad)
  return tf.concat(pieces, axis=0)


def split_back(flat, shapes, sizes):
  """Inverts `concat_flat`: pieces of `sizes` elements, reshaped.

  Vectors come out of the split as they were; one shape constant serves
  every piece of one shape.
  """
  constants = {}
  pieces = []
  for piece, shape in zip(tf.split(flat, sizes, axis=0), shapes):
    shape = tf.TensorShape(shape)
    if shape.rank != 1:
      key = tuple(shape.as_list())
      if key not in constants:
        constants[key] = tf.constant(list(key), dtype=tf.int32,
                                     name='piece_shape')
      piece = tf.reshape(piece, constants[key])
    pieces.append(piece)
  return pieces


def contrib_split_sizes(total, num_packs):
  """contrib's pack sizes: `num_packs` equal packs, the last takes the rest.

  E.g. 10 elements in 3 packs: [3, 3, 4]. With fewer elements than packs
  the first packs are empty, as in contrib.
  """
  size = total // num_packs
  return [size] * (num_packs - 1) + [total - size * (num_packs - 1)]


class Packer(object):
  """`pack(device_grads)` regroups; `unpack(reduced)` inverts the latest pack.

  The interface of contrib's packers: `pack` keeps on the object the plan
  that `unpack` needs. A subclass says how the first device's gradients are
  grouped (`_plan`); every device is packed by that plan. A group of one
  gradient and no `splits` is passed through as it is; any other group is
  the flat concatenation of its gradients, split into `splits` if given.
  """

  def __init__(self):
    self._packed_from = None

  def _plan(self, grads):
    """The `_Group`s of the first device's gradients, in packed order."""
    raise NotImplementedError

  def pack(self, grouped_grads_and_vars):
    """Packs `[[(grad, var), ...] per device]`; returns the packed list.

    Args:
      grouped_grads_and_vars: one list of `(grad, var)` pairs per device,
        the same variables in the same order on every device.

    Raises:
      InvalidArgumentError: if devices hold different numbers of gradients,
        or a shape is not fully defined.
      InvalidTypeError: if a gradient is an `IndexedSlices`.
    """
    device_grads = grouped_grads_and_vars
    check_device_grads(device_grads)
    plan = self._plan([grad for grad, _ in device_grads[0]])
    packed = []
    for grads in device_grads:
      device_packed = []
      with placed_with(grads[0][0]):
        for group in plan:
          if len(group.positions) == 1 and group.splits is None:
            device_packed.append(grads[group.positions[0]])
            continue
          flat = concat_flat([grads[p][0] for p in group.positions])
          if group.splits is None:
            device_packed.append((flat, group.var))
          else:
            device_packed.extend(
                (chunk, group.var)
                for chunk in tf.split(flat, group.splits, axis=0))
      packed.append(device_packed)
    self._packed_from = ([[v for _, v in grads] for grads in device_grads],
                         plan)
    return packed

  def unpack(self, summed_device_grad_packs):
    """Inverts the latest `pack`: gives `[[(grad, var), ...] per device]`.

    Args:
      summed_device_grad_packs: the packed structure `pack` returned, each
        tensor replaced by its reduction.

    Raises:
      ContextError: if `pack` was not called first.
    """
    if self._packed_from is None:
      raise errors.ContextError(
          '{}.unpack was called before pack; call pack(device_grads) '
          'first.'.format(type(self).__name__))
    all_device_vars, plan = self._packed_from
    result = []
    for packs, device_vars in zip(summed_device_grad_packs, all_device_vars):
      grads = [None] * len(device_vars)
      packs = [grad for grad, _ in packs]
      with placed_with(packs[0]):
        offset = 0
        for group in plan:
          count = 1 if group.splits is None else len(group.splits)
          pieces = packs[offset:offset + count]
          offset += count
          if len(group.positions) == 1 and group.splits is None:
            grads[group.positions[0]] = pieces[0]
            continue
          flat = pieces[0] if count == 1 else tf.concat(pieces, axis=0)
          for position, grad in zip(
              group.positions, split_back(flat, group.shapes, group.sizes)):
            grads[position] = grad
      result.append(list(zip(grads, device_vars)))
    return result


def group(grads, positions, splits=None, var=None):
  """The `_Group` of `grads` at `positions` (see `Packer`)."""
  chosen = [grads[p] for p in positions]
  return _Group(tuple(positions), tuple(g.shape for g in chosen),
                tuple(_num_elements(g) for g in chosen), splits, var)


def _check_positive(name, value, fix):
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise errors.InvalidArgumentError(
        '{} must be a positive integer, got {!r}; {}.'.format(
            name, value, fix))


class ConcatAndSplitPacker(Packer):
  """contrib's packer: concatenate all gradients, split into `num_packs`.

  Each dtype is concatenated on its own (contrib needed one dtype) and split
  as contrib splits: `num_packs` equal packs, the last taking the rest.
  """

  def __init__(self, num_packs=1):
    """Builds the packer.

    Args:
      num_packs: a positive int, how many packs each dtype is split into.

    Raises:
      InvalidArgumentError: if `num_packs` is not a positive int (a
        ValueError, as in contrib).
    """
    super(ConcatAndSplitPacker, self).__init__()
    _check_positive('num_packs', num_packs,
                    'use 1 to concatenate everything into one pack')
    self.num_packs = num_packs

  def _plan(self, grads):
    by_dtype = collections.OrderedDict()
    for position, grad in enumerate(grads):
      by_dtype.setdefault(grad.dtype.base_dtype, []).append(position)
    plan = []
    for positions in by_dtype.values():
      total = sum(_num_elements(grads[p]) for p in positions)
      plan.append(group(grads, positions,
                        splits=contrib_split_sizes(total, self.num_packs)))
    return plan


# The variable contrib pairs with a pack of small gradients.
_PACK_VAR_PLACEHOLDER = 'packing_var_placeholder'


class AggregateSmallTensorPacker(Packer):
  """contrib's packer: concatenate runs of small float32 gradients.

  As in contrib: a gradient is small when it is float32 and at most
  `agg_small_grads_max_bytes`; runs of consecutive small gradients grow
  while the run spans at most `agg_small_grads_max_group` positions (so a
  run holds up to `agg_small_grads_max_group + 2` of them); each run of two
  or more becomes one pack, paired with 'packing_var_placeholder'. The packs
  come first, then every other gradient in its order.
  """

  def __init__(self, agg_small_grads_max_bytes=1048576,
               agg_small_grads_max_group=16):
    """Builds the packer.

    Args:
      agg_small_grads_max_bytes: a positive int, the largest gradient
        (bytes) that is grouped.
      agg_small_grads_max_group: a positive int, bounds a run's span.

    Raises:
      InvalidArgumentError: if either is not a positive int (a ValueError,
        as in contrib).
    """
    super(AggregateSmallTensorPacker, self).__init__()
    _check_positive('agg_small_grads_max_bytes', agg_small_grads_max_bytes,
                    'pass the largest gradient size (bytes) to group')
    _check_positive('agg_small_grads_max_group', agg_small_grads_max_group,
                    'pass the most gradients to group')
    self.agg_small_grads_max_bytes = agg_small_grads_max_bytes
    self.agg_small_grads_max_group = agg_small_grads_max_group

  def _plan(self, grads):
    small = [p for p, g in enumerate(grads)
             if g.dtype == tf.float32 and
             4 * _num_elements(g) <= self.agg_small_grads_max_bytes]
    runs = []
    for position in small:
      run = runs[-1] if runs else None
      if (run and position == run[-1] + 1 and
          run[-1] - run[0] <= self.agg_small_grads_max_group):
        run.append(position)
      else:
        runs.append([position])
    runs = [run for run in runs if len(run) > 1]
    packed = set(p for run in runs for p in run)
    plan = [group(grads, run, var=_PACK_VAR_PLACEHOLDER) for run in runs]
    plan.extend(group(grads, [p]) for p in range(len(grads))
                if p not in packed)
    return plan


def placed_with(tensor):
  """Colocates the ops created in the scope with `tensor`'s device.

  Uses the tensor's device as a device scope when it has one (so the new ops
  carry that device), else plain colocation.
  """
  if tensor.device:
    return tf.device(tensor.device)
  return tf.compat.v1.colocate_with(tensor)

"""All-reduce graph builders over per-device lists of tensors.

Each builder takes `input_tensors`, one tensor per device (same shape and
dtype, each placed on its device), and returns a list of the same length
whose i-th tensor holds the reduction of all inputs and is placed on the
device of `input_tensors[i]`. The builders decide nothing about placement
beyond what the algorithm is: devices come from the inputs (and, for the
shuffle algorithms, from the gather devices passed in).

`red_op` combines two tensors (default `tf.add`); `un_op`, when given, is
applied to each output (e.g. to divide by the number of devices).

Ring, recursive halving-doubling and shuffle split each tensor into chunks,
so they need fully defined static shapes.
"""
import collections

import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate.core import device_util


def _placed_on(tensor):
  """A scope placing new ops on `tensor`'s device (colocating if unset)."""
  if tensor.device:
    return tf.device(tensor.device)
  return tf.compat.v1.colocate_with(tensor)


def _check_inputs(input_tensors, needs_static_shape):
  if not input_tensors:
    raise errors.InvalidArgumentError(
        'An all-reduce needs at least one input tensor; got none.')
  first = input_tensors[0]
  for t in input_tensors[1:]:
    if t.dtype != first.dtype or not t.shape.is_compatible_with(first.shape):
      raise errors.InvalidArgumentError(
          'All-reduce inputs must share one shape and dtype; got {} {} and '
          '{} {}.'.format(first.shape, first.dtype.name, t.shape,
                          t.dtype.name))
  if needs_static_shape and not first.shape.is_fully_defined():
    raise errors.InvalidArgumentError(
        'This all-reduce splits tensors into chunks and needs a fully defined '
        'shape, got {}; give the tensors static shapes or use NCCL or '
        'reduction to one device.'.format(first.shape))


def _apply_un_op(outputs, un_op):
  if un_op is None:
    return outputs
  result = []
  for t in outputs:
    with _placed_on(t):
      result.append(un_op(t))
  return result


def _fold(tensors, red_op):
  total = tensors[0]
  for t in tensors[1:]:
    total = red_op(total, t)
  return total


def _split_into_chunks(tensor, num_chunks):
  """Flattens and zero-pads `tensor`, splits into `num_chunks` equal chunks."""
  size = tensor.shape.num_elements()
  padding = (-size) % num_chunks
  with _placed_on(tensor):
    flat = tf.reshape(tensor, [-1])
    if padding:
      flat = tf.concat([flat, tf.zeros([padding], dtype=tensor.dtype)], 0)
    return tf.split(flat, num_chunks, axis=0)


def _join_chunks(chunks, shape):
  """Inverse of `_split_into_chunks`, on the device of `chunks[0]`."""
  size = shape.num_elements()
  with _placed_on(chunks[0]):
    flat = chunks[0] if len(chunks) == 1 else tf.concat(chunks, axis=0)
    return tf.reshape(flat[:size], shape)


def tie_together(tensors):
  """Copies of `tensors`, each on its device, each waiting for all of them.

  The members of a collective (NCCL) all-reduce must all run, or the others
  wait forever. Tying the outputs together means that fetching any one of
  them runs every member.
  """
  result = []
  for t in tensors:
    with _placed_on(t), tf.control_dependencies(tensors):
      result.append(tf.identity(t))
  return result


def _copy(tensor, onto):
  """`tensor` copied onto the device of `onto`."""
  with _placed_on(onto):
    return tf.identity(tensor)


def build_ring_all_reduce(input_tensors, num_subchunks=1, red_op=tf.add,
                          un_op=None):
  """All-reduce around a ring, in the order of `input_tensors`.

  Each tensor is split into `n * num_subchunks` chunks (`n` devices). For
  each subchunk a reduce-scatter takes `n - 1` steps (device i passes a
  partial sum to device i + 1), then an all-gather takes `n - 1` more.

  Args:
    input_tensors: list of tensors, one per device, fully defined shapes.
    num_subchunks: a positive int, independent rings to run side by side.
    red_op: binary reduction.
    un_op: optional unary op applied to each output.

  Returns:
    The reduced tensors, one per input, on the inputs' devices.

  Raises:
    InvalidArgumentError: for no inputs, mismatched or undefined shapes, or
      `num_subchunks` < 1.
  """
  _check_inputs(input_tensors, needs_static_shape=True)
  if num_subchunks < 1:
    raise errors.InvalidArgumentError(
        'num_subchunks must be at least 1, got {}.'.format(num_subchunks))
  n = len(input_tensors)
  if n == 1:
    return _apply_un_op([_copy(input_tensors[0], input_tensors[0])], un_op)
  chunks = [_split_into_chunks(t, n * num_subchunks) for t in input_tensors]
  for sub in range(num_subchunks):
    base = sub * n
    # Reduce-scatter: at step s device i sends chunk (i - s) to device i + 1;
    # afterwards device i holds the full sum of chunk (i + 1) mod n.
    for step in range(n - 1):
      sent = [(i, (i - step) % n) for i in range(n)]
      received = []
      for i, j in sent:
        dst = (i + 1) % n
        with _placed_on(input_tensors[dst]):
          received.append((dst, j, red_op(chunks[dst][base + j],
                                          chunks[i][base + j])))
      for dst, j, value in received:
        chunks[dst][base + j] = value
    # All-gather: at step s device i passes its complete chunk (i + 1 - s).
    for step in range(n - 1):
      received = []
      for i in range(n):
        j = (i + 1 - step) % n
        dst = (i + 1) % n
        received.append((dst, j, _copy(chunks[i][base + j],
                                       input_tensors[dst])))
      for dst, j, value in received:
        chunks[dst][base + j] = value
  outputs = [_join_chunks(c, input_tensors[0].shape) for c in chunks]
  return _apply_un_op(outputs, un_op)


def build_recursive_hd_all_reduce(input_tensors, red_op=tf.add, un_op=None):
  """All-reduce by recursive halving (reduce-scatter) then doubling (gather).

  With `n` (a power of two) devices, each tensor is split into `n` chunks.
  In log2(n) halving steps, device i exchanges half of its current chunk
  range with device `i ^ span`; then log2(n) doubling steps gather the
  reduced chunks back.

  Args:
    input_tensors: list of tensors, one per device; their number must be a
      power of two; fully defined shapes.
    red_op: binary reduction.
    un_op: optional unary op applied to each output.

  Returns:
    The reduced tensors, one per input, on the inputs' devices.

  Raises:
    InvalidArgumentError: for no inputs, a count that is not a power of two,
      or mismatched or undefined shapes.
  """
  _check_inputs(input_tensors, needs_static_shape=True)
  n = len(input_tensors)
  if n & (n - 1):
    raise errors.InvalidArgumentError(
        'Recursive halving-doubling needs a power-of-two number of devices, '
        'got {}; use ring or shuffle all-reduce instead.'.format(n))
  if n == 1:
    return _apply_un_op([_copy(input_tensors[0], input_tensors[0])], un_op)
  chunks = [_split_into_chunks(t, n) for t in input_tensors]
  segments = [(0, n)] * n
  span = n // 2
  while span >= 1:
    new_segments, received = [], []
    for i in range(n):
      partner = i ^ span
      lo, hi = segments[i]
      mid = (lo + hi) // 2
      keep = (lo, mid) if not i & span else (mid, hi)
      with _placed_on(input_tensors[i]):
        for c in range(*keep):
          received.append((i, c, red_op(chunks[i][c], chunks[partner][c])))
      new_segments.append(keep)
    for i, c, value in received:
      chunks[i][c] = value
    segments = new_segments
    span //= 2
  span = 1
  while span < n:
    new_segments, received = [], []
    for i in range(n):
      partner = i ^ span
      for c in range(*segments[partner]):
        received.append((i, c, _copy(chunks[partner][c], input_tensors[i])))
      new_segments.append((min(segments[i][0], segments[partner][0]),
                           max(segments[i][1], segments[partner][1])))
    for i, c, value in received:
      chunks[i][c] = value
    segments = new_segments
    span *= 2
  outputs = [_join_chunks(c, input_tensors[0].shape) for c in chunks]
  return _apply_un_op(outputs, un_op)


def build_shuffle_all_reduce(input_tensors, gather_devices, red_op=tf.add,
                             un_op=None):
  """All-reduce through gather devices: chunk k is reduced on device k.

  Args:
    input_tensors: list of tensors, one per device; fully defined shapes.
    gather_devices: non-empty list of device strings; each tensor is split
      into one chunk per gather device.
    red_op: binary reduction.
    un_op: optional unary op applied to each output.

  Returns:
    The reduced tensors, one per input, on the inputs' devices.

  Raises:
    InvalidArgumentError: for no inputs or gather devices, or mismatched or
      undefined shapes.
  """
  _check_inputs(input_tensors, needs_static_shape=True)
  if not gather_devices:
    raise errors.InvalidArgumentError(
        'Shuffle all-reduce needs at least one gather device; got none.')
  reduced = _shuffle_reduce(input_tensors, gather_devices, red_op)
  outputs = []
  for t in input_tensors:
    outputs.append(_join_chunks([_copy(r, t) for r in reduced], t.shape))
  return _apply_un_op(outputs, un_op)


def _shuffle_reduce(input_tensors, gather_devices, red_op):
  """Chunk k of the reduction, on `gather_devices[k]`."""
  chunks = [_split_into_chunks(t, len(gather_devices)) for t in input_tensors]
  reduced = []
  for k, device in enumerate(gather_devices):
    with tf.device(device):
      reduced.append(_fold([c[k] for c in chunks], red_op))
  return reduced


def build_nccl_all_reduce(input_tensors, red_op=tf.add, un_op=None):
  """NCCL all-sum: one NCCL op per device (GPUs only).

  Args:
    input_tensors: list of tensors, one per GPU.
    red_op: must be `tf.add` (NCCL sums here).
    un_op: optional unary op applied to each output.

  Returns:
    The summed tensors, one per input, on the inputs' devices.

  Raises:
    InvalidArgumentError: for no inputs, mismatched shapes, or a `red_op`
      other than `tf.add`.
  """
  _check_inputs(input_tensors, needs_static_shape=False)
  if red_op not in (tf.add, tf.math.add):
    raise errors.InvalidArgumentError(
        'NCCL all-reduce only sums here (red_op must be tf.add), got {!r}; '
        'use ring or shuffle all-reduce for other reductions.'.format(red_op))
  return _apply_un_op(tie_together(_compat.nccl_all_sum(list(input_tensors))),
                      un_op)


def _by_worker(input_tensors):
  """Lists of input indices grouped by worker, in order of first appearance."""
  groups = collections.OrderedDict()
  for i, t in enumerate(input_tensors):
    groups.setdefault(device_util.worker_of(t.device), []).append(i)
  return list(groups.values())


def _build_nccl_hybrid(input_tensors, upper_level, un_op):
  """NCCL within each worker, `upper_level` across workers, copy back."""
  _check_inputs(input_tensors, needs_static_shape=False)
  groups = _by_worker(input_tensors)
  level_one = []
  for indices in groups:
    tensors = [input_tensors[i] for i in indices]
    level_one.append(_compat.nccl_all_sum(tensors) if len(tensors) > 1
                     else tensors)
  across = upper_level([summed[0] for summed in level_one])
  outputs = [None] * len(input_tensors)
  for indices, summed, total in zip(groups, level_one, across):
    for i in indices:
      # Every NCCL op of the worker must run, so each copy waits for all.
      with tf.control_dependencies(summed):
        outputs[i] = _copy(total, input_tensors[i])
  return _apply_un_op(outputs, un_op)


def build_nccl_then_ring(input_tensors, num_subchunks=1, red_op=tf.add,
                         un_op=None):
  """NCCL within each worker, ring across workers (one GPU each), copy back.

  Raises:
    InvalidArgumentError: as `build_ring_all_reduce`.
  """
  return _build_nccl_hybrid(
      input_tensors,
      lambda ts: build_ring_all_reduce(ts, num_subchunks, red_op), un_op)


def build_nccl_then_recursive_hd(input_tensors, red_op=tf.add, un_op=None):
  """NCCL within each worker, recursive halving-doubling across workers.

  Raises:
    InvalidArgumentError: as `build_recursive_hd_all_reduce`.
  """
  return _build_nccl_hybrid(
      input_tensors, lambda ts: build_recursive_hd_all_reduce(ts, red_op),
      un_op)


def build_nccl_then_shuffle(input_tensors, gather_devices, red_op=tf.add,
                            un_op=None):
  """NCCL within each worker, shuffle across workers via `gather_devices`.

  Raises:
    InvalidArgumentError: as `build_shuffle_all_reduce`.
  """
  return _build_nccl_hybrid(
      input_tensors,
      lambda ts: build_shuffle_all_reduce(ts, gather_devices, red_op), un_op)


def build_shuffle_then_shuffle(input_tensors, first_gather_devices,
                               second_gather_devices, red_op=tf.add,
                               un_op=None):
  """Two-level shuffle: within each worker, then across workers.

  Each worker reduces its tensors (as whole tensors) on its own gather
  device, the per-worker sums are shuffle-all-reduced through
  `second_gather_devices`, and each worker's result is copied to its
  devices.

  Args:
    input_tensors: list of tensors, one per device; fully defined shapes.
    first_gather_devices: one gather device per worker, in the order the
      workers first appear in `input_tensors`.
    second_gather_devices: gather devices of the across-worker shuffle.
    red_op: binary reduction.
    un_op: optional unary op applied to each output.

  Returns:
    The reduced tensors, one per input, on the inputs' devices.

  Raises:
    InvalidArgumentError: for no inputs, mismatched or undefined shapes, or
      a number of first gather devices different from the number of workers.
  """
  _check_inputs(input_tensors, needs_static_shape=True)
  groups = _by_worker(input_tensors)
  if len(first_gather_devices) != len(groups):
    raise errors.InvalidArgumentError(
        'build_shuffle_then_shuffle needs one first-level gather device per '
        'worker: {} workers, {} devices ({}).'.format(
            len(groups), len(first_gather_devices), first_gather_devices))
  per_worker = []
  for indices, device in zip(groups, first_gather_devices):
    with tf.device(device):
      per_worker.append(_fold([input_tensors[i] for i in indices], red_op))
  across = build_shuffle_all_reduce(per_worker, second_gather_devices, red_op)
  outputs = [None] * len(input_tensors)
  for indices, total in zip(groups, across):
    for i in indices:
      outputs[i] = _copy(total, input_tensors[i])
  return _apply_un_op(outputs, un_op)


def build_hierarchical_copy_all_reduce(input_tensors, red_op=tf.add,
                                       un_op=None, leader_offset=0):
  """Reduce within two halves of the devices, combine the halves, copy back.

  The devices are split into a first and a second half. Each half sums on
  its leader (the half's `leader_offset`-th device, modulo its size), the
  leaders combine on the leader of the half that holds device
  `leader_offset` (modulo the device count), and each half's leader copies
  the total to the devices of its half. Successive tensors thus spread
  every step over all devices, as TF's hierarchical copy does. This
  matches machines whose GPUs form two fully linked groups (DGX-1).

  Args:
    input_tensors: list of tensors, one per device.
    red_op: binary reduction.
    un_op: optional unary op applied to each output.
    leader_offset: which device of each half leads.

  Returns:
    The reduced tensors, one per input, on the inputs' devices.

  Raises:
    InvalidArgumentError: for no inputs or mismatched shapes.
  """
  _check_inputs(input_tensors, needs_static_shape=False)
  n = len(input_tensors)
  if n == 1:
    return _apply_un_op([_copy(input_tensors[0], input_tensors[0])], un_op)
  halves = [list(range(n // 2)), list(range(n // 2, n))]
  leaders = [half[leader_offset % len(half)] for half in halves]
  sums = []
  for half, leader in zip(halves, leaders):
    with _placed_on(input_tensors[leader]):
      sums.append(_fold([input_tensors[i] for i in half], red_op))
  first = 0 if leader_offset % n < n // 2 else 1
  with _placed_on(input_tensors[leaders[first]]):
    total = red_op(sums[first], sums[1 - first])
  totals = [None, None]
  totals[first] = total
  totals[1 - first] = _copy(total, input_tensors[leaders[1 - first]])
  outputs = [None] * n
  for half, half_total in zip(halves, totals):
    for i in half:
      outputs[i] = _copy(half_total, input_tensors[i])
  return _apply_un_op(outputs, un_op)

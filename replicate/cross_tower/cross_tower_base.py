"""The `CrossTowerOps` API, and reduction to one device.

`CrossTowerOps.reduce`, `batch_reduce` and `broadcast` validate their
arguments and hand canonical ones to the private `_reduce`, `_batch_reduce`
and `_broadcast` that subclasses implement. Reduction to one device lives
here too because every other implementation falls back to it (for sparse
values, or destinations its fast path cannot serve).
"""
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import reduce_util
from replicate.core import tuning as tuning_lib
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import packed_reduction
from replicate.cross_tower import values as values_lib


def tensors_on_devices(per_device_value):
  """The values of a `DistributedValues`, each as a tensor or IndexedSlices.

  Non-tensor values (Python or NumPy numbers) are converted on their device.
  If any value is an `IndexedSlices`, dense ones are turned into
  `IndexedSlices` too (whole rows, never the other way round).

  Args:
    per_device_value: a `DistributedValues`.

  Returns:
    A list of tensors or `IndexedSlices`, in the order of its devices.

  Raises:
    InvalidTypeError: if the values do not all have one dtype.
  """
  result = []
  for device, value in zip(per_device_value.devices, per_device_value.values):
    if not isinstance(value, (tf.Tensor, tf.IndexedSlices)):
      with tf.device(device):
        value = tf.convert_to_tensor(value)
    result.append(value)
  dtypes = set(v.dtype.base_dtype for v in result)
  if len(dtypes) > 1:
    raise errors.InvalidTypeError(
        'The values to reduce have different dtypes ({}) on devices {}; cast '
        'them to one dtype first.'.format(
            ', '.join(sorted(d.name for d in dtypes)),
            ', '.join(per_device_value.devices)))
  if any(isinstance(v, tf.IndexedSlices) for v in result):
    result = [_as_indexed_slices(v, d)
              for v, d in zip(result, per_device_value.devices)]
    result = check_dense_shapes(result, per_device_value.devices)
  return result


def check_dense_shapes(slices, devices):
  """Checks that `IndexedSlices` on several devices have one `dense_shape`.

  Slices of different dense shapes (gradients of different variables, or a
  bug upstream) cannot be reduced into one: the result would silently carry
  the first device's `dense_shape`. Every `CrossTowerOps` checks its values
  with this before reducing them.

  * Where every `dense_shape` is known when the graph is built (constant, or
    the static shape of a dense value), a mismatch raises
    `replicate.errors.InvalidArgumentError` at once.
  * Where some `dense_shape` is only known at run time, each device's values
    get a control dependency on a `tf.debugging.assert_equal` against the
    first device's `dense_shape`: running the reduction then fails with TF's
    `tf.errors.InvalidArgumentError` naming both devices. (No assertion is
    added where the shapes are known, so static graphs pay nothing.)
  * Slices without a `dense_shape` (None) are not checked.

  Args:
    slices: `IndexedSlices`, one per device, in the order of `devices`.
    devices: the devices, for the messages.

  Returns:
    `slices`, or, with a run-time check, new `IndexedSlices` whose values
    depend on it.

  Raises:
    InvalidArgumentError: if two known dense shapes differ.
  """
  known = [(i, s.dense_shape) for i, s in enumerate(slices)
           if s.dense_shape is not None]
  if len(known) < 2:
    return slices
  static = [(i, tf.get_static_value(shape)) for i, shape in known]
  static = [(i, list(value)) for i, value in static if value is not None]
  for i, value in static[1:]:
    if value != static[0][1]:
      raise errors.InvalidArgumentError(
          'The IndexedSlices to reduce have different dense_shape: {} on {} '
          'but {} on {}. Values reduced together must stand for one variable '
          '(one dense shape) on every device.'.format(
              static[0][1], devices[static[0][0]], value, devices[i]))
  if len(static) == len(known):
    return slices
  result = list(slices)
  first_index, first_shape = known[0]
  for i, shape in known[1:]:
    with tf.device(devices[i]):
      # Compared as strings, so that shapes of different ranks fail the
      # assertion too (an element-wise comparison would not broadcast).
      this, that = _shape_string(shape), _shape_string(first_shape)
      message = tf.strings.join([
          'The IndexedSlices to reduce have different dense_shape: [', this,
          '] on {} but ['.format(devices[i]), that,
          '] on {}; values reduced together must stand for one variable '
          '(one dense shape) on every device.'.format(devices[first_index])
      ])
      check = tf1.debugging.Assert(tf.equal(this, that), [message])
      with tf.control_dependencies([check]):
        result[i] = tf.IndexedSlices(tf.identity(slices[i].values),
                                     slices[i].indices, shape)
  return result


def _shape_string(shape):
  return tf.strings.reduce_join(tf.as_string(tf.cast(shape, tf.int64)),
                                separator=', ')


def _as_indexed_slices(value, device):
  if isinstance(value, tf.IndexedSlices):
    return value
  with tf.device(device):
    rows = tf.shape(value, out_type=tf.int64)[0]
    return tf.IndexedSlices(value, tf.range(rows),
                            tf.shape(value, out_type=tf.int64))


def is_sparse(per_device_value):
  """Whether any value of a `DistributedValues` is an `IndexedSlices`."""
  return any(isinstance(v, tf.IndexedSlices) for v in per_device_value.values)


def _check_mean_dtype(reduce_op, dtype):
  if reduce_op == ReduceOp.MEAN and not (dtype.is_floating or dtype.is_complex):
    raise errors.InvalidTypeError(
        'Cannot take the MEAN of {} values: the division would not be exact; '
        'cast them to a floating dtype or reduce with SUM.'.format(dtype.name))


def _checked_value(reduce_op, value):
  """`value` as a `PerDevice` of tensors or IndexedSlices, validated."""
  value = values_lib.as_per_device(value)
  tensors = tensors_on_devices(value)
  _check_mean_dtype(reduce_op, tensors[0].dtype)
  return values_lib.PerDevice(dict(zip(value.devices, tensors)))


def _destinations_of(destinations, per_device_value):
  """The devices `destinations` names; None: `per_device_value`'s."""
  if destinations is None:
    return tuple(per_device_value.devices)
  return values_lib.get_devices_from(destinations)


def divide_by(value, count):
  """`value / count` in the dtype of `value` (tensor or IndexedSlices)."""
  if count == 1:
    return value
  if isinstance(value, tf.IndexedSlices):
    return tf.IndexedSlices(divide_by(value.values, count), value.indices,
                            value.dense_shape)
  return value / tf.constant(count, dtype=value.dtype)


def reduce_on_device(tensors, reduce_op, device, accumulation_fn=tf.math.add_n):
  """Reduces `tensors` on `device`: sums (or concatenates slices), then means.

  Args:
    tensors: a non-empty list of tensors, or of `IndexedSlices`, one dtype.
    reduce_op: a `ReduceOp`.
    device: where the reduction runs.
    accumulation_fn: sums a list of dense tensors.

  Returns:
    One tensor or `IndexedSlices` on `device`. Slices are concatenated, never
    densified: repeated indices stay repeated, and mean their sum.
  """
  with tf.device(device):
    if isinstance(tensors[0], tf.IndexedSlices):
      if len(tensors) == 1:
        reduced = tensors[0]
      else:
        reduced = tf.IndexedSlices(
            tf.concat([t.values for t in tensors], axis=0),
            tf.concat([tf.cast(t.indices, tf.int64) for t in tensors], axis=0),
            tensors[0].dense_shape)
    elif len(tensors) == 1:
      reduced = tensors[0]
    else:
      reduced = accumulation_fn(tensors)
    if reduce_op == ReduceOp.MEAN:
      reduced = divide_by(reduced, len(tensors))
    return reduced


def copy_to_device(value, device):
  """A copy of `value` (tensor or IndexedSlices) placed on `device`."""
  with tf.device(device):
    if isinstance(value, tf.IndexedSlices):
      dense_shape = value.dense_shape
      if dense_shape is not None:
        dense_shape = tf.identity(dense_shape)
      return tf.IndexedSlices(tf.identity(value.values),
                              tf.identity(value.indices), dense_shape)
    return tf.identity(value)


def mirror(value, destinations):
  """`Mirrored` with a copy of `value` on each of `destinations`."""
  return values_lib.Mirrored(
      {d: copy_to_device(value, d) for d in destinations})


class CrossTowerOps(object):
  """Base class of the ways values on several devices are combined.

  Subclasses implement `_reduce` (and may implement `_batch_reduce` and
  `_broadcast`); they receive a `ReduceOp`, `PerDevice` values whose values
  are all tensors or all `IndexedSlices` of one dtype, and tuples of
  canonical destination devices. The `Tuning` an object packs and buckets
  with is fixed when it is made (`tuning`).
  """

  def __init__(self, tuning=None):
    """Builds the object.

    Args:
      tuning: the `replicate.Tuning` its packs and buckets are sized by;
        None: the calling thread's current one (`replicate.get_tuning()`).

    Raises:
      InvalidTypeError: if `tuning` is neither None nor a `Tuning`.
    """
    self._tuning = tuning_lib.resolve(tuning)

  @property
  def tuning(self):
    """The `replicate.Tuning` this object sizes its packs and buckets by."""
    # A subclass that does not call this __init__ takes the current one.
    return getattr(self, '_tuning', None) or tuning_lib.get_tuning()

  def reduce(self, aggregation, per_device_value, destinations=None):
    """Reduces `per_device_value` and places the result on `destinations`.

    Args:
      aggregation: `replicate.ReduceOp.SUM` / `MEAN` or
        `tf.VariableAggregation.SUM` / `MEAN`. MEAN divides by the number of
        values.
      per_device_value: a `PerDevice` (or `Mirrored`) of tensors or
        `IndexedSlices`; a single tensor with its device set stands for a
        one-device `PerDevice`.
      destinations: a device string, a list of them, a `DistributedValues`
        or a variable or tensor placed on a device; None (contrib's
        default): the devices of `per_device_value`.

    Returns:
      A `Mirrored` with the reduced value on each destination device.

    Raises:
      InvalidArgumentError: for another aggregation, or empty
        destinations, or a single tensor without a device.
      InvalidTypeError: for values of other types, of several dtypes, or a
        MEAN of integers.
    """
    reduce_op = reduce_util.as_reduce_op(aggregation)
    per_device_value = _checked_value(reduce_op, per_device_value)
    return self._reduce(reduce_op, per_device_value,
                        _destinations_of(destinations, per_device_value))

  def batch_reduce(self, aggregation, value_destination_pairs):
    """Reduces several values at once, each to its own destinations.

    Implementations may fuse the reductions (packing, one all-reduce).

    Args:
      aggregation: as in `reduce`.
      value_destination_pairs: a non-empty list of `(per_device_value,
        destinations)` pairs, each as in `reduce` (None destinations: the
        value's devices).

    Returns:
      A list of `Mirrored`, one per pair, in order.

    Raises:
      InvalidArgumentError: for an empty list, or any bad pair (see `reduce`).
      InvalidTypeError: if `value_destination_pairs` is not a list of pairs,
        or for bad values (see `reduce`).
    """
    reduce_op = reduce_util.as_reduce_op(aggregation)
    if not isinstance(value_destination_pairs, (list, tuple)):
      raise errors.InvalidArgumentTypeError(
          'value_destination_pairs must be a list of (per_device_value, '
          'destinations) pairs, got {!r} of type {}.'.format(
              value_destination_pairs, type(value_destination_pairs).__name__))
    if not value_destination_pairs:
      raise errors.InvalidArgumentError(
          'value_destination_pairs is empty; pass at least one '
          '(per_device_value, destinations) pair.')
    pairs = []
    for pair in value_destination_pairs:
      if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise errors.InvalidArgumentTypeError(
            'Each item of value_destination_pairs must be a '
            '(per_device_value, destinations) pair, got {!r}.'.format(pair))
      value = _checked_value(reduce_op, pair[0])
      pairs.append((value, _destinations_of(pair[1], value)))
    return self._batch_reduce(reduce_op, pairs)

  def broadcast(self, tensor, destinations):
    """Copies `tensor` onto each of `destinations`.

    Args:
      tensor: a tensor, `IndexedSlices`, variable, or anything
        `tf.convert_to_tensor` accepts.
      destinations: as in `reduce`.

    Returns:
      A `Mirrored` with a copy on each destination device.

    Raises:
      InvalidArgumentError: for empty/None destinations.
      InvalidTypeError: if `tensor` cannot be converted to a tensor.
    """
    destinations = values_lib.get_devices_from(destinations)
    if not isinstance(tensor, (tf.Tensor, tf.IndexedSlices)):
      try:
        tensor = tf.convert_to_tensor(tensor)
      except (TypeError, ValueError) as e:
        raise errors.InvalidTypeError(
            'broadcast needs a tensor (or a value convertible to one), got '
            '{!r} of type {} ({}).'.format(tensor, type(tensor).__name__, e))
    return self._broadcast(tensor, destinations)

  def _reduce(self, reduce_op, per_device_value, destinations):
    raise NotImplementedError('_reduce must be implemented by subclasses.')

  def _batch_reduce(self, reduce_op, value_destination_pairs):
    return [self._reduce(reduce_op, value, destinations)
            for value, destinations in value_destination_pairs]

  def _broadcast(self, tensor, destinations):
    return mirror(tensor, destinations)


class ReductionToOneDeviceCrossTowerOps(CrossTowerOps):
  """Reduces every value on one device, then copies it to the destinations.

  Works for any devices and for `IndexedSlices` (which are concatenated, not
  densified). `batch_reduce` reduces small dense values of one dtype and
  shape after dimension 0 in packs (packed_reduction.py): one concatenation
  per device, one sum and one split per destination for up to 16 values (any
  number of tiny ones), with the same results as reducing them one by one.
  """

  def __init__(self, reduce_to_device=None, accumulation_fn=None,
               tuning=None):
    """Builds the object.

    Args:
      reduce_to_device: the device the reduction runs on; None means the
        first destination device of each reduction.
      accumulation_fn: sums a list of dense tensors; default `tf.add_n`.
      tuning: as for `CrossTowerOps`.

    Raises:
      InvalidTypeError: if `accumulation_fn` is not callable, `tuning` is
        not a `Tuning`, or `reduce_to_device` is not a device string.
      InvalidArgumentError: if `reduce_to_device` cannot be parsed.
    """
    super(ReductionToOneDeviceCrossTowerOps, self).__init__(tuning=tuning)
    if accumulation_fn is None:
      accumulation_fn = tf.math.add_n
    if not callable(accumulation_fn):
      raise errors.InvalidTypeError(
          'accumulation_fn must be callable (like tf.add_n), got {!r}.'.format(
              accumulation_fn))
    self._reduce_to_device = (
        None if reduce_to_device is None
        else device_util.canonicalize(reduce_to_device))
    self._accumulation_fn = accumulation_fn

  @property
  def reduce_to_device(self):
    """The canonical device reductions run on, or None (first destination)."""
    return self._reduce_to_device

  def _reduce(self, reduce_op, per_device_value, destinations):
    device = self._reduce_to_device or destinations[0]
    reduced = reduce_on_device(list(per_device_value.values), reduce_op,
                               device, self._accumulation_fn)
    return mirror(reduced, destinations)

  def _batch_reduce(self, reduce_op, value_destination_pairs):
    # Small dense values go in packs (packed_reduction.py): bit-identical
    # results from far fewer ops and transfers; the rest one by one.
    packed = packed_reduction.batch_reduce_packed(
        value_destination_pairs,
        lambda tensors, device: reduce_on_device(
            tensors, reduce_op, device, self._accumulation_fn),
        self._reduce_to_device, self.tuning)
    return [
        result if result is not None else self._reduce(reduce_op, value,
                                                       destinations)
        for result, (value, destinations) in zip(packed,
                                                 value_destination_pairs)
    ]

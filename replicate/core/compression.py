"""Gradient compression for cross-device reductions (Horovod's semantics).

A compressor is a stateless pair: `compress(value) -> (compressed, context)`
on the sending device, `decompress(reduced, context) -> value` after the
reduction. Nothing is kept between the two calls. `Compression.fp16` sends
floating-point values wider than 16 bits as float16 (half the bytes) and sums
them in float16; `Compression.none` (the default) leaves them as they are.
"""
import tensorflow as tf


class Compressor(object):
  """The interface: a stateless compress/decompress pair."""

  @staticmethod
  def compress(value):
    """Returns `(compressed value, context for decompress)`."""
    raise NotImplementedError

  @staticmethod
  def decompress(value, context):
    """Returns the value `compress` was given, from the reduced `value`."""
    raise NotImplementedError


class NoneCompressor(Compressor):
  """Sends values as they are."""

  @staticmethod
  def compress(value):
    return value, None

  @staticmethod
  def decompress(value, context):
    del context  # Nothing was changed.
    return value


class FP16Compressor(Compressor):
  """Sends float32/float64 values as float16, cast back after the reduction.

  The cast runs next to the value (its device), so what crosses devices is
  half as large. Integer, float16 and bfloat16 values pass unchanged.
  `IndexedSlices` keep their indices; their values are cast. Values beyond
  float16's range (about 65504) become infinite, as in Horovod.
  """

  @staticmethod
  def compress(value):
    dtype = _values_of(value).dtype
    if not dtype.is_floating or dtype.size <= 2:
      return value, None
    return _map_values(value, lambda v: tf.cast(v, tf.float16)), dtype

  @staticmethod
  def decompress(value, context):
    if context is None:
      return value
    return _map_values(value, lambda v: tf.cast(v, context))


class Compression(object):
  """The compressors, by name: `Compression.none`, `Compression.fp16`."""
  none = NoneCompressor
  fp16 = FP16Compressor


def is_compressor(value):
  """Whether `value` is a compressor class or object."""
  return (isinstance(value, Compressor) or
          (isinstance(value, type) and issubclass(value, Compressor)))


def _values_of(value):
  return value.values if isinstance(value, tf.IndexedSlices) else value


def _map_values(value, fn):
  """`fn` applied to a tensor, or to an `IndexedSlices`' values, in place."""
  with tf.device(_values_of(value).device):
    if isinstance(value, tf.IndexedSlices):
      return tf.IndexedSlices(fn(value.values), value.indices,
                              value.dense_shape)
    return fn(value)

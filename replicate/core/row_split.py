"""Splitting a batch's rows among N devices, in order, as evenly as it can.

A batch of `b` rows goes to `N` shards: the first `b % N` get `b // N + 1`
rows, the others `b // N` (some get none when `b < N`); no row is dropped.
A batch whose static size divides by `N` keeps `tf.split(value, N)`. Any
other batch is split by row counts computed at run time; a static batch size
is first hidden behind a `placeholder_with_default`, so that no shard's
shape carries a row count (a copy of shard 0's graph must bake in nothing of
shard 0's). Both `replicate_model_fn`'s towers and the strategies' dataset
input split this way.
"""
import tensorflow as tf

from replicate._compat import tf1


def batch_rows(value):
  """`(int64 scalar, static int or None)`: the size of `value`'s dimension 0.

  Args:
    value: a `Tensor` or `SparseTensor` of rank >= 1.
  """
  if isinstance(value, tf1.SparseTensor):
    static_shape = tf.get_static_value(value.dense_shape)
    return (value.dense_shape[0],
            None if static_shape is None else int(static_shape[0]))
  static = (tf.compat.dimension_value(value.shape[0])
            if value.shape.ndims is not None else None)
  return tf.shape(value, out_type=tf.int64)[0], static


def splits_evenly(static_rows, num_shards):
  """Whether a batch of `static_rows` (None: unknown) keeps `tf.split`."""
  return static_rows is not None and static_rows % num_shards == 0


def shard_rows(batch_size, num_shards, static_rows=None):
  """The rows of each shard: the first `b % N` get one more than `b // N`.

  Args:
    batch_size: the int64 scalar `b`.
    num_shards: `N`, a Python int.
    static_rows: `b` where it is known statically: it is then hidden from
      shape inference (see the module docstring).

  Returns:
    `(sizes, batch_size)`: an int64 vector of `N` row counts, and the int64
    scalar they sum to (the hidden one where `static_rows` was given).
  """
  if static_rows is not None:
    batch_size = tf1.placeholder_with_default(batch_size, [],
                                              name='batch_size')
  n = tf.cast(num_shards, tf.int64)
  extra = tf.cast(tf.range(num_shards, dtype=tf.int64) <
                  tf.math.floormod(batch_size, n), tf.int64)
  sizes = tf.math.add(tf.math.floordiv(batch_size, n), extra,
                      name='shard_sizes')
  return sizes, batch_size


def split_rows(value, num_shards, sizes=None):
  """`value` split along dimension 0 into `num_shards` shards, in order.

  Args:
    value: a `Tensor` or `SparseTensor`.
    num_shards: `N`, a Python int.
    sizes: None for `N` equal shards (`tf.split`); else the int64 vector of
      `shard_rows`.

  Returns:
    A list of `N` values of `value`'s type.
  """
  if isinstance(value, tf1.SparseTensor):
    if sizes is None:
      # Rows go to shards in order, as dense tensors are split.
      return tf1.sparse.split(sp_input=value, num_split=num_shards, axis=0)
    starts = tf.math.cumsum(sizes, exclusive=True)
    rest = value.dense_shape[1:]
    return [tf1.sparse.slice(
        value, tf.concat([starts[i:i + 1], tf.zeros_like(rest)], 0),
        tf.concat([sizes[i:i + 1], rest], 0)) for i in range(num_shards)]
  if sizes is None:
    return tf.split(value, num_shards, axis=0)
  return tf.split(value, sizes, num=num_shards, axis=0)

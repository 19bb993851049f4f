"""Splitting a strategy's global batches among its replicas.

Every component of a dataset element is split along dimension 0 by the same
row counts, replica i taking the i-th slice: a batch of `b` rows on `N`
replicas gives the first `b % N` replicas `b // N + 1` rows and the others
`b // N`, as `replicate_model_fn` splits a batch among towers
(`replicate.core.row_split`). Nothing is dropped: a final partial batch
leaves some replicas with fewer rows, or none.
"""
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import row_split


def split_batch(tensors, num):
  """Splits each of `tensors` along dimension 0 into `num` shards of rows.

  The rows are shared out as `replicate.core.row_split` shares them; all
  tensors are split by the same row counts, those of the first.

  Args:
    tensors: a list of `Tensor`s / `SparseTensor`s, one batch's components.
    num: the number of replicas.

  Returns:
    One list of `num` pieces per tensor.

  Raises:
    InvalidArgumentError: if a tensor is a scalar, or its static batch size
      differs from the first tensor's (a size known only at run time is
      checked by an assertion that fails the step).
  """
  for tensor in tensors:
    if tensor.shape.ndims == 0:
      raise errors.InvalidArgumentError(
          'Cannot split the scalar input {} among {} replicas; the dataset '
          'must yield batches (dimension 0 is the batch).'.format(
              _name(tensor), num))
  if not tensors:
    return []
  with tf1.name_scope('split_batch'):
    first = tensors[0]
    batch_size, static = row_split.batch_rows(first)
    tensors = [first] + [_with_rows(tensor, first, batch_size, static)
                         for tensor in tensors[1:]]
    sizes = None
    if not row_split.splits_evenly(static, num):
      sizes, _ = row_split.shard_rows(batch_size, num, static)
    return [row_split.split_rows(tensor, num, sizes) for tensor in tensors]


def _name(tensor):
  if isinstance(tensor, tf1.SparseTensor):
    return 'SparseTensor({})'.format(tensor.indices.name)
  return tensor.name


def _mismatch(tensor, rows, first, first_rows):
  return (
      'Input {} has {} rows in dimension 0 but input {} (the first) has {}: '
      'every input is split along dimension 0 among the replicas by the '
      'same row counts, so all components of a dataset element must share '
      'their batch dimension. Batch them together (batch a dataset of '
      'tuples or dicts).'.format(_name(tensor), rows, _name(first),
                                 first_rows))


def _with_rows(tensor, first, batch_size, static):
  """`tensor`, checked to have `batch_size` rows like `first`.

  Raises:
    InvalidArgumentError: where both sizes are static and differ.
  """
  size, tensor_static = row_split.batch_rows(tensor)
  if tensor_static is not None and static is not None:
    if tensor_static != static:
      raise errors.InvalidArgumentError(
          _mismatch(tensor, tensor_static, first, static))
    return tensor
  check = tf1.assert_equal(
      size, batch_size, data=['Rows:', size, 'first input:', batch_size],
      message=_mismatch(tensor, _known(tensor_static), first, _known(static)))
  with tf.control_dependencies([check]):
    return identity(tensor)


def _known(rows):
  return '(known at run time)' if rows is None else rows


def identity(value):
  """`value` (a `Tensor` or `SparseTensor`) through `tf.identity`."""
  if isinstance(value, tf1.SparseTensor):
    return tf1.SparseTensor(tf.identity(value.indices),
                            tf.identity(value.values),
                            tf.identity(value.dense_shape))
  return tf.identity(value)

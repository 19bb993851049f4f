"""Splitting a global batch of features and labels into one shard per tower.

A batch of `b` rows goes to `N` towers in order, as evenly as it can: the
first `b % N` towers get `b // N + 1` rows, the others `b // N` (some get none
when `b < N`). Where the static shape already divides, the split is today's
`tf.split(value, N)` and the loss is averaged over the towers; otherwise the
rows are counted at run time, every tower reads a batch dimension of unknown
size (so that a copy of tower 0 bakes in no row count of tower 0's), and the
towers' losses are weighted by their rows (tower_context.py).

Scalars cannot be split: they go whole to every tower, as do the features
named in `replicate_model_fn(..., unsplit_features=[...])`.
"""
import collections

import tensorflow as tf

from replicate import errors
from replicate._compat import tf1

# feature_shards, label_shards: one nest per tower.
# rows: None where every tower gets `b / N` rows of a static batch (the loss
# is averaged over towers); else one int64 scalar per tower, its row count.
# batch_size: None with `rows` None; else the int64 scalar `b`.
BatchSplit = collections.namedtuple(
    'BatchSplit', ['feature_shards', 'label_shards', 'rows', 'batch_size'])


def check_unsplit_features(unsplit_features):
  """Validates `replicate_model_fn`'s `unsplit_features` argument.

  Returns:
    The names, as a tuple.

  Raises:
    InvalidTypeError: unless it is a list or tuple of strings.
  """
  if unsplit_features is None:
    return ()
  if isinstance(unsplit_features, str) or not isinstance(
      unsplit_features, (list, tuple)) or not all(
          isinstance(name, str) for name in unsplit_features):
    raise errors.InvalidTypeError(
        'unsplit_features must be a list of feature names (strings), got {!r}; '
        "e.g. unsplit_features=['vocab'].".format(unsplit_features))
  return tuple(unsplit_features)


def check_unsplit_names(features, unsplit_features):
  """Raises unless every name in `unsplit_features` is a key of `features`.

  Raises:
    InvalidArgumentError: naming the missing feature and the features there
      are.
  """
  for name in unsplit_features:
    if not isinstance(features, dict) or name not in features:
      keys = sorted(features) if isinstance(features, dict) else None
      raise errors.InvalidArgumentError(
          'unsplit_features names {!r}, but the features have no such key '
          '(features: {}). Name features of the dict the input_fn returns, '
          'or drop {!r} from unsplit_features.'.format(
              name, keys if keys is not None else
              'a {}, not a dict'.format(type(features).__name__), name))


def split_batch(features, labels, num_shards, device, unsplit_features=()):
  """Splits features and labels along dimension 0 into `num_shards` shards.

  Args:
    features: a `Tensor`, `SparseTensor`, or a nest (e.g. a dict) of them.
    labels: `None`, or a `Tensor`/`SparseTensor` or a nest of them.
    num_shards: number of towers.
    device: where the split ops run.
    unsplit_features: keys of `features` given whole to every tower.

  Returns:
    A `BatchSplit`: lists of `num_shards` nests shaped like the inputs
    (`label_shards` a list of `None` when `labels` is `None`), and the rows
    of each shard where they are not all `b / N` of a static batch.

  Raises:
    InvalidArgumentError: if a value to split has a dimension 0 that differs
      from the batch's (the first value split). A size known only at run time
      is checked by an assertion that fails the step with the same
      explanation. Or if `unsplit_features` names a missing feature.
    InvalidTypeError: if a value is neither a `Tensor` nor a `SparseTensor`.
  """
  check_unsplit_names(features, unsplit_features)
  with tf1.name_scope('split_inputs'), tf1.device(device):
    leaves = _leaves(features, 'features', unsplit_features)
    if labels is not None:
      leaves += _leaves(labels, 'labels', ())
    split = [leaf for leaf in leaves if leaf.split]
    if not split:
      sizes = rows = batch_size = None
    else:
      batch_size, static_size = _batch_size(split[0].value)
      for leaf in split[1:]:
        _check_batch_dimension(leaf, split[0], batch_size, static_size,
                               unsplit_features)
      if static_size is not None and static_size % num_shards == 0:
        sizes = rows = batch_size = None  # today's even split
      else:
        if static_size is not None:
          # The static count would reach the towers' shapes through shape
          # inference; a copy of tower 0 must not bake in tower 0's rows.
          batch_size = tf1.placeholder_with_default(batch_size, [],
                                                    name='batch_size')
        sizes = _shard_sizes(batch_size, num_shards)
        rows = [sizes[i] for i in range(num_shards)]
    for leaf in leaves:
      leaf.shards = (_split_value(leaf.value, num_shards, sizes)
                     if leaf.split else [leaf.value] * num_shards)
    feature_shards = _shards(features, leaves, num_shards, 0)
    label_shards = ([None] * num_shards if labels is None else _shards(
        labels, leaves, num_shards, len(tf.nest.flatten(features))))
  return BatchSplit(feature_shards, label_shards, rows, batch_size)


class _Leaf(object):
  """One value of the inputs: its name, and whether it is split."""

  def __init__(self, value, name, split):
    self.value = value
    self.name = name
    self.split = split
    self.shards = None


def _leaves(nest, what, unsplit_features):
  flat = tf.nest.flatten(nest)
  names = _leaf_names(nest, what)
  unsplit_names = set()
  if isinstance(nest, dict):
    for key in unsplit_features:
      unsplit_names.update(_leaf_names(nest[key], '{}[{!r}]'.format(what, key)))
  leaves = []
  for value, name in zip(flat, names):
    value = _converted(value, name)
    leaves.append(_Leaf(value, name, name not in unsplit_names and
                        _rank(value) != 0))
  return leaves


def _shards(nest, leaves, num_shards, start):
  flat = leaves[start:start + len(tf.nest.flatten(nest))]
  return [tf.nest.pack_sequence_as(nest, [leaf.shards[i] for leaf in flat])
          for i in range(num_shards)]


def _leaf_names(nest, what):
  """Human-readable names of a nest's leaves, in `tf.nest.flatten` order."""
  if isinstance(nest, dict):
    names = []
    for key in sorted(nest):
      names.extend(_leaf_names(nest[key], '{}[{!r}]'.format(what, key)))
    return names
  if isinstance(nest, (list, tuple)):
    names = []
    for i, value in enumerate(nest):
      names.extend(_leaf_names(value, '{}[{}]'.format(what, i)))
    return names
  return [what]


def _converted(value, name):
  if isinstance(value, (tf1.SparseTensor, tf1.SparseTensorValue)):
    return tf1.SparseTensor.from_value(value)
  try:
    return tf1.convert_to_tensor(value)
  except (TypeError, ValueError) as e:
    raise errors.InvalidTypeError(
        '{} must be a Tensor, a SparseTensor or a nest of them, got {!r} of '
        'type {} ({}).'.format(name, value, type(value).__name__, e))


def _rank(value):
  if isinstance(value, tf1.SparseTensor):
    return tf.compat.dimension_value(value.dense_shape.shape[0])
  return value.shape.ndims


def _batch_size(value):
  """`(int64 scalar, static int or None)`: the size of dimension 0."""
  if isinstance(value, tf1.SparseTensor):
    static_shape = tf.get_static_value(value.dense_shape)
    return (value.dense_shape[0],
            None if static_shape is None else int(static_shape[0]))
  static = (tf.compat.dimension_value(value.shape[0])
            if value.shape.ndims is not None else None)
  return tf.shape(value, out_type=tf.int64)[0], static


def _mismatch_message(leaf, size, reference, reference_size,
                      unsplit_features):
  return (
      '{} has {} rows in dimension 0, but the batch has {} ({}, the first '
      'value split): every feature and label is split along dimension 0 '
      'into the towers\' shards. To give a feature whole to every tower, '
      'pass replicate_model_fn(..., unsplit_features=[...]) naming it{}; '
      'else give it the batch size in dimension 0.'.format(
          leaf.name, size, reference_size, reference.name,
          ' (unsplit_features is {!r})'.format(list(unsplit_features))
          if unsplit_features else ''))


def _check_batch_dimension(leaf, reference, batch_size, static_size,
                           unsplit_features):
  """Raises, or asserts at run time, that `leaf` has the batch's rows.

  Raises:
    InvalidArgumentError: where both sizes are static and differ.
  """
  size, static = _batch_size(leaf.value)
  if static is not None and static_size is not None:
    if static != static_size:
      raise errors.InvalidArgumentError(_mismatch_message(
          leaf, static, reference, static_size, unsplit_features))
    return
  check = tf1.assert_equal(
      size, batch_size, data=['Rows:', size, 'batch:', batch_size],
      message=_mismatch_message(
          leaf, _known(static), reference, _known(static_size),
          unsplit_features))
  with tf1.control_dependencies([check]):
    if isinstance(leaf.value, tf1.SparseTensor):
      leaf.value = tf1.SparseTensor(tf.identity(leaf.value.indices),
                                    leaf.value.values, leaf.value.dense_shape)
    else:
      leaf.value = tf.identity(leaf.value)


def _known(size):
  return '(known at run time)' if size is None else size


def _shard_sizes(batch_size, num_shards):
  """The rows of each shard: the first `b % N` get one more than `b // N`."""
  n = tf.cast(num_shards, tf.int64)
  extra = tf.cast(tf.range(num_shards, dtype=tf.int64) <
                  tf.math.floormod(batch_size, n), tf.int64)
  return tf.math.add(tf.math.floordiv(batch_size, n), extra,
                     name='shard_sizes')


def _split_value(value, num_shards, sizes):
  """`value` split into `num_shards` shards of `sizes` rows (None: even)."""
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

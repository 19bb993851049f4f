"""Splitting a global batch of features and labels into one shard per tower.

A batch of `b` rows goes to `N` towers in order, as evenly as it can
(core/row_split.py, shared with the strategies' input): the
first `b % N` towers get `b // N + 1` rows, the others `b // N` (some get none
when `b < N`). Where the static shape already divides, the split is today's
`tf.split(value, N)` and the loss is averaged over the towers; otherwise the
rows are counted at run time, every tower reads a batch dimension of unknown
size (so that a copy of tower 0 bakes in no row count of tower 0's), and the
towers' losses are weighted by their rows (tower_context.py).

Scalars cannot be split: they go whole to every tower, as do the features
named in `replicate_model_fn(..., unsplit_features=[...])`. A list of Python
values (`[[1.], [2.]]`) is the one tensor TF makes of it, split by rows.
"""
import collections
import copy
import numbers

import numpy as np
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import row_split

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
    features: a `Tensor`, `SparseTensor`, or a nest (e.g. a dict) of them;
      a list of Python values counts as the tensor made of it.
    labels: `None`, or a `Tensor`/`SparseTensor` or a nest of them (the
      same).
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
    InvalidTypeError: if a value is neither a `Tensor` nor a `SparseTensor`
      (a `RaggedTensor` included).
  A value to split of unknown rank is asserted at run time to have a
  dimension 0, naming it.
  """
  check_unsplit_names(features, unsplit_features)
  with tf1.name_scope('split_inputs'), tf1.device(device):
    features = _lists_as_tensors(features)
    labels = _lists_as_tensors(labels)
    leaves = _leaves(features, 'features', unsplit_features)
    if labels is not None:
      leaves += _leaves(labels, 'labels', ())
    split = [leaf for leaf in leaves if leaf.split]
    if not split:
      sizes = rows = batch_size = None
    else:
      batch_size, static_size = row_split.batch_rows(split[0].value)
      for leaf in split[1:]:
        _check_batch_dimension(leaf, split[0], batch_size, static_size,
                               unsplit_features)
      if row_split.splits_evenly(static_size, num_shards):
        sizes = rows = batch_size = None  # today's even split
      else:
        # A static count is hidden: a copy of tower 0 must not bake in
        # tower 0's rows.
        sizes, batch_size = row_split.shard_rows(batch_size, num_shards,
                                                 static_size)
        rows = [sizes[i] for i in range(num_shards)]
    for leaf in leaves:
      leaf.shards = (row_split.split_rows(leaf.value, num_shards, sizes)
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
    leaf = _Leaf(value, name, name not in unsplit_names and _rank(value) != 0)
    if leaf.split and _rank(value) is None:
      _assert_has_rows(leaf, unsplit_features)
    leaves.append(leaf)
  return leaves


def _assert_has_rows(leaf, unsplit_features):
  """Fails the step, naming `leaf`, if its value of unknown rank is a
  scalar (which has no rows to split)."""
  check = tf1.assert_rank_at_least(
      leaf.value, 1, message=(
          '{} has no static rank and is split along dimension 0 into the '
          "towers' shards, but it is a scalar. Give it a static shape "
          '(set_shape), or pass replicate_model_fn(..., unsplit_features=['
          '...]) naming it to give it whole to every tower{}.'.format(
              leaf.name, ' (unsplit_features is {!r})'.format(
                  list(unsplit_features)) if unsplit_features else '')))
  with tf1.control_dependencies([check]):
    leaf.value = tf.identity(leaf.value)


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


def _lists_as_tensors(nest):
  """`nest` with each list or tuple of Python values only (`[[1.], [2.]]`)
  made the tensor TF makes of it where `model_fn` reads it, so that its rows
  are split. `tf.nest` would take each number for a scalar, given whole to
  every tower: the towers would read the batch N times. A
  `tf.compat.v1.SparseTensorValue` (a namedtuple) is made a SparseTensor
  first, or its indices, values and shape would be split as three values."""
  if isinstance(nest, tf1.SparseTensorValue):
    return tf1.SparseTensor.from_value(nest)
  if isinstance(nest, dict):
    converted = copy.copy(nest)
    converted.update((key, _lists_as_tensors(value))
                     for key, value in nest.items())
    return converted
  if not isinstance(nest, (list, tuple)) or not nest:
    return nest
  if all(isinstance(leaf, _PYTHON_VALUES) for leaf in tf.nest.flatten(nest)):
    return tf1.convert_to_tensor(nest)
  values = [_lists_as_tensors(value) for value in nest]
  if hasattr(nest, '_fields'):  # a namedtuple
    return type(nest)(*values)
  return type(nest)(values)


# What TF makes a tensor of, in a list (bool is an int).
_PYTHON_VALUES = (numbers.Number, str, bytes, np.generic)


def _converted(value, name):
  if isinstance(value, tf1.SparseTensor):
    return value
  if isinstance(value, tf.RaggedTensor):
    raise errors.InvalidTypeError(
        '{} is a tf.RaggedTensor; features and labels are split as Tensors '
        'or SparseTensors. Convert it in input_fn: value.to_sparse(), or '
        'value.to_tensor() (padded).'.format(name))
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


def _mismatch_message(leaf, size, reference, reference_size,
                      unsplit_features):
  return (
      '{} has {} rows in dimension 0, but the batch has {} ({}, the first '
      'value split): every feature and label is split along dimension 0 '
      'into the towers\' shards, so each must have the batch\'s rows. The '
      'batch is taken from the first value split, so either of the two may '
      'be the odd one. A feature that is not batched (one value for every '
      'tower, such as a lookup table) goes whole to every tower with '
      'replicate_model_fn(..., unsplit_features=[...]) naming its key{}; '
      'any other value needs the batch\'s rows in dimension 0.'.format(
          leaf.name, size, reference_size, reference.name,
          ' (unsplit_features is {!r})'.format(list(unsplit_features))
          if unsplit_features else ''))


def _check_batch_dimension(leaf, reference, batch_size, static_size,
                           unsplit_features):
  """Raises, or asserts at run time, that `leaf` has the batch's rows.

  Raises:
    InvalidArgumentError: where both sizes are static and differ.
  """
  size, static = row_split.batch_rows(leaf.value)
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

"""Splitting a global batch of features and labels into one shard per tower."""
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1


def split_batch(features, labels, num_shards, device):
  """Splits features and labels along dimension 0 into `num_shards` shards.

  Args:
    features: a `Tensor`, `SparseTensor`, or a nest (e.g. a dict) of them.
    labels: `None`, or a `Tensor`/`SparseTensor` or a nest of them.
    num_shards: number of towers.
    device: where the split ops run.

  Returns:
    `(feature_shards, label_shards)`: lists of `num_shards` nests shaped like
    the inputs; `label_shards` is a list of `None` when `labels` is `None`.

  Raises:
    InvalidArgumentError: if a statically known batch size is not divisible by
      `num_shards`, or a value has no batch dimension. A batch size known only
      at run time is checked by an assertion that fails the step with the same
      explanation.
    InvalidTypeError: if a value is neither a `Tensor` nor a `SparseTensor`.
  """
  with tf1.name_scope('split_inputs'), tf1.device(device):
    feature_shards = _split_nest(features, num_shards, 'features')
    if labels is None:
      label_shards = [None] * num_shards
    else:
      label_shards = _split_nest(labels, num_shards, 'labels')
  return feature_shards, label_shards


def _split_nest(nest, num_shards, what):
  flat = tf.nest.flatten(nest)
  names = _leaf_names(nest, what)
  split_leaves = [
      _split_value(value, num_shards, name) for value, name in zip(flat, names)
  ]
  return [
      tf.nest.pack_sequence_as(nest, [leaf[i] for leaf in split_leaves])
      for i in range(num_shards)
  ]


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


def _not_divisible_message(name, batch_size, num_shards):
  return ('Batch size {} of {} is not divisible by the number of towers ({}); '
          'use a global batch size that is a multiple of {} (with tf.data, '
          'batch(..., drop_remainder=True)) or pass fewer devices.'.format(
              batch_size, name, num_shards, num_shards))


def _checked_batch_size(batch_size, static_batch_size, num_shards, name):
  """Validates the batch size now if known, else returns a run-time check."""
  if static_batch_size is not None:
    if static_batch_size % num_shards:
      raise errors.InvalidArgumentError(
          _not_divisible_message(name, static_batch_size, num_shards))
    return []
  message = _not_divisible_message(name, '(known at run time)', num_shards)
  return [
      tf1.assert_equal(
          tf.math.floormod(batch_size, tf.cast(num_shards, batch_size.dtype)),
          tf.cast(0, batch_size.dtype),
          data=['Batch size:', batch_size],
          message=message)
  ]


def _split_value(value, num_shards, name):
  if isinstance(value, (tf1.SparseTensor, tf1.SparseTensorValue)):
    value = tf1.SparseTensor.from_value(value)
    batch_size = value.dense_shape[0]
    static_shape = tf.get_static_value(value.dense_shape)
    static_batch_size = None if static_shape is None else int(static_shape[0])
    checks = _checked_batch_size(batch_size, static_batch_size, num_shards, name)
    with tf1.control_dependencies(checks):
      # Rows go to shards in order, as dense tensors are split.
      return tf1.sparse.split(sp_input=value, num_split=num_shards, axis=0)
  try:
    value = tf1.convert_to_tensor(value)
  except (TypeError, ValueError) as e:
    raise errors.InvalidTypeError(
        '{} must be a Tensor, a SparseTensor or a nest of them, got {!r} of '
        'type {} ({}).'.format(name, value, type(value).__name__, e))
  if value.shape.ndims == 0:
    raise errors.InvalidArgumentError(
        '{} is a scalar, but every feature and label needs a batch dimension '
        '(dimension 0) to be split across towers; give it shape [batch, ...].'
        .format(name))
  static_batch_size = (
      tf.compat.dimension_value(value.shape[0])
      if value.shape.ndims is not None else None)
  checks = _checked_batch_size(
      tf.shape(value, out_type=tf.int64)[0], static_batch_size, num_shards,
      name)
  if checks:
    with tf1.control_dependencies(checks):
      value = tf.identity(value)
  return tf.split(value, num_shards, axis=0)

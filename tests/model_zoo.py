"""The kinds of `model_fn` Estimator users write, for the model suite.

Every model here is deterministic given its checkpoint (no dropout, no
sampling), so a replicated run can be compared with one device number for
number. Data: 32 rows, distinct per row (no two rows share a label, a
feature value or a sequence length pattern), so a mix-up of rows or towers
changes the result.
"""
import os

import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

ROWS = 32
COLORS = ['red', 'green', 'blue', 'teal', 'pink']
ANIMALS = ['bird', 'cat', 'dog', 'fish']
TAGS = ['a', 'b', 'c', 'd', 'e', 'f']
SEQ_LEN = 5
fc = tf1.feature_column


def columns_data():
  """Features and labels as numpy arrays (the dense part of the data)."""
  rng = np.random.RandomState(17)
  rows = np.arange(ROWS)
  return {
      'x': rng.uniform(-1, 1, size=(ROWS, 3)).astype(np.float32),
      'age': (rows * 2.5 + 1).astype(np.float32).reshape(ROWS, 1),
      'color': np.array([COLORS[(3 * i) % 5] for i in rows]),
      'color2': np.array([COLORS[(i + i // 5) % 5] for i in rows]),
      'city': np.array(['city{}'.format(i % 11) for i in rows]),
      'id': (rows * 7 % 10).astype(np.int64),
      'seq': rng.uniform(-1, 1, size=(ROWS, SEQ_LEN, 2)).astype(np.float32),
      'seq_len': (rows % SEQ_LEN + 1).astype(np.int64),
  }, {
      'value': rng.uniform(-2, 2, size=(ROWS, 1)).astype(np.float32),
      'animal': np.array([ANIMALS[(i * 3 + i // 4) % 4] for i in rows]),
      'class': np.array([(i * 3 + i // 4) % 4 for i in rows], np.int64),
  }


def serialized_examples():
  """The rows as `tf.Example`s, with a multi-valued string feature `tags`."""
  features, labels = columns_data()
  examples = []
  for i in range(ROWS):
    tags = [TAGS[(i + k * 2) % len(TAGS)].encode() for k in range(i % 3 + 1)]
    if i % 7 == 6:
      tags.append(b'unknown')
    example = tf1.train.Example(features=tf1.train.Features(feature={
        'x': tf1.train.Feature(float_list=tf1.train.FloatList(
            value=features['x'][i])),
        'tags': tf1.train.Feature(bytes_list=tf1.train.BytesList(value=tags)),
        'value': tf1.train.Feature(float_list=tf1.train.FloatList(
            value=labels['value'][i])),
    }))
    examples.append(example.SerializeToString())
  return examples


EXAMPLE_SPEC = {
    'x': tf1.FixedLenFeature([3], tf.float32),
    'tags': tf1.VarLenFeature(tf.string),
}


def input_fn(label_key='value', batch_size=8, epochs=None, examples=False):
  """An input_fn over the 32 rows, in order, `epochs` times (None: forever)."""

  def fn():
    if examples:
      dataset = tf1.data.Dataset.from_tensor_slices(serialized_examples())
      dataset = dataset.repeat(epochs).batch(batch_size)

      def parse(serialized):
        spec = dict(EXAMPLE_SPEC, value=tf1.FixedLenFeature([1], tf.float32))
        parsed = tf1.parse_example(serialized, spec)
        label = parsed.pop('value')
        return parsed, label

      return dataset.map(parse)
    features, labels = columns_data()
    dataset = tf1.data.Dataset.from_tensor_slices(
        (features, labels[label_key]))
    return dataset.repeat(epochs).batch(batch_size)

  return fn


def vocabulary_file(directory):
  path = os.path.join(directory, 'colors.txt')
  with open(path, 'w') as f:
    f.write('\n'.join(COLORS[:4]) + '\n')
  return path


def _optimizer(params):
  if params.get('optimizer') == 'adam':
    return replicate.TowerOptimizer(tf1.train.AdamOptimizer(0.05))
  if params.get('optimizer') == 'momentum':
    return replicate.TowerOptimizer(tf1.train.MomentumOptimizer(0.05, 0.9))
  return replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))


def _init(seed):
  return tf1.glorot_uniform_initializer(seed=seed)


def regression_spec(mode, prediction, labels, params, extra_metrics=None,
                    hooks=()):
  """A regression `EstimatorSpec` with standard metrics on `prediction`."""
  predictions = {'prediction': prediction}
  if mode == tf1.estimator.ModeKeys.PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions=predictions, export_outputs={
            'serving_default': tf1.estimator.export.RegressionOutput(
                prediction)})
  loss = tf1.losses.mean_squared_error(labels, prediction)
  weights = tf.abs(labels) + 0.5  # non-uniform weights
  metrics = {
      'mae': tf1.metrics.mean_absolute_error(labels, prediction),
      'rmse': tf1.metrics.root_mean_squared_error(labels, prediction,
                                                  weights=weights),
      'mean_prediction': tf1.metrics.mean(prediction),
      'above': tf1.metrics.accuracy(tf.cast(labels > 0, tf.int32),
                                    tf.cast(prediction > 0, tf.int32)),
  }
  metrics.update(extra_metrics or {})
  train_op = None
  if mode == tf1.estimator.ModeKeys.TRAIN:
    train_op = _optimizer(params).minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, eval_metric_ops=metrics,
      predictions=predictions, training_hooks=list(hooks))


def _head(inputs, mode, labels, params, units=4):
  hidden = tf1.layers.dense(inputs, units, tf.nn.tanh,
                            kernel_initializer=_init(1), name='hidden')
  prediction = tf1.layers.dense(hidden, 1, kernel_initializer=_init(2),
                                name='out')
  return regression_spec(mode, prediction, labels, params)


def _bucketized_age():
  return fc.bucketized_column(fc.numeric_column('age'), [10.0, 30.0, 50.0])


def numeric_bucketized(features, labels, mode, params):
  columns = [fc.numeric_column('x', shape=3), _bucketized_age()]
  return _head(fc.input_layer(features, columns), mode, labels, params)


def vocabulary_list(features, labels, mode, params):
  color = fc.categorical_column_with_vocabulary_list('color', COLORS[:4],
                                                     num_oov_buckets=1)
  columns = [fc.numeric_column('x', shape=3), fc.indicator_column(color),
             fc.embedding_column(color, 3, initializer=_init(3))]
  return _head(fc.input_layer(features, columns), mode, labels, params)


def vocabulary_file_model(features, labels, mode, params):
  color = fc.categorical_column_with_vocabulary_file(
      'color', params['vocabulary_file'], vocabulary_size=4,
      num_oov_buckets=1)
  columns = [fc.numeric_column('x', shape=3),
             fc.embedding_column(color, 3, initializer=_init(3))]
  return _head(fc.input_layer(features, columns), mode, labels, params)


def hash_identity_crossed(features, labels, mode, params):
  city = fc.categorical_column_with_hash_bucket('city', 7)
  ident = fc.categorical_column_with_identity('id', 10)
  color = fc.categorical_column_with_vocabulary_list('color', COLORS)
  crossed = fc.crossed_column([color, _bucketized_age()], 11)
  columns = [fc.indicator_column(city),
             fc.embedding_column(ident, 3, initializer=_init(4)),
             fc.indicator_column(crossed)]
  return _head(fc.input_layer(features, columns), mode, labels, params)


def shared_embedding(features, labels, mode, params):
  first = fc.categorical_column_with_vocabulary_list('color', COLORS)
  second = fc.categorical_column_with_vocabulary_list('color2', COLORS)
  columns = fc.shared_embedding_columns([first, second], 3,
                                        initializer=_init(5))
  return _head(fc.input_layer(features, columns), mode, labels, params)


def linear_model(features, labels, mode, params):
  color = fc.categorical_column_with_vocabulary_list('color', COLORS)
  columns = [fc.numeric_column('x', shape=3), color, _bucketized_age()]
  prediction = fc.linear_model(features, columns)
  return regression_spec(mode, prediction, labels, params)


def sparse_tags(features, labels, mode, params):
  """Multi-valued sparse strings parsed from `tf.Example`s."""
  tags = fc.categorical_column_with_vocabulary_list('tags', TAGS,
                                                    num_oov_buckets=1)
  columns = [fc.numeric_column('x', shape=3),
             fc.embedding_column(tags, 3, combiner='mean',
                                 initializer=_init(6))]
  return _head(fc.input_layer(features, columns), mode, labels, params)


def partitioned(features, labels, mode, params):
  table = tf1.get_variable(
      'table', [10, 4], initializer=_init(7),
      partitioner=tf1.fixed_size_partitioner(3))
  embedded = tf1.nn.embedding_lookup(table, features['id'])
  return _head(tf.concat([embedded, features['x']], 1), mode, labels, params)


def _sequence_head(outputs, mode, labels, params):
  return _head(outputs, mode, labels, params, units=3)


def lstm(features, labels, mode, params):
  cell = tf1.nn.rnn_cell.LSTMCell(4, initializer=_init(8))
  _, state = tf1.nn.dynamic_rnn(cell, features['seq'],
                                sequence_length=features['seq_len'],
                                dtype=tf.float32)
  return _sequence_head(state.h, mode, labels, params)


def stacked_gru(features, labels, mode, params):
  cell = tf1.nn.rnn_cell.MultiRNNCell([
      tf1.nn.rnn_cell.GRUCell(4, kernel_initializer=_init(9)),
      tf1.nn.rnn_cell.GRUCell(3, kernel_initializer=_init(10))])
  outputs, _ = tf1.nn.dynamic_rnn(cell, features['seq'],
                                  sequence_length=features['seq_len'],
                                  dtype=tf.float32)
  return _sequence_head(tf.reduce_sum(outputs, 1), mode, labels, params)


def bidirectional(features, labels, mode, params):
  forward = tf1.nn.rnn_cell.LSTMCell(3, initializer=_init(11))
  backward = tf1.nn.rnn_cell.GRUCell(3, kernel_initializer=_init(12))
  _, (state_fw, state_bw) = tf1.nn.bidirectional_dynamic_rnn(
      forward, backward, features['seq'],
      sequence_length=features['seq_len'], dtype=tf.float32)
  return _sequence_head(tf.concat([state_fw.h, state_bw], 1), mode, labels,
                        params)


def while_loop(features, labels, mode, params):
  """A hand-written loop: three steps of h = tanh(h @ w + x @ u)."""
  w = tf1.get_variable('w', [3, 3], initializer=_init(13))
  u = tf1.get_variable('u', [3, 3], initializer=_init(14))
  x = features['x']

  def body(i, h):
    return i + 1, tf.tanh(tf.matmul(h, w) + tf.matmul(x, u))

  _, h = tf1.while_loop(lambda i, _: i < 3, body,
                        [tf.constant(0), tf.zeros_like(x)])
  return _head(h, mode, labels, params)


def cond_per_row(features, labels, mode, params):
  """A `tf.cond` on each row's first feature (inside `map_fn`)."""
  w = tf1.get_variable('w', [3], initializer=tf1.constant_initializer(
      [0.5, -1.0, 2.0]))
  rows = tf.map_fn(
      lambda row: tf.cond(row[0] > 0, lambda: row * w, lambda: -row),
      features['x'])
  return _head(rows, mode, labels, params)


def sampled_softmax(features, labels, mode, params):
  """Sampled softmax with fixed candidates, so that it is deterministic."""
  hidden = tf1.layers.dense(features['x'], 4, tf.nn.tanh,
                            kernel_initializer=_init(15), name='hidden')
  weights = tf1.get_variable('softmax_w', [4, 4], initializer=_init(16))
  biases = tf1.get_variable('softmax_b', [4],
                            initializer=tf1.zeros_initializer())
  logits = tf.matmul(hidden, weights, transpose_b=True) + biases
  predictions = {'class': tf.argmax(logits, 1)}
  if mode == tf1.estimator.ModeKeys.PREDICT:
    return tf1.estimator.EstimatorSpec(mode, predictions=predictions)
  sampled = (tf.constant([1, 3], tf.int64),
             tf.constant([0.4, 0.3]), tf.constant([0.4, 0.3]))
  loss = tf.reduce_mean(tf1.nn.sampled_softmax_loss(
      weights, biases, tf.reshape(labels, [-1, 1]), hidden, num_sampled=2,
      num_classes=4, sampled_values=sampled, remove_accidental_hits=True))
  train_op = None
  if mode == tf1.estimator.ModeKeys.TRAIN:
    train_op = _optimizer(params).minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, predictions=predictions,
      eval_metric_ops={'accuracy': tf1.metrics.accuracy(
          labels, predictions['class'])})


def py_function(features, labels, mode, params):
  squared = tf1.py_func(lambda v: (v * v).astype(np.float32), [features['x']],
                        tf.float32)
  squared.set_shape(features['x'].shape)
  return _head(tf.concat([squared, features['x']], 1), mode, labels, params)


def string_labels(features, labels, mode, params):
  """String labels through lookup tables, classes returned as strings."""
  hidden = tf1.layers.dense(features['x'], 5, tf.nn.tanh,
                            kernel_initializer=_init(17), name='hidden')
  logits = tf1.layers.dense(hidden, len(ANIMALS),
                            kernel_initializer=_init(18), name='logits')
  class_id = tf.argmax(logits, 1)
  names = tf1.lookup.StaticHashTable(tf1.lookup.KeyValueTensorInitializer(
      tf.range(len(ANIMALS), dtype=tf.int64), tf.constant(ANIMALS)),
                                      'unknown').lookup(class_id)
  predictions = {'class': names, 'logits': logits}
  if mode == tf1.estimator.ModeKeys.PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions=predictions, export_outputs={
            'serving_default': tf1.estimator.export.ClassificationOutput(
                scores=tf.nn.softmax(logits),
                classes=tf.reshape(names, [-1, 1]))})
  ids = tf1.lookup.StaticVocabularyTable(tf1.lookup.KeyValueTensorInitializer(
      tf.constant(ANIMALS), tf.range(len(ANIMALS), dtype=tf.int64)),
                                          num_oov_buckets=1).lookup(labels)
  loss = tf1.losses.sparse_softmax_cross_entropy(ids, logits)
  train_op = None
  if mode == tf1.estimator.ModeKeys.TRAIN:
    train_op = _optimizer(params).minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, predictions=predictions,
      eval_metric_ops={
          'accuracy': tf1.metrics.accuracy(ids, class_id),
          'per_class': tf1.metrics.mean_per_class_accuracy(
              ids, class_id, len(ANIMALS) + 1),
      })


def summaries(features, labels, mode, params):
  hidden = tf1.layers.dense(features['x'], 4, tf.nn.tanh,
                            kernel_initializer=_init(1), name='hidden')
  tf1.summary.histogram('hidden', hidden)
  tf1.summary.scalar('hidden_mean', tf.reduce_mean(hidden))
  prediction = tf1.layers.dense(hidden, 1, kernel_initializer=_init(2),
                                name='out')
  return regression_spec(mode, prediction, labels, params)


def keras_layers(features, labels, mode, params):
  """Keras layer objects, a Sequential and a functional model."""
  first = tf.keras.layers.Dense(4, activation='tanh',
                                kernel_initializer=_init(19))
  sequential = tf.keras.Sequential([
      tf.keras.layers.Dense(3, activation='tanh',
                            kernel_initializer=_init(20))])
  inputs = tf.keras.Input(shape=(3,))
  functional = tf.keras.Model(inputs, tf.keras.layers.Dense(
      1, kernel_initializer=_init(21))(inputs))
  prediction = functional(sequential(first(features['x'])))
  return regression_spec(mode, prediction, labels, params)


def keras_lstm(features, labels, mode, params):
  outputs = tf.keras.layers.LSTM(4, kernel_initializer=_init(22),
                                 recurrent_initializer=_init(23))(
                                     features['seq'])
  return _sequence_head(outputs, mode, labels, params)


def clipped_schedule(features, labels, mode, params):
  """Clipped gradients, a decaying learning rate, a LoggingTensorHook."""
  hidden = tf1.layers.dense(features['x'], 4, tf.nn.tanh,
                            kernel_initializer=_init(1), name='hidden')
  prediction = tf1.layers.dense(hidden, 1, kernel_initializer=_init(2),
                                name='out')
  if mode != tf1.estimator.ModeKeys.TRAIN:
    return regression_spec(mode, prediction, labels, params)
  loss = tf1.losses.mean_squared_error(labels, prediction)
  rate = tf1.train.exponential_decay(0.2, tf1.train.get_global_step(), 1, 0.5)
  optimizer = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(rate))
  grads, variables = zip(*optimizer.compute_gradients(loss))
  # Clipping is per tower (as in contrib): a norm that never binds keeps
  # the replicated run equal to one device.
  clipped, _ = tf.clip_by_global_norm(grads, 100.0)
  train_op = optimizer.apply_gradients(zip(clipped, variables),
                                       tf1.train.get_global_step())
  hook = tf1.train.LoggingTensorHook({'rate': rate, 'loss': loss},
                                     every_n_iter=1)
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                     training_hooks=[hook])


def forward_counter(features, labels, mode, params):
  """A counter of the rows seen, written in the forward pass."""
  seen = tf1.get_variable('examples_seen', [], tf.float32,
                          initializer=tf1.zeros_initializer(),
                          trainable=False)
  rows = tf.cast(tf.shape(features['x'])[0], tf.float32)
  # Locked: the towers add at once, and an unlocked add to a TF 1.15
  # reference variable can lose one (with calls as well).
  with tf.control_dependencies([tf1.assign_add(seen, rows,
                                               use_locking=True)]):
    x = tf.identity(features['x'])
  return _head(x, mode, labels, params)


def batch_norm(features, labels, mode, params):
  training = mode == tf1.estimator.ModeKeys.TRAIN
  hidden = tf1.layers.dense(features['x'], 4, kernel_initializer=_init(1),
                            name='hidden')
  hidden = tf1.layers.batch_normalization(hidden, training=training)
  prediction = tf1.layers.dense(tf.nn.tanh(hidden), 1,
                                kernel_initializer=_init(2), name='out')
  if mode != tf1.estimator.ModeKeys.TRAIN:
    return regression_spec(mode, prediction, labels, params)
  loss = tf1.losses.mean_squared_error(labels, prediction)
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train_op = _optimizer(params).minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def canned_dnn(features, labels, mode, params, config):
  """A canned `DNNClassifier`'s model_fn with string labels."""
  color = fc.categorical_column_with_vocabulary_list('color', COLORS)
  estimator = tf1.estimator.DNNClassifier(
      hidden_units=[4], n_classes=len(ANIMALS), label_vocabulary=ANIMALS,
      feature_columns=[fc.numeric_column('x', shape=3),
                       fc.embedding_column(color, 2, initializer=_init(24))],
      optimizer=replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)),
      config=config)
  del params
  return estimator.model_fn(features, labels, mode, config)


def scaffolded(features, labels, mode, params):
  """A `Scaffold` with its own `Saver` and an `init_fn`."""
  spec = numeric_bucketized(features, labels, mode, params)
  offset = tf1.get_variable('offset', [], initializer=tf1.zeros_initializer(),
                            trainable=False)
  set_offset = tf1.assign(offset, 2.5)

  def init_fn(scaffold, session):
    del scaffold
    session.run(set_offset)

  saver = tf1.train.Saver(max_to_keep=2, sharded=True)
  return spec._replace(scaffold=tf1.train.Scaffold(init_fn=init_fn,
                                                    saver=saver))

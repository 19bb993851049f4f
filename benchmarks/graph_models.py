"""The models of gpu_graph_bench.py: ResNet-50, a Transformer, wide & deep.

Each is an Estimator-style `model_fn(features, labels, mode, params)` written
with `tf.compat.v1` layers only, trained with Momentum and the UPDATE_OPS
control-dependency idiom. `params['wrap_optimizer']` wraps the optimizer
(`replicate.TowerOptimizer`, contrib's, or the identity for one device).
`make_input(name, batch)` builds the features and labels of a global batch
from `tf.zeros` / `tf.random` (graph only: nothing is ever run).

MODELS maps each name to `(model_fn, make_input, global batch)`.
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import tensorflow as tf

tf1 = tf.compat.v1


def _train_op(loss, params):
  """Momentum on `loss`, wrapped as asked, after the UPDATE_OPS."""
  optimizer = params['wrap_optimizer'](
      tf1.train.MomentumOptimizer(0.01, momentum=0.9))
  with tf1.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    return optimizer.minimize(loss, tf1.train.get_global_step())


def _spec(mode, loss, params):
  """The TRAIN `EstimatorSpec` of `loss`."""
  return tf1.estimator.EstimatorSpec(mode, loss=loss,
                                     train_op=_train_op(loss, params))


# ----------------------------------------------------------------------------
# ResNet-50 (v1.5: the stride on the 3x3 convolution), NHWC.
# ----------------------------------------------------------------------------


def _conv_bn(net, filters, kernel, stride, name, relu=True):
  """conv2d without bias, fused batch norm (training), optional ReLU.

  Layers are named: tf.contrib's towers call model_fn again and find the
  variables by name.
  """
  with tf1.variable_scope(name):
    net = tf1.layers.conv2d(net, filters, kernel, strides=stride,
                            padding='same', use_bias=False, name='conv')
    net = tf1.layers.batch_normalization(net, fused=True, training=True,
                                         name='bn')
  return tf.nn.relu(net) if relu else net


def _bottleneck(net, filters, stride, project):
  """1x1 / 3x3 / 1x1 bottleneck with a (projected) shortcut."""
  shortcut = net
  if project:
    shortcut = _conv_bn(net, 4 * filters, 1, stride, 'shortcut', relu=False)
  net = _conv_bn(net, filters, 1, 1, 'a')
  net = _conv_bn(net, filters, 3, stride, 'b')
  net = _conv_bn(net, 4 * filters, 1, 1, 'c', relu=False)
  return tf.nn.relu(net + shortcut)


def resnet50_model_fn(features, labels, mode, params):
  """ResNet-50: bottleneck blocks [3, 4, 6, 3], 1000 classes."""
  net = _conv_bn(features, 64, 7, 2, 'stem')
  net = tf1.layers.max_pooling2d(net, 3, 2, padding='same', name='pool')
  for stage, (blocks, filters) in enumerate(
      zip([3, 4, 6, 3], [64, 128, 256, 512])):
    for block in range(blocks):
      with tf1.variable_scope('stage{}_block{}'.format(stage, block)):
        net = _bottleneck(net, filters, 2 if block == 0 and stage else 1,
                          project=block == 0)
  net = tf.reduce_mean(net, [1, 2])
  logits = tf1.layers.dense(net, 1000, name='logits')
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  return _spec(mode, loss, params)


def resnet50_input(batch):
  """Images `[batch, 224, 224, 3]` and int32 labels in [0, 1000)."""
  return (tf.zeros([batch, 224, 224, 3]),
          tf1.random.uniform([batch], maxval=1000, dtype=tf.int32))


# ----------------------------------------------------------------------------
# Transformer-like encoder: vocab 32k, d 512, 6 layers, 8 heads, FFN 2048.
# ----------------------------------------------------------------------------

VOCAB, D_MODEL, LAYERS, HEADS, D_FF, SEQ = 32000, 512, 6, 8, 2048, 128


def _layer_norm(net, name):
  """Layer norm over the last axis, with a scale and a bias."""
  with tf1.variable_scope(name):
    gamma = tf1.get_variable('gamma', [D_MODEL],
                             initializer=tf1.ones_initializer())
    beta = tf1.get_variable('beta', [D_MODEL],
                            initializer=tf1.zeros_initializer())
    mean, variance = tf.nn.moments(net, [-1], keepdims=True)
    return (net - mean) * tf1.rsqrt(variance + 1e-6) * gamma + beta


def _attention(net):
  """Multi-head self-attention of `net` `[batch, SEQ, D_MODEL]`."""
  batch = tf.shape(net)[0]
  depth = D_MODEL // HEADS

  def heads(x):
    x = tf.reshape(x, [batch, SEQ, HEADS, depth])
    return tf.transpose(x, [0, 2, 1, 3])

  q = heads(tf1.layers.dense(net, D_MODEL, name='q'))
  k = heads(tf1.layers.dense(net, D_MODEL, name='k'))
  v = heads(tf1.layers.dense(net, D_MODEL, name='v'))
  weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * depth**-0.5)
  out = tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3])
  out = tf.reshape(out, [batch, SEQ, D_MODEL])
  return tf1.layers.dense(out, D_MODEL, name='output')


def transformer_model_fn(features, labels, mode, params):
  """Embeddings, 6 post-norm encoder layers, softmax over the vocabulary."""
  embedding = tf1.get_variable(
      'embedding', [VOCAB, D_MODEL],
      initializer=tf1.random_normal_initializer(stddev=D_MODEL**-0.5))
  position = tf1.get_variable(
      'position', [SEQ, D_MODEL],
      initializer=tf1.random_normal_initializer(stddev=0.02))
  net = tf.nn.embedding_lookup(embedding, features) + position
  for layer in range(LAYERS):
    with tf1.variable_scope('layer_{}'.format(layer)):
      with tf1.variable_scope('attention'):
        net = _layer_norm(net + _attention(net), 'norm')
      with tf1.variable_scope('ffn'):
        hidden = tf1.layers.dense(net, D_FF, activation=tf.nn.relu,
                                  name='hidden')
        net = _layer_norm(net + tf1.layers.dense(hidden, D_MODEL,
                                                 name='output'), 'norm')
  logits = tf1.layers.dense(net, VOCAB, name='softmax')
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  return _spec(mode, loss, params)


def transformer_input(batch):
  """Token ids `[batch, SEQ]` and next-token labels, int32 in [0, VOCAB)."""
  ids = tf1.random.uniform([batch, SEQ], maxval=VOCAB, dtype=tf.int32)
  return ids, tf1.random.uniform([batch, SEQ], maxval=VOCAB, dtype=tf.int32)


# ----------------------------------------------------------------------------
# Wide & deep on feature columns (DNNLinearCombined by hand).
# ----------------------------------------------------------------------------

_COLORS = ['red', 'green', 'blue', 'cyan', 'magenta', 'yellow', 'black']
_HASH_BUCKETS = 10000


def _columns():
  """(linear columns, DNN columns) of the wide & deep model."""
  fc = tf1.feature_column
  color = fc.categorical_column_with_vocabulary_list('color', _COLORS)
  city = fc.categorical_column_with_hash_bucket('city', _HASH_BUCKETS)
  item = fc.categorical_column_with_hash_bucket('item', 100000)
  age = fc.numeric_column('age')
  price = fc.numeric_column('price')
  cross = fc.crossed_column([color, 'city'], hash_bucket_size=50000)
  linear = [color, city, cross, age, price]
  deep = [fc.embedding_column(color, 8), fc.embedding_column(city, 32),
          fc.embedding_column(item, 64), age, price]
  return linear, deep


def wide_deep_model_fn(features, labels, mode, params):
  """linear_model + input_layer DNN 1024-512-256, summed logits."""
  linear_columns, deep_columns = _columns()
  with tf1.variable_scope('linear'):
    linear_logits = tf1.feature_column.linear_model(features, linear_columns)
  with tf1.variable_scope('dnn'):
    net = tf1.feature_column.input_layer(features, deep_columns)
    for index, width in enumerate([1024, 512, 256]):
      net = tf1.layers.dense(net, width, activation=tf.nn.relu,
                             name='hidden_{}'.format(index))
    dnn_logits = tf1.layers.dense(net, 1, name='logits')
  loss = tf1.losses.sigmoid_cross_entropy(labels, linear_logits + dnn_logits)
  return _spec(mode, loss, params)


def wide_deep_input(batch):
  """A features dict of strings and floats, labels `[batch, 1]` in {0, 1}."""
  def strings(vocab_size, prefix):
    ids = tf1.random.uniform([batch, 1], maxval=vocab_size, dtype=tf.int32)
    return tf.strings.join([prefix, tf.as_string(ids)])

  color = tf.gather(tf.constant(_COLORS),
                    tf1.random.uniform([batch, 1], maxval=len(_COLORS),
                                       dtype=tf.int32))
  features = {'color': color, 'city': strings(5000, 'city'),
              'item': strings(200000, 'item'),
              'age': tf1.random.uniform([batch, 1], maxval=90.0),
              'price': tf1.random.uniform([batch, 1], maxval=1000.0)}
  labels = tf.cast(tf1.random.uniform([batch, 1], maxval=2, dtype=tf.int32),
                   tf.float32)
  return features, labels


MODELS = {
    'resnet50': (resnet50_model_fn, resnet50_input, 64),
    'transformer': (transformer_model_fn, transformer_input, 64),
    'wide_deep': (wide_deep_model_fn, wide_deep_input, 1024),
}

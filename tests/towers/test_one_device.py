"""One device: the graph is the plain `model_fn`'s, node for node.

With a single device there is nothing to split, copy or aggregate, so
`replicate_model_fn` must add nothing to the step: a one-GPU user pays no
per-step cost for wrapping (issue 34's "one GPU against the plain Estimator"
item rests on this). The check is graph-only and works for '/gpu:0' on a
CPU-only machine: the plain `model_fn` is built under `tf.device` of the
same device (where the replicated one puts its ops), and the two GraphDefs
must be equal in every NodeDef (name, op, inputs, device, attributes,
constants). Through a real Estimator the training graph it writes
(graph.pbtxt) and the trained variables, metrics and predictions must be
equal too.
"""
import os
import re
import shutil
import tempfile

from absl.testing import parameterized
from google.protobuf import text_format
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

TRAIN = tf1.estimator.ModeKeys.TRAIN
EVAL = tf1.estimator.ModeKeys.EVAL
PREDICT = tf1.estimator.ModeKeys.PREDICT

# 10 distinct rows; batches of 4 leave a final batch of 2.
_ROWS = np.arange(10, dtype=np.float32)
_X = np.stack([np.sin(_ROWS), np.cos(0.7 * _ROWS), _ROWS / 10.0 - 0.5],
              axis=1).astype(np.float32)
_Y = (_ROWS % 3).astype(np.int64)
_W = (1.0 + _ROWS % 4).astype(np.float32)  # non-uniform weights


def _input_fn():
  return tf1.data.Dataset.from_tensor_slices(
      ({'x': _X, 'w': _W}, _Y)).batch(4)


def _model_fn(features, labels, mode, params):
  # Two same-shaped hidden layers, a moving average of the batch mean in
  # UPDATE_OPS, seeded initializers: every kind of op a copy could add.
  hidden = features['x']
  for i in range(2):
    kernel = tf1.get_variable(
        'kernel{}'.format(i), [3, 3],
        initializer=tf1.glorot_uniform_initializer(seed=i + 1))
    hidden = tf.nn.tanh(tf.matmul(hidden, kernel))
  mean = tf1.get_variable('mean', [3], initializer=tf1.zeros_initializer(),
                          trainable=False)
  logits = tf1.layers.dense(
      hidden - mean, 3,
      kernel_initializer=tf1.glorot_uniform_initializer(seed=3), name='out')
  if mode == TRAIN:
    # After the forward pass's read of `mean`, so that the step is
    # deterministic (as batch normalization's update).
    with tf.control_dependencies([logits]):
      tf1.add_to_collection(
          tf1.GraphKeys.UPDATE_OPS,
          tf1.assign_sub(mean, 0.1 * (mean - tf.reduce_mean(hidden, 0))))
  if mode == PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions={'logits': logits, 'class': tf.argmax(logits, 1)})
  loss = tf1.losses.sparse_softmax_cross_entropy(
      labels, logits, weights=features['w'])
  metrics = {'accuracy': tf1.metrics.accuracy(labels, tf.argmax(logits, 1)),
             'mean_loss': tf1.metrics.mean(loss)}
  if mode == EVAL:
    return tf1.estimator.EstimatorSpec(mode, loss=loss,
                                       eval_metric_ops=metrics)
  optimizer = (tf1.train.AdamOptimizer(0.05) if params['optimizer'] == 'adam'
               else tf1.train.GradientDescentOptimizer(0.5))
  if params['wrap']:
    optimizer = replicate.TowerOptimizer(optimizer)
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                     eval_metric_ops=metrics)


def _plain_on(device):
  def model_fn(features, labels, mode, params):
    with tf.device(device):
      return _model_fn(features, labels, mode, dict(params, wrap=False))
  return model_fn


def _canonical_names(graph_def):
  """The GraphDef with its functions' process-wide uid suffixes removed.

  TF 2's control flow (`If` in a loss's `cond`) names its branch functions
  `..._false_74`, the number a process-wide counter: two builds of one
  model differ in it and in nothing else.
  """
  graph_def = graph_def.__class__.FromString(graph_def.SerializeToString())
  names = {f.signature.name: re.sub(r'_\d+$', '', f.signature.name)
           for f in graph_def.library.function}

  def rename(node_defs):
    for node in node_defs:
      for attr in node.attr.values():
        if attr.func.name in names:
          attr.func.name = names[attr.func.name]
        for func in attr.list.func:
          func.name = names.get(func.name, func.name)

  rename(graph_def.node)
  for function in graph_def.library.function:
    function.signature.name = names[function.signature.name]
    rename(function.node_def)
  return graph_def


def _nodes(graph_def):
  """Every NodeDef and FunctionDef, serialized, for exact comparison."""
  graph_def = _canonical_names(graph_def)
  functions = sorted(f.SerializeToString(deterministic=True)
                     for f in graph_def.library.function)
  # A Saver names its temporary checkpoint files by a fresh uuid.
  return [re.sub(rb'_temp_[0-9a-f]{32}', b'_temp_',
                 node.SerializeToString(deterministic=True))
          for node in graph_def.node] + functions


class OneDeviceGraphTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.product(mode=[TRAIN, EVAL, PREDICT],
                         device=['/gpu:0', '/cpu:0'],
                         optimizer=['sgd', 'adam'])
  def test_model_fn_graph_is_the_plain_one(self, mode, device, optimizer):
    graph_defs = []
    for model_fn in (
        _plain_on(device),
        replicate.replicate_model_fn(_model_fn, devices=[device])):
      graph = tf.Graph()
      with graph.as_default():
        tf1.train.create_global_step()
        features = {'x': tf1.placeholder(tf.float32, [None, 3]),
                    'w': tf1.placeholder(tf.float32, [None])}
        labels = tf1.placeholder(tf.int64, [None])
        model_fn(features, labels, mode,
                 {'optimizer': optimizer, 'wrap': True})
      graph_defs.append(graph.as_graph_def())
    plain, wrapped = graph_defs
    self.assertGreater(len(plain.node), 20)
    # Devices as the plain model_fn's, and nothing added, moved or renamed.
    self.assertEqual([n.name for n in plain.node],
                     [n.name for n in wrapped.node])
    self.assertEqual(_nodes(plain), _nodes(wrapped))


class OneDeviceEstimatorTest(parameterized.TestCase, tf.test.TestCase):

  def _run(self, model_fn, params):
    model_dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    self.addCleanup(shutil.rmtree, model_dir, ignore_errors=True)
    estimator = tf1.estimator.Estimator(
        model_fn=model_fn, model_dir=model_dir, params=params,
        config=tf1.estimator.RunConfig(tf_random_seed=7))
    # Two epochs of 3 batches (4, 4, 2 rows): 6 steps.
    estimator.train(lambda: _input_fn().repeat(2))
    with open(os.path.join(model_dir, 'graph.pbtxt')) as f:
      graph_def = text_format.Parse(f.read(), tf1.GraphDef())
    variables = {name: estimator.get_variable_value(name)
                 for name in estimator.get_variable_names()}
    metrics = estimator.evaluate(_input_fn)
    predictions = list(estimator.predict(_input_fn))
    return graph_def, variables, metrics, predictions

  @parameterized.product(device=['/gpu:0', '/cpu:0'],
                         optimizer=['sgd', 'adam'])
  def test_trains_as_the_plain_estimator(self, device, optimizer):
    params = {'optimizer': optimizer, 'wrap': True}
    plain = self._run(_plain_on(device), params)
    wrapped = self._run(
        replicate.replicate_model_fn(_model_fn, devices=[device]), params)
    self.assertEqual(_nodes(plain[0]), _nodes(wrapped[0]))
    self.assertEqual(sorted(plain[1]), sorted(wrapped[1]))
    self.assertEqual(plain[1]['global_step'], 6)
    for name in plain[1]:
      # Same graph, same seeds, same steps: bit for bit.
      self.assertAllEqual(plain[1][name], wrapped[1][name], msg=name)
    # The moving mean moved: the update ran in both.
    self.assertNotAllClose(plain[1]['mean'], np.zeros(3))
    self.assertEqual(plain[2], wrapped[2])
    self.assertLen(wrapped[3], 10)
    for one, other in zip(plain[3], wrapped[3]):
      self.assertAllEqual(one['logits'], other['logits'])
      self.assertEqual(one['class'], other['class'])


if __name__ == '__main__':
  tf.test.main()

"""SavedModels of a replicated Estimator serve anywhere (towers/serving.py).

The export graph is the unreplicated model's: no `tower_` copies, no batch
split, no device pins; it loads in a 1-CPU session without soft placement
and answers any batch size as the unreplicated model's export does.
"""
import os

import model_testing as mt
import numpy as np
import tensorflow as tf
from test_keras_layers import _keras_model_fn
from test_keras_layers import keras_estimator
from test_keras_layers import QuietEstimatorTestCase
from test_keras_layers import train_input_fn

from replicate import _compat
from replicate._compat import tf1
from replicate.towers import serving

_SERVE = tf1.saved_model.tag_constants.SERVING


def _serving_input_fn():
  return tf1.estimator.export.build_raw_serving_input_receiver_fn(
      {'x': tf1.placeholder(tf.float32, [None, 3], name='x')})()


def _supervised_input_fn():
  return tf1.estimator.experimental.build_raw_supervised_input_receiver_fn(
      {'x': tf1.placeholder(tf.float32, [None, 3], name='x')},
      tf1.placeholder(tf.float32, [None, 1], name='y'))()


def _export(estimator, base, method='export_saved_model'):
  path = getattr(estimator, method)(base, _serving_input_fn)
  return path.decode() if isinstance(path, bytes) else path


def _serve(path, x):
  """Loads the SavedModel at `path` in a fresh graph of one CPU, no soft
  placement, and runs its serving signature on `x`."""
  graph = tf.Graph()
  config = tf1.ConfigProto(allow_soft_placement=False,
                           device_count={'CPU': 1})
  with graph.as_default(), tf1.Session(graph=graph, config=config) as sess:
    meta_graph = tf1.saved_model.loader.load(sess, [_SERVE], path)
    signature = meta_graph.signature_def['serving_default']
    fetches = {key: graph.get_tensor_by_name(info.name)
               for key, info in signature.outputs.items()}
    feed = {graph.get_tensor_by_name(signature.inputs['x'].name): x}
    return sess.run(fetches, feed), meta_graph


def _nodes(meta_graph):
  nodes = list(meta_graph.graph_def.node)
  for function in meta_graph.graph_def.library.function:
    nodes.extend(function.node_def)
  return nodes


class ExportTest(QuietEstimatorTestCase):

  def setUp(self):
    super(ExportTest, self).setUp()
    self._model_dir = os.path.join(self.get_temp_dir(), 'model')
    self._replicated = keras_estimator(self._model_dir, 4)
    self._replicated.train(train_input_fn, steps=3)
    # The same checkpoint through the unreplicated model_fn.
    self._one = keras_estimator(self._model_dir, 0)

  def test_export_serves_any_batch_on_one_cpu_like_unreplicated(self):
    base = self.get_temp_dir()
    path = _export(self._replicated, os.path.join(base, 'replicated'))
    expected_path = _export(self._one, os.path.join(base, 'one'))
    rng = np.random.RandomState(3)
    for rows in (1, 3, 8):
      x = rng.uniform(-1, 1, size=(rows, 3)).astype(np.float32)
      got, meta_graph = _serve(path, x)
      want, expected_meta_graph = _serve(expected_path, x)
      self.assertEqual(sorted(want), sorted(got))
      for key in want:
        self.assertEqual((rows, 1), got[key].shape)
        self.assertAllClose(want[key], got[key], rtol=1e-6, atol=1e-7)
    nodes = _nodes(meta_graph)
    self.assertEqual([], [n.name for n in nodes if 'tower_' in n.name])
    self.assertEqual([], [n.name for n in nodes if 'split_inputs' in n.name])
    # Pinned exactly as the unreplicated export: the model nowhere, the
    # Estimator's sharded saver on CPU:0.
    self.assertEqual(set(n.device for n in _nodes(expected_meta_graph)),
                     set(n.device for n in nodes))
    self.assertEqual([], [n.name for n in nodes if n.device and not n.name
                          .startswith('save')])

  def test_every_export_method_and_mode(self):
    base = self.get_temp_dir()
    paths = [_export(self._replicated, os.path.join(base, 'v1'),
                     'export_savedmodel')]
    all_modes = self._replicated.experimental_export_all_saved_models(
        os.path.join(base, 'all'), {
            mt.TRAIN: _supervised_input_fn,
            mt.EVAL: _supervised_input_fn,
            mt.PREDICT: _serving_input_fn,
        })
    paths.append(all_modes.decode() if isinstance(all_modes, bytes)
                 else all_modes)
    x = np.ones([1, 3], np.float32)
    expected, _ = _serve(_export(self._one, os.path.join(base, 'one')), x)
    for path in paths:
      got, _ = _serve(path, x)
      self.assertAllClose(expected['probability'], got['probability'])
      for tags in ([_SERVE], ['train'], ['eval']):
        if path == paths[0] and tags != [_SERVE]:
          continue
        with tf.Graph().as_default() as graph, tf1.Session() as sess:
          tf1.saved_model.loader.load(sess, tags, path)
          self.assertEqual([], [op.name for op in graph.get_operations()
                                if 'tower_' in op.name], tags)


class ExportGraphTest(tf.test.TestCase):

  def test_only_the_pins_of_model_fn_stay(self):
    def model_fn(features, labels, mode):
      del labels
      hidden = tf.keras.layers.Dense(4)(features['x'])
      with tf.device('/device:CPU:0'):  # the user's own pin
        logits = tf.keras.layers.Dense(1, name='logits')(hidden)
      return tf1.estimator.EstimatorSpec(mode, predictions=logits)

    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      spec = serving.build_for_export(
          model_fn, {'x': tf1.placeholder(tf.float32, [None, 3])}, None,
          mt.PREDICT, None, None, tf1.losses.Reduction.MEAN)
    self.assertEqual((None, 1), tuple(spec.predictions.shape.as_list()))
    pinned = set(op.name.split('/')[0] for op in graph.get_operations()
                 if op.device)
    self.assertEqual({'logits'}, pinned)


class ExportDetectionTest(QuietEstimatorTestCase):
  """`_compat.building_saved_model` on this TF: exports only, never
  predict()."""

  def test_true_in_exports_only(self):
    seen = []

    def model_fn(features, labels, mode, params):
      seen.append((mode, _compat.building_saved_model()))
      if mode == mt.TRAIN or mode == mt.EVAL:
        graph = tf1.get_default_graph()
        seen.append(('graph', bool(graph.get_operations())))
      return _keras_model_fn(features, labels, mode, params)

    model_dir = os.path.join(self.get_temp_dir(), 'model')
    estimator = keras_estimator(model_dir, 4, model_fn)
    estimator.train(train_input_fn, steps=1)
    estimator.evaluate(train_input_fn, steps=1)
    list(estimator.predict(
        lambda: train_input_fn().map(lambda x, y: x).take(1)))
    self.assertEqual([(mt.TRAIN, False), (mt.EVAL, False),
                      (mt.PREDICT, False)],
                     [s for s in seen if s[0] != 'graph'])
    del seen[:]
    _export(estimator, self.get_temp_dir())
    self.assertEqual([(mt.PREDICT, True)], seen)
    self.assertFalse(_compat.building_saved_model())

  def test_predict_still_splits_across_towers(self):
    graphs = []

    def model_fn(features, labels, mode, params):
      graphs.append(tf1.get_default_graph())
      return _keras_model_fn(features, labels, mode, params)

    estimator = keras_estimator(
        os.path.join(self.get_temp_dir(), 'model'), 4, model_fn)
    estimator.train(train_input_fn, steps=1)
    predictions = list(estimator.predict(
        lambda: train_input_fn().map(lambda x, y: x).take(1)))
    self.assertLen(predictions, 8)
    names = [op.name for op in graphs[-1].get_operations()]
    self.assertTrue([n for n in names if n.startswith('split_inputs')])
    self.assertTrue([n for n in names if n.startswith('tower_3/')])


if __name__ == '__main__':
  tf.test.main()

"""REPLICATED's all-reduce runs in buckets that overlap back-propagation.

Graph-only (8 GPU towers built on the CPU, nothing run): with
`AllReduceCrossTowerOps('nccl')` at its defaults, most all-reduced bytes must
not wait for the last gradient (the first layer's), every gradient byte is
all-reduced once (the ring floor), and there is one collective per bucket.
contrib's packing knobs, when given, keep contrib's meaning. Then the
numbers: buckets train as one device (hierarchical copy on virtual CPUs).
Across workers (`WorkerAllReduce`): the same buckets, as collective ops.
"""
import tempfile

from absl.testing import parameterized
import graph_metrics
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

_GPUS = ['/gpu:{}'.format(i) for i in range(8)]
# Eight dense layers of different widths; the first one small, as in most
# models (so that the gradient computed last is a small share of the bytes).
_WIDTHS = [48, 96, 160, 256, 192, 128, 64, 10]


def _dense8():
  return (graph_metrics.mlp_model_fn(_WIDTHS), lambda: tf.zeros([16, 16]),
          lambda: tf.zeros([16, 10]))


def _cnn():
  return (graph_metrics.cnn_model_fn, lambda: tf.zeros([16, 32, 32, 3]),
          lambda: tf.zeros([16], tf.int32))


_MODELS = dict(dense8=_dense8, cnn=_cnn)


def _report(model, **knobs):
  graph, size = graph_metrics.build_replicated(
      *_MODELS[model](), devices=_GPUS,
      cross_tower_ops=replicate.AllReduceCrossTowerOps('nccl', **knobs))
  return graph_metrics.overlap_report(graph, size)


class OverlapTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters('dense8', 'cnn')
  def test_defaults_overlap_back_propagation(self, model):
    report = _report(model)
    self.assertGreaterEqual(report['overlappable'], 0.75)
    self.assertAllClose(1.0, report['bytes_vs_floor'], rtol=0, atol=1e-12)
    # At most one collective per bucket: buckets of at least 1/8 of the
    # bytes (all_reduce_min_buckets) make at most 8 and an unfilled last.
    self.assertBetween(report['collectives'], 2, 9)

  @parameterized.parameters('dense8', 'cnn')
  def test_one_pack_waits_for_the_last_gradient(self, model):
    # contrib's num_packs=1, given explicitly: one collective, no overlap
    # (what the default was before the buckets).
    report = _report(model, num_packs=1)
    self.assertEqual(1, report['collectives'])
    self.assertEqual(0.0, report['overlappable'])
    self.assertAllClose(1.0, report['bytes_vs_floor'], rtol=0, atol=1e-12)

  def test_contrib_knobs_keep_their_meaning(self):
    # 8 layers: 16 variables. num_packs=0: one collective each.
    self.assertEqual(16, _report('dense8', num_packs=0)['collectives'])
    self.assertEqual(3, _report('dense8', num_packs=3)['collectives'])
    # agg_small_grads_* without num_packs: contrib's default num_packs=1.
    self.assertEqual(1, _report('dense8', agg_small_grads_max_bytes=1024)[
        'collectives'])

  def test_bucket_size_is_the_tuning_knob(self):
    # One bucket of up to 25 MiB: the ~0.6 MB model is one collective.
    with replicate.tuning_scope(replicate.Tuning(all_reduce_min_buckets=1)):
      self.assertEqual(1, _report('dense8')['collectives'])
    # One byte: a bucket per depth, so at least one per layer, at most one
    # per variable.
    with replicate.tuning_scope(replicate.Tuning(all_reduce_bucket_bytes=1)):
      self.assertBetween(_report('dense8')['collectives'], 8, 16)


def _deep_model_fn(features, labels, mode, params):
  """Six dense layers of different widths, seeded; SGD or Adam."""
  net = features['x']
  for index, width in enumerate([5, 7, 3, 6, 4, 1]):
    net = tf1.layers.dense(
        net, width, activation=tf.nn.tanh if width > 1 else None,
        kernel_initializer=tf1.glorot_uniform_initializer(seed=index + 1),
        bias_initializer=tf1.constant_initializer(0.1 * index),
        name='layer_{}'.format(index))
  loss = tf1.losses.mean_squared_error(labels, net)
  optimizer = replicate.TowerOptimizer(params['optimizer']())
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class BucketsTrainAsOneDeviceTest(parameterized.TestCase, tf.test.TestCase):

  def _train(self, params, **replicate_kwargs):
    rng = np.random.RandomState(4)
    # 16 distinct rows (a row offset per index), 4 per tower.
    x = rng.uniform(-1, 1, (16, 3)).astype(np.float32)
    x += np.arange(16, dtype=np.float32)[:, None] * 0.05
    y = (x[:, :1] * 0.5 - x[:, 1:2]).astype(np.float32)

    def input_fn():
      return tf.data.Dataset.from_tensors(({'x': x}, y)).repeat()

    model_dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    tf1.estimator.Estimator(
        replicate.replicate_model_fn(_deep_model_fn, **replicate_kwargs),
        model_dir=model_dir, params=params,
        config=tf1.estimator.RunConfig(
            session_config=replicate.testing.virtual_cpu_config(4),
            tf_random_seed=7)).train(input_fn, steps=3)
    return {name: tf1.train.load_variable(model_dir, name)
            for name, _ in tf1.train.list_variables(model_dir)}

  @parameterized.named_parameters(
      ('sgd', lambda: tf1.train.GradientDescentOptimizer(0.1)),
      ('adam', lambda: tf1.train.AdamOptimizer(0.05)))
  def test_replicated_buckets_equal_one_device(self, optimizer):
    params = {'optimizer': optimizer}
    one = self._train(params, devices=['/cpu:0'])
    # Defaults: buckets of 1/8 of the 572 bytes of gradients, several
    # (test_buckets.py); each summed by hierarchical copy.
    towers = self._train(
        params, devices=replicate.testing.virtual_cpu_devices(4),
        variable_placement=replicate.VariablePlacement.REPLICATED,
        cross_tower_ops=replicate.AllReduceCrossTowerOps('hierarchical_copy'))
    self.assertCountEqual(one, towers)
    for name, value in one.items():
      self.assertAllClose(value, towers[name], rtol=1e-5, atol=1e-6,
                          msg=name)


class WorkerBucketsTest(tf.test.TestCase):

  def test_worker_all_reduce_overlaps_and_stays_at_the_floor(self):
    devices = replicate.testing.virtual_cpu_devices(2)
    with tf.Graph().as_default() as graph:
      per_tower = []
      for index, device in enumerate(devices):
        # Each task's tower: its own copy of the 8 layers, its gradients.
        with tf1.device(device), tf1.variable_scope('tower_{}'.format(index)):
          net = tf.zeros([4, 16])
          for width in _WIDTHS:
            net = tf1.layers.dense(net, width, activation=tf.nn.relu)
          variables = tf1.trainable_variables('tower_{}/'.format(index))
          per_tower.append(list(zip(
              tf.gradients(tf.reduce_sum(net), variables), variables)))
      all_reduce = replicate.multi_worker.WorkerAllReduce(num_workers=2)
      all_reduce.batch_reduce(replicate.ReduceOp.SUM, [
          (replicate.PerDevice({d: pairs[k][0] for d, pairs in
                                zip(devices, per_tower)}), devices)
          for k in range(len(per_tower[0]))])
    size = sum(v.shape.num_elements() * 4 for _, v in per_tower[0])
    report = graph_metrics.overlap_report(graph, size)
    self.assertGreaterEqual(report['overlappable'], 0.75)
    self.assertAllClose(1.0, report['bytes_vs_floor'], rtol=0, atol=1e-12)
    self.assertBetween(report['collectives'], 2, 9)


if __name__ == '__main__':
  tf.test.main()

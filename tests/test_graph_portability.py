"""What replicate leaves in a graph loads and runs where it is not imported.

Trains a replicated MLP through a real `tf.estimator.Estimator`, then, in a
fresh Python process that never imports `replicate`, imports the latest
checkpoint's meta graph, differentiates the loss with `tf.gradients` and runs
the gradients with the checkpoint restored. A gradient override registered by
the library (an op attribute `_gradient_op_type` naming a gradient only
`import replicate` registers) fails there with a LookupError. Likewise for a
`MirroredStrategy` graph holding a `ReplicaContext.all_reduce`.
"""
import json
import os
import subprocess
import sys

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

_NUM_TOWERS = 4
_BATCH = 8

# Run by a fresh interpreter: argv = meta graph path, checkpoint prefix, loss
# tensor name, variable names (JSON). Prints {name: gradient} as JSON.
_CHILD = r'''
import json
import sys
import tensorflow as tf
tf1 = tf.compat.v1
meta_path, checkpoint, loss_name, names = sys.argv[1:5]
names = json.loads(names)
with tf.Graph().as_default() as graph:
  saver = tf1.train.import_meta_graph(meta_path)
  loss = graph.get_tensor_by_name(loss_name)
  variables = {v.op.name: v for v in tf1.trainable_variables()}
  grads = tf.gradients(loss, [variables[name] for name in names])
  with tf1.Session(config=tf1.ConfigProto(device_count={'CPU': 4})) as sess:
    saver.restore(sess, checkpoint)
    values = sess.run(grads)
assert 'replicate' not in sys.modules, 'the child imported replicate'
print(json.dumps({n: v.tolist() for n, v in zip(names, values)}))
'''

_VARIABLES = ['hidden/kernel', 'hidden/bias', 'logits/kernel', 'logits/bias']


def _features_and_labels():
  # Distinct rows; labels mixed so every tower's shard has both classes'
  # gradients of different signs.
  features, labels = mt.data(batch_size=_BATCH, seed=3)
  labels = np.array([[1], [0], [0], [1], [1], [1], [0], [0]], np.float32)
  return features, labels


def _single_device_gradients(checkpoint, rows):
  """d/dv of sum over `rows` of the per-row loss / _BATCH, on one device.

  With MEAN reduction each of the 4 towers takes 2 rows, its loss is their
  mean, scaled by 1/4 in the summed loss: the sum over rows of loss_i / 8.
  Its gradient with respect to a trainable variable collects the towers that
  read that variable: all of them when the towers share the variables, tower
  0 only (rows 0-1) when the other towers read copies of their own.
  """
  features, labels = _features_and_labels()
  weights = np.zeros([_BATCH, 1], np.float32)
  weights[rows] = 1.0
  with tf.Graph().as_default():
    mt.mlp_model_fn({'x': tf.constant(features['x'])}, tf.constant(labels),
                    mt.TRAIN, {'wrapper': lambda fn: fn()})
    logits = tf1.get_default_graph().get_tensor_by_name('logits/BiasAdd:0')
    loss = tf.reduce_sum(
        tf1.losses.sigmoid_cross_entropy(
            labels, logits, weights=weights,
            reduction=tf1.losses.Reduction.NONE)) / _BATCH
    variables = {v.op.name: v for v in tf1.trainable_variables()}
    grads = tf.gradients(loss, [variables[name] for name in _VARIABLES])
    with tf1.Session() as sess:
      for name in _VARIABLES:
        variables[name].load(tf1.train.load_variable(checkpoint, name), sess)
      return dict(zip(_VARIABLES, sess.run(grads)))


class GraphPortabilityTest(parameterized.TestCase, tf.test.TestCase):

  def _train(self, placement):
    features, labels = _features_and_labels()
    replicated = replicate.replicate_model_fn(
        mt.mlp_model_fn, loss_reduction=tf1.losses.Reduction.MEAN,
        devices=mt.cpus(_NUM_TOWERS), variable_placement=placement)
    loss_names = []

    def model_fn(features, labels, mode, params, config):
      spec = replicated(features, labels, mode, params, config)
      loss_names.append(spec.loss.name)
      return spec

    model_dir = os.path.join(self.get_temp_dir(), placement.name)
    config = tf1.estimator.RunConfig(
        model_dir=model_dir, tf_random_seed=0,
        session_config=replicate.testing.virtual_cpu_config(_NUM_TOWERS),
        save_summary_steps=None, log_step_count_steps=None)
    estimator = tf1.estimator.Estimator(model_fn, config=config, params={})
    estimator.train(lambda: ({'x': tf.constant(features['x'])},
                             tf.constant(labels)), steps=3)
    checkpoint = tf1.train.latest_checkpoint(model_dir)
    self.assertEqual(3, tf1.train.load_variable(checkpoint, 'global_step'))
    return checkpoint, loss_names[-1]

  @parameterized.named_parameters(
      ('consolidation_device', 'CONSOLIDATION_DEVICE', range(_BATCH)),
      ('replicated', 'REPLICATED', [0, 1]))
  def test_checkpoint_differentiates_without_replicate(self, placement, rows):
    checkpoint, loss_name = self._train(
        getattr(replicate.VariablePlacement, placement))
    meta_graph = tf1.MetaGraphDef()
    with open(checkpoint + '.meta', 'rb') as f:
      meta_graph.ParseFromString(f.read())
    nodes = list(meta_graph.graph_def.node)
    for function in meta_graph.graph_def.library.function:
      nodes.extend(function.node_def)
    self.assertEqual(
        [], [n.name for n in nodes if '_gradient_op_type' in n.attr])

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', CUDA_VISIBLE_DEVICES='')
    env.pop('PYTHONPATH', None)
    result = subprocess.run(
        [sys.executable, '-c', _CHILD, checkpoint + '.meta', checkpoint,
         loss_name, json.dumps(_VARIABLES)],
        cwd=self.get_temp_dir(), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    self.assertEqual(0, result.returncode, result.stderr[-3000:])
    grads = json.loads(result.stdout.strip().splitlines()[-1])
    expected = _single_device_gradients(checkpoint, list(rows))
    for name in _VARIABLES:
      self.assertAllClose(expected[name], grads[name], rtol=1e-5, atol=1e-7,
                          msg=name)
      self.assertGreater(np.abs(expected[name]).max(), 1e-4, name)


# Run by a fresh interpreter: argv = meta graph path, loss tensor name,
# variable op names and their initializers' (JSON; each replica's copy of the
# mirrored variable, which only replica 0's is in the collections).
# Prints the gradient of the loss with respect to each, as a JSON list.
_MIRRORED_CHILD = r'''
import json
import sys
import tensorflow as tf
tf1 = tf.compat.v1
meta_path, loss_name, names, inits = sys.argv[1:5]
with tf.Graph().as_default() as graph:
  tf1.train.import_meta_graph(meta_path)
  loss = graph.get_tensor_by_name(loss_name)
  handles = [graph.get_operation_by_name(name).outputs[0]
             for name in json.loads(names)]
  grads = tf.gradients(loss, handles)
  with tf1.Session(config=tf1.ConfigProto(device_count={'CPU': 2})) as sess:
    sess.run([graph.get_operation_by_name(name) for name in json.loads(inits)])
    values = sess.run(grads)
assert 'replicate' not in sys.modules, 'the child imported replicate'
print(json.dumps([v.tolist() for v in values]))
'''


class MirroredAllReducePortabilityTest(tf.test.TestCase):

  def test_all_reduce_differentiates_without_replicate(self):
    # Replica i: y_i = x_i * w (its copy of w), x_i = (i + 1) * [1, 2];
    # z = all-sum of the y_i; loss_i = c_i * sum(z), c_i = i + 1. Inside the
    # replicas each one differentiates its own loss through the all-reduce's
    # own gradient (the all-sum of the replicas' output gradients, c_0 + c_1
    # = 3): d loss_i / d w_i = 3 * x_i = [3, 6], [6, 12]. In a process that
    # never imported replicate the graph is plain TF: the gradient of the
    # whole graph's loss (sum_i loss_i) with respect to w_i is, again,
    # x_i * sum_j c_j.
    strategy = replicate.MirroredStrategy(
        replicate.testing.virtual_cpu_devices(2))

    def fn():
      i = float(replicate.get_replica_context().replica_id_in_sync_group)
      y = tf.constant([1.0, 2.0]) * (i + 1.0) * weights
      z = replicate.get_replica_context().all_reduce(
          replicate.ReduceOp.SUM, y)
      loss = (i + 1.0) * tf.reduce_sum(z)
      return loss, tf.gradients(loss, weights)[0]

    with tf.Graph().as_default() as graph:
      with strategy.scope():
        weights = tf1.get_variable(
            'w', [2], initializer=tf1.constant_initializer([3.0, 5.0]))
        losses, grads = strategy.experimental_run_v2(fn)
      total = tf.add_n(list(strategy.unwrap(losses)), name='total_loss')
      names = [copy.op.name for copy in strategy.unwrap(weights)]
      inits = [copy.initializer.name for copy in strategy.unwrap(weights)]
      self.assertEqual(['w', 'w/replica_1'], names)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as sess:
        sess.run(tf1.global_variables_initializer())
        self.assertAllClose([[3.0, 6.0], [6.0, 12.0]],
                            sess.run(list(strategy.unwrap(grads))))
      meta_path = os.path.join(self.get_temp_dir(), 'mirrored.meta')
      tf1.train.export_meta_graph(meta_path, graph=graph)
      self.assertEqual([], [op.name for op in graph.get_operations()
                            if '_gradient_op_type' in op.node_def.attr])

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', CUDA_VISIBLE_DEVICES='')
    env.pop('PYTHONPATH', None)
    result = subprocess.run(
        [sys.executable, '-c', _MIRRORED_CHILD, meta_path, total.name,
         json.dumps(names), json.dumps(inits)],
        cwd=self.get_temp_dir(), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    self.assertEqual(0, result.returncode, result.stderr[-3000:])
    self.assertAllClose([[3.0, 6.0], [6.0, 12.0]],
                        json.loads(result.stdout.strip().splitlines()[-1]))


def _registered_gradients():
  """The names in TF's gradient registry (TF-private, read by tests only)."""
  from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
  return set(ops._gradient_registry.list())  # pylint: disable=protected-access


class GradientRegistryTest(tf.test.TestCase):
  """Nothing the library registers with TF outlives the call that needs it."""

  def test_import_registers_no_gradient(self):
    child = ('from tensorflow.python.framework import ops\n'
             'before = set(ops._gradient_registry.list())\n'
             'import replicate\n'
             'print(sorted(set(ops._gradient_registry.list()) - before))\n')
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', CUDA_VISIBLE_DEVICES='')
    result = subprocess.run(
        [sys.executable, '-c', child], cwd=self.get_temp_dir(), env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=300)
    self.assertEqual(0, result.returncode, result.stderr[-3000:])
    self.assertEqual('[]', result.stdout.strip().splitlines()[-1])

  def test_all_reduce_gradient_is_registered_for_the_run_only(self):
    # Replica i: y_i = (i + 1) * w_i; z = all-reduce of the y_i;
    # loss_i = (i + 1) * z. Inside the run d loss_i / d w_i is (i + 1) times
    # the all-reduce of the output gradients (1, 2): SUM 3 -> [3, 6],
    # MEAN 1.5 -> [1.5, 3].
    strategy = replicate.MirroredStrategy(
        replicate.testing.virtual_cpu_devices(2))
    before = _registered_gradients()
    for reduce_op, expected in ((replicate.ReduceOp.SUM, [3.0, 6.0]),
                                (replicate.ReduceOp.MEAN, [1.5, 3.0])):

      def fn(reduce_op=reduce_op):
        scale = 1.0 + tf.cast(
            replicate.get_replica_context().replica_id_in_sync_group,
            tf.float32)
        z = replicate.get_replica_context().all_reduce(
            reduce_op, scale * weights)
        self.assertGreater(len(_registered_gradients() - before), 0)
        return tf.gradients(scale * z, weights)[0]

      with tf.Graph().as_default():
        with strategy.scope():
          weights = tf1.get_variable('w', [], initializer=tf1.ones_initializer())
          grads = strategy.experimental_run_v2(fn)
        self.assertEqual(before, _registered_gradients())
        with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as sess:
          sess.run(tf1.global_variables_initializer())
          self.assertAllClose(expected, sess.run(list(strategy.unwrap(grads))))

  def test_a_failed_run_unregisters_too(self):
    strategy = replicate.MirroredStrategy(
        replicate.testing.virtual_cpu_devices(2))
    before = _registered_gradients()

    def fn():
      replicate.get_replica_context().all_reduce(
          replicate.ReduceOp.SUM, tf.constant(1.0))
      raise ValueError('replica function failed')

    with tf.Graph().as_default():
      with strategy.scope():
        with self.assertRaisesRegex(ValueError, 'replica function failed'):
          strategy.experimental_run_v2(fn)
    self.assertEqual(before, _registered_gradients())


if __name__ == '__main__':
  tf.test.main()

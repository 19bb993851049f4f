"""Tests that fail on wrong results the rest of the suite let through.

Each test here guards against a one-line change of the library that gave a
wrong result and still passed every other test:

* PREDICT: export outputs (classes included) and predictions merged out of
  tower order, or copied towers exporting tower 0's outputs. The data are
  distinct per row (classes spelled from each row's id), compared row by row
  with one device.
* Placement of `/gpu:N` towers: variables and gradient sums on `/device:CPU:0`
  (not GPU:0), tower `i`'s ops on GPU:i; under `REPLICATED` each tower's copies
  on its own GPU. Graph only: no GPU is needed to build for GPU names.
* fp16 compression: what crosses devices between the towers' gradients and
  the update (the all-reduce's inputs and outputs under `REPLICATED`, the
  tower-to-consolidation-device transfers otherwise) is float16, and the
  update applies float32.
* Gradient scale: training compared with contrib (TF 1.15) under SGD and
  Momentum, whose steps, unlike Adam's, change with the gradient's scale.
"""
from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.core import device_util

_NUM_TOWERS = 4
_GPUS = ['/gpu:{}'.format(i) for i in range(_NUM_TOWERS)]
_REPLICATED = replicate.VariablePlacement.REPLICATED
# Row ids in no order, so that rows out of order or repeated show.
_IDS = np.array([5, 2, 7, 0, 3, 6, 1, 4], np.int64)


def _canonical(device):
  return device_util.canonicalize(device)


def _predict_model_fn(features, labels, mode, params):
  """Scores from a dense layer; classes spelled from each row's id.

  Row r with id d has classes [b'c0-d', b'c1-d', b'c2-d']: a row of another
  tower, or of another position, has other strings.
  """
  del labels, params
  # Kernel and bias of distinct values (constants: a REPLICATED copy starts
  # equal to tower 0's even before its sync hook runs).
  kernel = np.arange(6, dtype=np.float32).reshape(2, 3) / 10 - 0.2
  logits = tf1.layers.dense(
      features['x'], 3, name='logits',
      kernel_initializer=tf1.constant_initializer(kernel),
      bias_initializer=tf1.constant_initializer([0.1, -0.2, 0.3]))
  scores = tf.nn.softmax(logits)
  ids = tf.as_string(features['id'])
  classes = tf.stack(
      [tf.strings.join(['c{}-'.format(k), ids]) for k in range(3)], axis=1)
  predictions = {'logits': logits, 'classes': classes, 'id': features['id']}
  return tf1.estimator.EstimatorSpec(
      mode, predictions=predictions,
      export_outputs={
          'serving_default': tf1.estimator.export.ClassificationOutput(
              scores=scores, classes=classes),
          'regression': tf1.estimator.export.RegressionOutput(
              logits[:, :1]),
          'predict': tf1.estimator.export.PredictOutput(
              {'logits': logits, 'first_class': classes[:, 0]}),
      })


def _predict(devices, **kwargs):
  """Predictions and export outputs of `_predict_model_fn` on `_IDS`."""
  x = np.stack([_IDS * 0.25 - 1.0, np.sin(_IDS.astype(np.float32))],
               axis=1).astype(np.float32)
  with tf.Graph().as_default():
    spec = replicate.replicate_model_fn(
        _predict_model_fn, devices=devices, **kwargs)(
            {'x': tf.constant(x), 'id': tf.constant(_IDS)}, None,
            mt.PREDICT, {}, None)
    classification = spec.export_outputs['serving_default']
    fetches = {
        'predictions': spec.predictions,
        'scores': classification.scores,
        'classes': classification.classes,
        'regression': spec.export_outputs['regression'].value,
        'predict': spec.export_outputs['predict'].outputs,
    }
    with tf1.Session(config=replicate.testing.virtual_cpu_config(
        _NUM_TOWERS)) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      for hook in spec.prediction_hooks or ():
        hook.after_create_session(sess, None)  # REPLICATED: sync the copies
      return sess.run(fetches)


class PredictRowOrderTest(tf.test.TestCase, parameterized.TestCase):
  """Merged PREDICT outputs are one device's, row by row, in input order."""

  @parameterized.named_parameters(
      ('copies', {}),
      ('call_per_tower', {'tower_build': replicate.TowerBuild.CALL_PER_TOWER}),
      ('replicated', {'variable_placement': _REPLICATED}),
  )
  def test_outputs_in_input_order(self, kwargs):
    one = _predict(['/cpu:0'])
    towers = _predict(mt.cpus(_NUM_TOWERS), **kwargs)
    # Rows of 4 towers of 2: tower t has input rows 2t and 2t+1.
    expected_classes = [[('c{}-{}'.format(k, i)).encode() for k in range(3)]
                        for i in _IDS]
    self.assertAllEqual(expected_classes, one['classes'])
    self.assertAllEqual(expected_classes, towers['classes'])
    self.assertAllEqual(_IDS, towers['predictions']['id'])
    self.assertAllEqual(expected_classes, towers['predictions']['classes'])
    self.assertAllEqual([c[0] for c in expected_classes],
                        towers['predict']['first_class'])
    # Scores differ per row (x depends on the row's id): equal rows only if
    # the rows are the same, in the same order.
    self.assertEqual(8, len(set(np.round(one['scores'][:, 0], 6))))
    for key in ('scores', 'regression'):
      self.assertAllClose(one[key], towers[key], rtol=1e-6, atol=1e-7,
                          msg=key)
    self.assertAllClose(one['predictions']['logits'],
                        towers['predictions']['logits'], rtol=1e-6, atol=1e-7)
    self.assertAllClose(one['predict']['logits'], towers['predict']['logits'],
                        rtol=1e-6, atol=1e-7)


def _build_train(devices, compression=None, **kwargs):
  """A TRAIN graph of `mt.mlp_model_fn` (SGD) for `devices`; not run."""
  features, labels = mt.data(batch_size=8)
  params = {}
  if compression is not None:
    params['wrapper'] = lambda opt: replicate.TowerOptimizer(
        opt, compression=compression)
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    replicate.replicate_model_fn(mt.mlp_model_fn, devices=devices, **kwargs)(
        {'x': tf.constant(features['x'])}, tf.constant(labels), mt.TRAIN,
        params, None)
  return graph


def _apply_ops(graph):
  return [op for op in graph.get_operations()
          if op.type in ('ApplyGradientDescent',
                         'ResourceApplyGradientDescent')]


def _gradient_of(apply_op):
  """The gradient an `(Resource)ApplyGradientDescent` applies: its `delta`."""
  return apply_op.inputs[2]


def _tower_of(name):
  """The tower id of an op name: `tower_<i>/...` is i; anything else 0."""
  head = name.split('/')[0]
  if head.startswith('tower_') and head[len('tower_'):].isdigit():
    return int(head[len('tower_'):])
  return 0


class GpuPlacementTest(tf.test.TestCase):
  """Where `/gpu:N` towers put variables, tower ops and gradient sums."""

  def test_consolidated_on_cpu0(self):
    graph = _build_train(_GPUS)
    cpu0 = _canonical('/device:CPU:0')
    gpus = [_canonical('/device:GPU:{}'.format(i)) for i in range(4)]
    with graph.as_default():
      variables = [v for v in tf1.global_variables()
                   if v.op.name != 'global_step']  # made by the test, outside
    self.assertLen(variables, 4)
    for variable in variables:
      self.assertEqual(cpu0, _canonical(variable.device), variable.op.name)
    ops = {op.name: op for op in graph.get_operations()}
    # Tower i (i > 0) runs under tower_<i>/ on GPU:i: every op of it.
    for tower_id in range(1, _NUM_TOWERS):
      scope = 'tower_{}/'.format(tower_id)
      tower_ops = [op for name, op in ops.items() if name.startswith(scope)]
      self.assertGreater(len(tower_ops), 20)
      for op in tower_ops:
        self.assertEqual(gpus[tower_id], _canonical(op.device), op.name)
    # Tower 0's forward and backward ops (those the copies repeat) on GPU:0.
    tower0 = [ops[name[len('tower_1/'):]] for name in ops
              if name.startswith('tower_1/') and name[len('tower_1/'):] in ops]
    self.assertGreater(len(tower0), 20)
    for name in ('hidden/MatMul', 'logits/MatMul',
                 'gradients/hidden/MatMul_grad/MatMul_1'):
      self.assertIn(ops[name], tower0)
    for op in tower0:
      self.assertEqual(gpus[0], _canonical(op.device), op.name)
    # The gradient sums: from each applied gradient back to the towers'
    # gradients, every op on CPU:0, and the sums read all four GPUs.
    applies = _apply_ops(graph)
    self.assertLen(applies, 4)
    for apply_op in applies:
      self.assertEqual(cpu0, _canonical(apply_op.device), apply_op.name)
      sums, sources = _region_on(_gradient_of(apply_op).op, cpu0)
      self.assertIn('AddN', [op.type for op in sums], apply_op.name)
      self.assertCountEqual(
          gpus, set(_canonical(t.op.device) for t in sources), apply_op.name)

  def test_replicated_copies_on_their_gpus(self):
    graph = _build_train(_GPUS, variable_placement=_REPLICATED)
    gpus = [_canonical('/device:GPU:{}'.format(i)) for i in range(4)]
    with graph.as_default():
      trainable = {v.op.name: v for v in tf1.trainable_variables()}
      local = {v.op.name: v for v in tf1.local_variables()}
    self.assertCountEqual(
        ['hidden/kernel', 'hidden/bias', 'logits/kernel', 'logits/bias'],
        trainable)
    for name, variable in trainable.items():
      self.assertEqual(gpus[0], _canonical(variable.device), name)
      for tower_id in range(1, _NUM_TOWERS):
        copy = local['tower_{}/{}'.format(tower_id, name)]
        self.assertEqual(gpus[tower_id], _canonical(copy.device), copy.op.name)
    # Each copy is updated on its GPU, with a sum delivered to that GPU.
    applies = _apply_ops(graph)
    self.assertLen(applies, 4 * _NUM_TOWERS)
    for apply_op in applies:
      variable = apply_op.inputs[0].op.name
      tower_id = _tower_of(variable)
      self.assertEqual(gpus[tower_id], _canonical(apply_op.device),
                       apply_op.name)
      self.assertEqual(gpus[tower_id],
                       _canonical(_gradient_of(apply_op).device),
                       apply_op.name)
    # Tower i's ops (those placed) on GPU:i.
    for op in graph.get_operations():
      tower_id = _tower_of(op.name)
      if tower_id and op.device:
        self.assertEqual(gpus[tower_id], _canonical(op.device), op.name)


def _region_on(op, device):
  """The ops `op` depends on through data edges while they stay on `device`.

  Returns:
    `(ops on device, tensors entering them from other devices)`.
  """
  region, sources, pending = set(), [], [op]
  while pending:
    current = pending.pop()
    if current in region:
      continue
    region.add(current)
    for tensor in current.inputs:
      if not tensor.op.device:
        continue  # an unplaced constant (e.g. a split's sizes)
      if _canonical(tensor.op.device) == device:
        pending.append(tensor.op)
      else:
        sources.append(tensor)
  return region, sources


def _is_compression(op):
  return op.type == 'Cast' and op.get_attr('DstT') == tf.float16


def _crossings(apply_op):
  """Tensors crossing devices between the towers' compression and the update.

  Walks back from the applied gradient through data edges, and stops at the
  casts to float16 (the compression); without compression the walk reaches
  the towers' own ops, whose gradients then cross in float32.
  """
  crossings, seen, pending = [], set(), [apply_op]
  while pending:
    op = pending.pop()
    if op in seen:
      continue
    seen.add(op)
    inputs = op.inputs[2:3] if op is apply_op else op.inputs
    for tensor in inputs:
      if (tensor.op.device and op.device and
          _canonical(tensor.op.device) != _canonical(op.device)):
        crossings.append(tensor)
      if not _is_compression(tensor.op):
        pending.append(tensor.op)
  return crossings


class CompressionOnTheWireTest(tf.test.TestCase, parameterized.TestCase):
  """Under fp16 compression only float16 gradients cross devices."""

  def _assert_float16_crossings_and_float32_updates(self, graph, num_applies):
    applies = _apply_ops(graph)
    self.assertLen(applies, num_applies)
    for apply_op in applies:
      gradient = _gradient_of(apply_op)
      # The update applies float32, cast back from the float16 sum.
      self.assertEqual(tf.float32, gradient.dtype.base_dtype, apply_op.name)
      self.assertEqual('Cast', gradient.op.type, apply_op.name)
      self.assertEqual(tf.float16, gradient.op.inputs[0].dtype, apply_op.name)
      crossings = _crossings(apply_op)
      self.assertNotEmpty(crossings, apply_op.name)
      for tensor in crossings:
        self.assertEqual(tf.float16, tensor.dtype,
                         '{} -> {}'.format(tensor.name, apply_op.name))

  @parameterized.named_parameters(('cpus', 'cpus'), ('gpus', 'gpus'))
  def test_replicated_all_reduces_float16(self, kind):
    devices = mt.cpus(_NUM_TOWERS) if kind == 'cpus' else _GPUS
    graph = _build_train(devices, compression=replicate.Compression.fp16,
                         variable_placement=_REPLICATED)
    self._assert_float16_crossings_and_float32_updates(graph, 4 * _NUM_TOWERS)

  @parameterized.named_parameters(('cpus', 'cpus'), ('gpus', 'gpus'))
  def test_replicated_all_reduce_receives_float16(self, kind):
    # What the all-reduce (a CrossTowerOps' batch_reduce) is handed: every
    # tower's value of every gradient is float16.
    received = []

    class Recording(replicate.ReductionToOneDevice):

      def batch_reduce(self, aggregation, value_destination_pairs):
        for value, _ in value_destination_pairs:
          received.extend(value.values)
        return super(Recording, self).batch_reduce(aggregation,
                                                   value_destination_pairs)

    devices = mt.cpus(_NUM_TOWERS) if kind == 'cpus' else _GPUS
    graph = _build_train(devices, compression=replicate.Compression.fp16,
                         variable_placement=_REPLICATED,
                         cross_tower_ops=Recording())
    # 4 variables (2 kernels, 2 biases), one value per tower.
    self.assertLen(received, 4 * _NUM_TOWERS)
    for tensor in received:
      self.assertEqual(tf.float16, tensor.dtype, tensor.name)
    self._assert_float16_crossings_and_float32_updates(graph, 4 * _NUM_TOWERS)

  @parameterized.named_parameters(('cpus', 'cpus'), ('gpus', 'gpus'))
  def test_consolidated_sends_float16(self, kind):
    devices = mt.cpus(_NUM_TOWERS) if kind == 'cpus' else _GPUS
    graph = _build_train(devices, compression=replicate.Compression.fp16)
    self._assert_float16_crossings_and_float32_updates(graph, 4)


class ContribGradientScaleTest(tf.test.TestCase, parameterized.TestCase):
  """TF 1.15's contrib as the oracle, with optimizers that see the scale.

  The oracle tests in tests/oracle train with Adam, whose step does not
  change when every gradient is scaled by the same factor: a sum off by
  1/N (or N) matches contrib there. SGD's and Momentum's steps are
  proportional to the gradient.
  """

  @parameterized.named_parameters(
      (reduction_name + '_' + optimizer, reduction, optimizer)
      for reduction_name, reduction in (
          ('mean', tf1.losses.Reduction.MEAN),
          ('sum', tf1.losses.Reduction.SUM))
      for optimizer in ('sgd', 'momentum'))
  def test_same_variables_as_contrib(self, reduction, optimizer):
    if not hasattr(tf, 'contrib'):
      self.skipTest('tf.contrib (the reference) exists only in TF 1.x')
    contrib = tf.contrib.estimator  # pylint: disable=no-member
    optimizer_fn = {
        'sgd': lambda: tf1.train.GradientDescentOptimizer(0.5),
        'momentum': lambda: tf1.train.MomentumOptimizer(0.3, 0.9),
    }[optimizer]
    features, labels = mt.data(batch_size=8)
    results = [
        mt.train_variables(
            mt.mlp_model_fn, features, labels, mt.cpus(_NUM_TOWERS), steps=3,
            loss_reduction=reduction, replicate_fn=replicate_fn,
            params={'wrapper': wrapper, 'optimizer_fn': optimizer_fn,
                    'reduction': reduction})
        for replicate_fn, wrapper in (
            (replicate.replicate_model_fn, replicate.TowerOptimizer),
            (contrib.replicate_model_fn, contrib.TowerOptimizer))]
    ours, theirs = results
    self.assertEqual(sorted(theirs), sorted(ours))
    for name in theirs:
      self.assertAllClose(theirs[name], ours[name], rtol=1e-5, atol=1e-6,
                          msg=name)


if __name__ == '__main__':
  tf.test.main()

"""Towers and replicas compute TF's own gradients, summed per variable (no
product fused across towers). Replicas gate them with TF's own
`gate_gradients`; towers carry out `GATE_OP` with one barrier per tower that
every update waits for (gradient_gating.py)."""
import collections
import contextlib
import functools

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import IS_TF2
from replicate._compat import tf1

# 384 x 384 float32 = 576 KB: the middle layer's kernel gradient is larger
# than any pack (Tuning.pack_max_bytes, 256 KB), so it is summed alone (it
# used to be fused across CPU towers into one product); the others are small.
WIDTH = 384


def _wide_model_fn(features, labels, mode, params):
  """16 -> 384 -> 384 -> 1 MLP; params pick the optimizer, gating, transpose."""
  x = tf1.layers.dense(
      features['x'], WIDTH, activation=tf.nn.relu,
      kernel_initializer=tf1.glorot_uniform_initializer(seed=1), name='in')
  if params.get('transpose'):
    # y = x . W^T: the kernel's gradient is matmul(dY, x, transpose_a=True).
    kernel = tf1.get_variable(
        'middle/kernel', [WIDTH, WIDTH],
        initializer=tf1.glorot_uniform_initializer(seed=2))
    x = tf.nn.relu(tf1.matmul(x, kernel, transpose_b=True))
  else:
    x = tf1.layers.dense(
        x, WIDTH, activation=tf.nn.relu,
        kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
        name='middle')
  logits = tf1.layers.dense(
      x, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=3),
      name='logits')
  loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
  # A MirroredStrategy replica scales its loss to the global batch itself.
  scaled_loss = loss * params.get('loss_scale', 1.0)
  optimizer = params.get('wrapper', replicate.TowerOptimizer)(
      params.get('optimizer_fn',
                 lambda: tf1.train.GradientDescentOptimizer(0.5)))
  train_op = optimizer.minimize(
      scaled_loss, tf1.train.get_global_step(),
      gate_gradients=params.get('gate', tf1.train.Optimizer.GATE_OP))
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _data(batch_size=8):
  return mt.data(batch_size=batch_size, num_features=16)


def _build(graph, devices, params, tower_build=replicate.TowerBuild.CLONE,
           model_fn=None, **kwargs):
  """Builds the replicated train_op of `model_fn` (`_wide_model_fn` by
  default) in `graph`; returns the EstimatorSpec."""
  features, labels = _data()
  with graph.as_default():
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    return replicate.replicate_model_fn(
        model_fn or _wide_model_fn, devices=devices, tower_build=tower_build,
        **kwargs)({'x': tf.constant(features['x'])}, tf.constant(labels),
                  mt.TRAIN, params)


def _reads_of(graph, variable):
  """The tensors that read `variable` (a reference or resource variable)."""
  return [t for op in graph.get_operations()
          if op.type in ('Identity', 'ReadVariableOp') and op.inputs and
          op.inputs[0].op is variable.op for t in op.outputs]


# Ops whose output may be the variable's own buffer on CPU: a reference
# variable's snapshot, and a reshape or an identity-permutation transpose.
_ALIASING_OP_TYPES = ('Identity', 'ReadVariableOp', 'Transpose', 'Reshape')


def _backward_readers(variable):
  """The gradient ops that read `variable`, directly or through aliases."""
  aliases = [variable.op]
  readers = []
  for op in aliases:
    for tensor in op.outputs:
      for consumer in tensor.consumers():
        if 'gradients' in consumer.name:
          if consumer not in readers:
            readers.append(consumer)
        elif consumer.type in _ALIASING_OP_TYPES and consumer not in aliases:
          aliases.append(consumer)
  return readers


def _ops_its_update_needs(graph, variable):
  """Names of the ops the one SGD update of `variable` depends on."""
  apply_ops = [op for op in graph.get_operations()
               if op.type.endswith('ApplyGradientDescent') and
               op.inputs[0].op is variable.op]
  assert len(apply_ops) == 1, (variable.op.name, apply_ops)
  return mt.ancestors(apply_ops)


def _tuple_gates(graph):
  """The identities of GATE_OP's `tuple`s (TF's `control_dependency`)."""
  return [op for op in graph.get_operations()
          if op.type == 'Identity' and '/tuple/control_dependency' in op.name]


def _fused_ops(graph):
  """What the CPU-only rewrites built: fused products, one-thread copies."""
  return [op for op in graph.get_operations()
          if op.type == 'DynamicStitch' or 'fused_gradient' in op.name]


_OPTIMIZER_FNS = {
    'sgd': lambda: tf1.train.GradientDescentOptimizer(0.5),
    'adam': lambda: tf1.train.AdamOptimizer(0.01),
    'sync': lambda: tf1.train.SyncReplicasOptimizer(
        tf1.train.GradientDescentOptimizer(0.5), replicas_to_aggregate=1,
        total_num_replicas=1),
}


def _one_device_variables(params):
  """The variables after training `_wide_model_fn` unreplicated."""
  features, labels = _data()
  return mt.train_variables(_wide_model_fn, features, labels, mt.cpus(1),
                            params=params)


def _assert_each_tower_product_is_summed(test, graph, train_op, count):
  """`count` per-device [WIDTH, WIDTH] weight-gradient products (TF's
  `MatMul` gradient, one per tower) exist, each on its tower's device, all
  added by one `AddN` that `train_op` needs; nothing fused or stitched."""
  test.assertEmpty([op.name for op in _fused_ops(graph)])
  needed = mt.ancestors([train_op])
  products = [
      op for op in graph.get_operations()
      if op.type == 'MatMul' and 'gradients' in op.name and
      op.outputs[0].shape.as_list() == [WIDTH, WIDTH]]
  test.assertLen(products, count)
  test.assertEqual(sorted('CPU:{}'.format(i) for i in range(count)),
                   sorted(op.device[-5:] for op in products))
  test.assertFalse([op.name for op in products if op.name not in needed])
  sums = set()
  for product in products:
    consumer = product.outputs[0]
    # Through the gate (an identity) to the sum.
    while consumer.op.type != 'AddN':
      (consumer_op,) = consumer.consumers()
      consumer = consumer_op.outputs[0]
    sums.add(consumer.op.name)
  test.assertLen(sums, 1)


def _assert_same_variables(test, expected, actual, atol=1e-6):
  """Same variable names, and values equal within float rounding."""
  test.assertEqual(sorted(expected), sorted(actual))
  for name in expected:
    test.assertAllClose(expected[name], actual[name], rtol=1e-5, atol=atol,
                        msg=name)


class TowerGradientsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('sgd_2', 'sgd', False, 2),
      ('sgd_4', 'sgd', False, 4),
      ('adam_4', 'adam', False, 4),
      ('sgd_transpose_4', 'sgd', True, 4),
      ('adam_transpose_2', 'adam', True, 2),
  )
  def test_matches_one_device(self, optimizer, transpose, num_towers):
    features, labels = _data()
    params = {'optimizer_fn': _OPTIMIZER_FNS[optimizer],
              'transpose': transpose}
    actual = mt.train_variables(_wide_model_fn, features, labels,
                                mt.cpus(num_towers), params=params)
    # Adam scales each element's step by 1 / (sqrt(v) + eps): where a
    # gradient element is ~0 (rounding noise) the order of the sum (the
    # towers' products added vs. one product over the batch) moves it by up
    # to ~lr * 1e-3.
    _assert_same_variables(self, _one_device_variables(params), actual,
                           atol=2e-5 if optimizer == 'adam' else 1e-6)

  @parameterized.named_parameters(('cloned', replicate.TowerBuild.CLONE),
                                  ('per_tower',
                                   replicate.TowerBuild.CALL_PER_TOWER))
  def test_large_weights_with_sgd_equal_one_device(self, tower_build):
    # SGD's step is linear in the gradient: 3 steps of lr 0.5 on the sum of
    # 4 towers' TF MatMul gradients (2 rows each) equal one device's on the
    # 8 rows within float32 rounding of the sums' order.
    features, labels = _data()
    expected = _one_device_variables({})
    actual = mt.train_variables(
        _wide_model_fn, features, labels, mt.cpus(4), params={},
        replicate_fn=functools.partial(replicate.replicate_model_fn,
                                       tower_build=tower_build))
    self.assertEqual(sorted(expected), sorted(actual))
    for name in expected:
      self.assertAllClose(expected[name], actual[name], rtol=1e-6, atol=1e-7,
                          msg=name)

  @parameterized.named_parameters(('cloned', replicate.TowerBuild.CLONE),
                                  ('per_tower',
                                   replicate.TowerBuild.CALL_PER_TOWER))
  def test_towers_compute_and_sum_their_own_weight_gradients(
      self, tower_build):
    graph = tf.Graph()
    spec = _build(graph, mt.cpus(4), {}, tower_build)
    # Each tower's [384, 384] product (TF's MatMul gradient of the middle
    # kernel) is in the step and summed; no product over the towers' inputs
    # concatenated, no DynamicStitch copy.
    _assert_each_tower_product_is_summed(
        self, graph, spec.train_op.op if hasattr(spec.train_op, 'op')
        else spec.train_op, 4)

  def test_deep_model_has_no_cpu_only_rewrite(self):
    # 20 layers of 64: the 20 kernel reads (16 KB each) used to be copied to
    # the towers in one DynamicStitch pack, the gradients summed in packs
    # sized for one CPU thread. Now: TF's ConcatV2 packs of Tuning's sizes.
    def model_fn(features, labels, mode, params):
      del params
      x = features['x']
      for i in range(20):
        x = tf1.layers.dense(
            x, 64, activation=tf.nn.relu, name='layer_{}'.format(i),
            kernel_initializer=tf1.glorot_uniform_initializer(seed=i))
      logits = tf1.layers.dense(x, 1, name='logits')
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    features, labels = _data()
    graph = tf.Graph()
    with graph.as_default():
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(model_fn, devices=mt.cpus(4))(
          {'x': tf.constant(features['x'])}, tf.constant(labels), mt.TRAIN,
          None)
    self.assertEmpty([op.name for op in _fused_ops(graph)])
    self.assertFalse([op.name for op in graph.get_operations()
                      if 'packed_reads' in op.name])

  @parameterized.named_parameters(
      ('cloned', False, replicate.TowerBuild.CLONE),
      ('transposed_cloned', True, replicate.TowerBuild.CLONE),
      ('per_tower', False, replicate.TowerBuild.CALL_PER_TOWER),
      ('transposed_per_tower', True, replicate.TowerBuild.CALL_PER_TOWER))
  def test_updates_wait_for_every_backward_read_of_their_variable(
      self, transpose, tower_build):
    # What GATE_OP guarantees: no update of W while a gradient op still
    # reads W (e.g. dX = dY . W^T). Every such reader, in every tower
    # (copies read the shared variable as a per-tower call does), must come
    # before the op that applies W's gradient.
    graph = tf.Graph()
    spec = _build(graph, mt.cpus(4), {'transpose': transpose}, tower_build)
    in_step = mt.ancestors([getattr(spec.train_op, 'op', spec.train_op)])
    checked = 0
    for var in graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES):
      readers = [op for op in _backward_readers(var) if op.name in in_step]
      needed = _ops_its_update_needs(graph, var)
      self.assertFalse([op.name for op in readers if op.name not in needed],
                       msg=var.op.name)
      checked += len(readers)
    # The middle and logits kernels are read by each tower's dX; the model
    # input's gradient (in/kernel's reader) is not in the step: no tuple
    # makes a tower compute it.
    self.assertEqual(2 * 4, checked)

  def test_gate_graph_is_passed_through(self):
    features, labels = _data()
    params = {'gate': tf1.train.Optimizer.GATE_GRAPH}
    graph = tf.Graph()
    _build(graph, mt.cpus(4), params)
    self.assertEmpty(_fused_ops(graph))
    expected = mt.train_variables(_wide_model_fn, features, labels,
                                  mt.cpus(1), params=params)
    actual = mt.train_variables(_wide_model_fn, features, labels, mt.cpus(4),
                                params=params)
    for name in expected:
      self.assertAllClose(expected[name], actual[name], rtol=1e-5, atol=1e-6)

  def test_gate_none_builds_no_tuple(self):
    graph = tf.Graph()
    _build(graph, mt.cpus(4), {'gate': tf1.train.Optimizer.GATE_NONE})
    self.assertEmpty(_fused_ops(graph))
    self.assertEmpty(_tuple_gates(graph))

  @parameterized.named_parameters(('cloned', replicate.TowerBuild.CLONE),
                                  ('per_tower',
                                   replicate.TowerBuild.CALL_PER_TOWER))
  def test_gate_op_is_one_barrier_per_tower(self, tower_build):
    # One device builds GATE_OP's 28 `tuple` identities for this model.
    # Towers build none: each tower's barrier waits for its 6 gradients
    # (3 kernels, 3 biases) and its loss, and every update waits for the 3
    # barriers.
    features, labels = _data()
    one = tf.Graph()
    with one.as_default():
      tf1.train.get_or_create_global_step()
      _wide_model_fn({'x': tf.constant(features['x'])}, tf.constant(labels),
                     mt.TRAIN, {'wrapper': lambda make: make()})
    self.assertLen(_tuple_gates(one), 28)
    graph = tf.Graph()
    _build(graph, mt.cpus(3), {}, tower_build)
    self.assertEmpty([op.name for op in _tuple_gates(graph)])
    barriers = [op for op in graph.get_operations()
                if op.type == 'NoOp' and 'gradients_computed' in op.name]
    self.assertLen(barriers, 3)
    self.assertEqual(['CPU:0', 'CPU:1', 'CPU:2'],
                     sorted(op.device[-5:] for op in barriers))
    for barrier in barriers:
      self.assertLen(barrier.control_inputs, 7, msg=barrier.name)
      self.assertLen({op.device for op in barrier.control_inputs}, 1)
    updates = [op for op in graph.get_operations()
               if op.type.endswith('ApplyGradientDescent')]
    self.assertLen(updates, 6)
    for update in updates:
      self.assertContainsSubset(barriers, update.control_inputs,
                                msg=update.name)

  def test_bad_gate_gradients(self):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'gate_gradients must be TowerOptimizer.GATE_NONE, GATE_OP or '
        r'GATE_GRAPH, got 7'):
      _build(tf.Graph(), mt.cpus(2), {'gate': 7})

  # SGD too: Adam's step does not change with the gradient's scale, so a
  # sum scaled by 1/N (or N) would show only with SGD.
  @parameterized.named_parameters(
      ('mean_adam', 'mean', 'adam'), ('sum_adam', 'sum', 'adam'),
      ('mean_sgd', 'mean', 'sgd'), ('sum_sgd', 'sum', 'sgd'))
  def test_matches_contrib_oracle(self, reduction, optimizer):
    if IS_TF2:
      self.skipTest('tf.contrib exists only in TF 1.x')
    contrib = tf.contrib.estimator  # pylint: disable=no-member
    features, labels = _data(batch_size=16)
    reduction = {'mean': tf1.losses.Reduction.MEAN,
                 'sum': tf1.losses.Reduction.SUM}[reduction]
    results = [
        mt.train_variables(
            _wide_model_fn, features, labels, mt.cpus(4), steps=4,
            loss_reduction=reduction, replicate_fn=replicate_fn,
            params={'wrapper': wrapper,
                    'optimizer_fn': _OPTIMIZER_FNS[optimizer]})
        for replicate_fn, wrapper in (
            (replicate.replicate_model_fn, replicate.TowerOptimizer),
            (contrib.replicate_model_fn, contrib.TowerOptimizer))]
    ours, theirs = results
    self.assertEqual(sorted(theirs), sorted(ours))
    # atol as in test_matches_one_device: Adam turns rounding differences of
    # ~0 gradient elements into steps.
    for name in theirs:
      self.assertAllClose(theirs[name], ours[name], rtol=1e-5, atol=2e-5,
                          msg=name)


def _build_mirrored(graph, num_replicas, params, cross_tower_ops=None,
                    strategy=None):
  """Builds `_wide_model_fn`'s step under `replicate.MirroredStrategy`.

  Args:
    graph: the graph to build in.
    num_replicas: how many virtual CPUs replicate the step.
    params: `_wide_model_fn`'s params.
    cross_tower_ops: passed to the strategy.
    strategy: another strategy to build with instead (the oracle test gives
      TF 1.15's own MirroredStrategy, whose replicas take a plain optimizer).

  Returns:
    `(train_op, iterator)`; the dataset gives the whole batch of `_data()`,
    which the strategy splits among the replicas.
  """
  features, labels = _data()
  if strategy is None:
    strategy = replicate.MirroredStrategy(
        testing.virtual_cpu_devices(num_replicas),
        cross_tower_ops=cross_tower_ops)
  params = dict(params, loss_scale=1.0 / num_replicas)
  with graph.as_default():
    tf1.set_random_seed(0)
    dataset = tf.data.Dataset.from_tensors(
        (features['x'], labels)).repeat()
    iterator = strategy.make_dataset_iterator(dataset)
    with strategy.scope():
      tf1.train.get_or_create_global_step()

      def step(inputs):
        x, y = inputs
        return _wide_model_fn({'x': x}, y, mt.TRAIN, params).train_op

      train_op = strategy.group(strategy.experimental_run(step, iterator))
  return train_op, iterator


def _train_mirrored(num_replicas, params, steps=3, cross_tower_ops=None,
                    strategy=None):
  """Trains as `_build_mirrored` builds; {name: value} of the variables."""
  graph = tf.Graph()
  train_op, iterator = _build_mirrored(graph, num_replicas, params,
                                       cross_tower_ops, strategy)
  with graph.as_default(), tf1.Session(
      config=testing.virtual_cpu_config(num_replicas)) as sess:
    sess.run(tf1.global_variables_initializer())
    sess.run(tf.nest.flatten(iterator.initialize()))
    for _ in range(steps):
      sess.run(train_op)
    return {v.op.name: sess.run(v) for v in tf1.global_variables()}


class MirroredStrategyGradientsTest(tf.test.TestCase,
                                    parameterized.TestCase):
  """`TowerOptimizer` in `replicate.MirroredStrategy` replicas on CPUs."""

  @parameterized.named_parameters(
      ('sgd_2', 'sgd', False, 2),
      ('adam_4', 'adam', False, 4),
      ('sgd_transpose_4', 'sgd', True, 4),
  )
  def test_matches_one_device(self, optimizer, transpose, num_replicas):
    params = {'optimizer_fn': _OPTIMIZER_FNS[optimizer],
              'transpose': transpose}
    # As for towers (TowerGradientsTest): the sum adds in another order.
    _assert_same_variables(self, _one_device_variables(params),
                           _train_mirrored(num_replicas, params),
                           atol=2e-5 if optimizer == 'adam' else 1e-6)

  def test_matches_tf_mirrored_strategy(self):
    if IS_TF2:
      self.skipTest('the reference is TF 1.15 (its MirroredStrategy takes a '
                    'plain optimizer in replicas)')
    # Both sum each replica's TF MatMul gradients: equal within float
    # rounding.
    ours = _train_mirrored(4, {})
    theirs = _train_mirrored(
        4, {'wrapper': lambda optimizer_fn: optimizer_fn()},
        strategy=tf.distribute.MirroredStrategy(
            testing.virtual_cpu_devices(4)))
    _assert_same_variables(self, theirs, ours)

  def test_replicas_compute_and_sum_their_own_weight_gradients(self):
    graph = tf.Graph()
    train_op, _ = _build_mirrored(graph, 4, {})
    # Each replica's own [384, 384] product (the middle kernel's gradient) is
    # in the step, summed with the others'.
    _assert_each_tower_product_is_summed(self, graph, train_op, 4)

  def test_each_copy_waits_for_every_backward_read_of_every_copy(self):
    # GATE_OP's guarantee per copy: no copy of W changes while a gradient
    # op still reads W's copy in its replica. The sum waits for every
    # replica's gated gradient, so every copy's update comes after all of
    # the readers.
    graph = tf.Graph()
    _build_mirrored(graph, 4, {})
    kernel = [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
              if v.op.name == 'middle/kernel'][0]
    readers = []
    for copy in kernel.values:
      readers.extend(op for t in _reads_of(graph, copy)
                     for op in t.consumers() if 'gradients' in op.name)
    # Each replica's dX = dY . W^T reads its own copy.
    self.assertLen(readers, 4)
    for copy in kernel.values:
      needed = _ops_its_update_needs(graph, copy)
      self.assertFalse([op.name for op in readers if op.name not in needed],
                       msg=copy.op.name)

  def test_gate_graph_is_passed_through(self):
    params = {'gate': tf1.train.Optimizer.GATE_GRAPH}
    graph = tf.Graph()
    _build_mirrored(graph, 2, params)
    self.assertEqual([], _fused_ops(graph))
    _assert_same_variables(self, _one_device_variables(params),
                           _train_mirrored(2, params))

  def test_bad_gate_gradients_in_a_replica(self):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'gate_gradients must be'):
      _build_mirrored(tf.Graph(), 2, {'gate': 7})

  def test_given_cross_tower_ops(self):
    params = {}
    graph = tf.Graph()
    _build_mirrored(graph, 2, params,
                    replicate.ReductionToOneDeviceCrossTowerOps())
    self.assertEqual([], _fused_ops(graph))
    _assert_same_variables(
        self, _one_device_variables(params),
        _train_mirrored(
            2, params,
            cross_tower_ops=replicate.ReductionToOneDeviceCrossTowerOps()))


@contextlib.contextmanager
def _control_flow_v1():
  """Builds `tf.compat.v1.while_loop` as TF1 frames, on TF 2 as well."""
  was_v2 = tf1.control_flow_v2_enabled()
  tf1.disable_control_flow_v2()
  try:
    yield
  finally:
    if was_v2:
      tf1.enable_control_flow_v2()


def _loop_model_fn(features, labels, mode, params):
  """A dense layer, then a TF1 while loop that reads `w` in every iteration.

  Reference variables (updated in place, TF 1.15's default) on both TFs: TF
  2.15 cannot place the gradient of a TF1 loop that reads a resource
  variable held on another device, replicated or not ("Cannot colocate
  nodes ... ReadVariableOp").
  """
  del params
  with tf1.variable_scope('', use_resource=False):
    h = tf1.layers.dense(
        features['x'], 8, activation=tf.nn.tanh,
        kernel_initializer=tf1.glorot_uniform_initializer(seed=1), name='h')
    w = tf1.get_variable('w', [8, 8],
                         initializer=tf1.glorot_uniform_initializer(seed=5))

    def body(i, a):
      return i + 1, tf.tanh(tf.matmul(a, w) + a)

    _, h = tf1.while_loop(lambda i, _: i < 3, body, [tf.constant(0), h])
    logits = tf1.layers.dense(
        h, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
        name='out')
  loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.5)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class ControlFlowGatingTest(tf.test.TestCase, parameterized.TestCase):
  """Variables read inside TF1 control flow: TF's tuples gate them too."""

  @parameterized.named_parameters(('cloned', replicate.TowerBuild.CLONE),
                                  ('per_tower',
                                   replicate.TowerBuild.CALL_PER_TOWER))
  def test_loop_reading_a_variable_trains_like_one_device(self, tower_build):
    # Without the barrier, the update of `w` raced the backward loop's last
    # read of it: 6 of 8 runs of 2 copied towers were off by up to 0.03. A
    # few repetitions catch a regression with near certainty.
    features, labels = mt.data(batch_size=8)
    with _control_flow_v1():
      one = mt.train_variables(_loop_model_fn, features, labels, mt.cpus(1))
      for _ in range(4):
        two = mt.train_variables(
            _loop_model_fn, features, labels, mt.cpus(2),
            replicate_fn=functools.partial(replicate.replicate_model_fn,
                                           tower_build=tower_build))
        for name in one:
          self.assertAllClose(one[name], two[name], rtol=1e-5, atol=1e-6,
                              msg=name)


def _sequence_model_fn(features, labels, mode, params):
  """Dense layers over [batch, time, units]: the output layer is a
  `tensordot`, whose `Transpose` of the kernel (identity permutation)
  forwards a reference variable's buffer on CPU. dX = dY . W^T reads the
  kernel through it, not through a read of the variable.

  `params` (optional) picks the optimizer, resource variables and
  TowerOptimizer's settings: every path an update can take."""
  params = dict({'optimizer': 'sgd', 'resource': False,
                 'accumulation_steps': 1, 'compression': None},
                **(params or {}))
  with tf1.variable_scope('', use_resource=params['resource']):
    h = tf1.layers.dense(
        features['x'], 4, tf.tanh, name='h',
        kernel_initializer=tf1.glorot_uniform_initializer(seed=1))
    prediction = tf1.layers.dense(
        h, 2, name='out',
        kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
  loss = tf.reduce_mean(tf.square(prediction - labels))
  optimizer = replicate.TowerOptimizer(
      _OPTIMIZER_FNS[params['optimizer']],
      accumulation_steps=params['accumulation_steps'],
      compression=params['compression'])
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _sequence_data():
  """8 rows of 6 steps of 3 units, distinct values; targets of 2 units."""
  x = np.arange(8 * 6 * 3, dtype=np.float32).reshape(8, 6, 3)
  y = np.cos(np.arange(8 * 6 * 2, dtype=np.float32)).reshape(8, 6, 2)
  return {'x': np.sin(x / 7.0)}, y


class AliasedReadsTest(tf.test.TestCase, parameterized.TestCase):
  """Backward reads of a variable through ops that alias its buffer."""

  @parameterized.named_parameters(('cloned', replicate.TowerBuild.CLONE),
                                  ('per_tower',
                                   replicate.TowerBuild.CALL_PER_TOWER))
  def test_update_waits_for_reads_through_a_transpose(self, tower_build):
    # out/kernel reaches each tower's dX through `read` and the tensordot's
    # Transpose: its update must wait for all four, as TF's tuple makes
    # one device's wait.
    features, labels = _sequence_data()
    graph = tf.Graph()
    with graph.as_default():
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(
          _sequence_model_fn, devices=mt.cpus(4), tower_build=tower_build)(
              {'x': tf.constant(features['x'])}, tf.constant(labels),
              mt.TRAIN, None)
      (kernel,) = [v for v in tf1.global_variables()
                   if v.op.name == 'out/kernel']
    readers = _backward_readers(kernel)
    self.assertLen(readers, 4)
    for reader in readers:  # dX = MatMul(dY, Reshape(Transpose(read)))
      self.assertEqual('MatMul', reader.type)
    needed = _ops_its_update_needs(graph, kernel)
    self.assertFalse([op.name for op in readers if op.name not in needed])

  @parameterized.named_parameters(('cloned', replicate.TowerBuild.CLONE),
                                  ('per_tower',
                                   replicate.TowerBuild.CALL_PER_TOWER))
  def test_trains_like_one_device_in_every_run(self, tower_build):
    # When out/kernel's in-place update could run before a tower's dX read
    # it, 1 step of SGD came out different from one device in most runs on
    # TF 1.15 (the update of a 4 x 2 kernel is fast beside the backward
    # pass). A few runs catch a regression with near certainty.
    features, labels = _sequence_data()
    one = mt.train_variables(_sequence_model_fn, features, labels,
                             mt.cpus(1), steps=1)
    for _ in range(4):
      four = mt.train_variables(
          _sequence_model_fn, features, labels, mt.cpus(4), steps=1,
          replicate_fn=functools.partial(replicate.replicate_model_fn,
                                         tower_build=tower_build))
      _assert_same_variables(self, one, four)


def _regularized_model_fn(features, labels, mode, params):
  """16 -> 8 -> 1 with an L2 term on each kernel. The terms' values feed
  the loss only: their gradients (2 * 0.05 * W) read W, not the terms."""
  del params
  regularizer = tf.keras.regularizers.l2(0.05)
  hidden = tf1.layers.dense(
      features['x'], 8, activation=tf.nn.relu,
      kernel_initializer=tf1.glorot_uniform_initializer(seed=1),
      kernel_regularizer=regularizer, name='hidden')
  logits = tf1.layers.dense(
      hidden, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
      kernel_regularizer=regularizer, name='logits')
  loss = (tf1.losses.sigmoid_cross_entropy(labels, logits) +
          tf1.losses.get_regularization_loss())
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.5)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _forward_readers(variable_op):
  """The ops outside `gradients` scopes that read `variable_op`'s value,
  directly or through ops that may alias its buffer."""
  aliases = [variable_op]
  readers = []
  for op in aliases:
    for consumer in [c for t in op.outputs for c in t.consumers()]:
      if consumer.type in _ALIASING_OP_TYPES:
        if consumer not in aliases:
          aliases.append(consumer)
      elif 'gradients' not in consumer.name and consumer not in readers:
        readers.append(consumer)
  return readers


class LossReadsTest(tf.test.TestCase, parameterized.TestCase):
  """The loss a step reports reads the variables before the step's update.

  A regularizer's value is in the loss, but no gradient needs it: only the
  towers' barriers order its reads (a copy's on the copy's device) before
  the update. Before 2026-11-29 they did not, and on TF 1.15 the loss of
  copied towers came out of the updated weights in 5 of 20 runs (1.597779
  where calls report 1.598755), the weights being equal.
  """

  @parameterized.named_parameters(
      ('cloned', replicate.TowerBuild.CLONE, None),
      ('per_tower', replicate.TowerBuild.CALL_PER_TOWER, None),
      ('replicated', replicate.TowerBuild.CLONE,
       replicate.VariablePlacement.REPLICATED))
  def test_update_waits_for_every_read_of_the_loss(self, tower_build,
                                                   placement):
    graph = tf.Graph()
    kwargs = {} if placement is None else {'variable_placement': placement}
    spec = _build(graph, mt.cpus(4), {}, tower_build,
                  model_fn=_regularized_model_fn, **kwargs)
    in_loss = mt.ancestors([spec.loss.op])
    squares = 0
    for update in graph.get_operations():
      if not update.type.endswith('ApplyGradientDescent'):
        continue
      needed = mt.ancestors([update])
      readers = [op for op in _forward_readers(update.inputs[0].op)
                 if op.name in in_loss]
      self.assertFalse([op.name for op in readers if op.name not in needed],
                       msg=update.name)
      squares += len([op for op in readers
                      if op.type in ('Square', 'L2Loss')])
    # The regularizer squares each kernel once per call (a `Square` on
    # TF 1.15, an `L2Loss` on TF 2.15): once with towers
    # built by calls (towers 1-3 reuse tower 0's term, as contrib's), once
    # per tower in copies, of the tower's own kernel under REPLICATED.
    self.assertEqual(
        2 if tower_build == replicate.TowerBuild.CALL_PER_TOWER else 2 * 4,
        squares)

  @parameterized.named_parameters(('cloned', replicate.TowerBuild.CLONE),
                                  ('per_tower',
                                   replicate.TowerBuild.CALL_PER_TOWER))
  def test_reported_loss_is_of_the_weights_before_the_step(self,
                                                           tower_build):
    # The loss of a step equals the loss of the weights it starts from,
    # evaluated without training: one device's, 3 steps in a row.
    graph = tf.Graph()
    spec = _build(graph, mt.cpus(4), {}, tower_build,
                  model_fn=_regularized_model_fn)
    with graph.as_default():
      with tf1.Session(config=testing.virtual_cpu_config(4)) as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(3):
          before = sess.run(spec.loss)
          _, reported = sess.run([spec.train_op, spec.loss])
          self.assertEqual(before, reported)


def _variable_of(tensor):
  """The variable op a ref or handle comes from, through identities and
  control flow (a `RefSwitch` into a `cond`)."""
  op = tensor.op
  while op.type in ('Identity', 'RefIdentity', 'Switch', 'RefSwitch',
                    'Enter', 'RefEnter'):
    op = op.inputs[0].op
  return op


class UpdatePathsTest(tf.test.TestCase, parameterized.TestCase):
  """Every way an update is built waits for every tower's backward reads."""

  @parameterized.named_parameters(
      ('sgd', {}),
      ('adam_resource', {'optimizer': 'adam', 'resource': True}),
      ('replicated', {'placement': replicate.VariablePlacement.REPLICATED}),
      ('replicated_adam', {'optimizer': 'adam',
                           'placement': replicate.VariablePlacement.REPLICATED}),
      # Accumulation applies in a `cond`: TF 1.15's brings a reference
      # variable in through a RefSwitch; TF 2.15's (an `If`) takes resource
      # variables only.
      ('accumulated', {'accumulation_steps': 2, 'resource': IS_TF2}),
      ('accumulated_replicated', {
          'accumulation_steps': 2, 'resource': IS_TF2,
          'placement': replicate.VariablePlacement.REPLICATED}),
      ('compressed', {'compression': replicate.Compression.fp16}),
      ('per_tower_accumulated', {
          'build': replicate.TowerBuild.CALL_PER_TOWER,
          'accumulation_steps': 2, 'resource': IS_TF2}),
  )
  def test_updates_wait_for_every_backward_read(self, settings):
    params = dict(settings)
    placement = params.pop('placement',
                           replicate.VariablePlacement.CONSOLIDATION_DEVICE)
    build = params.pop('build', replicate.TowerBuild.CLONE)
    features, labels = _sequence_data()
    graph = tf.Graph()
    with graph.as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(
          _sequence_model_fn, devices=mt.cpus(4),
          variable_placement=placement,
          tower_build=build)(
              {'x': tf.constant(features['x'])}, tf.constant(labels),
              mt.TRAIN, params)
    in_step = mt.ancestors([getattr(spec.train_op, 'op', spec.train_op)])
    updates = collections.defaultdict(list)
    for op in graph.get_operations():
      if op.type.startswith(('Apply', 'ResourceApply')):
        updates[_variable_of(op.inputs[0]).name].append(op)
      elif op.type in ('If', 'StatelessIf'):
        # TF 2's `cond`: the updates are in its branches' functions; the
        # `If` takes the variables' handles.
        for tensor in op.inputs:
          if tensor.dtype == tf.resource:
            updates[_variable_of(tensor).name].append(op)
    kernels = [op for op in graph.get_operations()
               if op.type in ('VariableV2', 'VarHandleOp') and
               op.name.endswith('kernel')]
    # h/ and out/kernel, and under REPLICATED each tower's copy of them.
    self.assertLen(kernels, 8 if 'placement' in settings else 2)
    checked = 0
    for kernel in kernels:
      variable = collections.namedtuple('V', 'op')(kernel)
      readers = [op for op in _backward_readers(variable)
                 if op.name in in_step]
      needed = mt.ancestors(updates[kernel.name])
      self.assertNotEmpty(updates[kernel.name], msg=kernel.name)
      self.assertFalse([op.name for op in readers if op.name not in needed],
                       msg=kernel.name)
      checked += len(readers)
    # out/kernel's dX in each of the 4 towers (h/kernel's dX is the model
    # input's gradient, not in the step).
    self.assertEqual(4, checked)

  @parameterized.named_parameters(('cloned', replicate.TowerBuild.CLONE),
                                  ('per_tower',
                                   replicate.TowerBuild.CALL_PER_TOWER))
  def test_sync_replicas_keeps_tfs_gates(self, tower_build):
    # SyncReplicasOptimizer's updates run in its chief's queue runner, not
    # in the step: a variable's update can start once its accumulator took
    # the step's gradient. That apply must wait for every tower's backward
    # reads of the variable, which TF's tuples (kept for it) make it do.
    features, labels = _sequence_data()
    graph = tf.Graph()
    with graph.as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(
          _sequence_model_fn, devices=mt.cpus(4), tower_build=tower_build)(
              {'x': tf.constant(features['x'])}, tf.constant(labels),
              mt.TRAIN, {'optimizer': 'sync'})
    self.assertNotEmpty([op.name for op in _tuple_gates(graph)
                         if op.name.startswith('tower_1/')])
    in_step = mt.ancestors([getattr(spec.train_op, 'op', spec.train_op)])
    checked = 0
    for apply_op in [op for op in graph.get_operations()
                     if op.type.endswith('AccumulatorApplyGradient')]:
      (take,) = [op for op in apply_op.inputs[0].consumers()
                 if op.type.endswith('AccumulatorTakeGradient')]
      (update,) = [op for op in graph.get_operations()
                   if op.type == 'ApplyGradientDescent' and
                   take.name in mt.ancestors([op])]
      variable = collections.namedtuple('V', 'op')(
          _variable_of(update.inputs[0]))
      readers = [op for op in _backward_readers(variable)
                 if op.name in in_step]
      needed = mt.ancestors([apply_op])
      self.assertFalse([op.name for op in readers if op.name not in needed],
                       msg=variable.op.name)
      checked += len(readers)
    # h/ and out/kernel's dX in each of the 4 towers: GATE_OP's tuple puts
    # the model input's gradient in the step, as on one device.
    self.assertEqual(8, checked)


@tf.function
def _tanh_layer(x, kernel):
  return tf.tanh(tf.matmul(x, kernel))


def _function_model_fn(features, labels, mode, params):
  """h = f(x, w) with `f` a `tf.function`, then pred = h . v, on reference
  variables: dh = dpred . v^T is computed outside the function and feeds
  its backward call, which gives w's gradient. TF inlines the call, and a
  control edge from a call then waits only for its stateful ops: v's
  in-place update must still wait for each tower's dh."""
  del params
  with tf1.variable_scope('', use_resource=False):
    w = tf1.get_variable('w', initializer=np.linspace(
        -0.6, 0.5, 6, dtype=np.float32).reshape(3, 2))
    v = tf1.get_variable('v', initializer=np.array(
        [[0.4], [-0.7]], dtype=np.float32))
  h = _tanh_layer(features['x'], w)
  h.set_shape([None, 2])
  loss = tf1.losses.mean_squared_error(labels, tf1.matmul(h, v))
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(1.0)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class FunctionCallGatingTest(tf.test.TestCase, parameterized.TestCase):
  """Updates wait for backward reads that feed a function call."""

  def _step(self, devices, **kwargs):
    """w and v after one SGD step on 8 distinct rows, one inter-op thread
    (where the race showed in every run)."""
    x = np.sin(np.arange(24, dtype=np.float32)).reshape(8, 3)
    y = np.cos(np.arange(8, dtype=np.float32)).reshape(8, 1)
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      model_fn = _function_model_fn
      if len(devices) > 1:
        model_fn = replicate.replicate_model_fn(
            model_fn, devices=devices, **kwargs)
      spec = model_fn({'x': tf.constant(x)}, tf.constant(y), mt.TRAIN, None)
      for hook in spec.training_hooks:
        hook.begin()
      with tf1.Session(config=testing.virtual_cpu_config(
          len(devices), inter_op_parallelism_threads=1)) as sess:
        sess.run(tf1.global_variables_initializer())
        for hook in spec.training_hooks:  # REPLICATED: copies set from w, v
          hook.after_create_session(sess, None)
        sess.run(spec.train_op)
        return {name: sess.run(name + ':0') for name in ('w', 'v')}

  @parameterized.named_parameters(
      ('cloned', {}),
      ('per_tower', {'tower_build': replicate.TowerBuild.CALL_PER_TOWER}),
      ('replicated', {
          'variable_placement': replicate.VariablePlacement.REPLICATED}),
  )
  def test_trains_like_one_device(self, kwargs):
    # Before: v was updated before a tower's dh read it, and w's step came
    # out different from one device's (e.g. [-0.052 -0.430 ...] against
    # [-0.111 -0.463 ...] on TF 1.15).
    one = self._step(mt.cpus(1))
    for _ in range(2):
      _assert_same_variables(self, one, self._step(mt.cpus(2), **kwargs))


if __name__ == '__main__':
  tf.test.main()

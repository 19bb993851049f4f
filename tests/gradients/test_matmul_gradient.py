"""The CPU tower MatMul gradient (replicate/matmul_gradient.py)."""
from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate import testing
from replicate._compat import tf1
from replicate.gradients import matmul_gradient


def _gradients(transpose_a, transpose_b, a_shape, b_shape, device, override,
               dtype=np.float32):
  """d(sum(matmul(a, b) * c))/d(a, b) in a fresh graph, with or without the
  override; returns (values, graph)."""
  rng = np.random.RandomState(0)
  a_value = rng.normal(size=a_shape).astype(dtype)
  b_value = rng.normal(size=b_shape).astype(dtype)
  with tf.Graph().as_default() as graph:
    a = tf1.placeholder(dtype, a_shape)
    b = tf1.placeholder(dtype, b_shape)
    with tf1.device(device), matmul_gradient.cpu_tower_gradients(
        graph, device, enabled=override):
      product = tf1.matmul(a, b, transpose_a=transpose_a,
                           transpose_b=transpose_b)
    # A weighting so that the incoming gradient is not all ones.
    weights = tf.constant(rng.normal(size=product.shape.as_list()).astype(
        dtype))
    with tf1.device(device):
      grads = tf.gradients(tf.reduce_sum(product * weights), [a, b])
    with tf1.Session() as sess:
      values = sess.run(grads, {a: a_value, b: b_value})
  return values, graph


def _overridden(op):
  """Whether `op` was built with the CPU MatMul gradient."""
  try:
    return op.get_attr('_gradient_op_type') == tf.compat.as_bytes(
        matmul_gradient.GRADIENT_NAME)
  except ValueError:
    return False


class MatMulGradientTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      # (transpose_a, transpose_b, a shape, b shape); b of 300 x 300 = 90000
      # elements is above Tuning.matmul_min_elements (65536).
      ('plain_large', False, False, (8, 300), (300, 300)),
      ('plain_small', False, False, (8, 30), (30, 30)),
      ('transpose_a', True, False, (300, 8), (300, 300)),
      ('transpose_b', False, True, (8, 300), (300, 300)),
      ('both', True, True, (300, 8), (300, 300)),
  )
  def test_same_gradients_as_tensorflow(self, transpose_a, transpose_b,
                                        a_shape, b_shape):
    # float64, so that the other summation order of the transpose-free
    # product differs only at ~1e-13 (float32 sums of 300 terms of ~10 may
    # differ at ~1e-5).
    expected, _ = _gradients(transpose_a, transpose_b, a_shape, b_shape,
                             '/device:CPU:0', override=False,
                             dtype=np.float64)
    actual, graph = _gradients(transpose_a, transpose_b, a_shape, b_shape,
                               '/device:CPU:0', override=True,
                               dtype=np.float64)
    for want, got in zip(expected, actual):
      self.assertAllClose(want, got, rtol=1e-10, atol=1e-10)
    forward = [op for op in graph.get_operations()
               if op.type == 'MatMul' and 'gradients' not in op.name]
    self.assertLen(forward, 1)
    self.assertEqual(tf.compat.as_bytes(matmul_gradient.GRADIENT_NAME),
                     forward[0].get_attr('_gradient_op_type'))

  def test_large_weight_input_gradient_has_no_transposed_weight(self):
    # dx = (W . dy^T)^T: the weight is the left operand, untransposed, and
    # the only transposed operand is the [8, 300] incoming gradient.
    _, graph = _gradients(False, False, (8, 300), (300, 300), '/device:CPU:0',
                          override=True)
    grad_ops = [op for op in graph.get_operations()
                if op.name.startswith('gradients/')]
    self.assertIn('Transpose', [op.type for op in grad_ops])
    for op in grad_ops:
      if op.type == 'MatMul' and op.get_attr('transpose_b'):
        self.assertEqual([8, 300], op.inputs[1].shape.as_list())

  @parameterized.named_parameters(
      ('small_weight', (8, 30), (30, 30), '/device:CPU:0'),
      ('gpu', (8, 300), (300, 300), '/device:GPU:0'),
  )
  def test_tensorflow_formula_where_it_does_not_pay(self, a_shape, b_shape,
                                                    device):
    with tf.Graph().as_default() as graph:
      a = tf1.placeholder(tf.float32, a_shape)
      b = tf1.placeholder(tf.float32, b_shape)
      # The override map is entered directly so that a GPU op gets it too:
      # the gradient function itself keeps TF's formula off CPUs.
      with tf1.device(device), graph.gradient_override_map(
          {'MatMul': matmul_gradient.GRADIENT_NAME}):
        product = tf1.matmul(a, b)
      with tf1.device(device):
        tf.gradients(tf.reduce_sum(product), [a, b])
    self.assertNotIn('Transpose', [op.type for op in graph.get_operations()])

  def test_override_only_on_cpu_devices_and_when_enabled(self):
    for device, enabled, expected in (('/device:CPU:1', True, True),
                                      ('/device:GPU:0', True, False),
                                      ('/device:CPU:1', False, False)):
      with tf.Graph().as_default() as graph:
        with matmul_gradient.cpu_tower_gradients(graph, device, enabled):
          op = tf1.matmul(tf.ones([2, 2]), tf.ones([2, 2])).op
      self.assertEqual(expected, _overridden(op), msg=(device, enabled))


class ReplicatedTowersTest(tf.test.TestCase):

  def _matmuls(self, mode, devices):
    features, labels = mt.data(batch_size=8)
    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(mt.mlp_model_fn, devices=devices)(
          {'x': tf.constant(features['x'])},
          None if mode == mt.PREDICT else tf.constant(labels), mode, {})
      return [op for op in graph.get_operations()
              if op.type == 'MatMul' and 'gradients' not in op.name]

  def test_training_towers_on_cpus_get_the_override(self):
    matmuls = self._matmuls(mt.TRAIN, mt.cpus(2))
    # Two dense layers x two towers.
    self.assertLen(matmuls, 4)
    self.assertTrue(all(_overridden(op) for op in matmuls))

  def test_not_in_eval_or_predict(self):
    for mode in (mt.EVAL, mt.PREDICT):
      matmuls = self._matmuls(mode, mt.cpus(2))
      self.assertTrue(matmuls)
      self.assertFalse([op.name for op in matmuls if _overridden(op)])


class MirroredReplicasTest(tf.test.TestCase):
  """Replicas of `replicate.MirroredStrategy` on CPUs get the CPU gradient."""

  def test_replicas_build_matmuls_with_the_override_only_while_they_run(self):
    # Each replica calls `step` (copied replicas would run it once).
    strategy = replicate.MirroredStrategy(
        testing.virtual_cpu_devices(2),
        replica_build=replicate.ReplicaBuild.CALL_PER_REPLICA)
    built = {'replica': [], 'merge': []}

    def merge_fn(unused_strategy):
      built['merge'].append(tf1.matmul(tf.ones([2, 2]), tf.ones([2, 2])).op)

    def step():
      built['replica'].append(tf1.matmul(tf.ones([2, 2]), tf.ones([2, 2])).op)
      replicate.get_replica_context().merge_call(merge_fn)
      # After the merge, the replica holds the override again.
      built['replica'].append(tf1.matmul(tf.ones([2, 2]), tf.ones([2, 2])).op)

    with tf.Graph().as_default():
      with strategy.scope():
        strategy.extended.call_for_each_replica(step)
        after = tf1.matmul(tf.ones([2, 2]), tf.ones([2, 2])).op
    # 2 replicas x 2 products, each on its replica's CPU; replicas run in
    # turn up to the merge_call, then in turn to their end.
    self.assertLen(built['replica'], 4)
    self.assertTrue(all(_overridden(op) for op in built['replica']))
    self.assertEqual(['CPU:0', 'CPU:1', 'CPU:0', 'CPU:1'],
                     [op.device[-5:] for op in built['replica']])
    self.assertLen(built['merge'], 1)
    self.assertFalse(_overridden(built['merge'][0]))
    self.assertFalse(_overridden(after))

  def test_no_override_left_behind_when_a_replica_fails(self):
    strategy = replicate.MirroredStrategy(testing.virtual_cpu_devices(2))

    def step():
      context = replicate.get_replica_context()
      if context.replica_id_in_sync_group == 1:
        # Replica 0 is paused in its merge_call (its run is then aborted);
        # replica 1 fails while it holds the override.
        raise ValueError('replica 1 fails')
      context.merge_call(lambda unused_strategy: None)

    with tf.Graph().as_default():
      with strategy.scope():
        with self.assertRaisesRegex(ValueError, 'replica 1 fails'):
          strategy.extended.call_for_each_replica(step)
        after = tf1.matmul(tf.ones([2, 2]), tf.ones([2, 2])).op
    self.assertFalse(_overridden(after))

  def test_a_model_fn_map_inside_a_replica_wins(self):
    strategy = replicate.MirroredStrategy(
        testing.virtual_cpu_devices(2),
        replica_build=replicate.ReplicaBuild.CALL_PER_REPLICA)
    ops = []

    def step():
      graph = tf1.get_default_graph()
      with graph.gradient_override_map({'MatMul': 'MatMul'}):
        ops.append(tf1.matmul(tf.ones([2, 2]), tf.ones([2, 2])).op)

    with tf.Graph().as_default():
      with strategy.scope():
        strategy.extended.call_for_each_replica(step)
    self.assertEqual([b'MatMul', b'MatMul'],
                     [op.get_attr('_gradient_op_type') for op in ops])

  def test_training_step_equals_the_one_device_step(self):
    # y = (x . W) . V with W, V of 300 x 300 (above Tuning.matmul_min_elements), 2 replicas
    # of 4 rows each, loss sum(y * c) / 2 per replica (scaled to the global
    # batch), one SGD step of rate 0.5, compared with the same step computed
    # by NumPy. float64: the transpose-free input gradient only reorders
    # sums.
    rng = np.random.RandomState(0)
    x_value = rng.normal(size=(8, 300))
    c_value = rng.normal(size=(8, 300))
    w_value = rng.normal(size=(300, 300))
    v_value = rng.normal(size=(300, 300))
    strategy = replicate.MirroredStrategy(testing.virtual_cpu_devices(2))
    with tf.Graph().as_default() as graph:
      dataset = tf.data.Dataset.from_tensors((x_value, c_value)).repeat()
      iterator = strategy.make_dataset_iterator(dataset)
      with strategy.scope():
        w = tf1.get_variable('w', initializer=w_value)
        v = tf1.get_variable('v', initializer=v_value)

        def step(inputs):
          x, c = inputs
          # Two layers, so that W's update needs the input gradient of the
          # second product, which the override rewrites.
          y = tf1.matmul(tf1.matmul(x, w), v)
          loss = tf.reduce_sum(y * c) / 2.0
          return replicate.TowerOptimizer(
              tf1.train.GradientDescentOptimizer(0.5)).minimize(loss)

        train_op = strategy.group(strategy.experimental_run(step, iterator))
      gradient_ops = [op for op in graph.get_operations()
                      if 'gradients' in op.name]
      # Each replica's input gradients are (V . dy^T)^T and (W . dh^T)^T:
      # Transposes of a [300, 4] product, none of a weight. Replica 0's
      # `tf.gradients` builds that of x too (nothing runs it); replica 1 is
      # a copy of what the update needs, so it has only the other one.
      transposes = [op for op in gradient_ops if op.type == 'Transpose']
      self.assertEqual(
          [2, 1], [len([op for op in transposes
                        if op.name.startswith('replica_1/') == copy])
                   for copy in (False, True)])
      self.assertEqual([[300, 4]] * 3,
                       [op.inputs[0].shape.as_list() for op in transposes])
      with tf1.Session(config=testing.virtual_cpu_config(2)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(iterator.initialize())
        sess.run(train_op)
        w_after, v_after = sess.run([w, v])
    # Summed over the replicas' rows, the gradients are those of one device
    # on all 8 rows with the loss sum(y * c) / 2: d/dV = (x W)^T c / 2 and
    # d/dW = x^T (c V^T) / 2.
    grad_v = x_value.dot(w_value).T.dot(c_value) / 2.0
    grad_w = x_value.T.dot(c_value.dot(v_value.T)) / 2.0
    self.assertAllClose(v_value - 0.5 * grad_v, v_after, rtol=1e-10,
                        atol=1e-10)
    self.assertAllClose(w_value - 0.5 * grad_w, w_after, rtol=1e-10,
                        atol=1e-10)

if __name__ == '__main__':
  tf.test.main()

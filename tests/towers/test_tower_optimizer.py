"""TowerOptimizer outside and inside replicate_model_fn."""
import model_testing as mt
import tensorflow as tf

import replicate
from replicate._compat import tf1


class PassThroughTest(tf.test.TestCase):

  def test_plain_optimizer_outside_replication(self):
    # w = 2, loss = w^2, dloss/dw = 4, lr 0.25: w = 2 - 0.25 * 4 = 1.
    with tf.Graph().as_default():
      w = tf1.get_variable('w', [], initializer=tf1.constant_initializer(2.))
      optimizer = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.25))
      train_op = optimizer.minimize(tf.square(w))
      self.assertIsNone(replicate.get_tower_context())
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(train_op)
        self.assertAllClose(1.0, sess.run(w))

  def test_optimizer_fn_built_once_per_graph_in_that_graph(self):
    built = []

    def optimizer_fn():
      built.append(tf1.get_default_graph())
      return tf1.train.MomentumOptimizer(
          tf1.train.exponential_decay(0.1, tf1.train.get_or_create_global_step(),
                                      10, 0.5), momentum=0.9)

    optimizer = replicate.TowerOptimizer(optimizer_fn)
    graphs = []
    for _ in range(2):
      with tf.Graph().as_default() as graph:
        w = tf1.get_variable('w', [])
        optimizer.minimize(tf.square(w))
        optimizer.minimize(tf.square(w))  # same graph: not built again
        graphs.append(graph)
    self.assertEqual(graphs, built)

  def test_slot_pass_through(self):
    with tf.Graph().as_default():
      w = tf1.get_variable('w', [])
      optimizer = replicate.TowerOptimizer(tf1.train.AdamOptimizer(0.1))
      optimizer.minimize(tf.square(w))
      self.assertEqual(['m', 'v'], sorted(optimizer.get_slot_names()))
      self.assertIsNotNone(optimizer.get_slot(w, 'm'))
      self.assertEqual('Adam', optimizer.get_name())
      # beta1_power, beta2_power and the two slots of w.
      self.assertLen(optimizer.variables(), 4)


class AggregationPlacementTest(tf.test.TestCase):

  def test_gradients_summed_on_variable_device(self):
    features, labels = mt.data(batch_size=8)
    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(
          mt.mlp_model_fn, devices=mt.cpus(2),
          variable_placement=replicate.VariablePlacement.ROUND_ROBIN)(
              {'x': tf.constant(features['x'])}, tf.constant(labels),
              mt.TRAIN, {})
      variables = {v.op.name: v.device for v in tf1.trainable_variables()}
      sums = [op for op in graph.get_operations()
              if op.name.startswith('gradient_aggregation/')
              and op.type == 'AddN']
      # The gradient each variable is updated with (the last input of its
      # apply op) is produced on that variable's device.
      summed_on = {}
      for op in graph.get_operations():
        if (op.type.endswith('ApplyGradientDescent') and
            op.inputs[0].op.name in variables):
          summed_on[op.inputs[0].op.name] = op.inputs[-1].op.device
    self.assertEqual(variables, summed_on)
    # Round robin puts two of the four variables on each CPU; every sum runs
    # on one of them (small gradients of a device are summed in one packed
    # AddN, see gradient_aggregation.py).
    self.assertEqual(['/device:CPU:0', '/device:CPU:1'] * 2,
                     list(variables.values()))
    self.assertTrue(sums)
    self.assertTrue(set(op.device for op in sums) <= set(variables.values()))

  def test_no_collections_beyond_the_unreplicated_model(self):
    features, labels = mt.data(batch_size=8)
    keys = []
    for devices in (None, mt.cpus(4)):
      with tf.Graph().as_default() as graph:
        tf1.train.get_or_create_global_step()
        model_fn = mt.mlp_model_fn
        if devices:
          model_fn = replicate.replicate_model_fn(model_fn, devices=devices)
        model_fn({'x': tf.constant(features['x'])}, tf.constant(labels),
                 mt.TRAIN, {})
        keys.append(sorted(graph.get_all_collection_keys()))
    self.assertEqual(keys[0], keys[1])


if __name__ == '__main__':
  tf.test.main()

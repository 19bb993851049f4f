"""The towers' barriers (gradient_gating.py): an `IndexedSlices` gradient is
waited for whole, and with two optimizer calls each update waits for the
losses of its own call (tower_gradients.py `_losses_of`)."""
from absl.testing import parameterized
import model_testing as mt
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.gradients import gradient_gating


def _two_calls_model_fn(features, labels, mode, params):
  """Two `minimize` calls, the second under the first's control dependency.
  Each loss has a term no gradient needs (sum of squares, named
  `penalty_a` / `penalty_b`): only the barrier orders its read before the
  update of its call."""
  del params
  a = tf1.get_variable('a', initializer=tf.constant([[0.5], [-0.25]] * 8))
  b = tf1.get_variable('b', initializer=tf.constant([0.125]))
  predictions = tf.matmul(features['x'], a)
  penalty_a = tf.reduce_sum(tf.square(a), name='penalty_a')
  loss_a = tf1.losses.mean_squared_error(labels, predictions) + penalty_a
  train_a = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1, name='first')).minimize(
          loss_a, var_list=[a])
  with tf.control_dependencies([train_a]):
    penalty_b = tf.reduce_sum(tf.square(b), name='penalty_b')
    loss_b = tf1.losses.mean_squared_error(
        labels, tf.stop_gradient(predictions) + b) + penalty_b
    train_b = replicate.TowerOptimizer(
        tf1.train.GradientDescentOptimizer(0.1, name='second')).minimize(
            loss_b, tf1.train.get_global_step(), var_list=[b])
  return tf1.estimator.EstimatorSpec(mode, loss=loss_a + loss_b,
                                     train_op=train_b)


class LossesPerCallTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('cloned', replicate.TowerBuild.CLONE),
                                  ('per_tower',
                                   replicate.TowerBuild.CALL_PER_TOWER))
  def test_each_update_waits_for_the_losses_of_its_call(self, tower_build):
    # 3 towers: the update of a (call 0) waits for each tower's penalty_a;
    # the update of b (call 1) for each tower's penalty_b.
    features, labels = mt.data(batch_size=6, num_features=16)
    graph = tf.Graph()
    with graph.as_default():
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(
          _two_calls_model_fn, devices=mt.cpus(3), tower_build=tower_build)(
              {'x': tf.constant(features['x'])}, tf.constant(labels),
              mt.TRAIN, {})
    updates = {}
    for op in graph.get_operations():
      if op.type.endswith('ApplyGradientDescent'):
        updates[op.inputs[0].op.name] = op
    self.assertEqual(['a', 'b'], sorted(updates))
    for name, update in updates.items():
      penalties = sorted(op.name for op in graph.get_operations()
                         if op.name.endswith('penalty_' + name))
      self.assertLen(penalties, 3, msg=penalties)
      needed = mt.ancestors([update])
      self.assertEqual([], [p for p in penalties if p not in needed],
                       msg=name)


class BarrierTest(tf.test.TestCase):

  def test_an_indexed_slices_gradient_is_waited_for_whole(self):
    # The barrier waits for the values, the indices and the dense shape.
    with tf.Graph().as_default():
      values = tf.constant([[1.0, 2.0]], name='values')
      indices = tf.constant([1], name='indices')
      dense_shape = tf.constant([3, 2], name='dense_shape')
      dense = tf.constant([4.0], name='dense')
      barrier = gradient_gating.barrier(
          [tf.IndexedSlices(values, indices, dense_shape), None, dense], '')
      self.assertEqual(
          ['dense', 'dense_shape', 'indices', 'values'],
          sorted(op.name for op in barrier.control_inputs))
      self.assertIsNone(gradient_gating.barrier([None], ''))


if __name__ == '__main__':
  tf.test.main()

"""Two optimizers of one name on the same variables: copied towers name
their slots as one device does (`Momentum`, `Momentum_1`), the update being
built in tower 0's own scopes (tower_context.first_tower_call_scopes)."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1


def _model_fn(features, labels, mode):
  with tf1.variable_scope('model'):
    w = tf1.get_variable('w', initializer=tf.constant([[0.1], [-0.2], [0.3]]))
    loss = tf1.losses.mean_squared_error(labels, tf.matmul(features['x'], w))
    ops = [replicate.TowerOptimizer(
        tf1.train.MomentumOptimizer(lr, 0.9)).minimize(loss)
           for lr in (0.1, 0.01)]
    with tf1.control_dependencies(ops):
      train_op = tf1.assign_add(tf1.train.get_global_step(), 1)
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _train(num_towers, **kwargs):
  x = (np.arange(24, dtype=np.float32).reshape([8, 3]) - 11.) / 10.
  y = np.array([[r * 0.5] for r in range(8)], np.float32)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    spec = replicate.replicate_model_fn(
        _model_fn, devices=replicate.testing.virtual_cpu_devices(num_towers),
        **kwargs)({'x': tf.constant(x)}, tf.constant(y),
                  tf1.estimator.ModeKeys.TRAIN)
    with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as sess:
      sess.run(tf1.global_variables_initializer())
      for _ in range(2):
        sess.run(spec.train_op)
      return {v.op.name: sess.run(v) for v in tf1.global_variables()}


class TwoOptimizersSlotNamesTest(tf.test.TestCase, parameterized.TestCase):

  # (CALL_PER_TOWER refuses this model, naming the fix: its update is
  # built by re-entering tower 0's scopes.)
  @parameterized.parameters((replicate.TowerBuild.CLONE,))
  def test_slot_names_and_values_as_one_device(self, tower_build):
    expected = _train(1)
    self.assertIn('model/model/w/Momentum', expected)
    self.assertIn('model/model/w/Momentum_1', expected)
    actual = _train(2, tower_build=tower_build)
    self.assertCountEqual(expected, actual)
    for name in expected:
      self.assertAllClose(expected[name], actual[name], msg=name)


if __name__ == '__main__':
  tf.test.main()

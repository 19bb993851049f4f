"""Where replicate/towers/device_setter.py puts variables: the consolidation
device is CPU:0 even when the towers skip it, REPLICATED keeps tower 0's
copies on tower 0's device, and a device the user set on a variable inside
model_fn is kept (as contrib's replicate_model_fn). Graphs only.
"""
from absl.testing import parameterized
import model_testing as mt
import tensorflow as tf

import replicate
from replicate._compat import tf1


def _pinned_model_fn(features, labels, mode, params):
  """mt.mlp_model_fn's shape, with the output layer's variables pinned by
  the user to CPU:3."""
  del params
  hidden = tf1.layers.dense(features['x'], 4, activation=tf.nn.tanh,
                            name='hidden')
  with tf1.device('/device:CPU:3'):  # the user's own pin
    kernel = tf1.get_variable('pinned_kernel', [4, labels.shape[1]])
  logits = tf.matmul(hidden, kernel)
  loss = tf1.losses.mean_squared_error(labels, logits)
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class VariableDeviceTest(tf.test.TestCase, parameterized.TestCase):

  def _variable_devices(self, devices, model_fn=mt.mlp_model_fn, **kwargs):
    features, labels = mt.data(batch_size=8)
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(model_fn, devices=devices, **kwargs)(
          {'x': tf.constant(features['x'])}, tf.constant(labels), mt.TRAIN,
          {})
      return {v.op.name: v.device for v in tf1.global_variables()
              if v.op.name != 'global_step'}

  def test_consolidation_device_is_cpu0_when_towers_skip_it(self):
    # Towers on CPU:1 and CPU:2: shared variables still go to CPU:0 (the
    # consolidation device of several devices), not to tower 0's CPU:1.
    devices = self._variable_devices(['/cpu:1', '/cpu:2'])
    self.assertEqual({'hidden/kernel', 'hidden/bias', 'logits/kernel',
                      'logits/bias'}, set(devices))
    self.assertEqual({'/device:CPU:0'}, set(devices.values()))

  def test_replicated_keeps_tower_0s_copies_on_tower_0(self):
    # REPLICATED: the unreplicated names (tower 0's copies) live on tower
    # 0's device, CPU:1 here, not on the last tower's CPU:2 or on CPU:0.
    devices = self._variable_devices(
        ['/cpu:1', '/cpu:2'],
        variable_placement=replicate.VariablePlacement.REPLICATED)
    self.assertEqual('/device:CPU:1', devices['hidden/kernel'])
    self.assertEqual('/device:CPU:1', devices['logits/bias'])

  @parameterized.parameters(
      {}, {'variable_placement': replicate.VariablePlacement.ROUND_ROBIN})
  def test_users_pin_on_a_variable_is_kept(self, **kwargs):
    devices = self._variable_devices(mt.cpus(2), _pinned_model_fn, **kwargs)
    self.assertEqual('/device:CPU:3', devices['pinned_kernel'])
    # Unpinned variables follow the placement: CPU:0 (consolidation), or
    # round robin from CPU:0.
    self.assertEqual('/device:CPU:0', devices['hidden/kernel'])


if __name__ == '__main__':
  tf.test.main()

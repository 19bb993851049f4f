"""Every op an apply creates counts as the optimizer's, its first one
included (gradient_gating.ops_created_by).

Under `VariablePlacement.REPLICATED` the ops of the one `apply_gradients`
are the only writes allowed to the copies (replicated_variables.
check_writes). With a learning rate given as a tensor, SGD's first op is
the update of the first variable itself; losing it from the list would
refuse a plain model, or leave that update ungated."""
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1


def _model_fn(features, labels, mode, params):
  del params
  hidden = tf1.layers.dense(
      features['x'], 2, activation=tf.nn.tanh, name='hidden',
      kernel_initializer=tf1.constant_initializer(
          [[0.3, -0.1], [-0.2, 0.4], [0.5, 0.2]]))
  logits = tf1.layers.dense(
      hidden, 1, name='logits',
      kernel_initializer=tf1.constant_initializer([[0.7], [-0.6]]))
  loss = tf1.losses.mean_squared_error(labels, logits)
  # A tensor learning rate (a schedule's, as a rule): no op of its own is
  # made when the optimizer applies.
  learning_rate = tf.constant(0.5, name='learning_rate_tensor')
  optimizer = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(learning_rate))
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _train(x, y, devices, steps=2, **kwargs):
  """{name: value} of the global variables after `steps` steps."""
  with tf.Graph().as_default():
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    spec = replicate.replicate_model_fn(_model_fn, devices=devices, **kwargs)(
        {'x': tf.constant(x)}, tf.constant(y), mt.TRAIN)
    with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as sess:
      # The copies are local variables, set from tower 0's.
      sess.run(tf1.global_variables_initializer())
      sess.run(tf1.local_variables_initializer())
      for _ in range(steps):
        sess.run(spec.train_op)
      return {v.op.name: sess.run(v) for v in tf1.global_variables()}


class ReplicatedTensorLearningRateTest(tf.test.TestCase):

  def test_trains_as_one_device(self):
    # 8 distinct rows over 4 towers, distinct targets.
    x = np.array([[1., 2., 3.], [-1., .5, 2.], [.25, -3., 1.], [2., 1., -1.],
                  [.5, .5, -2.], [-1.5, 1., .75], [3., -1., .5], [0., 2., -1.]],
                 np.float32)
    y = np.array([[1.], [-2.], [.5], [3.], [-1.], [2.], [.25], [-.5]],
                 np.float32)
    one = _train(x, y, ['/cpu:0'])
    got = _train(x, y, mt.cpus(4),
                 variable_placement=replicate.VariablePlacement.REPLICATED)
    self.assertEqual(2, got['global_step'])
    # MEAN over 4 equal shards: the all-reduced sum of the scaled gradients
    # is one device's gradient over the 8 rows (up to the order of sums).
    for name in ('hidden/kernel', 'hidden/bias', 'logits/kernel',
                 'logits/bias'):
      self.assertAllClose(one[name], got[name], rtol=1e-6, atol=1e-6,
                          msg=name)
    self.assertNotAllClose([[0.7], [-0.6]], got['logits/kernel'])


if __name__ == '__main__':
  tf.test.main()

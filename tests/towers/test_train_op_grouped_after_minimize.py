"""TRAIN's train_op is tower 0's, whichever tower applies the gradients:
what model_fn groups into it after `minimize` runs once, from tower 0."""
import functools

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1


def _model_fn(features, labels, mode, params=None):
  del params
  normalized = tf1.layers.batch_normalization(
      features['x'], momentum=0.5, training=mode == mt.TRAIN, name='bn')
  logits = tf1.layers.dense(
      normalized, 1, kernel_initializer=tf1.glorot_uniform_initializer(
          seed=4), name='logits')
  loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1))
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  # Grouped after minimize (as Keras users group `layer.updates`), not
  # waited for by it.
  train_op = tf.group(train_op,
                      *tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class GroupedAfterMinimizeTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('cloned', replicate.TowerBuild.CLONE),
      # The last tower applies the gradients here; tower 0's train_op is
      # still the spec's.
      ('per_tower', replicate.TowerBuild.CALL_PER_TOWER))
  def test_moving_statistics_from_tower_0(self, tower_build):
    # 8 distinct rows on 4 towers, 2 a tower. One step, momentum 0.5,
    # moving_mean from 0: 0.5 * mean(tower 0's rows 0, 1)
    # = 0.5 * [2, 3, 4, 5] = [1, 1.5, 2, 2.5] (tower 3's rows 6, 7 would
    # give 0.5 * [26, 27, 28, 29]).
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    labels = np.ones((8, 1), np.float32)
    values = mt.train_variables(
        _model_fn, {'x': x}, labels, mt.cpus(4), steps=1,
        replicate_fn=functools.partial(replicate.replicate_model_fn,
                                       tower_build=tower_build))
    self.assertAllEqual([1.0, 1.5, 2.0, 2.5], values['bn/moving_mean'])
    self.assertEqual(1, values['global_step'])


if __name__ == '__main__':
  tf.test.main()

"""Asking where a new op would go, inside a tower.

A `Mirrored` converted to a tensor, and a destination string without a job,
read the enclosing device scope (`_compat.current_device`), which inside a
tower is the towers' device function. That function took every non-Operation
for a NodeDef: on TF 1.15, whose device scopes hand it the stand-in op, both
failed with an AttributeError inside `model_fn`.
"""
import model_testing as mt
import tensorflow as tf

import replicate
from replicate._compat import tf1


class DeviceQueriesInTowersTest(tf.test.TestCase):

  def test_mirrored_and_destinations_inside_model_fn(self):
    seen = []

    def model_fn(features, labels, mode, params):
      del params
      mirrored = replicate.Mirrored({'/cpu:0': tf.constant(2.),
                                     '/cpu:1': tf.constant(2.)})
      scale = tf.identity(mirrored)
      seen.append((scale, replicate.cross_tower_ops.get_devices_from(
          ['/cpu:1', '/job:localhost/cpu:0'])))
      logits = tf1.layers.dense(features['x'], 1) * scale
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      optimizer = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.5))
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss,
          train_op=optimizer.minimize(loss, tf1.train.get_global_step()))

    features, labels = mt.data(batch_size=8)
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(model_fn, devices=mt.cpus(2))(
          {'x': tf.constant(features['x'])}, tf.constant(labels), mt.TRAIN,
          None)
      scale, destinations = seen[0]
      # A string without a job is this process's device inside a tower
      # (no job, TF's graph-mode canonical form).
      self.assertEqual(destinations,
                       ('/replica:0/task:0/device:CPU:1',
                        '/replica:0/task:0/device:CPU:0'))
      with tf1.Session(config=tf1.ConfigProto(device_count={'CPU': 2})) as sess:
        self.assertEqual(sess.run(scale), 2.)


if __name__ == '__main__':
  tf.test.main()

"""get_tower_context() answers for the graph the towers are built in only:
in another graph made inside model_fn there is no tower (and asking there
does not stop the towers from being copies)."""
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1


class TowerContextOtherGraphTest(tf.test.TestCase):

  def test_none_in_another_graph_inside_model_fn(self):
    seen = []

    def model_fn(features, labels, mode):
      del labels
      with tf.Graph().as_default():
        seen.append(replicate.get_tower_context())
      return tf1.estimator.EstimatorSpec(
          mode, predictions={'y': features['x'] * 2.})

    x = np.arange(8, dtype=np.float32).reshape([4, 2])
    with tf.Graph().as_default():
      spec = replicate.replicate_model_fn(
          model_fn, devices=replicate.testing.virtual_cpu_devices(2))(
              {'x': tf.constant(x)}, None, tf1.estimator.ModeKeys.PREDICT)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as s:
        self.assertAllEqual(x * 2., s.run(spec.predictions)['y'])
    # One call (tower 0, copied), which saw no tower in its own graph.
    self.assertEqual([None], seen)


if __name__ == '__main__':
  tf.test.main()

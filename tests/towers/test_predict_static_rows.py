"""PREDICT's static row count per tower comes from a value the towers
split, never from one every tower gets whole (tower_build._static_rows)."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1


def _model_fn(features, mode):
  # Row r of x is [r, 10 r, 100 r]; prediction = x . [1, 2, 3] * scale + the
  # vocabulary's sum: 321 r * 2 + 21 (vocab 0..6 sums to 21).
  w = tf1.get_variable('w', initializer=tf.constant([[1.], [2.], [3.]]))
  extra = tf.reduce_sum(features['a_whole'])
  return tf1.estimator.EstimatorSpec(
      mode, predictions={'y': tf.matmul(features['x'], w) * 2. + extra})


def _predict(num_towers, whole):
  x = np.array([[r, 10. * r, 100. * r] for r in range(8)], np.float32)
  with tf.Graph().as_default():
    spec = replicate.replicate_model_fn(
        _model_fn, devices=replicate.testing.virtual_cpu_devices(num_towers),
        unsplit_features=['a_whole'])(
            {'a_whole': tf.constant(whole), 'x': tf.constant(x)}, None,
            tf1.estimator.ModeKeys.PREDICT)
    with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as sess:
      sess.run(tf1.global_variables_initializer())
      return sess.run(spec.predictions)['y']


class PredictStaticRowsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      # 7 rows that are not the batch's: the towers' rows stay [4, 4].
      ('vocabulary', np.arange(7, dtype=np.float32)),
      # A scalar has no dimension 0 at all.
      ('scalar', np.float32(21.)))
  def test_unsplit_feature_sorted_first_is_not_the_rows(self, whole):
    # 'a_whole' flattens before 'x'; every tower gets it whole (so tower
    # 0's and tower 1's are the same tensor) and it must not set the rows.
    expected = [[642. * r + 21.] for r in range(8)]
    self.assertAllEqual(expected, _predict(1, whole))
    self.assertAllEqual(expected, _predict(2, whole))


if __name__ == '__main__':
  tf.test.main()

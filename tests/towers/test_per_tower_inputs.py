"""Each tower's checks read that tower's own shard (tower_build.py sets
`replication.tower_inputs` per tower): a sparse feature split unevenly is
sliced by one op per tower, so tower 1's loss reads only tower 1's slice."""
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

# 5 rows of 3 columns; row r holds (r + 1) at column r % 3 and 10 * (r + 1)
# at column (r + 1) % 3: distinct per row.
_INDICES = [[r, c] for r in range(5) for c in sorted((r % 3, (r + 1) % 3))]
_VALUES = [float(v) for r in range(5) for _, v in sorted(
    ((r % 3, r + 1.), ((r + 1) % 3, 10. * (r + 1))))]


def _model_fn(features, mode):
  # SUM: the loss is the sum over rows of (x_r . w)^2; no labels, so the
  # one term reads nothing but the tower's sparse slice.
  w = tf1.get_variable('w', initializer=tf.constant([[0.01], [-0.02],
                                                     [0.03]]))
  dense = tf1.sparse.to_dense(features['s'], validate_indices=False)
  loss = tf.reduce_sum(tf.square(tf.matmul(dense, w)))
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(1e-4)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _train(num_towers, **kwargs):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    sparse = tf1.SparseTensor(indices=np.array(_INDICES, np.int64),
                              values=np.array(_VALUES, np.float32),
                              dense_shape=np.array([5, 3], np.int64))
    spec = replicate.replicate_model_fn(
        _model_fn, loss_reduction=tf1.losses.Reduction.SUM,
        devices=replicate.testing.virtual_cpu_devices(num_towers), **kwargs)(
            {'s': sparse}, None, tf1.estimator.ModeKeys.TRAIN)
    with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as sess:
      sess.run(tf1.global_variables_initializer())
      for _ in range(2):
        sess.run(spec.train_op)
      return sess.run(tf1.trainable_variables()[0])


class PerTowerInputsTest(tf.test.TestCase):

  def test_uneven_sparse_sum_per_tower_equals_one_device(self):
    # 5 rows on 2 towers: [3, 2]; under SUM the towers' row sums add up to
    # one device's sum, so the weights match one device's after 2 steps.
    # Tower 1's loss reads tower 1's SparseSlice, not tower 0's: checking it
    # against tower 0's inputs would refuse the term as one that reads none
    # of the tower's rows.
    expected = _train(1)
    for tower_build in (replicate.TowerBuild.CALL_PER_TOWER,
                        replicate.TowerBuild.CLONE):
      self.assertAllClose(expected, _train(2, tower_build=tower_build),
                          msg=str(tower_build))


if __name__ == '__main__':
  tf.test.main()

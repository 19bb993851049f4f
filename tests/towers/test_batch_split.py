"""Splitting features and labels into tower shards."""
import tensorflow as tf

from replicate._compat import tf1
from replicate.towers import batch_split


class SplitBatchTest(tf.test.TestCase):

  def _run(self, fetches):
    with tf1.Session() as sess:
      return sess.run(fetches)

  def test_tensor_and_dict_labels(self):
    with tf.Graph().as_default():
      features = tf.reshape(tf.range(8), [4, 2])
      labels = {'a': tf.constant([0, 1, 2, 3]), 'b': tf.constant([[4], [5],
                                                                 [6], [7]])}
      f, l = batch_split.split_batch(features, labels, 2, '/cpu:0')
      f, l = self._run([f, l])
    self.assertAllEqual([[0, 1], [2, 3]], f[0])
    self.assertAllEqual([[4, 5], [6, 7]], f[1])
    self.assertAllEqual([0, 1], l[0]['a'])
    self.assertAllEqual([[6], [7]], l[1]['b'])

  def test_labels_none(self):
    with tf.Graph().as_default():
      _, labels = batch_split.split_batch(tf.zeros([4]), None, 4, '/cpu:0')
    self.assertEqual([None] * 4, labels)

  def test_sparse_tensor_split_by_rows(self):
    with tf.Graph().as_default():
      # Rows 0..3; row r holds the value 10 * r at column r.
      sparse = tf1.SparseTensor(indices=[[0, 0], [1, 1], [2, 2], [3, 3]],
                                values=[0, 10, 20, 30], dense_shape=[4, 4])
      shards, _ = batch_split.split_batch({'s': sparse}, None, 2, '/cpu:0')
      dense = self._run([tf1.sparse.to_dense(s['s']) for s in shards])
    self.assertAllEqual([[0, 0, 0, 0], [0, 10, 0, 0]], dense[0])
    self.assertAllEqual([[0, 0, 20, 0], [0, 0, 0, 30]], dense[1])

  def test_sparse_tensor_not_divisible(self):
    with tf.Graph().as_default():
      sparse = tf1.SparseTensor(indices=[[0, 0]], values=[1], dense_shape=[3, 2])
      with self.assertRaisesRegex(
          ValueError, r"Batch size 3 of features\['s'\] is not divisible"):
        batch_split.split_batch({'s': sparse}, None, 2, '/cpu:0')

  def test_nested_features(self):
    with tf.Graph().as_default():
      features = {'a': (tf.zeros([4, 1]), tf.ones([4]))}
      shards, _ = batch_split.split_batch(features, None, 2, '/cpu:0')
    self.assertEqual([2, 1], shards[1]['a'][0].shape.as_list())
    self.assertEqual([2], shards[1]['a'][1].shape.as_list())

  def test_unsupported_type(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(TypeError, r"features\['x'\] must be a "
                                  'Tensor, a SparseTensor'):
        batch_split.split_batch({'x': object()}, None, 2, '/cpu:0')

  def test_split_runs_on_given_device(self):
    with tf.Graph().as_default():
      shards, _ = batch_split.split_batch(tf.zeros([4]), None, 2, '/cpu:0')
    self.assertEqual('/device:CPU:0', shards[0].op.device)


if __name__ == '__main__':
  tf.test.main()

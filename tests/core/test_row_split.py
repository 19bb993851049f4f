"""The split of a batch's rows among shards (replicate/core/row_split.py)."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from replicate._compat import tf1
from replicate.core import row_split


class RowSplitTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(
      # (rows, shards, expected): the first rows % shards get one more.
      (8, 4, [2, 2, 2, 2]), (10, 4, [3, 3, 2, 2]), (7, 4, [2, 2, 2, 1]),
      (2, 4, [1, 1, 0, 0]), (0, 3, [0, 0, 0]), (5, 1, [5]))
  def test_shard_rows(self, rows, shards, expected):
    with tf.Graph().as_default():
      value = tf1.placeholder(tf.float32, [None, 2])
      batch_size, static = row_split.batch_rows(value)
      self.assertIsNone(static)
      sizes, _ = row_split.shard_rows(batch_size, shards)
      pieces = row_split.split_rows(value, shards, sizes)
      data = np.arange(2 * rows, dtype=np.float32).reshape(rows, 2)
      with tf1.Session() as sess:
        got_sizes, got = sess.run([sizes, pieces], {value: data})
    self.assertEqual(got_sizes.tolist(), expected)
    # Every row once, in order.
    self.assertAllEqual(np.concatenate(got), data)

  def test_static_rows_are_hidden_unless_even(self):
    with tf.Graph().as_default():
      value = tf.zeros([6, 2])
      batch_size, static = row_split.batch_rows(value)
      self.assertEqual(static, 6)
      self.assertTrue(row_split.splits_evenly(6, 3))
      self.assertFalse(row_split.splits_evenly(6, 4))
      self.assertFalse(row_split.splits_evenly(None, 4))
      even = row_split.split_rows(value, 3)
      sizes, hidden = row_split.shard_rows(batch_size, 4, static)
      uneven = row_split.split_rows(value, 4, sizes)
      self.assertEqual([p.shape.as_list() for p in even], [[2, 2]] * 3)
      # 6 rows on 4: 2, 2, 1, 1 at run time; no static row count.
      self.assertEqual([p.shape.as_list() for p in uneven], [[None, 2]] * 4)
      with tf1.Session() as sess:
        self.assertEqual(sess.run(hidden), 6)
        self.assertEqual([len(p) for p in sess.run(uneven)], [2, 2, 1, 1])

  def test_sparse_rows(self):
    with tf.Graph().as_default():
      sparse = tf1.SparseTensor(indices=[[0, 0], [1, 1], [2, 0]],
                                values=[1., 2., 3.], dense_shape=[3, 2])
      batch_size, static = row_split.batch_rows(sparse)
      self.assertEqual(static, 3)
      sizes, _ = row_split.shard_rows(batch_size, 2, static)
      pieces = [tf1.sparse.to_dense(p)
                for p in row_split.split_rows(sparse, 2, sizes)]
      with tf1.Session() as sess:
        # 3 rows on 2: rows 0-1, then row 2.
        self.assertEqual([p.tolist() for p in sess.run(pieces)],
                         [[[1., 0.], [0., 2.]], [[3., 0.]]])


if __name__ == '__main__':
  tf.test.main()

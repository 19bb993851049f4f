"""Splitting features and labels into tower shards."""
import collections
import tempfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
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
      split = batch_split.split_batch(features, labels, 2, '/cpu:0')
      f, l = split.feature_shards, split.label_shards
      f, l = self._run([f, l])
    self.assertAllEqual([[0, 1], [2, 3]], f[0])
    self.assertAllEqual([[4, 5], [6, 7]], f[1])
    self.assertAllEqual([0, 1], l[0]['a'])
    self.assertAllEqual([[6], [7]], l[1]['b'])

  def test_labels_none(self):
    with tf.Graph().as_default():
      split = batch_split.split_batch(tf.zeros([4]), None, 4, '/cpu:0')
    self.assertEqual([None] * 4, split.label_shards)

  def test_sparse_tensor_split_by_rows(self):
    with tf.Graph().as_default():
      # Rows 0..3; row r holds the value 10 * r at column r.
      sparse = tf1.SparseTensor(indices=[[0, 0], [1, 1], [2, 2], [3, 3]],
                                values=[0, 10, 20, 30], dense_shape=[4, 4])
      shards = batch_split.split_batch({'s': sparse}, None, 2,
                                       '/cpu:0').feature_shards
      dense = self._run([tf1.sparse.to_dense(s['s']) for s in shards])
    self.assertAllEqual([[0, 0, 0, 0], [0, 10, 0, 0]], dense[0])
    self.assertAllEqual([[0, 0, 20, 0], [0, 0, 0, 30]], dense[1])

  def test_sparse_tensor_not_divisible_is_split_unevenly(self):
    with tf.Graph().as_default():
      # 3 rows on 2 shards: rows 0-1, then row 2.
      sparse = tf1.SparseTensor(indices=[[0, 0], [2, 1]], values=[1, 2],
                                dense_shape=[3, 2])
      split = batch_split.split_batch({'s': sparse}, None, 2, '/cpu:0')
      dense, rows = self._run(
          [[tf1.sparse.to_dense(s['s']) for s in split.feature_shards],
           split.rows])
    self.assertEqual([2, 1], rows)
    self.assertAllEqual([[1, 0], [0, 0]], dense[0])
    self.assertAllEqual([[0, 2]], dense[1])

  def test_sparse_tensor_values_split_as_sparse_tensors(self):
    # A SparseTensorValue (a namedtuple) of 3 rows, of NumPy arrays or of
    # Python lists: split by rows as the SparseTensor it stands for (rows
    # 0-1, then row 2), not as its indices, values and shape.
    for make in (np.array, list):
      with tf.Graph().as_default():
        value = tf1.SparseTensorValue(
            indices=make([[0, 0], [2, 1]]), values=make([1, 2]),
            dense_shape=make([3, 2]))
        split = batch_split.split_batch({'s': value, 'x': tf.zeros([3])},
                                        None, 2, '/cpu:0')
        for shard in split.feature_shards:
          self.assertIsInstance(shard['s'], tf1.SparseTensor)
        dense, rows = self._run(
            [[tf1.sparse.to_dense(s['s']) for s in split.feature_shards],
             split.rows])
      self.assertEqual([2, 1], rows)
      self.assertAllEqual([[1, 0], [0, 0]], dense[0])
      self.assertAllEqual([[0, 2]], dense[1])

  def test_empty_list_feature_is_no_value_to_split(self):
    # An empty list or tuple in the features is an empty nest (no leaves),
    # as tf.nest sees it: every tower gets it as it is, and the batch is
    # x's 3 rows, split [2, 1]. Made a tensor, it would be a float32 [0]
    # value whose 0 rows differ from the batch's 3 (refused).
    with tf.Graph().as_default():
      split = batch_split.split_batch(
          {'x': tf.constant([[1.], [2.], [3.]]), 'empty': [], 'none': ()},
          [], 2, '/cpu:0')
      self.assertEqual([], split.feature_shards[0]['empty'])
      self.assertEqual((), split.feature_shards[1]['none'])
      self.assertEqual([[], []], split.label_shards)
      with tf1.Session() as sess:
        x, rows = sess.run([[s['x'] for s in split.feature_shards],
                            split.rows])
    self.assertAllEqual([[1.], [2.]], x[0])
    self.assertAllEqual([[3.]], x[1])
    self.assertEqual([2, 1], rows)

  def test_even_static_batch_counts_no_rows(self):
    with tf.Graph().as_default():
      split = batch_split.split_batch(tf.zeros([4, 2]), tf.zeros([4]), 2,
                                      '/cpu:0')
    self.assertIsNone(split.rows)
    self.assertIsNone(split.batch_size)

  def test_uneven_dynamic_batch(self):
    # 5 rows on 4 shards: [2, 1, 1, 1], in order.
    with tf.Graph().as_default():
      x = tf1.placeholder(tf.int32, [None])
      split = batch_split.split_batch(x, None, 4, '/cpu:0')
      with tf1.Session() as sess:
        shards, rows, size = sess.run(
            [split.feature_shards, split.rows, split.batch_size],
            {x: [0, 1, 2, 3, 4]})
    self.assertEqual([[0, 1], [2], [3], [4]], [s.tolist() for s in shards])
    self.assertEqual([2, 1, 1, 1], rows)
    self.assertEqual(5, size)

  def test_scalars_are_not_split(self):
    with tf.Graph().as_default():
      scale = tf.constant(2.0)
      shards = batch_split.split_batch({'x': tf.zeros([4]), 's': scale}, None,
                                       2, '/cpu:0').feature_shards
    self.assertIs(scale, shards[0]['s'])
    self.assertIs(scale, shards[1]['s'])

  def test_nested_features(self):
    with tf.Graph().as_default():
      features = {'a': (tf.zeros([4, 1]), tf.ones([4]))}
      shards = batch_split.split_batch(features, None, 2,
                                       '/cpu:0').feature_shards
    self.assertEqual([2, 1], shards[1]['a'][0].shape.as_list())
    self.assertEqual([2], shards[1]['a'][1].shape.as_list())

  def test_lists_of_python_values_are_split_by_rows(self):
    # As TF reads them: [[1.], [2.], [3.], [4.]] is a [4, 1] tensor, so
    # each of 2 towers gets 2 rows. Before, each number was a scalar given
    # whole to every tower.
    pair = collections.namedtuple('Pair', ['words', 'ids'])
    with tf.Graph().as_default():
      features = {'x': [[1.], [2.], [3.], [4.]], 'scale': 2.0,
                  'pair': pair(['a', 'b', 'c', 'd'], tf.range(4))}
      split = batch_split.split_batch(features, [5, 6, 7, 8], 2, '/cpu:0')
      shards = self._run([split.feature_shards, split.label_shards])
    self.assertAllEqual([[3.], [4.]], shards[0][1]['x'])
    self.assertEqual(2.0, shards[0][1]['scale'])
    self.assertAllEqual([b'c', b'd'], shards[0][1]['pair'].words)
    self.assertAllEqual([2, 3], shards[0][1]['pair'].ids)
    self.assertAllEqual([[5, 6], [7, 8]], shards[1])

  def test_unsupported_type(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(TypeError, r"features\['x'\] must be a "
                                  'Tensor, a SparseTensor'):
        batch_split.split_batch({'x': object()}, None, 2, '/cpu:0')

  def test_ragged_tensor_is_refused_with_the_fix(self):
    with tf.Graph().as_default():
      ragged = tf.ragged.constant([[1.], [2., 3.]])
      with self.assertRaisesRegex(
          TypeError, r"features\['r'\] is a tf.RaggedTensor.*to_sparse\(\)"):
        batch_split.split_batch({'r': ragged}, None, 2, '/cpu:0')

  def test_value_of_unknown_rank_must_have_rows(self):
    # Split like any value (a [4, 1] batch gives [2, 1] shards); a scalar
    # fails the step naming it and unsplit_features.
    with tf.Graph().as_default():
      value = tf1.placeholder(tf.float32, shape=None)
      shards = batch_split.split_batch(
          {'x': tf.zeros([4, 1]), 'v': value}, None, 2,
          '/cpu:0').feature_shards
      with tf1.Session() as sess:
        self.assertAllEqual([[3.], [4.]], sess.run(
            shards[1]['v'], {value: [[1.], [2.], [3.], [4.]]}))
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError,
            # (TF escapes the quotes of features['v'] in the message.)
            r"features\[\\?'v\\?'\] has no static rank .* but it is a "
            'scalar.*unsplit_features'):
          sess.run(shards[1]['v'], {value: 2.0})

  def test_split_runs_on_given_device(self):
    with tf.Graph().as_default():
      shards = batch_split.split_batch(tf.zeros([4]), None, 2,
                                       '/cpu:0').feature_shards
    self.assertEqual('/device:CPU:0', shards[0].op.device)



class PythonListInputsTest(parameterized.TestCase, tf.test.TestCase):
  """An input_fn may return Python lists: one device's model_fn reads each
  as one tensor of the batch's rows."""

  @parameterized.parameters(tf1.losses.Reduction.SUM,
                            tf1.losses.Reduction.MEAN)
  def test_trains_as_one_device(self, reduction):
    # 5 distinct rows on 2 towers ([3, 2] rows), |x c - y| summed: with the
    # lists given whole to each tower, SUM moved c twice one device's step.
    features = [[1.], [2.], [-3.], [4.5], [0.5]]
    labels = [[2.], [-1.], [3.], [4.], [1.5]]

    def model_fn(features, labels, mode):
      c = tf1.get_variable('c', [], initializer=tf1.constant_initializer(
          0.7))
      errors = tf.abs(tf.convert_to_tensor(features) * c - labels)
      loss = (tf.reduce_sum(errors) if reduction == tf1.losses.Reduction.SUM
              else tf.reduce_mean(errors))
      optimizer = tf1.train.GradientDescentOptimizer(0.1)
      if replicate.get_tower_context() is not None:
        optimizer = replicate.TowerOptimizer(optimizer)
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss, train_op=optimizer.minimize(
              loss, tf1.train.get_global_step()))

    results = []
    for wrapped in (model_fn, replicate.replicate_model_fn(
        model_fn, reduction,
        devices=replicate.testing.virtual_cpu_devices(2))):
      estimator = tf1.estimator.Estimator(
          wrapped, model_dir=tempfile.mkdtemp(dir=self.get_temp_dir()),
          config=tf1.estimator.RunConfig(
              session_config=replicate.testing.virtual_cpu_config(2)))
      estimator.train(lambda: (features, labels), steps=2)
      results.append(estimator.get_variable_value('c'))
    self.assertAllClose(results[0], results[1], rtol=1e-6)
    self.assertNotAllClose(0.7, results[1])


if __name__ == '__main__':
  tf.test.main()

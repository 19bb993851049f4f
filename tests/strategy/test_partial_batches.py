"""MirroredStrategy's input splits any global batch: nothing is dropped.

A batch of `b` rows on 4 replicas gives the first `b % 4` replicas
`b // 4 + 1` rows and the others `b // 4`, in order, as replicate_model_fn
splits a batch among towers.
"""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.strategy.mirrored_copies import ReplicaBuild

NUM = 4
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)
SUM = replicate.ReduceOp.SUM
_LR = 0.1

# 10 distinct rows; batched by 8: a full batch, then a partial one of 2.
_X = np.array([[1., 2., 0.], [0., 1., 1.], [2., 0., 1.], [1., 1., 1.],
               [0., 2., 2.], [1., 0., 0.], [3., 1., 0.], [0., 0., 1.],
               [2., 2., 1.], [1., 3., -1.]], np.float32)
_Y = np.array([[1.], [0.], [2.], [1.], [-1.], [0.5], [3.], [0.], [4.],
               [-2.]], np.float32)
_W = np.array([1., 2., 3., 4., 5., 6., 7., 8., 9., 10.], np.float32)


def _iterator(strategy, dataset, how):
  if how == 'distribute_dataset':
    return strategy.experimental_distribute_dataset(
        dataset).make_initializable_iterator()
  return strategy.make_dataset_iterator(dataset)


def _global_mean_loss(x, y, weight):
  """This replica's share of the global batch's weighted squared error.

  The sum over this replica's rows divided by the rows of the whole global
  batch (an all-reduce of the replicas' row counts): the replicas' losses and
  gradients add up to those of the mean over the batch on one device,
  however the rows were shared out, empty replicas included.
  """
  w = tf1.get_variable('w', [3, 1], initializer=tf1.zeros_initializer())
  b = tf1.get_variable('b', [1], initializer=tf1.constant_initializer(0.5))
  per_example = weight * tf.square(tf.matmul(x, w) + b - y)[:, 0]
  rows = tf.cast(tf.shape(per_example)[0], tf.float32)
  global_rows = replicate.get_replica_context().all_reduce(SUM, rows)
  return tf.reduce_sum(per_example) / global_rows


def _one_device(optimizer_fn, data, batches):
  """The reference: the mean loss on one device, batch after batch."""
  with tf.Graph().as_default():
    x = tf1.placeholder(tf.float32, [None, 3])
    y = tf1.placeholder(tf.float32, [None, 1])
    weight = tf1.placeholder(tf.float32, [None])
    w = tf1.get_variable('w', [3, 1], initializer=tf1.zeros_initializer())
    b = tf1.get_variable('b', [1], initializer=tf1.constant_initializer(0.5))
    loss = tf.reduce_mean(weight * tf.square(tf.matmul(x, w) + b - y)[:, 0])
    train = optimizer_fn().minimize(loss)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      for rows in batches:
        sess.run(train, {x: data[0][rows], y: data[1][rows],
                         weight: data[2][rows]})
      return sess.run([w, b])


class PartialBatchInputTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters('make_dataset_iterator', 'distribute_dataset')
  def test_every_row_once_in_replica_order(self, how):
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      # Features and labels of one element are split by the same counts.
      dataset = tf.data.Dataset.from_tensor_slices(
          {'x': np.arange(10), 'y': np.arange(10) * 10}).batch(8)
      iterator = _iterator(strategy, dataset, how)
      batch = iterator.get_next()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        x, y = sess.run([list(batch['x'].values), list(batch['y'].values)])
        # 8 rows on 4 replicas: two each, replica i rows 2i and 2i + 1.
        self.assertEqual([r.tolist() for r in x],
                         [[0, 1], [2, 3], [4, 5], [6, 7]])
        self.assertEqual([r.tolist() for r in y],
                         [[0, 10], [20, 30], [40, 50], [60, 70]])
        x, y = sess.run([list(batch['x'].values), list(batch['y'].values)])
        # The final 2 rows: 2 % 4 = 2 replicas get 2 // 4 + 1 = 1 row, the
        # other two none.
        self.assertEqual([r.tolist() for r in x], [[8], [9], [], []])
        self.assertEqual([r.tolist() for r in y], [[80], [90], [], []])
        with self.assertRaises(tf.errors.OutOfRangeError):
          sess.run(list(batch['x'].values))

  def test_static_uneven_batch_hides_its_size(self):
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(12).batch(6, drop_remainder=True))
      batch = iterator.get_next()
      # 6 rows on 4 replicas: 2, 2, 1, 1; no replica's shape bakes in its
      # count (a copy of replica 0 would otherwise carry 2 rows).
      for piece in batch.values:
        self.assertEqual(piece.shape.as_list(), [None])
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        self.assertEqual([r.tolist() for r in sess.run(list(batch.values))],
                         [[0, 1], [2, 3], [4], [5]])
        self.assertEqual([r.tolist() for r in sess.run(list(batch.values))],
                         [[6, 7], [8, 9], [10], [11]])

  def test_static_even_batch_keeps_static_shapes(self):
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(8).batch(8, drop_remainder=True))
      batch = iterator.get_next()
      # 8 / 4: tf.split as before, two rows each, statically.
      for piece in batch.values:
        self.assertEqual(piece.shape.as_list(), [2])

  def test_sparse_rows_split_in_order(self):
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      sparse = tf1.SparseTensor(indices=[[0, 0], [1, 1], [2, 0], [4, 2]],
                                values=[1., 2., 3., 4.], dense_shape=[5, 3])
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.from_tensors(sparse))
      batch = iterator.get_next()
      dense = strategy.experimental_run_v2(tf1.sparse.to_dense,
                                           args=(batch,))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        # 5 rows: replica 0 gets rows 0-1, replicas 1-3 one row each.
        self.assertEqual([r.tolist() for r in sess.run(strategy.unwrap(dense))],
                         [[[1., 0., 0.], [0., 2., 0.]], [[3., 0., 0.]],
                          [[0., 0., 0.]], [[0., 0., 4.]]])

  def test_numpy_iterator_keeps_the_last_batch(self):
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      iterator = strategy.experimental_make_numpy_iterator(
          np.arange(8), batch_size=6, shuffle=None)
      batch = iterator.get_next()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        # 6 rows: 2, 2, 1, 1; then the last 2 rows: 1, 1, 0, 0.
        self.assertEqual([r.tolist() for r in sess.run(list(batch.values))],
                         [[0, 1], [2, 3], [4], [5]])
        self.assertEqual([r.tolist() for r in sess.run(list(batch.values))],
                         [[6], [7], [], []])

  def test_static_batch_mismatch_raises(self):
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(tf.data.Dataset.from_tensors(
          (np.zeros([4], np.float32), np.zeros([3], np.float32))))
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'Input .*:1 has 3 rows in dimension 0 but input .*:0 \(the first\) '
          'has 4: every input is split .* Batch them together'):
        iterator.get_next()

  def test_dynamic_batch_mismatch_fails_the_step(self):
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      dataset = tf.data.Dataset.from_tensors(
          (np.zeros([4], np.float32), np.zeros([3], np.float32))).map(
              lambda a, b: (tf.boolean_mask(a, a >= 0), b))  # a: [None]
      iterator = strategy.make_dataset_iterator(dataset)
      batch = iterator.get_next()
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError,
            r'has 3 rows in dimension 0 but input .* \(the first\) has '
            r'\(known at run time\)'):
          sess.run(list(batch[1].values))


class PartialBatchTrainingTest(parameterized.TestCase, tf.test.TestCase):

  def test_empty_replicas_give_no_nan(self):
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      # The last batch of 10 rows by 8 has 2 rows: replicas 2 and 3 get none.
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.from_tensor_slices((_X, _Y, _W)).batch(8))
      with strategy.scope():
        losses = strategy.experimental_run(
            lambda inputs: _global_mean_loss(*inputs), iterator)
        total = strategy.reduce(SUM, losses)
      with tf1.Session(config=CONFIG) as sess:
        sess.run([tf1.global_variables_initializer(), iterator.initialize()])
        sess.run(total)
        per_replica, summed = sess.run([strategy.unwrap(losses), total])
    # w = 0, b = 0.5: rows 8, 9 have errors (0.5 - 4)^2 = 12.25 and
    # (0.5 + 2)^2 = 6.25, weights 9 and 10; each over 2 global rows.
    self.assertAllClose(per_replica,
                        [9 * 12.25 / 2, 10 * 6.25 / 2, 0., 0.], rtol=1e-6)
    self.assertAllClose(summed, (9 * 12.25 + 10 * 6.25) / 2, rtol=1e-6)

  @parameterized.parameters(
      ('sgd_calls', lambda: tf1.train.GradientDescentOptimizer(_LR),
       ReplicaBuild.CALL_PER_REPLICA, 8, False),
      ('sgd_clone', lambda: tf1.train.GradientDescentOptimizer(_LR),
       ReplicaBuild.CLONE, 8, False),
      ('adam_calls', lambda: tf1.train.AdamOptimizer(_LR),
       ReplicaBuild.CALL_PER_REPLICA, 8, False),
      ('sgd_static_6_clone', lambda: tf1.train.GradientDescentOptimizer(_LR),
       ReplicaBuild.CLONE, 6, True))
  def test_training_matches_one_device(self, unused_name, optimizer_fn,
                                       replica_build, batch, drop_remainder):
    # Batches of 8 over 10 rows: rows 0-7 (two per replica), then 8-9 (one
    # on replicas 0 and 1, none on 2 and 3). Batches of 6 (static): rows
    # 0-5 then 6-11 of 12 (two, two, one, one rows).
    rows = 12 if drop_remainder else 10
    x = np.concatenate([_X, _X[:2] + 1.])[:rows]
    y = np.concatenate([_Y, _Y[:2] - 1.])[:rows]
    weight = np.concatenate([_W, [11., 12.]])[:rows].astype(np.float32)
    batches = [slice(0, batch), slice(batch, rows)]
    expected = _one_device(optimizer_fn, (x, y, weight), batches)
    strategy = replicate.MirroredStrategy(DEVICES,
                                          replica_build=replica_build)

    def step(inputs):
      loss = _global_mean_loss(*inputs)
      return replicate.TowerOptimizer(optimizer_fn()).minimize(loss)

    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.from_tensor_slices((x, y, weight)).batch(
              batch, drop_remainder=drop_remainder))
      with strategy.scope():
        train = strategy.group(strategy.experimental_run(step, iterator))
      w, b = tf1.trainable_variables()
      with tf1.Session(config=CONFIG) as sess:
        sess.run([tf1.global_variables_initializer(), iterator.initialize()])
        for _ in batches:
          sess.run(train)
        for variable, value in zip((w, b), expected):
          for copy in sess.run(list(variable.values)):
            # Every copy equals one device's mean-loss training.
            self.assertAllClose(copy, value, rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()

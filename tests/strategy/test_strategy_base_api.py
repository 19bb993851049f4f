"""Strategy's own methods: group over a nest, reduce's axis type, the
NumPy iterator's epochs and batches, run's kwargs."""
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.cross_tower import values

_NUM = 2
_DEVICES = testing.virtual_cpu_devices(_NUM)
_CONFIG = testing.virtual_cpu_config(_NUM)
SUM = replicate.ReduceOp.SUM


def _strategy():
  return replicate.MirroredStrategy(_DEVICES)


class StrategyBaseTest(tf.test.TestCase):

  def test_group_runs_every_leaf_of_a_nest(self):
    # Two leaves, each an op per replica: replica i adds i + 1 to `a` and
    # 10 * (i + 1) to `b`'s copy. Running the group once runs all four: a's
    # copies hold 1, 2 and b's 10, 20.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        a = tf1.get_variable('a', initializer=0.0,
                             synchronization=tf.VariableSynchronization.ON_READ,
                             aggregation=tf.VariableAggregation.SUM)
        b = tf1.get_variable('b', initializer=0.0,
                             synchronization=tf.VariableSynchronization.ON_READ,
                             aggregation=tf.VariableAggregation.SUM)

        def step():
          x = tf.cast(
              replicate.get_replica_context().replica_id_in_sync_group + 1,
              tf.float32)
          return {'a': a.assign_add(x).op, 'b': b.assign_add(10. * x).op,
                  'none': None}
        op = strategy.group(strategy.run(step))
      self.assertIsInstance(op, tf.Operation)
      with tf1.Session(config=_CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(op)
        self.assertAllEqual(sess.run(list(a.values)), [1., 2.])
        self.assertAllEqual(sess.run(list(b.values)), [10., 20.])

  def test_reduce_refuses_a_bool_axis(self):
    strategy = _strategy()
    with tf.Graph().as_default(), strategy.scope():
      rows = values.PerReplica(
          {d: tf.fill([2, 2], float(i)) for i, d in enumerate(_DEVICES)})
      for op in (SUM, replicate.ReduceOp.MEAN):
        with self.assertRaisesRegex(errors.InvalidTypeError,
                                    'int axis .*got True of type bool'):
          strategy.reduce(op, rows, axis=True)


  def test_run_and_run_v2_pass_kwargs(self):
    # Replica i gets x = i + 1 (split from a PerReplica) and scale = 10
    # (plain): results 10, 20 from each entry point.
    strategy = _strategy()
    with tf.Graph().as_default():
      x = values.PerReplica(
          {d: tf.constant(float(i + 1)) for i, d in enumerate(_DEVICES)})
      fn = lambda x, scale: x * scale
      results = [
          strategy.run(fn, kwargs={'x': x, 'scale': 10.}),
          strategy.experimental_run_v2(fn, args=(x,), kwargs={'scale': 10.}),
      ]
      with tf1.Session(config=_CONFIG) as sess:
        for result in results:
          self.assertAllEqual(sess.run(list(strategy.unwrap(result))),
                              [10., 20.])

  def test_numpy_iterator_batches_across_epochs(self):
    # 5 rows, 2 epochs, global batches of 2, no shuffling (None or 0, as
    # documented): the epochs run on without a partial batch between them
    # (as TF: repeat, then batch): 0 1 | 2 3 | 4 0 | 1 2 | 3 4, 5 steps, one
    # row per replica each.
    strategy = _strategy()
    for shuffle in (None, 0):
      with tf.Graph().as_default():
        iterator = strategy.experimental_make_numpy_iterator(
            np.arange(5, dtype=np.float32), batch_size=2, num_epochs=2,
            shuffle=shuffle)
        nxt = strategy.unwrap(iterator.get_next())
        got = []
        with tf1.Session(config=_CONFIG) as sess:
          sess.run(iterator.initialize())
          while True:
            try:
              got.append([list(r) for r in sess.run(list(nxt))])
            except tf.errors.OutOfRangeError:
              break
      self.assertEqual(got, [[[0.], [1.]], [[2.], [3.]], [[4.], [0.]],
                             [[1.], [2.]], [[3.], [4.]]], msg=shuffle)

if __name__ == '__main__':
  tf.test.main()

"""Which replica gets which input, and what the multi-step loop hands back.

Pins, on 4 virtual CPUs: that replica i (the strategy's i-th device) reads
the i-th of the successive elements of an `input_fn` dataset, by device and
not only by position; that `make_initializable_iterator` restarts; and
that `experimental_run_steps_on_iterator` gives each recorded
output its own last-step value.
"""
import tensorflow as tf

import replicate
from replicate import testing
from replicate._compat import tf1

NUM = 4
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)
SUM = replicate.ReduceOp.SUM


class InputReplicaOrderTest(tf.test.TestCase):

  def test_input_fn_elements_go_to_the_devices_in_order(self):
    # Elements are batches of 2: [0 1], [2 3], [4 5], [6 7], ...; device i
    # must hold the i-th one, [2i, 2i + 1], looked up by its device.
    strategy = replicate.MirroredStrategy(DEVICES)

    def input_fn(context):
      return tf.data.Dataset.range(100).batch(
          context.get_per_replica_batch_size(8))
    with tf.Graph().as_default():
      iterator = strategy.make_input_fn_iterator(input_fn)
      batch = iterator.get_next()
      by_device = [batch.get(d) for d in DEVICES]
      for i, piece in enumerate(by_device):
        self.assertIn('CPU:{}'.format(i), piece.device)
      # What each replica's function sees: its replica id and its rows.
      seen = strategy.experimental_run_v2(
          lambda x: x + 100 * tf.cast(
              replicate.get_replica_context().replica_id_in_sync_group,
              tf.int64), args=(batch,))
      seen_by_device = [seen.get(d) for d in DEVICES]
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        got, got_seen = sess.run([by_device, seen_by_device])
        self.assertAllEqual(got, [[0, 1], [2, 3], [4, 5], [6, 7]])
        # Replica i: [2i, 2i + 1] + 100 i.
        self.assertAllEqual(got_seen,
                            [[0, 1], [102, 103], [204, 205], [306, 307]])

  def test_tf_make_initializable_iterator_restarts(self):
    # tf.compat.v1.data.make_initializable_iterator on a distributed dataset
    # gives an iterator that its initializer restarts: global batches
    # [0..3], [4..7]; after re-initializing, [0..3] again (not [8..11]).
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      for dataset in (
          strategy.experimental_distribute_dataset(
              tf.data.Dataset.range(16).batch(4)),
          strategy.experimental_distribute_datasets_from_function(
              lambda context: tf.data.Dataset.range(16).batch(1))):
        iterator = tf1.data.make_initializable_iterator(dataset)
        self.assertLen(iterator.initialize(), 1)
        rows = list(iterator.get_next().values)
        with tf1.Session(config=CONFIG) as sess:
          sess.run(iterator.initializer)
          self.assertAllEqual(sess.run(rows), [[0], [1], [2], [3]])
          self.assertAllEqual(sess.run(rows), [[4], [5], [6], [7]])
          sess.run(iterator.initializer)
          self.assertAllEqual(sess.run(rows), [[0], [1], [2], [3]])


class RunStepsOutputsTest(tf.test.TestCase):

  def test_each_output_holds_its_own_last_step_value(self):
    # Global batches of 4 rows of range(12): [0..3], [4..7], [8..11]; 3
    # steps. Recorded per step: 'sum' = SUM over replicas of their rows'
    # sums, 'max' = MEAN over replicas of their largest row. Recorded in
    # the order 'sum', 'max' (not sorted) with an initial value each.
    # Last step [8 9 10 11], one row per replica: sum = 38, max = mean of
    # 8, 9, 10, 11 = 9.5.
    strategy = replicate.MirroredStrategy(DEVICES)

    def step_fn(context, inputs):
      sums = strategy.experimental_run_v2(
          lambda x: tf.cast(tf.reduce_sum(x), tf.float32), args=(inputs,))
      maxes = strategy.experimental_run_v2(
          lambda x: tf.cast(tf.reduce_max(x), tf.float32), args=(inputs,))
      context.set_last_step_output('sum', sums, reduce_op=SUM)
      context.set_last_step_output('max', maxes,
                                   reduce_op=replicate.ReduceOp.MEAN)
      return None

    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(12).batch(4))
      with strategy.scope():
        context = strategy.extended.experimental_run_steps_on_iterator(
            step_fn, iterator, iterations=3,
            initial_loop_values={'sum': -1.0, 'max': -2.0})
      with tf1.Session(config=CONFIG) as sess:
        sess.run(iterator.initialize())
        self.assertEqual(sorted(context.last_step_outputs), ['max', 'sum'])
        # One run: the outputs are the loop's, so run them with run_op.
        _, outputs = sess.run([context.run_op, context.last_step_outputs])
        self.assertAllClose(outputs, {'sum': 38.0, 'max': 9.5})


if __name__ == '__main__':
  tf.test.main()

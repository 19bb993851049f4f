"""Edges of the strategy API: complex ON_READ means, the default
strategy's non-slot device, two-replica input checks, op names, the
all-reduce gradient of complex inputs, replicas returning reordered copies."""
import tensorflow as tf

import replicate
from replicate import testing
from replicate._compat import tf1

_NUM = 4
_DEVICES = testing.virtual_cpu_devices(_NUM)


class StrategyEdgesTest(tf.test.TestCase):

  def test_mean_of_complex_copies(self):
    # Replica i adds (i + 1) - (i + 1)j: copies 1-1j, 2-2j, 3-3j, 4-4j,
    # whose MEAN is 10 / 4 = 2.5 - 2.5j (only integers are refused).
    strategy = replicate.MirroredStrategy(_DEVICES)
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf1.get_variable(
            'v', (), tf.complex64, initializer=tf1.zeros_initializer(),
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.MEAN)

        def add():
          x = float(replicate.get_replica_context().replica_id_in_sync_group
                    ) + 1.0
          return v.assign_add(tf.complex(x, -x))

        updates = strategy.experimental_run_v2(add)
        read = v.read_value()
      with tf1.Session(config=testing.virtual_cpu_config(_NUM)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.unwrap(updates))
        self.assertAllClose(2.5 - 2.5j, sess.run(read))

  def test_default_non_slot_device_is_the_variable_first_by_name(self):
    # As TF 1.15's default strategy: min(var_list, key=name), so that Adam's
    # beta powers sit by the same variable whatever var_list's order.
    extended = replicate.get_strategy().extended
    with tf.Graph().as_default():
      b = tf1.get_variable('b', initializer=1.0, use_resource=True)
      a = tf1.get_variable('a', initializer=2.0, use_resource=True)
      c = tf1.get_variable('c', initializer=3.0, use_resource=True)
      self.assertIs(a, extended.non_slot_devices([b, a, c]))
      self.assertIs(a, extended.non_slot_devices([c, b, a]))

  def test_scalar_input_cannot_be_split_on_two_replicas(self):
    strategy = replicate.MirroredStrategy(testing.virtual_cpu_devices(2))
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          ValueError, 'Input shape should have at least one dimension. '
          'Perhaps your input dataset is not batched?.*2 replicas'):
        strategy.make_dataset_iterator(tf.data.Dataset.range(3))

  def test_minimize_name_without_global_step(self):
    strategy = replicate.MirroredStrategy(testing.virtual_cpu_devices(2))
    with tf.Graph().as_default():
      with strategy.scope():
        w = tf1.get_variable('w', (), initializer=tf1.ones_initializer())

        def step():
          return replicate.TowerOptimizer(
              tf1.train.GradientDescentOptimizer(0.1)).minimize(
                  w * 3.0, name='my_train')

        train = strategy.experimental_run_v2(step)
      ops = strategy.experimental_local_results(train)
      self.assertEqual('my_train', ops[0].name.split('/')[-1])

  def test_all_reduce_passes_gradients_to_complex_inputs(self):
    # Replica i: y = all_reduce(SUM, x) of x = [1+2j, 3-1j] and its loss
    # real((i + 1) * y). The upstream gradient of y is i + 1 (as complex);
    # the backward all-sum gathers every replica's: 1+2+3+4 = 10 on each
    # element of every replica's x, as for float inputs.
    strategy = replicate.MirroredStrategy(_DEVICES)

    def fn():
      i = replicate.get_replica_context().replica_id_in_sync_group
      x = tf.constant([1 + 2j, 3 - 1j], tf.complex64)
      y = replicate.get_replica_context().all_reduce(
          replicate.ReduceOp.SUM, x)
      loss = tf.reduce_sum(tf.math.real(y * tf.complex(float(i + 1), 0.)))
      return tf.gradients(loss, x)[0]

    with tf.Graph().as_default():
      grads = strategy.experimental_run_v2(fn)
      with tf1.Session(config=testing.virtual_cpu_config(_NUM)) as sess:
        grads = sess.run(list(strategy.experimental_local_results(grads)))
    self.assertAllClose([[10 + 0j, 10 + 0j]] * _NUM, grads)

  def test_replicas_returning_other_replicas_copies_get_per_replica(self):
    # Replica i returns the copy of device (i + 1) % 4: not each its own
    # copy in device order, so not the variable but those copies, per
    # replica (TF's regroup checks the order too).
    strategy = replicate.MirroredStrategy(_DEVICES)
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf1.get_variable('v', [], initializer=tf1.ones_initializer())

        def fn():
          i = replicate.get_replica_context().replica_id_in_sync_group
          return v.values[(i + 1) % _NUM]

        result = strategy.extended.call_for_each_replica(fn)
      self.assertIsInstance(result, replicate.PerReplica)
      local = strategy.experimental_local_results(result)
      for i in range(_NUM):
        self.assertIs(v.values[(i + 1) % _NUM], local[i])


if __name__ == '__main__':
  tf.test.main()

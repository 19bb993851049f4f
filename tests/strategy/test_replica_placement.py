"""MirroredStrategy placement: each replica's devices, reads and updates
on its own device (graph checks, then the numbers)."""
import tensorflow as tf

import replicate
from replicate import testing
from replicate._compat import tf1
from replicate.core import device_util

NUM = 4
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)


def _strategy():
  return replicate.MirroredStrategy(DEVICES)


def _canonical(devices):
  return [device_util.canonicalize(d) for d in devices]


class PlacementTest(tf.test.TestCase):

  def test_replica_devices_are_each_replicas(self):
    # Replica i runs on DEVICES[i] (CPU:i): ReplicaContext.devices must say
    # so, as TF 1.15's MirroredReplicaContext.devices does, not CPU:0 for all.
    strategy = _strategy()
    seen = {}

    def fn():
      context = replicate.get_replica_context()
      seen[context.replica_id_in_sync_group] = _canonical(context.devices)
      return tf.constant(1.0)

    with tf.Graph().as_default():
      strategy.experimental_run_v2(fn)
    self.assertEqual({i: [d] for i, d in
                      enumerate(_canonical(strategy.extended.worker_devices))},
                     seen)
    self.assertEqual(NUM, len(set(tuple(d) for d in seen.values())))

  def test_combined_read_reads_each_copy_on_its_device(self):
    # An ON_READ (SUM) variable's cross-replica read adds the copies' reads:
    # each copy is read on its own device (copy i on CPU:i), the sum on the
    # primary's. Copies hold 1, 2, 3, 4, so the read is 10.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        v = tf1.get_variable(
            'v', (), initializer=tf1.zeros_initializer(),
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM)
        updates = strategy.experimental_run_v2(lambda: v.assign_add(
            float(replicate.get_replica_context().replica_id_in_sync_group)
            + 1.0))
        read = v.read_value()
      self.assertEqual('AddN', read.op.type)
      self.assertEqual(_canonical(v.devices),
                       _canonical([t.op.device for t in read.op.inputs]))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.unwrap(updates))
        self.assertEqual(10.0, sess.run(read))

  def test_each_copy_is_updated_with_the_sum_on_its_device(self):
    # Replica i's gradient of sum(w * x_i) is x_i = i + 1; the sum 10 is
    # all-reduced onto every copy's device, and copy i's update must use the
    # sum on CPU:i (not the primary's, which would send it across devices
    # again). w = 1 - 0.1 * 10 = 0 on every copy after one step.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        w = tf1.get_variable('w', (), initializer=tf1.ones_initializer())

        def step():
          x = float(replicate.get_replica_context().replica_id_in_sync_group
                    ) + 1.0
          loss = w * x
          opt = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
          return opt.minimize(loss)
        train = strategy.experimental_run_v2(step)
      graph = tf1.get_default_graph()
      applies = [op for op in graph.get_operations()
                 if op.type == 'ResourceApplyGradientDescent']
      self.assertLen(applies, NUM)
      by_var_device = {}
      for op in applies:
        var_op = op.inputs[0].op
        by_var_device[device_util.canonicalize(var_op.device)] = (
            device_util.canonicalize(op.inputs[2].op.device))
      self.assertEqual({d: d for d in _canonical(w.devices)}, by_var_device)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.unwrap(train))
        self.assertAllClose([0.0] * NUM, sess.run(list(w.values)))

  def test_fp16_compression_casts_each_gradient_back_to_its_dtype(self):
    # A float32 and a float64 variable, both 1; replica i's gradient of each
    # is x_i = i + 1 (exact in float16), summed to 10 as float16 and cast
    # back to each variable's own dtype: 1 - 0.5 * 10 = -4 on every copy.
    strategy = _strategy()
    with tf.Graph().as_default():
      with strategy.scope():
        w32 = tf1.get_variable('w32', (), tf.float32,
                               initializer=tf1.ones_initializer())
        w64 = tf1.get_variable('w64', (), tf.float64,
                               initializer=tf1.ones_initializer())

        def step():
          x = float(replicate.get_replica_context().replica_id_in_sync_group
                    ) + 1.0
          loss = w32 * x + tf.cast(w64 * tf.constant(x, tf.float64),
                                   tf.float32)
          opt = replicate.TowerOptimizer(
              tf1.train.GradientDescentOptimizer(0.5),
              compression=replicate.Compression.fp16)
          return opt.minimize(loss, var_list=[w32, w64])
        train = strategy.experimental_run_v2(step)
      # Each copy's update gets its own variable's dtype (a float64 copy
      # updated with a float32 delta would abort the process when run).
      handles = {}
      for var in (w32, w64):
        for copy in var.values:
          handles[copy.handle.op.name] = var.dtype.base_dtype
      applies = [op for op in tf1.get_default_graph().get_operations()
                 if op.type == 'ResourceApplyGradientDescent']
      self.assertLen(applies, 2 * NUM)
      for op in applies:
        self.assertEqual(handles[op.inputs[0].op.name], op.get_attr('T'))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.unwrap(train))
        self.assertAllEqual([-4.0] * NUM, sess.run(list(w32.values)))
        self.assertAllEqual([-4.0] * NUM, sess.run(list(w64.values)))


if __name__ == '__main__':
  tf.test.main()

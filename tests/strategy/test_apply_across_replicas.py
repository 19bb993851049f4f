"""`apply_gradients_across_replicas` (strategy/mirrored_gradients.py):
fp16 compression really rounds what is summed and lines up with the
gradients when some are None; variables of another strategy are refused."""
import tensorflow as tf

import replicate
from replicate import errors
from replicate import mirrored_strategy
from replicate import testing
from replicate._compat import tf1
from replicate.cross_tower import values
from replicate.strategy import mirrored_values

NUM = 2
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)


def _per_replica(*leaves):
  return values.PerReplica(dict(zip(DEVICES, leaves)))


class ApplyAcrossReplicasTest(tf.test.TestCase):

  def test_fp16_compression_rounds_and_follows_none_gradients(self):
    # Variables [unused (float32, gradient None), w64, w32], all 1.
    # Replica i (i = 0, 1) gives w64 the gradient 0.5 (i + 1) (exact in
    # float16) and w32 the gradient 1 + 1e-4 (i + 1), which float16 rounds
    # to 1.0. Summed as float16: w64 1.5, w32 2.0 (uncompressed w32 would
    # be 2.0003). With learning rate 0.5:
    #   w64 = 1 - 0.75 = 0.25;  w32 = 1 - 1.0 = 0.0 (not -0.00015).
    # Each update is cast back to its own variable's dtype: the None
    # gradient ahead of them must not shift whose dtype is whose.
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default() as graph:
      with strategy.scope():
        unused = tf1.get_variable('unused', (), tf.float32,
                                  initializer=tf1.ones_initializer())
        w64 = tf1.get_variable('w64', (), tf.float64,
                               initializer=tf1.ones_initializer())
        w32 = tf1.get_variable('w32', (), tf.float32,
                               initializer=tf1.ones_initializer())

        def step(k):
          optimizer = tf1.train.GradientDescentOptimizer(0.5)
          g64 = tf.cast(k, tf.float64) * 0.5
          g32 = 1.0 + 1e-4 * k
          return mirrored_strategy.apply_gradients_across_replicas(
              optimizer, [(None, unused), (g64, w64), (g32, w32)],
              compression=replicate.Compression.fp16)
        train = strategy.run(step, args=(_per_replica(tf.constant(1.0),
                                                      tf.constant(2.0)),))
      dtypes = {}
      for var in (w64, w32):
        for copy in var.values:
          dtypes[copy.handle.op.name] = var.dtype.base_dtype
      applies = [op for op in graph.get_operations()
                 if op.type == 'ResourceApplyGradientDescent']
      self.assertLen(applies, 2 * NUM)
      for op in applies:
        self.assertEqual(dtypes[op.inputs[0].op.name], op.get_attr('T'),
                         op.name)
      self.assertTrue(any(op.type == 'Cast' and
                          op.get_attr('DstT') == tf.float16
                          for op in graph.get_operations()))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(strategy.unwrap(train))
        self.assertAllEqual([0.25] * NUM, sess.run(list(w64.values)))
        self.assertAllEqual([0.0] * NUM, sess.run(list(w32.values)))
        self.assertAllEqual([1.0] * NUM, sess.run(list(unused.values)))

  def test_variable_of_another_strategy_is_refused(self):
    # A mirrored variable of strategy `a`, on the same devices, given to
    # strategy `b`'s apply: it is not a variable of the current strategy.
    a = replicate.MirroredStrategy(DEVICES)
    b = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      with a.scope():
        v = tf1.get_variable('v', initializer=1.0)
      optimizer = tf1.train.GradientDescentOptimizer(0.5)
      with b.scope():
        with self.assertRaisesRegex(
            errors.InvalidArgumentError,
            'is not a mirrored variable of the current strategy'):
          b.run(lambda: mirrored_strategy.apply_gradients_across_replicas(
              optimizer, [(tf.constant(1.0), v)]))

  def test_mirrored_global_step_advances_once_under_the_name(self):
    # A mirrored global step: the returned op has the given name and runs
    # the update (w = 1 - 0.5 * (1 + 2) = -0.5 on every copy) and then one
    # increment of every copy of the step (1 after one run).
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      with strategy.scope():
        step = tf1.train.get_or_create_global_step()
        w = tf1.get_variable('w', initializer=1.0)

        def fn(k):
          optimizer = tf1.train.GradientDescentOptimizer(0.5)
          return mirrored_strategy.apply_gradients_across_replicas(
              optimizer, [(k, w)], global_step=step, name='train_step')
        result = strategy.run(fn, args=(_per_replica(tf.constant(1.0),
                                                     tf.constant(2.0)),))
      self.assertIsInstance(step, mirrored_values.MirroredVariable)
      self.assertIsInstance(result, tf.Operation)
      self.assertEqual('train_step', result.name)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(result)
        self.assertAllEqual([1] * NUM, sess.run(list(step.values)))
        self.assertAllEqual([-0.5] * NUM, sess.run(list(w.values)))

  def test_plain_global_step_increment_sits_with_the_step(self):
    # A plain (not mirrored) step pinned to CPU:1: its increment is
    # colocated with it, as TF's optimizers put it. (TF 1.15's assign_add
    # colocates by itself; on TF 2.15 only the library's colocation does.)
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      with tf.device(DEVICES[1]):
        step = tf1.train.get_or_create_global_step()
      with strategy.scope():
        w = tf1.get_variable('w', initializer=1.0)

        def fn(k):
          optimizer = tf1.train.GradientDescentOptimizer(0.5)
          return mirrored_strategy.apply_gradients_across_replicas(
              optimizer, [(k, w)], global_step=step)
        result = strategy.run(fn, args=(_per_replica(tf.constant(1.0),
                                                     tf.constant(2.0)),))
      self.assertEqual([b'loc:@' + step.op.name.encode()],
                       result.colocation_groups())
      self.assertIn('CPU:1', result.device)
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(result)
        self.assertEqual(1, sess.run(step))


if __name__ == '__main__':
  tf.test.main()

"""VariablePlacement.REPLICATED with model_fns that stretch it.

* A trainable variable of a shape not fully known is refused: its copies
  on the other towers need one.
* A variable made before the towers (outside model_fn) is not copied:
  every tower reads the one variable.
* A scaffold whose local_init_op model_fn made before `minimize` (before
  the copies and their slots exist) still initializes them, or the session
  would never be ready.
"""
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import EstimatorSpec
from replicate._compat import ModeKeys
from replicate._compat import tf1


class ReplicatedModelFnsTest(tf.test.TestCase):

  def test_trainable_variable_of_unknown_shape_is_refused(self):
    def model_fn(features, labels, mode):
      # Initial value of shape [None]: the variable's shape is not known.
      bias = tf1.Variable(
          tf1.placeholder_with_default([0.5], shape=[None]),
          validate_shape=False, name='bias')
      kernel = tf1.get_variable('kernel', [1, 1],
                                initializer=tf1.ones_initializer())
      logits = tf.matmul(features['x'], kernel) + tf.reshape(bias, [1, 1])
      loss = tf1.losses.mean_squared_error(labels, logits)
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf1.train.get_or_create_global_step())
      return EstimatorSpec(mode, loss=loss, train_op=train_op)

    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'variable_placement=REPLICATED needs trainable variables of a '
          r'fully known shape.*; bias has shape .*Give it a static shape, or '
          r'use CONSOLIDATION_DEVICE'):
        replicate.replicate_model_fn(
            model_fn, devices=replicate.testing.virtual_cpu_devices(2),
            variable_placement=replicate.VariablePlacement.REPLICATED)(
                {'x': tf.ones([4, 1])}, tf.ones([4, 1]), ModeKeys.TRAIN)

  def test_variable_made_before_model_fn_is_read_by_every_tower(self):
    def model_fn(features, mode):
      kernel = tf1.get_variable('kernel', [1, 1],
                                initializer=tf1.ones_initializer())
      scale = tf1.get_variable('scale')  # made outside, reused here
      return EstimatorSpec(mode, predictions=tf.matmul(features['x'], kernel)
                           * scale)

    with tf.Graph().as_default():
      with tf1.variable_scope('', reuse=tf1.AUTO_REUSE):
        scale = tf1.get_variable('scale', [], trainable=True,
                                 initializer=tf1.constant_initializer(1.5))
        spec = replicate.replicate_model_fn(
            model_fn, devices=replicate.testing.virtual_cpu_devices(2),
            variable_placement=replicate.VariablePlacement.REPLICATED)(
                {'x': tf.constant([[1.], [2.], [3.], [4.]])}, None,
                ModeKeys.PREDICT)
      local_names = [v.op.name for v in tf1.local_variables()]
      self.assertIn('tower_1/kernel', local_names)  # tower 0's: copied
      self.assertNotIn('tower_1/scale', local_names)
      with tf1.Session(
          config=replicate.testing.virtual_cpu_config(2)) as sess:
        sess.run([tf1.global_variables_initializer(),
                  tf1.local_variables_initializer()])
        sess.run(scale.assign(3.0))
        # Every row reads scale 3 (x * 1 * 3); a copy of it in tower 1
        # would still hold 1.5 for rows 3 and 4.
        self.assertAllEqual([[3.], [6.], [9.], [12.]],
                            sess.run(spec.predictions))

  def test_local_init_op_of_model_fn_initializes_the_copies(self):
    def model_fn(features, labels, mode):
      kernel = tf1.get_variable('kernel', [1, 1],
                                initializer=tf1.ones_initializer())
      loss = tf1.losses.mean_squared_error(
          labels, tf.matmul(features['x'], kernel))
      # Made before minimize, where the copies are made: it does not know
      # them.
      scaffold = tf1.train.Scaffold(
          local_init_op=tf.group(tf1.local_variables_initializer(),
                                 name='model_fn_local_init'))
      train_op = replicate.TowerOptimizer(
          tf1.train.AdamOptimizer(0.1)).minimize(
              loss, tf1.train.get_or_create_global_step())
      return EstimatorSpec(mode, loss=loss, train_op=train_op,
                           scaffold=scaffold)

    with tf.Graph().as_default():
      spec = replicate.replicate_model_fn(
          model_fn, devices=replicate.testing.virtual_cpu_devices(2),
          variable_placement=replicate.VariablePlacement.REPLICATED)(
              {'x': tf.ones([4, 1])}, tf.ones([4, 1]), ModeKeys.TRAIN)
      self.assertIn('tower_1/kernel',
                    [v.op.name for v in tf1.local_variables()])
      with tf1.Session(
          config=replicate.testing.virtual_cpu_config(2)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(spec.scaffold.local_init_op)
        self.assertEqual([], [
            name.decode() if isinstance(name, bytes) else name
            for name in sess.run(tf1.report_uninitialized_variables())])



if __name__ == '__main__':
  tf.test.main()

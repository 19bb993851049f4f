"""A tower's write from its own rows inside a while_loop
(replicate/towers/empty_towers.py).

Before 2026-11-28, TF 1's loops (TF 1.15, and TF 2.15 in v1 mode) failed
every step ("has inputs from different frames"): the check was built
outside the loop from the loop's copy of the amount, and a copied tower's
write, which carries no Python control-flow context, was given it as a
control input across the frame. TF 2's functional While was not affected."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

TOWERS = 4
TRAIN = tf1.estimator.ModeKeys.TRAIN
# Row r: distinct features and labels.
_X = np.stack([np.arange(8.), np.arange(8.) ** 2, 1. - np.arange(8.)],
              axis=1).astype(np.float32)
_Y = (np.arange(8.) / 8.)[:, None].astype(np.float32)


def _build(model_fn, **kwargs):
  """The replicated TRAIN spec of `model_fn` on 4 towers, fed by
  placeholders of a dynamic batch: (spec, x, y)."""
  tf1.train.get_or_create_global_step()
  x = tf1.placeholder(tf.float32, [None, 3])
  y = tf1.placeholder(tf.float32, [None, 1])
  spec = replicate.replicate_model_fn(
      model_fn, devices=replicate.testing.virtual_cpu_devices(TOWERS),
      **kwargs)({'x': x, 'scale': tf.constant(0.5)}, y, TRAIN, None)
  return spec, x, y


class EmptyTowerLoopWriteTest(parameterized.TestCase, tf.test.TestCase):

  # Copies of tower 0 (the default) carry no Python control-flow context;
  # calls per tower do.
  @parameterized.parameters(replicate.TowerBuild.CLONE,
                            replicate.TowerBuild.CALL_PER_TOWER)
  def test_a_write_inside_a_while_loop_fails_the_step(self, tower_build):
    # The write runs in a loop (TF 1: inside its frame, where no control
    # input may come from outside; TF 2: a While op whose body writes). On
    # 2 rows, towers 2 and 3 get none: their mean is NaN, and the step
    # fails instead of writing it.
    def model_fn(features, labels, mode, params):
      del params
      state = tf1.get_variable('state', [3], use_resource=True,
                               initializer=tf1.zeros_initializer(),
                               trainable=False)
      mean = tf.reduce_mean(features['x'], 0)

      def body(i):
        with tf.control_dependencies([state.assign(mean)]):
          return i + 1

      loop = tf1.while_loop(lambda i: i < 1, body, [tf.constant(0)])
      loss = tf1.losses.mean_squared_error(
          labels, tf1.layers.dense(features['x'], 1, name='out'))
      with tf.control_dependencies([loop]):
        train_op = replicate.TowerOptimizer(
            tf1.train.GradientDescentOptimizer(0.1)).minimize(
                loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with tf.Graph().as_default():
      spec, x, y = _build(model_fn, tower_build=tower_build)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(
          TOWERS)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(spec.train_op, {x: _X[:4], y: _Y[:4]})
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError,
            r'Tower [23] of 4 was given no rows of this batch'):
          sess.run(spec.train_op, {x: _X[:2], y: _Y[:2]})

  def test_an_amount_computed_in_the_loop_is_left_unchecked_loudly(self):
    # The loop computes the amount from its own variable (mean * (i + 1)):
    # no check outside the loop can read it, so the write is left unchecked
    # with a WARNING naming it (TF 1 loops), and the steps run (before, each
    # failed on the frames).
    def model_fn(features, labels, mode, params):
      del params
      state = tf1.get_variable('state', [3], use_resource=True,
                               initializer=tf1.zeros_initializer(),
                               trainable=False)
      mean = tf.reduce_mean(features['x'], 0)

      def body(i):
        amount = mean * tf.cast(i + 1, tf.float32)
        with tf.control_dependencies([state.assign(amount)]):
          return i + 1

      loop = tf1.while_loop(lambda i: i < 1, body, [tf.constant(0)])
      loss = tf1.losses.mean_squared_error(
          labels, tf1.layers.dense(features['x'], 1, name='out'))
      with tf.control_dependencies([loop]):
        train_op = replicate.TowerOptimizer(
            tf1.train.GradientDescentOptimizer(0.1)).minimize(
                loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with tf.Graph().as_default():
      if tf1.control_flow_v2_enabled():  # TF 2's loop is one While op
        spec, x, y = _build(model_fn)
      else:
        with self.assertLogs('tensorflow', level='WARNING') as logs:
          spec, x, y = _build(model_fn)
        self.assertTrue(any(
            'writes a variable from its own rows inside a while_loop' in m
            for m in logs.output), logs.output)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(
          TOWERS)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(spec.train_op, {x: _X, y: _Y})
        # The step ran: one increment. (Every tower writes `state`; which
        # write lands last is TF's order, as with calls per tower.)
        self.assertEqual(1, sess.run(tf1.train.get_global_step()))

if __name__ == '__main__':
  tf.test.main()

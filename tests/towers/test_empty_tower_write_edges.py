"""Edges of the checks on what a tower given no rows writes
(replicate/towers/empty_towers.py)."""
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


def _checks(graph):
  """The name scopes of the checks on writes of towers given no rows."""
  return sorted(set(op.name.split('/')[0] for op in graph.get_operations()
                    if op.name.startswith('empty_tower_check')))


class EmptyTowerWriteEdgesTest(tf.test.TestCase):

  def test_every_amount_of_a_function_write_is_checked(self):
    # A function call that writes a variable writes it from its floating
    # inputs: here (scale, mean), scale shared by every tower and finite,
    # the mean of the tower's rows NaN on no rows. Every amount counts, not
    # only the first.
    def model_fn(features, labels, mode, params):
      del params
      state = tf1.get_variable('state', [3], use_resource=True,
                               initializer=tf1.zeros_initializer(),
                               trainable=False)

      @tf.function
      def write(scale, mean):
        return state.assign(scale * mean)

      update = write(features['scale'], tf.reduce_mean(features['x'], 0))
      loss = tf1.losses.mean_squared_error(
          labels, tf1.layers.dense(features['x'], 1, name='out'))
      with tf.control_dependencies([update]):
        train_op = replicate.TowerOptimizer(
            tf1.train.GradientDescentOptimizer(0.1)).minimize(
                loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with tf.Graph().as_default() as graph:
      spec, x, y = _build(model_fn)
      # Towers 1, 2 and 3 write from their own rows: one check each.
      self.assertLen(_checks(graph), 3)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(
          TOWERS)) as sess:
        sess.run(tf1.global_variables_initializer())
        # 4 rows: one a tower, every mean finite.
        sess.run(spec.train_op, {x: _X[:4], y: _Y[:4]})
        # 2 rows: towers 2 and 3 get none, their mean is NaN.
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError,
            r'Tower [23] of 4 was given no rows of this batch'):
          sess.run(spec.train_op, {x: _X[:2], y: _Y[:2]})

  def test_a_write_of_every_towers_rows_is_not_checked(self):
    # The optimizer's sparse update (a scatter into the embedding) writes
    # the towers' gradients summed: every tower's rows, not one tower's. It
    # is no tower's write from its own rows: no check, and 2 rows on 4
    # towers train to finite values.
    def model_fn(features, labels, mode, params):
      del params
      table = tf1.get_variable(
          'table', [8, 1],
          initializer=tf1.constant_initializer(np.arange(8.) / 10.))
      ids = tf.cast(features['x'][:, 0], tf.int32)
      loss = tf1.losses.mean_squared_error(
          labels, tf.nn.embedding_lookup(table, ids))
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with tf.Graph().as_default() as graph:
      spec, x, y = _build(model_fn)
      self.assertEmpty(_checks(graph))
      with tf1.Session(config=replicate.testing.virtual_cpu_config(
          TOWERS)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(spec.train_op, {x: _X[:2], y: _Y[:2]})
        self.assertTrue(all(np.all(np.isfinite(v)) for v in sess.run(
            tf1.global_variables())))


if __name__ == '__main__':
  tf.test.main()

"""Edges of the checks on what a tower given no rows writes
(replicate/towers/empty_towers.py): every amount of a function's write, a
write of every tower's rows, and writes inside a while_loop.

Before 2026-11-28, TF 1's loops (TF 1.15, and TF 2.15 in v1 mode) failed
every step ("has inputs from different frames"): the check was built
outside the loop from the loop's copy of the amount, and a copied tower's
write, which carries no Python control-flow context, was given it as a
control input across the frame. TF 2's functional While was not affected.
An amount the loop itself computes cannot be checked from outside: it is
left unchecked with a warning."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.towers import empty_towers

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


def _assert_four_rows_run_and_two_fail(test, spec, x, y):
  """4 rows: one a tower, every mean finite, the step runs. 2 rows: towers 2
  and 3 get none, their mean is NaN, and the step fails naming one."""
  with tf1.Session(config=replicate.testing.virtual_cpu_config(
      TOWERS)) as sess:
    sess.run(tf1.global_variables_initializer())
    sess.run(spec.train_op, {x: _X[:4], y: _Y[:4]})
    with test.assertRaisesRegex(
        tf.errors.InvalidArgumentError,
        r'Tower [23] of 4 was given no rows of this batch'):
      sess.run(spec.train_op, {x: _X[:2], y: _Y[:2]})


def _loop_model_fn(amount_of):
  """A model_fn whose towers write `amount_of(mean of their rows, loop
  variable)` into a variable inside a while_loop run once, before the
  step's update."""
  def model_fn(features, labels, mode, params):
    del params
    state = tf1.get_variable('state', [3], use_resource=True,
                             initializer=tf1.zeros_initializer(),
                             trainable=False)
    mean = tf.reduce_mean(features['x'], 0)

    def body(i):
      with tf.control_dependencies([state.assign(amount_of(mean, i))]):
        return i + 1

    loop = tf1.while_loop(lambda i: i < 1, body, [tf.constant(0)])
    loss = tf1.losses.mean_squared_error(
        labels, tf1.layers.dense(features['x'], 1, name='out'))
    with tf.control_dependencies([loop]):
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


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
      _assert_four_rows_run_and_two_fail(self, spec, x, y)

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
    model_fn = _loop_model_fn(lambda mean, i: mean)
    with tf.Graph().as_default():
      spec, x, y = _build(model_fn, tower_build=tower_build)
      _assert_four_rows_run_and_two_fail(self, spec, x, y)

  def test_an_amount_computed_in_the_loop_is_left_unchecked_loudly(self):
    # The loop computes the amount from its own variable (mean * (i + 1)):
    # no check outside the loop can read it, so the write is left unchecked
    # with a WARNING naming it (TF 1 loops), and the steps run (before, each
    # failed on the frames).
    model_fn = _loop_model_fn(
        lambda mean, i: mean * tf.cast(i + 1, tf.float32))
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

  def test_the_ops_of_every_towers_loop_are_told_apart(self):
    # Copied towers carry no Python control-flow context: their loop ops
    # are found from the graph alone, whatever order they are asked in.
    # TF 1 loops only (TF 2's loop is one While op; nothing is inside).
    with tf.Graph().as_default() as graph:
      _build(_loop_model_fn(lambda mean, i: mean))
      inside = empty_towers._loop_ops(graph)  # pylint: disable=protected-access
      ops = graph.get_operations()
    if tf1.control_flow_v2_enabled():
      self.assertEmpty(inside)
      return
    # Every tower's loop: ops under its while/ scope (the Exits too: they
    # leave the frame, their consumers do not).
    in_loops = {op for op in ops if op.name.split('/')[0] == 'while' or
                op.name.split('/')[:2][-1] == 'while'}
    self.assertLen({op.name.split('while/')[0] for op in in_loops}, TOWERS)
    self.assertEqual(in_loops, inside)


if __name__ == '__main__':
  tf.test.main()

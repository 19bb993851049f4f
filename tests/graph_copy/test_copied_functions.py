"""Copies of control flow and of resource reads inside loops.

Random ops under a graph seed draw what a model_fn call per tower draws
(graph_copier.py, `_compat.has_derived_seed`): a TF1 loop's or branch's ops
are top-level ops, whose seeds TF derives anew in every call, so every tower
draws its own numbers; a TF 2 `If` / `While` names functions whose bodies
every call builds in a graph of its own, deriving the same seeds, so every
tower draws tower 0's numbers; an explicit op seed is the same in every
call. In each case the gradient uses the tower's own draws, and a run draws
the same numbers as the last. graph_copier.py: the copy of an
op that TF's placer binds to a shared variable (the stack in which a TF1
while loop's gradient keeps an in-loop variable read, as in a Keras LSTM
under `disable_v2_behavior`) is placed with that variable, so the towers
train as one device.

Every test runs on TF 1.15 and TF 2.15; on TF 2.15, `V1BehaviorTest` runs
the others again in a subprocess after `tf.compat.v1.disable_v2_behavior()`
(TF1 control flow with resource variables).
"""
import os
import re
import subprocess
import sys

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate import _compat
from replicate._compat import tf1

_V1_BEHAVIOR = 'REPLICATE_TEST_V1_BEHAVIOR'
if os.environ.get(_V1_BEHAVIOR):
  tf1.disable_v2_behavior()

_NUM_TOWERS = 4
_ROWS = 32
_UNITS = 16
_LEARNING_RATE = 0.125


class _IdentityCell(tf1.nn.rnn_cell.RNNCell):
  """An RNN cell whose output is its input: shows DropoutWrapper's mask."""

  @property
  def state_size(self):
    return _UNITS

  @property
  def output_size(self):
    return _UNITS

  def call(self, inputs, state):
    return inputs, state


def _dropout(kind, x):
  """Dropout of `x` (rate 0.5: kept entries are doubled) built as `kind`."""
  training = tf1.placeholder_with_default(True, [])
  if kind == 'cond':  # tf.cond on a tensor flag: If in TF 2
    return tf1.layers.dropout(x, 0.5, training=training)
  if kind == 'rnn':  # a While in TF 2
    cell = tf1.nn.rnn_cell.DropoutWrapper(
        _IdentityCell(), input_keep_prob=0.5, seed=3)
    outputs, _ = tf1.nn.dynamic_rnn(cell, x[:, None, :], dtype=tf.float32)
    return outputs[:, 0, :]

  def body(i, total):
    if kind == 'while':
      return i + 1, total + tf1.nn.dropout(x, rate=0.5)
    # 'cond_in_while': an If in a While's body function.
    return i + 1, total + tf1.layers.dropout(x, 0.5, training=training)

  _, total = tf1.while_loop(lambda i, _: i < 1, body,
                            [tf.constant(0), tf.zeros_like(x)])
  return total


def _dropout_model_fn(features, labels, mode, params):
  """loss = sum(dropout(x * v) * w), with x, v and w all ones.

  d/dw_j = v_j * C_j and d/dv_j = w_j * C_j, where C_j sums column j of the
  scaled mask over the global batch (each entry 0 or 2).
  """
  del labels
  x = features['x']
  v = tf1.get_variable('v', [_UNITS], initializer=tf1.ones_initializer())
  w = tf1.get_variable('w', [_UNITS], initializer=tf1.ones_initializer())
  loss = tf.reduce_sum(_dropout(params['kind'], x * v) * w)
  optimizer = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(_LEARNING_RATE))
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss,
      train_op=optimizer.minimize(loss, tf1.train.get_global_step()))


def _train_dropout(kind, num_towers,
                   tower_build=replicate.TowerBuild.CLONE):
  """`(v, w)` after one SGD step of `_dropout_model_fn` (graph seed 7)."""
  with tf.Graph().as_default():
    tf1.set_random_seed(7)
    tf1.train.get_or_create_global_step()
    spec = replicate.replicate_model_fn(
        _dropout_model_fn, loss_reduction=tf1.losses.Reduction.SUM,
        devices=mt.cpus(num_towers), tower_build=tower_build)(
            {'x': tf.ones([_ROWS, _UNITS])}, None, mt.TRAIN, {'kind': kind},
            None)
    with tf1.Session(config=replicate.testing.virtual_cpu_config(
        _NUM_TOWERS)) as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(spec.train_op)
      return sess.run([tf1.global_variables('v')[0],
                       tf1.global_variables('w')[0]])


class CopiedRandomOpsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters('cond', 'while', 'cond_in_while', 'rnn')
  def test_towers_draw_as_calls_draw(self, kind):
    copied = _train_dropout(kind, _NUM_TOWERS)
    called = _train_dropout(kind, _NUM_TOWERS,
                            replicate.TowerBuild.CALL_PER_TOWER)
    for v, w in (copied, called):
      # One step from v = w = 1: v = w = 1 - 0.125 * C. Equal: each tower's
      # gradient uses the mask its forward pass drew.
      self.assertAllEqual(v, w)
      column_sums = (1 - w) / _LEARNING_RATE
      self.assertAllEqual(column_sums, np.round(column_sums))
      # About half of the 32 rows of each column are kept: C_j near 32.
      self.assertAllInRange(column_sums, 8, 56)
    # 4 towers repeating one 8-row mask make every C_j a multiple of
    # 4 * 2 = 8: so do calls where each builds the same seeds (a TF 2
    # function's body, DropoutWrapper's explicit seed), and copies then
    # draw exactly what calls draw. Where each call derives its own seeds
    # (TF1 control flow's top-level ops), the copies draw their own too.
    def repeats_one_mask(trained):
      return bool(np.all((1 - trained[1]) / _LEARNING_RATE % 8 == 0))
    same_seeds = kind == 'rnn' or tf1.control_flow_v2_enabled()
    self.assertEqual(same_seeds, repeats_one_mask(called))
    self.assertEqual(same_seeds, repeats_one_mask(copied))
    if same_seeds:
      self.assertAllEqual(called, copied)

  @parameterized.parameters('cond', 'rnn')
  def test_same_graph_seed_draws_the_same_masks(self, kind):
    self.assertAllEqual(_train_dropout(kind, _NUM_TOWERS),
                        _train_dropout(kind, _NUM_TOWERS))

  @parameterized.product(
      tower_build=[replicate.TowerBuild.CLONE,
                   replicate.TowerBuild.CALL_PER_TOWER],
      kind=['loop_read', 'loop_in_cond'])
  def test_function_bodies_ask_for_their_towers_device(self, tower_build,
                                                       kind):
    # TF 2's while_loop is a While (body, condition, their gradients) traced
    # under the tower's device scope: its body nodes name that device. A
    # copy of tower 0's While calling tower 0's functions would run every
    # tower's loop on tower 0's device; each copy calls its own functions,
    # as a call traces them, also those a copied function calls (a loop in
    # a cond's branch). (TF1 control flow has no functions.)
    devices = mt.cpus(_NUM_TOWERS)
    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(
          _recurrent_model_fn, devices=devices, tower_build=tower_build)(
              {'x': tf.constant(_sequences()[0])},
              tf.constant(_sequences()[1]), mt.TRAIN, {'kind': kind},
              None)
    calls = 0
    for op in graph.get_operations():
      match = re.match(r'tower_(\d+)/', op.name)
      tower_id = int(match.group(1)) if match else 0
      for name in _called_functions(op):
        calls += 1
        body_devices = _body_devices(graph, name)
        self.assertEqual(
            set(), body_devices - {'', _canonical(devices[tower_id])},
            '{} calls {}'.format(op.name, name))
    if _compat.IS_TF2 and not os.environ.get(_V1_BEHAVIOR):
      self.assertGreater(calls, 0)


class WorkerJobTest(tf.test.TestCase):

  def test_copied_loops_run_in_a_session_of_another_job(self):
    # A task of job `worker`: the copies of a TF 2 loop's functions must
    # ask for the tower's device as the tower's ops do (relative to the
    # session's job), not a canonical string that names `localhost`, of
    # which this session has no device.
    config = replicate.testing.virtual_cpu_config(2)
    server = tf1.train.Server(
        tf1.train.ClusterSpec({'worker': [
            'localhost:{}'.format(replicate.testing.pick_unused_port())]}),
        job_name='worker', task_index=0, config=config)
    features, labels = _sequences()
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(
          _recurrent_model_fn, devices=mt.cpus(2))(
              {'x': tf.constant(features)}, tf.constant(labels), mt.TRAIN,
              {'kind': 'dynamic_rnn'}, None)
      with tf1.Session(server.target, config=config) as sess:
        sess.run(tf1.global_variables_initializer())
        before = sess.run(spec.loss)
        for _ in range(3):
          sess.run(spec.train_op)
        self.assertLess(sess.run(spec.loss), before)


def _canonical(device):
  spec = tf.DeviceSpec.from_string(device)
  return '{}:{}'.format(spec.device_type, spec.device_index)


def _called_functions(op):
  names = []
  for attr in ('body', 'cond', 'then_branch', 'else_branch', 'f'):
    try:
      names.append(op.get_attr(attr).name)
    except ValueError:
      pass
  return names


def _body_devices(graph, name, seen=None):
  """The devices the nodes of function `name` (and those it calls) name."""
  seen = set() if seen is None else seen
  if name in seen:
    return set()
  seen.add(name)
  definition = _compat.graph_function_def(graph, name)
  devices = set()
  for node in definition.node_def:
    devices.add(_canonical(node.device) if node.device else '')
    for attr in node.attr.values():
      if attr.HasField('func'):
        devices |= _body_devices(graph, attr.func.name, seen)
  return devices


def _sequences():
  """8 sequences of 5 steps of 3 features, distinct per row; targets."""
  rng = np.random.RandomState(0)
  return (rng.uniform(-1, 1, (8, 5, 3)).astype(np.float32),
          rng.uniform(-1, 1, (8, 1)).astype(np.float32))


def _recurrent_model_fn(features, labels, mode, params):
  """A recurrent layer of 4 units and a dense output; MSE; SGD."""
  x = features['x']
  kernel = tf1.glorot_uniform_initializer(seed=1)
  recurrent = tf1.glorot_uniform_initializer(seed=2)
  kind = params['kind']
  if kind == 'lstm':
    h = tf.keras.layers.LSTM(
        4, kernel_initializer=kernel, recurrent_initializer=recurrent)(x)
  elif kind == 'gru':
    h = tf.keras.layers.GRU(
        4, kernel_initializer=kernel, recurrent_initializer=recurrent)(x)
  elif kind == 'dynamic_rnn':
    outputs, _ = tf1.nn.dynamic_rnn(
        tf1.nn.rnn_cell.LSTMCell(4, initializer=kernel), x, dtype=tf.float32)
    h = outputs[:, -1]
  else:  # 'loop_read': the cause alone, a resource variable read in a loop;
    # 'loop_in_cond': that loop in a cond's branch (a function calling one).
    v = tf1.get_variable('v', [3, 4], initializer=kernel, use_resource=True)

    def body(i, state):
      return i + 1, tf.tanh(tf.matmul(x[:, i, :], v) + state)

    def loop():
      return tf1.while_loop(
          lambda i, _: i < 5, body,
          [tf.constant(0), tf.zeros([tf.shape(x)[0], 4])])[1]

    if kind == 'loop_in_cond':
      h = tf1.cond(tf.reduce_sum(x) > -100., loop,
                   lambda: tf.zeros([tf.shape(x)[0], 4]))
    else:
      h = loop()
  predictions = tf1.layers.dense(
      h, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=3),
      name='out')
  loss = tf1.losses.mean_squared_error(labels, predictions)
  optimizer = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.5))
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss,
      train_op=optimizer.minimize(loss, tf1.train.get_global_step()))


class RecurrentTowersTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters('lstm', 'gru', 'dynamic_rnn', 'loop_read')
  def test_trains_as_one_device(self, kind):
    # Variables live on CPU:0, tower 0's device; towers 1..3 must place the
    # stacks of their loops' variable reads with the variables, as TF's
    # placer does.
    features, labels = _sequences()
    params = {'kind': kind}
    towers = mt.train_variables(
        _recurrent_model_fn, {'x': features}, labels,
        mt.cpus(_NUM_TOWERS), params=params)
    one_device = mt.train_variables(
        _recurrent_model_fn, {'x': features}, labels, mt.cpus(1),
        params=params)
    self.assertEqual(sorted(towers), sorted(one_device))
    for name, value in one_device.items():
      self.assertAllClose(value, towers[name], rtol=1e-5, atol=1e-6,
                          msg=name)


class V1BehaviorTest(tf.test.TestCase):

  def test_under_disable_v2_behavior(self):
    if not _compat.IS_TF2 or os.environ.get(_V1_BEHAVIOR):
      self.skipTest('TF 2.15 only, run from the normal suite.')
    env = dict(os.environ, **{_V1_BEHAVIOR: '1'})
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', os.path.abspath(__file__), '-q',
         '-p', 'no:cacheprovider', '-k', 'not V1BehaviorTest'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))),
        check=False)
    self.assertEqual(result.returncode, 0,
                     result.stdout.decode()[-5000:])


if __name__ == '__main__':
  tf.test.main()

"""The optimizer's update, replicated, is the one-device model's update.

Two ways it was not:

* Under `VariablePlacement.REPLICATED`, a gradient copied from inside a TF1
  while loop (an LSTM's) had lost its static shape, and grouping the
  gradients for the all-reduce failed on it. A gradient has its variable's
  shape: the LSTM must train as on one device.
* The update was built under tower 0's outer scopes instead of the scopes
  of its `minimize` call, so a `minimize` inside `variable_scope('model')`
  (as in the canned estimators) named the optimizer's variables unlike one
  device: `model/h/kernel/Momentum` for one device's
  `model/model/h/kernel/Momentum`, and partitioned slots' checkpoint keys
  differed too. Checkpoints must move both ways with the slots' values.
"""
import tempfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.cross_tower import replicated_gradients

_NUM_CPUS = 4
_OPTIMIZERS = {
    'sgd': lambda: tf1.train.GradientDescentOptimizer(0.5),
    'momentum': lambda: tf1.train.MomentumOptimizer(0.1, 0.9),
    'adam': lambda: tf1.train.AdamOptimizer(0.05),
    'adagrad_partitioned': lambda: tf1.train.AdagradOptimizer(0.3),
}
_TRAIN = tf1.estimator.ModeKeys.TRAIN
_BUILDS = {
    'clone': {},
    'replicated': dict(
        variable_placement=replicate.VariablePlacement.REPLICATED),
    'call_per_tower': dict(tower_build=replicate.TowerBuild.CALL_PER_TOWER),
}


def _cpus(num):
  return replicate.testing.virtual_cpu_devices(num)


def _rows(num_rows=8, num_features=3):
  """Distinct rows (an offset per row) and distinct labels per row."""
  rng = np.random.RandomState(0)
  x = rng.uniform(-1, 1, size=(num_rows, num_features)).astype(np.float32)
  x += np.arange(num_rows, dtype=np.float32)[:, None] * 0.05
  y = np.linspace(-1., 1., num_rows, dtype=np.float32)[:, None]
  return x, y


def _scoped_model_fn(features, labels, mode, params):
  """`minimize` inside `variable_scope('model')`, as canned estimators do.

  With `params['partitioned']` the output weights are a variable in two
  partitions (as the canned DNN's under a partitioner).
  """
  with tf1.variable_scope('model'):
    hidden = tf1.layers.dense(
        features['x'], 4, activation=tf.nn.tanh,
        kernel_initializer=tf1.glorot_uniform_initializer(seed=1), name='h')
    if params.get('partitioned'):
      weights = tf1.get_variable(
          'w', [4, 1], partitioner=tf1.fixed_size_partitioner(2),
          initializer=tf1.glorot_uniform_initializer(seed=2))
      logits = tf.matmul(hidden, weights)
    else:
      logits = tf1.layers.dense(
          hidden, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
          name='logits')
    loss = tf1.losses.mean_squared_error(labels, logits)
    optimizer = replicate.TowerOptimizer(_OPTIMIZERS[params['optimizer']])
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _lstm_model_fn(features, labels, mode, params):
  """An LSTM over sequences of distinct lengths, then a dense layer."""
  init = tf1.glorot_uniform_initializer(seed=1)
  if params['layer'] == 'dynamic_rnn':
    cell = tf1.nn.rnn_cell.LSTMCell(3, initializer=init)
    _, state = tf1.nn.dynamic_rnn(
        cell, features['x'], sequence_length=features['length'],
        dtype=tf.float32)
    last = state.h
  else:
    last = tf.keras.layers.LSTM(3, kernel_initializer=init,
                                recurrent_initializer=init)(features['x'])
  logits = tf1.layers.dense(
      last, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
      name='logits')
  loss = tf1.losses.mean_squared_error(labels, logits)
  optimizer = replicate.TowerOptimizer(_OPTIMIZERS['sgd'])
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _train_in_graph(model_fn, features, labels, params, devices=None,
                    steps=3, **replicate_kwargs):
  """Trains `steps` steps in a new graph; {name: value} of globals.

  `devices=None` calls `model_fn` itself: the one-device model.
  """
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    if devices is not None:
      model_fn = replicate.replicate_model_fn(
          model_fn, devices=devices, **replicate_kwargs)
    spec = model_fn(
        {k: tf.constant(v) for k, v in features.items()},
        tf.constant(labels), _TRAIN, params)
    hooks = list(spec.training_hooks)
    for hook in hooks:
      hook.begin()
    with tf1.Session(config=replicate.testing.virtual_cpu_config(
        _NUM_CPUS)) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      for hook in hooks:  # REPLICATED: the copies are set from tower 0's.
        hook.after_create_session(sess, None)
      for _ in range(steps):
        sess.run(spec.train_op)
      return {v.op.name: sess.run(v) for v in tf1.global_variables()}


class ReplicatedWhileLoopTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('{}_{}_cpus'.format(layer, num_cpus), num_cpus, layer)
      for layer in ('dynamic_rnn', 'keras') for num_cpus in (2, 4))
  def test_lstm_trains_as_one_device(self, num_cpus, layer):
    rng = np.random.RandomState(1)
    x = rng.uniform(-1, 1, size=(8, 5, 2)).astype(np.float32)
    # Every row its own length: a shard that got another's rows differs.
    features = {'x': x, 'length': np.array([5, 3, 4, 1, 2, 5, 3, 4],
                                           dtype=np.int32)}
    labels = np.linspace(-1., 1., 8, dtype=np.float32)[:, None]
    params = {'layer': layer}
    one = _train_in_graph(_lstm_model_fn, features, labels, params)
    replicated = _train_in_graph(
        _lstm_model_fn, features, labels, params, _cpus(num_cpus),
        **_BUILDS['replicated'])
    self.assertEqual(sorted(one), sorted(replicated))
    kernel = [name for name in one if name.endswith('lstm_cell/kernel') or
              name.endswith('lstm/kernel')]
    self.assertLen(kernel, 1)
    for name in one:
      # Same mean loss: only the order of the towers' sums differs.
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    self.assertEqual(replicated['global_step'], 3)

  def test_gradient_of_unknown_shape_is_reduced_by_its_variables_shape(self):
    # Two variables of one shape, their gradients on two towers; tower 1's
    # gradient of `b` lost its static shape (as a copy from a while loop
    # may). It has `b`'s shape: the two gradients still pack together.
    devices = _cpus(2)
    values = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    graph = tf.Graph()
    with graph.as_default():
      tower_grads = []
      for tower_id, device in enumerate(devices):
        with tf.device(device):
          a = tf1.get_variable('a_{}'.format(tower_id), [2, 3])
          b = tf1.get_variable('b_{}'.format(tower_id), [2, 3])
          grad_a = tf.constant(values[2 * tower_id])
          grad_b = tf.constant(values[2 * tower_id + 1])
          if tower_id:
            grad_b = tf1.placeholder_with_default(grad_b, shape=None)
        tower_grads.append([(grad_a, a), (grad_b, b)])
      reduced = replicated_gradients.all_reduce_gradients(
          tower_grads, devices,
          replicate.ReductionToOneDeviceCrossTowerOps())
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as s:
        got = s.run([[grad for grad, _ in pairs] for pairs in reduced])
    # One pack: a concatenation per tower, one sum.
    self.assertEqual(2, sum(op.type == 'ConcatV2'
                            for op in graph.get_operations()))
    self.assertEqual([2, 3], reduced[1][1][0].shape.as_list())
    for pairs in got:
      self.assertAllEqual(values[0] + values[2], pairs[0])  # a: 0..5 + 12..17
      self.assertAllEqual(values[1] + values[3], pairs[1])


class OptimizerVariableNamesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('{}_{}'.format(optimizer, build), optimizer, partitioned, build)
      for optimizer, partitioned in (('momentum', False), ('adam', False),
                                     ('adagrad_partitioned', True))
      for build in sorted(_BUILDS))
  def test_names_and_values_as_one_device(self, optimizer, partitioned,
                                          build):
    x, y = _rows()
    params = {'optimizer': optimizer, 'partitioned': partitioned}
    one = _train_in_graph(_scoped_model_fn, {'x': x}, y, params)
    replicated = _train_in_graph(_scoped_model_fn, {'x': x}, y, params,
                                 _cpus(2), **_BUILDS[build])
    # One device names a slot under the scope of `minimize` and the slot's
    # own variable scope, which repeats `model/`; a partitioned variable's
    # slot keeps TF's name for it, e.g. `model/model/w/part_0/Adagrad`.
    expected_slot = {
        'momentum': 'model/model/h/kernel/Momentum',
        'adam': 'model/model/h/kernel/Adam_1',
        'adagrad_partitioned': 'model/model/w/part_1/Adagrad',
    }[optimizer]
    self.assertIn(expected_slot, one)
    if optimizer == 'adam':
      self.assertIn('model/beta1_power', one)
    self.assertEqual(sorted(one), sorted(replicated))
    for name in one:
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    self.assertEqual(replicated['global_step'], 3)


def _two_layers(features):
  """Logits of a tanh layer 'h' of 4 units and an output layer 'logits'."""
  hidden = tf1.layers.dense(
      features['x'], 4, activation=tf.nn.tanh,
      kernel_initializer=tf1.glorot_uniform_initializer(seed=1), name='h')
  return tf1.layers.dense(
      hidden, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2),
      name='logits')


def _moving_average_model_fn(features, labels, mode, params):
  """`minimize`, then an `ExponentialMovingAverage` of the weights.

  The idiom of TF's official image models: the averages' update runs after
  the optimizer's (a control dependency) and is the step's `train_op`; the
  decay follows the global step (`num_updates`), so a step counted twice or
  an average updated once per tower shows in the shadows' values.
  """
  logits = _two_layers(features)
  loss = tf1.losses.mean_squared_error(labels, logits)
  step = tf1.train.get_global_step()
  minimize = replicate.TowerOptimizer(
      _OPTIMIZERS[params['optimizer']]()).minimize(loss, step)
  averages = tf1.train.ExponentialMovingAverage(0.9, num_updates=step)
  with tf.control_dependencies([minimize]):
    train_op = averages.apply(tf1.trainable_variables())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class MovingAverageTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('{}_{}'.format(optimizer, build), optimizer, build)
      for optimizer in ('sgd', 'adam') for build in sorted(_BUILDS))
  def test_shadows_as_one_device(self, optimizer, build):
    x, y = _rows()
    params = {'optimizer': optimizer}
    one = _train_in_graph(_moving_average_model_fn, {'x': x}, y, params)
    replicated = _train_in_graph(_moving_average_model_fn, {'x': x}, y,
                                 params, _cpus(4), **_BUILDS[build])
    # A shadow per trainable variable (4: two kernels, two biases), beside
    # the variables, the global step and the optimizer's slots.
    self.assertLen([name for name in one
                    if name.endswith('/ExponentialMovingAverage')], 4)
    self.assertEqual(sorted(one), sorted(replicated))
    for name in one:
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    # The shadows lag the weights (else the comparison above shows nothing).
    self.assertNotAllClose(one['h/kernel'],
                           one['h/kernel/ExponentialMovingAverage'])
    self.assertEqual(replicated['global_step'], 3)


def _two_optimizers_model_fn(features, labels, mode, params):
  """Two optimizers, updating together once every gradient is computed.

  A GAN's step: the output layer's SGD step on one loss, the hidden layer's
  on another that reads the output kernel in its backward pass; both
  updates under `control_dependencies` of all the gradients, as one device
  orders them. The collection 'second_gradients' gets the second ones.
  """
  logits = _two_layers(features)
  loss = tf1.losses.mean_squared_error(labels, logits)
  loss2 = tf.reduce_mean(tf.square(logits + 0.3 * labels))
  head = tf1.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES, 'logits')
  body = tf1.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES, 'h/')
  first = replicate.TowerOptimizer(_OPTIMIZERS['sgd']())
  second = replicate.TowerOptimizer(
      _OPTIMIZERS[params['optimizer']]())
  grads = first.compute_gradients(loss, var_list=head)
  grads2 = second.compute_gradients(loss2, var_list=body)
  for grad, _ in grads2:
    tf1.add_to_collection('second_gradients', grad)
  with tf.control_dependencies([g for g, _ in grads + grads2]):
    train_op = tf.group(first.apply_gradients(grads),
                        second.apply_gradients(
                            grads2, tf1.train.get_global_step()))
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class TwoOptimizersTest(tf.test.TestCase, parameterized.TestCase):
  """Updates wait for every tower's gradients that their block names."""

  @parameterized.parameters('clone', 'call_per_tower')
  def test_first_update_waits_for_every_towers_second_gradients(self, build):
    # The first update writes the output kernel, which the second loss's
    # backward pass reads: on a reference variable (TF 1.15's default) a
    # tower's backward pass that ran after it read the new kernel, so the
    # towers' second gradients, and the step, changed from run to run: a
    # copy's (before, the update waited for tower 0's block only), or a
    # middle tower's built by its own call (the last tower's update waited
    # for tower 0's block and its own).
    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      x, y = _rows()
      replicate.replicate_model_fn(
          _two_optimizers_model_fn, devices=_cpus(4), **_BUILDS[build])(
              {'x': tf.constant(x)}, tf.constant(y), _TRAIN,
              {'optimizer': 'sgd'})
      updates = [op for op in graph.get_operations()
                 if 'ApplyGradientDescent' in op.type and
                 'logits/kernel' in op.inputs[0].name]
      self.assertLen(updates, 1)
      waited = set()
      pending = [updates[0]]
      while pending:
        op = pending.pop()
        for dependency in [t.op for t in op.inputs] + op.control_inputs:
          if dependency not in waited:
            waited.add(dependency)
            pending.append(dependency)
      second_gradients = [g.op for g in graph.get_collection(
          'second_gradients')]
      if build == 'clone':  # tower 0's h/kernel and h/bias, and copies
        self.assertLen(second_gradients, 2)
        second_gradients += [
            graph.get_operation_by_name('tower_{}/{}'.format(i, op.name))
            for op in second_gradients for i in (1, 2, 3)]
      self.assertLen(second_gradients, 8)  # every call's own
      for op in second_gradients:
        self.assertIn(op, waited)

  @parameterized.parameters('sgd', 'adam')
  def test_trains_as_one_device(self, optimizer):
    x, y = _rows()
    one = _train_in_graph(_two_optimizers_model_fn, {'x': x}, y,
                          {'optimizer': optimizer}, steps=5)
    for build in sorted(_BUILDS):
      replicated = _train_in_graph(
          _two_optimizers_model_fn, {'x': x}, y,
          {'optimizer': optimizer}, _cpus(4), steps=5,
          **_BUILDS[build])
      self.assertEqual(sorted(one), sorted(replicated))
      for name in one:
        self.assertAllClose(one[name], replicated[name], rtol=1e-5,
                            atol=1e-6, msg=(build, name))
      self.assertEqual(replicated['global_step'], 5)


def _input_fn():
  x, y = _rows(16)

  def input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(({'x': x}, y))
    return dataset.batch(8, drop_remainder=True).repeat()
  return input_fn


def _estimator(model_dir, replicated_build=None):
  """A one-device Estimator (`replicated_build=None`) or one on 2 CPUs."""
  model_fn = _scoped_model_fn
  if replicated_build is not None:
    model_fn = replicate.replicate_model_fn(
        model_fn, devices=_cpus(2), **_BUILDS[replicated_build])
  return tf1.estimator.Estimator(
      model_fn, model_dir=model_dir,
      params={'optimizer': 'adam', 'partitioned': True},
      config=tf1.estimator.RunConfig(
          session_config=replicate.testing.virtual_cpu_config(_NUM_CPUS),
          tf_random_seed=7))


def _checkpoint_keys(model_dir):
  return sorted(name for name, _ in tf1.train.list_variables(model_dir))


class _ReadVariables(tf1.train.SessionRunHook):
  """Reads every global variable once restored, and when training ends."""

  def begin(self):
    self._variables = {v.op.name: v for v in tf1.global_variables()}

  def after_create_session(self, session, coord):
    del coord  # unused
    self.restored = session.run(self._variables)

  def end(self, session):
    self.final = session.run(self._variables)


class CheckpointResumeTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('{}_then_{}'.format(*(('one', build) if one_first else
                             (build, 'one'))), one_first, build)
      for one_first in (True, False) for build in ('clone', 'replicated'))
  def test_resumes_with_the_optimizer_state(self, one_first, build):
    # Adam on a partitioned variable: slots, beta powers and partitioned
    # slots (checkpoint key `model/w/art_0/Adam`: TF's own name for the
    # slice of `model/model/w/part_0/Adam`).
    first, second = (None, build) if one_first else (build, None)
    expected_dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    _estimator(expected_dir).train(_input_fn(), steps=2)
    expected = _ReadVariables()
    _estimator(expected_dir).train(_input_fn(), steps=1, hooks=[expected])
    model_dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    written = _ReadVariables()
    _estimator(model_dir, first).train(_input_fn(), steps=2, hooks=[written])
    resumed = _ReadVariables()
    _estimator(model_dir, second).train(_input_fn(), steps=1, hooks=[resumed])
    # The second Estimator starts from every value the first one trained,
    # slots included: re-initialized slots would be zeros (beta2_power
    # 0.999 instead of 0.999 ** 3).
    self.assertIn('model/model/w/part_0/Adam', written.final)
    self.assertEqual(sorted(written.final), sorted(resumed.restored))
    for name, value in written.final.items():
      self.assertAllEqual(value, resumed.restored[name], msg=name)
    self.assertNotAllClose(
        resumed.restored['model/model/h/kernel/Adam'],
        np.zeros_like(resumed.restored['model/model/h/kernel/Adam']))
    self.assertAllClose(0.999 ** 3, resumed.restored['model/beta2_power'])
    # ... and trains on as one device does.
    self.assertEqual(sorted(expected.final), sorted(resumed.final))
    for name in expected.final:
      self.assertAllClose(expected.final[name], resumed.final[name],
                          rtol=1e-5, atol=1e-6, msg=name)
    self.assertEqual(resumed.final['global_step'], 3)
    self.assertIn('model/w/art_0/Adam', _checkpoint_keys(model_dir))
    self.assertEqual(_checkpoint_keys(expected_dir),
                     _checkpoint_keys(model_dir))


if __name__ == '__main__':
  tf.test.main()

"""TowerOptimizer outside and inside replicate_model_fn."""
import functools

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1


class PassThroughTest(tf.test.TestCase):

  def test_plain_optimizer_outside_replication(self):
    # w = 2, loss = w^2, dloss/dw = 4, lr 0.25: w = 2 - 0.25 * 4 = 1.
    with tf.Graph().as_default():
      w = tf1.get_variable('w', [], initializer=tf1.constant_initializer(2.))
      optimizer = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.25))
      train_op = optimizer.minimize(tf.square(w))
      self.assertIsNone(replicate.get_tower_context())
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(train_op)
        self.assertAllClose(1.0, sess.run(w))

  def test_optimizer_fn_built_once_per_graph_in_that_graph(self):
    built = []

    def optimizer_fn():
      built.append(tf1.get_default_graph())
      return tf1.train.MomentumOptimizer(
          tf1.train.exponential_decay(0.1, tf1.train.get_or_create_global_step(),
                                      10, 0.5), momentum=0.9)

    optimizer = replicate.TowerOptimizer(optimizer_fn)
    graphs = []
    for _ in range(2):
      with tf.Graph().as_default() as graph:
        w = tf1.get_variable('w', [])
        optimizer.minimize(tf.square(w))
        optimizer.minimize(tf.square(w))  # same graph: not built again
        graphs.append(graph)
    self.assertEqual(graphs, built)

  def test_an_overridden_minimize_is_named_in_a_warning(self):
    # TowerOptimizer.minimize calls compute_gradients and apply_gradients,
    # never the wrapped optimizer's minimize (contrib did the same): an
    # override's extra work (here a counter) is not done, and a WARNING
    # says so, once per wrapped optimizer. Before: silently.
    class CountingOptimizer(tf1.train.GradientDescentOptimizer):

      def minimize(self, loss, *args, **kwargs):
        counter = tf1.get_variable('minimize_calls', [],
                                   initializer=tf1.zeros_initializer())
        with tf.control_dependencies([tf1.assign_add(counter, 1.)]):
          return super(CountingOptimizer, self).minimize(loss, *args,
                                                         **kwargs)

    with tf.Graph().as_default():
      w = tf1.get_variable('w', [])
      optimizer = replicate.TowerOptimizer(CountingOptimizer(0.1))
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        optimizer.minimize(tf.square(w))
        optimizer.minimize(tf.square(w))
        tf1.logging.warning('built')
      self.assertEmpty(tf1.global_variables('minimize_calls'))
      self.assertLen(logs.records, 2)
      self.assertRegex(
          logs.records[0].getMessage(),
          r'CountingOptimizer overrides minimize, which '
          r'TowerOptimizer.minimize does not call.*is not done')
      # A plain optimizer: no warning.
      with self.assertLogs('tensorflow', level='WARNING') as logs:
        replicate.TowerOptimizer(tf1.train.AdamOptimizer(0.1)).minimize(
            tf.square(w))
        tf1.logging.warning('built')
      self.assertEqual(['built'], [r.getMessage() for r in logs.records])

  def test_slot_pass_through(self):
    with tf.Graph().as_default():
      w = tf1.get_variable('w', [])
      optimizer = replicate.TowerOptimizer(tf1.train.AdamOptimizer(0.1))
      optimizer.minimize(tf.square(w))
      self.assertEqual(['m', 'v'], sorted(optimizer.get_slot_names()))
      self.assertIsNotNone(optimizer.get_slot(w, 'm'))
      self.assertEqual('Adam', optimizer.get_name())
      # beta1_power, beta2_power and the two slots of w.
      self.assertLen(optimizer.variables(), 4)


class AggregationPlacementTest(tf.test.TestCase):

  def test_gradients_summed_on_variable_device(self):
    features, labels = mt.data(batch_size=8)
    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(
          mt.mlp_model_fn, devices=mt.cpus(2),
          variable_placement=replicate.VariablePlacement.ROUND_ROBIN)(
              {'x': tf.constant(features['x'])}, tf.constant(labels),
              mt.TRAIN, {})
      variables = {v.op.name: v.device for v in tf1.trainable_variables()}
      sums = [op for op in graph.get_operations()
              if op.name.startswith('gradient_aggregation/')
              and op.type == 'AddN']
      # The gradient each variable is updated with (the last input of its
      # apply op) is produced on that variable's device.
      summed_on = {}
      for op in graph.get_operations():
        if (op.type.endswith('ApplyGradientDescent') and
            op.inputs[0].op.name in variables):
          summed_on[op.inputs[0].op.name] = op.inputs[-1].op.device
    self.assertEqual(variables, summed_on)
    # Round robin puts two of the four variables on each CPU; every sum runs
    # on one of them (small gradients of a device are summed in one packed
    # AddN, see gradient_aggregation.py).
    self.assertEqual(['/device:CPU:0', '/device:CPU:1'] * 2,
                     list(variables.values()))
    self.assertTrue(sums)
    self.assertTrue(set(op.device for op in sums) <= set(variables.values()))

  def test_no_collections_beyond_the_unreplicated_model(self):
    features, labels = mt.data(batch_size=8)
    keys = []
    for devices in (None, mt.cpus(4)):
      with tf.Graph().as_default() as graph:
        tf1.train.get_or_create_global_step()
        model_fn = mt.mlp_model_fn
        if devices:
          model_fn = replicate.replicate_model_fn(model_fn, devices=devices)
        model_fn({'x': tf.constant(features['x'])}, tf.constant(labels),
                 mt.TRAIN, {})
        keys.append(sorted(graph.get_all_collection_keys()))
    self.assertEqual(keys[0], keys[1])


def _rows(batch_size=12):
  """Distinct rows: a mix-up of rows or towers changes the result."""
  x = (np.arange(batch_size * 3, dtype=np.float32).reshape(batch_size, 3) /
       10. - 1.)
  return {'x': x}, np.linspace(-1., 1., batch_size, dtype=np.float32)[:, None]


def _dense(x):
  return tf1.layers.dense(
      x, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=1),
      name='out')


def _counter(name, rows):
  counter = tf1.get_variable(name, [], tf.float32, trainable=False,
                             initializer=tf1.zeros_initializer())
  # Locked: the towers add at once, and an unlocked add to a TF 1.15
  # reference variable can lose one (with calls as well).
  return tf1.assign_add(counter, tf.cast(tf.shape(rows)[0], tf.float32),
                        use_locking=True)


def _counted_model_fn(features, labels, mode, params):
  """`minimize` under a counter of the rows and a grouped update op."""
  loss = tf1.losses.mean_squared_error(labels, _dense(features['x']))
  # An update op (UPDATE_OPS: tower 0's only) and a write (every tower's).
  tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS,
                        _counter('update_rows', features['x']))
  update = tf.group(*tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
  with tf1.control_dependencies([_counter('rows', features['x']), update]):
    train_op = replicate.TowerOptimizer(params['optimizer']()).minimize(
        loss, tf1.train.get_global_step())
  # A write grouped into train_op after minimize: tower 0's only.
  total = tf1.get_variable('first_feature_total', [], tf.float32,
                           trainable=False, initializer=tf1.zeros_initializer())
  add = tf1.assign_add(total, tf.reduce_sum(features['x'][:, 0]))
  return tf1.estimator.EstimatorSpec(mode, loss=loss,
                                     train_op=tf.group(train_op, add))


def _sequenced_model_fn(features, labels, mode, params):
  """A second `minimize` under `control_dependencies` of the first one's."""
  logits = _dense(features['x'])
  first = replicate.TowerOptimizer(params['optimizer']()).minimize(
      tf1.losses.mean_squared_error(labels, logits))
  with tf1.control_dependencies([first]):
    second = replicate.TowerOptimizer(
        tf1.train.GradientDescentOptimizer(0.05)).minimize(
            tf.reduce_mean(tf.abs(logits)), tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=tf.constant(0.), train_op=second)


def _same_named_model_fn(features, labels, mode, params):
  """Two Momentum optimizers of the default name, the second on a subset
  of the first's variables: one device names its slots `Momentum_1`."""
  del params
  logits = _dense(features['x'])
  first = replicate.TowerOptimizer(tf1.train.MomentumOptimizer(
      0.1, 0.9)).minimize(tf1.losses.mean_squared_error(labels, logits))
  with tf1.control_dependencies([first]):
    second = replicate.TowerOptimizer(tf1.train.MomentumOptimizer(
        0.05, 0.5)).minimize(
            tf.reduce_mean(tf.abs(logits)), tf1.train.get_global_step(),
            var_list=tf1.trainable_variables('out/kernel'))
  return tf1.estimator.EstimatorSpec(mode, loss=tf.constant(0.),
                                     train_op=second)


_OPTIMIZERS = {'sgd': lambda: tf1.train.GradientDescentOptimizer(0.1),
               'adam': lambda: tf1.train.AdamOptimizer(0.1)}


class ControlDependenciesAroundMinimizeTest(parameterized.TestCase,
                                            tf.test.TestCase):
  """What `minimize` is made under holds in every tower, however built."""

  def _train(self, model_fn, optimizer, num_towers=None, tower_build=None):
    features, labels = _rows()
    replicate_fn = None
    if tower_build is not None:
      replicate_fn = functools.partial(replicate.replicate_model_fn,
                                       tower_build=tower_build)
    return mt.train_variables(
        model_fn, features, labels,
        mt.cpus(num_towers) if num_towers else None,
        params={'optimizer': _OPTIMIZERS[optimizer]},
        replicate_fn=replicate_fn)

  @parameterized.product(
      tower_build=list(replicate.TowerBuild), num_towers=[2, 4],
      optimizer=['sgd', 'adam'])
  def test_writes_in_the_block_run_in_every_tower(self, tower_build,
                                                  num_towers, optimizer):
    one = self._train(_counted_model_fn, optimizer)
    got = self._train(_counted_model_fn, optimizer, num_towers, tower_build)
    # 3 steps of 12 rows: every tower counts its rows, 36 in all...
    self.assertEqual(36., got['rows'])
    # ...but the update ops are tower 0's: 3 steps of its 12 / N rows;
    self.assertEqual(36. / num_towers, got['update_rows'])
    # and so is what train_op groups after minimize: 3 steps of the sum of
    # tower 0's first feature (tower 0 gets the first 12 / N rows).
    x = _rows()[0]['x']
    self.assertAllClose(3 * x[:12 // num_towers, 0].sum(),
                        got['first_feature_total'])
    for name in ('out/kernel', 'out/bias', 'global_step'):
      self.assertAllClose(one[name], got[name], rtol=1e-6, atol=1e-6)

  @parameterized.product(
      tower_build=list(replicate.TowerBuild), num_towers=[2, 4],
      optimizer=['sgd', 'adam'])
  def test_minimize_after_another_minimize(self, tower_build, num_towers,
                                           optimizer):
    # The first update must run, and the second optimizer's gradients must
    # see its result, as on one device.
    one = self._train(_sequenced_model_fn, optimizer)
    got = self._train(_sequenced_model_fn, optimizer, num_towers, tower_build)
    self.assertEqual(sorted(one), sorted(got))
    for name in one:
      self.assertAllClose(one[name], got[name], rtol=1e-6, atol=1e-6,
                          msg=name)

  @parameterized.parameters(2, 4)
  def test_two_optimizers_of_one_name(self, num_towers):
    # Before: TF's "Variable out/kernel/Momentum/ already exists" (the
    # update was built in tower 0's scopes entered again, which forget on
    # leaving the slot scopes the first optimizer opened).
    one = self._train(_same_named_model_fn, 'sgd')
    got = self._train(_same_named_model_fn, 'sgd', num_towers)
    self.assertIn('out/kernel/Momentum_1', one)
    self.assertEqual(sorted(one), sorted(got))
    for name in one:
      self.assertAllClose(one[name], got[name], rtol=1e-6, atol=1e-6,
                          msg=name)

  def test_two_optimizers_of_one_name_in_towers_built_by_calls(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'Optimizer call 1 of the towers \(Momentum\) makes a variable .*'
        r'already exists.*Give each optimizer its own name'):
      self._train(_same_named_model_fn, 'sgd', 2,
                  replicate.TowerBuild.CALL_PER_TOWER)


if __name__ == '__main__':
  tf.test.main()

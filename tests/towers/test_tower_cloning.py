"""TowerBuild.CLONE: towers 1..N-1 as copies of tower 0 (tower_cloning.py)."""
import functools
import random
from unittest import mock

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.towers import tower_cloning

CLONE = replicate.TowerBuild.CLONE
PER_TOWER = replicate.TowerBuild.CALL_PER_TOWER


def _deep_model_fn(features, labels, mode, params):
  """Four tanh layers of 8 units: kernels [8, 8] and biases [8] pack."""
  params = params or {}
  h = features['x']
  for i in range(4):
    h = tf1.layers.dense(
        h, 8, activation=tf.nn.tanh,
        kernel_initializer=tf1.glorot_uniform_initializer(seed=i),
        name='layer_{}'.format(i))
  if params.get('dropout'):
    h = tf1.nn.dropout(h, rate=0.5)
  logits = tf1.layers.dense(
      h, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=9),
      name='logits')
  loss = tf1.losses.sigmoid_cross_entropy(
      labels, logits,
      reduction=params.get('reduction', tf1.losses.Reduction.MEAN))
  optimizer = replicate.TowerOptimizer(
      params.get('optimizer_fn',
                 lambda: tf1.train.GradientDescentOptimizer(0.5)))
  train_op = optimizer.minimize(
      loss, tf1.train.get_global_step(),
      colocate_gradients_with_ops=params.get('colocate', False))
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                     predictions=logits)


def _data():
  return mt.data(batch_size=8, num_features=8)


def _zeros_like(x):
  return np.zeros_like(x)


def _closure():
  """A function counting its calls in a cell of its own."""
  count = [0]

  def counted(x):
    count[0] += 1
    return np.zeros_like(x)

  return counted


def _default_argument():
  """A function counting its calls in a default argument made by the call."""

  def counted(x, _count=[0]):  # noqa: B006 (the state is the point)
    _count[0] += 1
    return np.zeros_like(x)

  return counted


def _counting_decorator(function):
  """A decorator counting calls in its wrapper's cell (functools.wraps)."""
  count = [0]

  @functools.wraps(function)
  def wrapper(x):
    count[0] += 1
    return function(x)

  return wrapper


def _wrapped():
  """A module-level function, decorated with state by the call."""
  return _counting_decorator(_zeros_like)


def _random_state():
  """A builtin bound method of a generator made by the call."""
  return np.random.RandomState(0).permutation


def _local_class():
  """A classmethod of a class made by the call, counting in the class."""

  class Counted(object):
    count = 0

    @classmethod
    def zeros_like(cls, x):
      cls.count += 1
      return np.zeros_like(x)

  return Counted.zeros_like


class _Module(object):
  """A module-level class: the same object in every call."""

  @classmethod
  def zeros_like(cls, x):
    return np.zeros_like(x)


def _scaled(x, scale=0.0, dtype=np.float32):
  return (scale * x).astype(dtype)


def _stateless_local():
  """A function made by the call that holds nothing: no closure, immutable
  defaults."""

  def zeros(x, scale=0.0, shape=(), dtype=np.float32, like=_zeros_like):
    del scale, shape, dtype
    return like(x)

  return zeros


# Made once per model_fn call by the test model below.
_FACTORIES = (_closure, _default_argument, _wrapped, _random_state,
              _local_class, _stateless_local)


class _Counter(object):
  """A callable object counting its calls."""

  def __init__(self):
    self.count = 0

  def __call__(self, x):
    self.count += 1
    return np.zeros_like(x)


def _counting(model_fn):
  """`model_fn` and a list that gets one entry per call."""
  calls = []

  @functools.wraps(model_fn)
  def counted(features, labels, mode, params):
    calls.append(mode)
    return model_fn(features, labels, mode, params)

  return counted, calls


def _build(model_fn, devices, params=None, mode=mt.TRAIN,
           tower_build=CLONE, **kwargs):
  """Builds the replicated model in a new graph: (graph, spec)."""
  features, labels = _data()
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    spec = replicate.replicate_model_fn(
        model_fn, devices=devices, tower_build=tower_build, **kwargs)(
            {'x': tf.constant(features['x'])}, tf.constant(labels), mode,
            params)
  return graph, spec


def _train(model_fn, devices, tower_build, params=None, steps=3, **kwargs):
  features, labels = _data()
  return mt.train_variables(
      model_fn, features, labels, devices, steps=steps, params=params,
      replicate_fn=functools.partial(replicate.replicate_model_fn,
                                     tower_build=tower_build), **kwargs)


class CloneTrainingTest(tf.test.TestCase, parameterized.TestCase):
  """Copied towers train exactly like towers built by model_fn, and like one
  device."""

  @parameterized.named_parameters(
      ('sgd_mean_2', 'sgd', tf1.losses.Reduction.MEAN, 2, False),
      ('sgd_mean_4', 'sgd', tf1.losses.Reduction.MEAN, 4, False),
      ('adam_nonzero_4', 'adam', tf1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS,
       4, False),
      ('sgd_sum_4', 'sgd', tf1.losses.Reduction.SUM, 4, False),
      ('sgd_colocated_4', 'sgd', tf1.losses.Reduction.MEAN, 4, True),
  )
  def test_same_variables_as_per_tower_and_one_device(
      self, optimizer, reduction, num_towers, colocate):
    params = {
        'optimizer_fn': {
            'sgd': lambda: tf1.train.GradientDescentOptimizer(0.5),
            'adam': lambda: tf1.train.AdamOptimizer(0.05),
        }[optimizer],
        'colocate': colocate,
        # The model reduces its loss as replicate is told it does.
        'reduction': reduction,
    }
    model_fn, calls = _counting(_deep_model_fn)
    one = _train(model_fn, mt.cpus(1), CLONE, params,
                 loss_reduction=reduction)
    del calls[:]
    cloned = _train(model_fn, mt.cpus(num_towers), CLONE, params,
                    loss_reduction=reduction)
    self.assertLen(calls, 1)  # model_fn built tower 0 only
    per_tower = _train(model_fn, mt.cpus(num_towers), PER_TOWER, params,
                       loss_reduction=reduction)
    self.assertLen(calls, 1 + num_towers)
    self.assertEqual(sorted(one), sorted(cloned))
    for name in one:
      # Copies compute what model_fn's own towers compute, op for op.
      self.assertAllClose(per_tower[name], cloned[name], rtol=1e-6, atol=1e-7,
                          msg=name)
      self.assertAllClose(one[name], cloned[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  def test_round_robin_variables(self):
    # Variables spread over the towers' devices: a copy reads those on its
    # own device directly (no pack, its gradient keeps its gate) and the
    # others from packs.
    features, labels = _data()
    one = mt.train_variables(_deep_model_fn, features, labels, mt.cpus(1))
    spread = mt.train_variables(
        _deep_model_fn, features, labels, mt.cpus(4),
        replicate_fn=functools.partial(
            replicate.replicate_model_fn,
            variable_placement=replicate.VariablePlacement.ROUND_ROBIN))
    for name in one:
      self.assertAllClose(one[name], spread[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  def test_sparse_gradients(self):
    # An embedding lookup gives IndexedSlices, which copies keep sparse.
    def model_fn(features, labels, mode):
      ids = tf.cast(tf.abs(features['x'][:, 0]) * 4, tf.int32)
      table = tf1.get_variable(
          'table', [8, 2], initializer=tf1.glorot_uniform_initializer(seed=1))
      logits = tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1,
                             keepdims=True)
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      optimizer = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.5))
      grads_and_vars = optimizer.compute_gradients(loss)
      self.assertIsInstance(grads_and_vars[0][0], tf.IndexedSlices)
      train_op = optimizer.apply_gradients(grads_and_vars,
                                           tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    features, labels = _data()
    one = mt.train_variables(model_fn, features, labels, mt.cpus(1))
    cloned = mt.train_variables(model_fn, features, labels, mt.cpus(4))
    self.assertAllClose(one['table'], cloned['table'], rtol=1e-5, atol=1e-6)

  def test_variables_created_outside_get_variable_are_shared(self):
    # tf.Variable (or a Keras layer object) inside model_fn creates new
    # variables on every call; model_fn is called once and the copies share
    # tower 0's, so training matches one device (test_misuse_errors has the
    # error where towers are built by their own calls).
    def model_fn(features, labels, mode, params):
      del params
      w = tf.Variable(tf1.glorot_uniform_initializer(seed=1)([8, 1]),
                      name='w')
      logits = tf.matmul(features['x'], w)
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.5)).minimize(
              loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    features, labels = _data()
    one = mt.train_variables(model_fn, features, labels, mt.cpus(1))
    four = _train(model_fn, mt.cpus(4), CLONE)
    self.assertEqual(sorted(one), sorted(four))
    self.assertAllClose(one['w'], four['w'], rtol=1e-5, atol=1e-6)

  def test_second_optimizer_waiting_for_the_first_is_not_copied(self):
    # g's update waits for d's train_op: the copies of g's gradients must
    # not copy d's update (which would apply d's gradients once per tower).
    def model_fn(features, labels, mode):
      del labels
      d = tf1.get_variable('d', [], initializer=tf1.ones_initializer())
      g = tf1.get_variable('g', [], initializer=tf1.ones_initializer())
      d_train = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              tf.reduce_mean(d * d * features['x']), var_list=[d])
      with tf1.control_dependencies([d_train]):
        g_loss = tf.reduce_mean(g * features['x'])
      g_train = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              g_loss, var_list=[g])
      return tf1.estimator.EstimatorSpec(
          mode, loss=g_loss, train_op=tf.group(d_train, g_train))

    values = mt.train_variables(
        model_fn, {'x': np.array([1., 2., 3., 6.], np.float32)}, None,
        mt.cpus(4), steps=1)
    # mean(x) = 3: d = 1 - 0.1 * 2 * 1 * 3 = 0.4, g = 1 - 0.1 * 3 = 0.7.
    self.assertAllClose(0.4, values['d'])
    self.assertAllClose(0.7, values['g'])

  def test_seeded_random_ops_differ_between_towers(self):
    # With a graph seed, towers built by model_fn draw different dropout
    # masks; so must copies (their seed2 is offset by the tower index).
    graph, _ = _build(_deep_model_fn, mt.cpus(4), {'dropout': True})
    masks = [op for op in graph.get_operations()
             if op.type == 'RandomUniform' and 'dropout' in op.name]
    self.assertLen(masks, 4)
    self.assertLen(set(op.get_attr('seed2') for op in masks), 4)
    with graph.as_default(), tf1.Session(
        config=replicate.testing.virtual_cpu_config(4)) as sess:
      values = sess.run([op.outputs[0] for op in masks])
    for value in values[1:]:
      self.assertNotAllClose(values[0], value)


class CloneGraphTest(tf.test.TestCase):
  """What the copies look like."""

  def test_names_and_devices_as_per_tower(self):
    cloned, _ = _build(_deep_model_fn, mt.cpus(4))
    per_tower, _ = _build(_deep_model_fn, mt.cpus(4), tower_build=PER_TOWER)
    ops = {op.name: op for op in cloned.get_operations()}
    per_tower_ops = {op.name: op for op in per_tower.get_operations()}
    for tower_id in range(1, 4):
      prefix = 'tower_{}/'.format(tower_id)
      for name in ('layer_0/MatMul', 'layer_3/Tanh', 'logits/BiasAdd'):
        copy = ops[prefix + name]
        built = per_tower_ops[prefix + name]
        self.assertEqual(built.type, copy.type)
        self.assertEqual('/device:CPU:{}'.format(tower_id), copy.device)
        self.assertEqual(built.device, copy.device)
      # Gradient ops are named after tower 0's (tf.gradients in tower i
      # names them gradients/tower_<i>/...).
      built = per_tower_ops[
          prefix + 'gradients/' + prefix + 'layer_2/MatMul_grad/MatMul']
      copy = ops[prefix + 'gradients/layer_2/MatMul_grad/MatMul']
      self.assertEqual(built.type, copy.type)
      self.assertEqual(built.device, copy.device)
    # Shared, not copied: variables, their reads, the global step.
    self.assertNotIn('tower_1/layer_0/kernel', ops)
    self.assertNotIn('tower_1/layer_0/kernel/read', ops)
    # The copies do not build what no gradient needs: the input gradient of
    # the first layer (towers compute without GATE_OP's tuples, which would
    # run it) exists in tower 0 only.
    self.assertIn('gradients/layer_0/MatMul_grad/MatMul', ops)
    self.assertNotIn('tower_1/gradients/layer_0/MatMul_grad/MatMul', ops)

  def test_losses_collection_holds_every_tower(self):
    graph, spec = _build(_deep_model_fn, mt.cpus(4))
    losses = graph.get_collection(tf1.GraphKeys.LOSSES)
    self.assertLen(losses, 4)
    self.assertEqual(['', 'tower_1/', 'tower_2/', 'tower_3/'],
                     [loss.op.name[:len(loss.op.name) - len(losses[0].op.name)]
                      for loss in losses])
    # The spec's loss adds the four scaled tower losses.
    self.assertEqual('AddN', spec.loss.op.type)
    self.assertLen(spec.loss.op.inputs, 4)

  def test_gradients_and_loss_are_copied_in_one_import(self):
    # Every import has a cost of its own (TF's checks, and on TF 1.15 a
    # scan of the whole graph): the loss the optimizer got is copied with
    # the gradients.
    with mock.patch.object(
        tf1, 'import_graph_def', wraps=tf1.import_graph_def) as imports:
      graph, spec = _build(_deep_model_fn, mt.cpus(4))
    self.assertEqual(1, imports.call_count)
    # The spec's loss adds the towers' scaled losses, each scaling the
    # tower's copy of tower 0's loss.
    unscaled = [t.op.inputs[0] for t in spec.loss.op.inputs]
    self.assertEqual(
        ['tower_{}/{}'.format(i, unscaled[0].name) for i in range(1, 4)],
        [t.name for t in unscaled[1:]])
    del graph

  def test_reported_loss_built_after_the_optimizer_is_copied_too(self):
    def model_fn(features, labels, mode, params):
      spec = _deep_model_fn(features, labels, mode, params)
      # Reported, but no optimizer saw it: copied in a round of its own.
      return spec._replace(loss=spec.loss * 2.0)

    with mock.patch.object(
        tf1, 'import_graph_def', wraps=tf1.import_graph_def) as imports:
      graph, spec = _build(model_fn, mt.cpus(2))
    self.assertEqual(2, imports.call_count)
    copied_loss = spec.loss.op.inputs[1]
    self.assertStartsWith(copied_loss.op.name, 'tower_1/')
    self.assertEqual('Mul', copied_loss.op.inputs[0].op.type)
    self.assertStartsWith(copied_loss.op.inputs[0].op.name, 'tower_1/')
    del graph

  def test_colocated_gradients_follow_their_copies(self):
    graph, _ = _build(_deep_model_fn, mt.cpus(4), {'colocate': True})
    op = graph.get_operation_by_name(
        'tower_2/gradients/layer_1/MatMul_grad/MatMul')
    self.assertEqual('/device:CPU:2', op.device)
    self.assertEqual([b'loc:@tower_2/layer_1/MatMul'],
                     op.get_attr('_class'))

  def test_colocated_gradient_seed_goes_with_its_towers_loss(self):
    # colocate_gradients_with_ops puts the seed of the gradients (and the
    # gradient of the loss scaling) with the scaled loss, which the copies
    # do not copy (each tower scales its own): a call colocates it with its
    # tower's, so every op named for tower i runs on tower i's device.
    for tower_build in (CLONE, PER_TOWER):
      graph, _ = _build(_deep_model_fn, mt.cpus(4), {'colocate': True},
                        tower_build=tower_build)
      for tower_id in range(1, 4):
        prefix = 'tower_{}/'.format(tower_id)
        # (A call's reads of TF 2 resource variables ask for no device:
        # the placer puts them with their variable.)
        elsewhere = [
            (op.name, op.device) for op in graph.get_operations()
            if op.name.startswith(prefix) and op.type != 'ReadVariableOp' and
            op.device != '/device:CPU:{}'.format(tower_id)]
        self.assertEqual([], elsewhere, tower_build)

  def test_explicit_device_of_another_task_is_kept(self):
    # An op pinned inside model_fn to another task stays there in copies.
    def model_fn(features, labels, mode, params):
      del params
      with tf1.device('/job:localhost/replica:0/task:0/device:CPU:1'):
        features = {'x': tf.identity(features['x'], name='pinned')}
      return _deep_model_fn(features, labels, mode, None)

    graph, _ = _build(model_fn, mt.cpus(4))
    self.assertEqual(
        '/job:localhost/replica:0/task:0/device:CPU:1',
        graph.get_operation_by_name('tower_3/pinned').device)


class CopiedReadsTest(tf.test.TestCase):
  """Copied towers read the shared variables as a per-tower call would."""

  def test_copies_read_the_variables_not_packs(self):
    graph, _ = _build(_deep_model_fn, mt.cpus(4))
    self.assertFalse([op.name for op in graph.get_operations()
                      if 'packed_reads' in op.name or
                      op.type == 'DynamicStitch'])
    # The copy of tower 2's first layer reads the kernel through tower 0's
    # read of it (shared, not copied), as every tower's model_fn call would
    # read the one variable.
    read = graph.get_operation_by_name('tower_2/layer_0/MatMul').inputs[1].op
    self.assertIn(read.type, ('Identity', 'ReadVariableOp'))
    self.assertFalse(read.name.startswith('tower_'), read.name)
    self.assertEqual('layer_0/kernel', read.inputs[0].op.name)

  def test_same_transfers_as_model_fn_per_tower(self):
    def received(tower_build):
      """Variable reads received per step by other devices."""
      graph, spec = _build(_deep_model_fn, mt.cpus(4),
                           tower_build=tower_build)
      with graph.as_default(), tf1.Session(
          config=replicate.testing.virtual_cpu_config(4)) as sess:
        sess.run(tf1.global_variables_initializer())
        metadata = tf1.RunMetadata()
        sess.run(spec.train_op,
                 options=tf1.RunOptions(output_partition_graphs=True),
                 run_metadata=metadata)
      names = [node.attr['tensor_name'].s.decode()
               for partition in metadata.partition_graphs
               for node in partition.node if node.op == '_Recv']
      return len([n for n in names
                  if n.endswith(('/read', 'ReadVariableOp'))])

    # Towers 1-3 receive each of the 10 variables of _deep_model_fn, built
    # by model_fn or copied alike.
    self.assertEqual(3 * 10, received(PER_TOWER))
    self.assertEqual(3 * 10, received(CLONE))


class FallbackTest(tf.test.TestCase, parameterized.TestCase):
  """Where copying cannot be shown right, model_fn builds every tower."""

  def _reasons(self, model_fn, devices=None, **kwargs):
    """(model_fn calls, reasons logged) of one TRAIN build."""
    counted, calls = _counting(model_fn)
    with mock.patch.object(tower_cloning, 'warn_not_cloned') as warn:
      _build(counted, devices or mt.cpus(2), **kwargs)
    return len(calls), [c[0][0] for c in warn.call_args_list]

  def _assert_called_per_tower(self, model_fn, reason, **kwargs):
    """Two towers built by two model_fn calls, for one reason matching
    the regular expression `reason`."""
    calls, reasons = self._reasons(model_fn, **kwargs)
    self.assertEqual(2, calls)
    self.assertLen(reasons, 1)
    self.assertRegex(reasons[0], reason)

  def test_tower_context_before_the_optimizer(self):
    def model_fn(features, labels, mode, params):
      self.assertIsNotNone(replicate.get_tower_context())
      return _deep_model_fn(features, labels, mode, params)

    self._assert_called_per_tower(
        model_fn, r'^model_fn calls replicate\.get_tower_context\(\), so its '
        r'towers may differ')

  def test_warning_names_reason_and_fix(self):
    # (warn_not_cloned logs this once per process.)
    self.assertRegex(
        tower_cloning.POLICY.fallback_message('model_fn does X'),
        r'replicate_model_fn\(tower_build=TowerBuild.CLONE\) copies tower 0 '
        r'onto the other towers, but model_fn does X: copies cannot be shown '
        r'to do what calling model_fn once per tower does, so the build does '
        r'that instead. To silence this, pass '
        r'tower_build=replicate.TowerBuild.CALL_PER_TOWER \(what copies '
        r'preserve: docs/replicate_model_fn.md#what-a-copy-preserves\)')

  def test_sum_reduction_with_regularization(self):
    def model_fn(features, labels, mode, params):
      del params
      logits = tf1.layers.dense(
          features['x'], 1, kernel_regularizer=tf.keras.regularizers.l2(0.1))
      loss = (tf1.losses.sigmoid_cross_entropy(
          labels, logits, reduction=tf1.losses.Reduction.SUM) +
              tf1.losses.get_regularization_loss())
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    self._assert_called_per_tower(
        model_fn, 'loss_reduction is SUM',
        loss_reduction=tf1.losses.Reduction.SUM)
    calls, reasons = self._reasons(model_fn)  # MEAN: copied
    self.assertEqual((1, []), (calls, reasons))

  @staticmethod
  def _py_func_model_fn(function):
    """The deep model with `function(x)` (a tf.numpy_function) added to
    its features; `function` may be a factory: called once per model_fn
    call."""

    def model_fn(features, labels, mode, params):
      called = function() if function in _FACTORIES + (_Counter,) else (
          function)
      x = features['x']
      x = x + tf1.numpy_function(called, [x], tf.float32)
      x.set_shape(features['x'].shape)
      return _deep_model_fn({'x': x}, labels, mode, params)

    return model_fn

  def test_py_func_with_state_of_its_own(self):
    # A closure made by model_fn, or a callable object: another call makes
    # another one, with its own state.
    for factory, words in ((_closure, '_closure.<locals>.counted'),
                           (_Counter, '_Counter object'),
                           (_default_argument, '_default_argument'),
                           (_wrapped, '_zeros_like'),
                           (_random_state, 'permutation'),
                           (_local_class, 'Counted.zeros_like')):
      self._assert_called_per_tower(
          self._py_func_model_fn(factory),
          r'^model_fn built the PyFunc op \S+ calling .*{}.*which keeps '
          r'Python state of its own'.format(words))

  def test_py_func_of_a_module_function_is_copied(self):
    # One function object, whichever call registers it: copies call it as
    # the calls would.
    for function in (_zeros_like, np.zeros_like, _Module.zeros_like, _scaled,
                     _stateless_local, np.float32, np.copy):
      calls, reasons = self._reasons(self._py_func_model_fn(function))
      self.assertEqual((1, []), (calls, reasons))

  def test_seed_drawn_from_numpy_random(self):
    # Keras's backend.dropout draws its op seed from numpy.random when given
    # none: another call would draw another.
    def model_fn(features, labels, mode, params):
      x = tf1.keras.backend.dropout(features['x'], 0.5)
      return _deep_model_fn({'x': x}, labels, mode, params)

    self._assert_called_per_tower(
        model_fn, r'^model_fn drew numbers from Python\'s random generators '
        r'.* random op \S*dropout\S* with an explicit seed')

  def test_seeds_drawn_where_the_state_check_must_look(self):
    # Keras 2.15 draws seeds from Python's `random`; a draw from
    # numpy.random mid-stream (its key already refilled) moves only the
    # position; a stateless op takes the drawn seed as a constant input.
    # Another call would draw other seeds in each case.
    np.random.seed(0)
    np.random.uniform()
    noises = (
        lambda x: tf1.nn.dropout(x, rate=0.5, seed=random.randint(1, 10**6)),
        lambda x: tf1.nn.dropout(x, rate=0.5,
                                 seed=int(np.random.randint(10**6))),
        lambda x: x + tf1.random.stateless_uniform(
            tf.shape(x), seed=[int(np.random.randint(10**6)), 0]))
    for noise in noises:
      def model_fn(features, labels, mode, params, noise=noise):
        return _deep_model_fn({'x': noise(features['x'])}, labels, mode,
                              params)

      self._assert_called_per_tower(
          model_fn, r'^model_fn drew numbers from Python\'s random generators')

  def test_py_function_of_a_closure(self):
    # tf.py_function (EagerPyFunc) keeps a closure's state as tf.py_func.
    def model_fn(features, labels, mode, params):
      x = features['x']
      x = x + tf.py_function(_closure(), [x], tf.float32)
      x.set_shape(features['x'].shape)
      return _deep_model_fn({'x': x}, labels, mode, params)

    self._assert_called_per_tower(
        model_fn, r'^model_fn built the EagerPyFunc op \S+ calling '
        r'.*_closure.<locals>.counted.*which keeps Python state of its own')

  def test_seed_given_without_drawing(self):
    # An explicit op seed that no Python generator drew: every call builds
    # it alike, and so do copies (test_copy_fidelity.py's RandomSeedTest).
    def model_fn(features, labels, mode, params):
      x = tf1.nn.dropout(features['x'], rate=0.5, seed=3)
      return _deep_model_fn({'x': x}, labels, mode, params)

    calls, reasons = self._reasons(model_fn)
    self.assertEqual((1, []), (calls, reasons))

  @staticmethod
  def _cond_model_fn(predicate_fn):
    """A model_fn whose logits change sign where `predicate_fn(x)` is False."""

    def model_fn(features, labels, mode, params):
      del params
      logits = tf1.layers.dense(
          features['x'], 1,
          kernel_initializer=tf1.glorot_uniform_initializer(seed=1))
      logits = tf1.cond(predicate_fn(features['x']), lambda: logits,
                        lambda: -2 * logits)
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn

  def test_cond_is_copied(self):
    # tf.cond: Switch/Merge ops under TF 1.15, one If op under TF 2: copied
    # either way. The same branch for every shard, so that towers agree
    # with one device.
    model_fn = self._cond_model_fn(
        lambda x: tf1.train.get_global_step() < 100)
    calls, reasons = self._reasons(model_fn)
    self.assertEqual((1, []), (calls, reasons))
    features, labels = _data()
    one = mt.train_variables(model_fn, features, labels, mt.cpus(1))
    two = mt.train_variables(model_fn, features, labels, mt.cpus(2))
    for name in one:
      self.assertAllClose(one[name], two[name], rtol=1e-5, atol=1e-6)

  def test_cond_on_each_towers_shard(self):
    # Each copy takes the branch its own shard asks for, as a tower built by
    # its own model_fn call does (shards 0, 1 have a positive mean, 2, 3 not).
    model_fn = self._cond_model_fn(lambda x: tf.reduce_mean(x) > 0)
    copied = _train(model_fn, mt.cpus(4), CLONE)
    per_tower = _train(model_fn, mt.cpus(4), PER_TOWER)
    for name in copied:
      self.assertAllClose(per_tower[name], copied[name], rtol=1e-6,
                          atol=1e-7, msg=name)

  @parameterized.named_parameters(('cloned', CLONE), ('per_tower', PER_TOWER))
  def test_while_loop_is_copied_and_trains_like_one_device(self, tower_build):
    # dynamic_rnn: a TF1 while loop under TF 1.15 (copies get frames of
    # their own), one While op under TF 2. The loop's Enter reads the kernel;
    # a gate on it would wait for an op inside the loop's frame from outside
    # it, which TF rejects at run time (gradient_gating.py skips control-flow
    # ops).
    def model_fn(features, labels, mode, params):
      del params
      inputs = tf.reshape(features['x'], [-1, 4, 2])
      with tf1.variable_scope(
          'rnn', initializer=tf1.glorot_uniform_initializer(seed=4)):
        _, state = tf1.nn.dynamic_rnn(tf1.nn.rnn_cell.BasicRNNCell(5),
                                      inputs, dtype=tf.float32)
      logits = tf1.layers.dense(
          state, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.5)).minimize(
              loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    features, labels = _data()
    with mock.patch.object(tower_cloning, 'warn_not_cloned') as warn:
      one = mt.train_variables(model_fn, features, labels, mt.cpus(1))
      four = _train(model_fn, mt.cpus(4), tower_build)
    warn.assert_not_called()
    for name in one:
      self.assertAllClose(one[name], four[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    graph, _ = _build(model_fn, mt.cpus(2), tower_build=tower_build)
    frames = set(op.get_attr('frame_name') for op in graph.get_operations()
                 if op.type == 'Enter')
    if frames:  # TF1 loops: one frame per tower and loop (forward, gradient)
      self.assertLen(frames, 4)
      self.assertLen([f for f in frames if f.startswith(b'tower_1/')], 2)

  def test_device_scope_around_the_replicated_model_fn(self):
    # An enclosing scope fills in the job of tower 0's ops; a copy would not
    # get it, so model_fn builds every tower.
    counted, calls = _counting(_deep_model_fn)
    features, labels = _data()
    with mock.patch.object(tower_cloning, 'warn_not_cloned') as warn:
      with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        with tf1.device('/job:localhost'):
          replicate.replicate_model_fn(counted, devices=mt.cpus(2))(
              {'x': tf.constant(features['x'])}, tf.constant(labels),
              mt.TRAIN, None)
    self.assertLen(calls, 2)
    self.assertIn('a device scope around the replicated model_fn',
                  warn.call_args[0][0])

  @parameterized.named_parameters(('eval', mt.EVAL), ('predict', mt.PREDICT))
  def test_eval_and_predict_copy_tower_0(self, mode):
    counted, calls = _counting(_deep_model_fn)
    _build(counted, mt.cpus(4), mode=mode)
    self.assertLen(calls, 1)
    _build(counted, mt.cpus(4), mode=mode, tower_build=PER_TOWER)
    self.assertLen(calls, 1 + 4)

  @parameterized.named_parameters(('eval', mt.EVAL), ('predict', mt.PREDICT))
  def test_eval_and_predict_fall_back_on_tower_context(self, mode):
    def model_fn(features, labels, mode, params):
      self.assertIsNotNone(replicate.get_tower_context())
      return _deep_model_fn(features, labels, mode, params)

    counted, calls = _counting(model_fn)
    with mock.patch.object(tower_cloning, 'warn_not_cloned') as warn:
      _build(counted, mt.cpus(2), mode=mode)
    self.assertLen(calls, 2)
    self.assertIn('replicate.get_tower_context()', warn.call_args[0][0])

  def test_tower_build_must_be_an_enum_member(self):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"tower_build must be a replicate.TowerBuild \(one of \['CLONE', "
        r"'CALL_PER_TOWER'\]\), got 'clone'"):
      replicate.replicate_model_fn(_deep_model_fn, tower_build='clone')


if __name__ == '__main__':
  tf.test.main()

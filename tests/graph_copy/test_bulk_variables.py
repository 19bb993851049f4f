"""graph_copy/bulk_variables.py: variables and slots made by one import.

(Kept where it pays: docs/performance.md, "Variables and slots made by
import". The garbage collector is never paused.)

The bulk variables must be what `tf.Variable` makes (op types and names,
devices, dtype, shape, initial value, collections, trainability), and slots
made in bulk must leave an optimizer's `apply_gradients` nothing to make,
start at the optimizer's own initial values (RMSProp's `rms` at 1,
Adagrad's accumulator at its initial value) and train as the primary's.
REPLICATED Estimators, whose copies and slots are made this way, train as
one device with each of those optimizers.
"""
import gc
import tempfile
from unittest import mock

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.graph_copy import bulk_variables

_NUM_CPUS = 3
_OPTIMIZERS = {
    'momentum': lambda: tf1.train.MomentumOptimizer(0.3, 0.9),
    'adam': lambda: tf1.train.AdamOptimizer(0.05),
    'rmsprop': lambda: tf1.train.RMSPropOptimizer(0.05, momentum=0.5),
    'adagrad': lambda: tf1.train.AdagradOptimizer(
        0.2, initial_accumulator_value=0.25),
}


def _virtual_session(graph):
  return tf1.Session(graph=graph,
                     config=replicate.testing.virtual_cpu_config(_NUM_CPUS))


def _ops_by_type(graph, first_index, op_type):
  return [op.name for op in graph.get_operations()[first_index:]
          if op.type == op_type]


class CreateVariablesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(True, False)
  def test_as_tf_variable_makes_them(self, resource):
    graph = tf.Graph()
    with graph.as_default():
      with tf1.device('/cpu:0'):
        original = tf1.get_variable(
            'w', initializer=np.arange(6, dtype=np.float32).reshape(2, 3),
            use_resource=resource)
      with tf1.device('/cpu:1'):
        start = len(graph.get_operations())
        made = tf1.Variable(original.initial_value, trainable=False,
                            collections=[tf1.GraphKeys.LOCAL_VARIABLES],
                            name='tower_1/w', use_resource=resource)
        expected = {op.name.replace('tower_1', 'tower_2'): op.type
                    for op in graph.get_operations()[start:]}
      start = len(graph.get_operations())
      bulk, = bulk_variables.create_variables(graph, [
          bulk_variables.VariableSpec(
              name='tower_2/w', device='/device:CPU:2',
              initial_value=original.initial_value, resource=resource,
              trainable=False, collections=[tf1.GraphKeys.LOCAL_VARIABLES],
              colocate_with=None, wrap_initial_value=False)])
      created = {op.name: op.type for op in graph.get_operations()[start:]}
      # tf.Variable's ops, under the copy's name, but for the IsInitialized
      # op of a resource variable, which nothing reads.
      expected.pop('tower_2/w/IsInitialized/VarIsInitializedOp', None)
      self.assertEqual(expected, created)
      self.assertTrue(tf1.get_default_graph() is graph)
      with _virtual_session(graph) as session:
        # Still reported as uninitialized until initialized (the report
        # makes its own check).
        self.assertIn(b'tower_2/w', session.run(
            tf1.report_uninitialized_variables(tf1.local_variables())))
      self.assertEqual('tower_2/w', bulk.op.name)
      self.assertEqual(made.op.type, bulk.op.type)
      self.assertEqual('/device:CPU:2', bulk.device)
      self.assertEqual(made.dtype, bulk.dtype)
      self.assertEqual(made.shape, bulk.shape)
      self.assertFalse(bulk.trainable)
      self.assertIs(bulk.initial_value, original.initial_value)
      self.assertEqual([made, bulk], tf1.local_variables())
      self.assertEqual([original], tf1.global_variables())
      with _virtual_session(graph) as session:
        session.run(tf1.global_variables_initializer())
        session.run(tf1.local_variables_initializer())
        self.assertAllEqual(session.run(original), session.run(bulk))
        session.run(bulk.assign(bulk + 1.0))
        # Its own storage: the original did not move.
        self.assertAllEqual(session.run(original) + 1.0, session.run(bulk))

  def test_many_variables_one_import(self):
    graph = tf.Graph()
    with graph.as_default():
      values = [tf.constant([float(i), 10.0 + i]) for i in range(5)]
      specs = [bulk_variables.VariableSpec(
          name='v{}'.format(i), device='/cpu:{}'.format(i % _NUM_CPUS),
          initial_value=value, resource=True, trainable=True,
          collections=[tf1.GraphKeys.GLOBAL_VARIABLES], colocate_with=None,
          wrap_initial_value=True,
          aggregation=tf.VariableAggregation.MEAN)
               for i, value in enumerate(values)]
      with mock.patch.object(
          tf1, 'import_graph_def', wraps=tf1.import_graph_def) as spy:
        made = bulk_variables.create_variables(graph, specs)
      self.assertEqual(1, spy.call_count)
      self.assertEqual(['v{}'.format(i) for i in range(5)],
                       [v.op.name for v in made])
      self.assertEqual(tf.VariableAggregation.MEAN, made[3].aggregation)
      self.assertEqual('v3/Initializer/Identity:0',
                       made[3].initial_value.name)
      with _virtual_session(graph) as session:
        session.run(tf1.global_variables_initializer())
        # Variable i starts at [i, 10 + i].
        self.assertAllEqual([[i, 10.0 + i] for i in range(5)],
                            session.run(made))


class CanCopyTest(tf.test.TestCase):

  def test_guarded_initial_values_are_not_copied(self):
    with tf.Graph().as_default():
      base = tf1.get_variable('base', initializer=[1.0, 2.0],
                              use_resource=False)
      plain = tf1.get_variable('plain', initializer=[3.0, 4.0],
                               use_resource=False)
      # Read from `base`: TF guards its initializer against an
      # uninitialized `base`; a copy reading the initial value would not be.
      derived = tf1.get_variable('derived', initializer=base * 2.0,
                                 use_resource=False)
      self.assertTrue(bulk_variables.can_copy(plain))
      self.assertFalse(bulk_variables.can_copy(derived))


class SlotCopiesTest(tf.test.TestCase, parameterized.TestCase):

  def _build(self, optimizer_name, bulk):
    """w on cpu:0 and two copies, updated by one apply_gradients."""
    graph = tf.Graph()
    with graph.as_default():
      init = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
      with tf1.device('/cpu:0'):
        w = tf1.get_variable('w', initializer=init, use_resource=True)
      copies = bulk_variables.create_variables(graph, [
          bulk_variables.VariableSpec(
              name='tower_{}/w'.format(i), device='/cpu:{}'.format(i),
              initial_value=w.initial_value, resource=True, trainable=False,
              collections=[tf1.GraphKeys.LOCAL_VARIABLES],
              colocate_with=None, wrap_initial_value=False)
          for i in (1, 2)])
      optimizer = _OPTIMIZERS[optimizer_name]()
      made = 0
      if bulk:
        made = bulk_variables.create_slot_copies(
            optimizer, [w], [copies], [tf1.GraphKeys.LOCAL_VARIABLES])
      start = len(graph.get_operations())
      # One gradient for all: the copies must follow w exactly.
      grad = tf.constant([[0.1, -0.2], [0.3, 0.05]])
      train_op = optimizer.apply_gradients(
          [(grad * 1.0, v) for v in [w] + copies])
      handles = _ops_by_type(graph, start, 'VarHandleOp')
    return graph, optimizer, w, copies, train_op, made, handles

  @parameterized.parameters('momentum', 'adam', 'rmsprop', 'adagrad')
  def test_slots_made_in_bulk_train_as_the_primary(self, optimizer_name):
    graph, optimizer, w, copies, train_op, made, handles = self._build(
        optimizer_name, bulk=True)
    slot_names = optimizer.get_slot_names()
    # Every slot of both copies was made in bulk; apply_gradients made no
    # variable (Adam's beta powers were made with w's slots).
    self.assertEqual(2 * len(slot_names), made)
    self.assertEqual([], handles)
    with graph.as_default():
      for name in slot_names:
        slot = optimizer.get_slot(w, name)
        for tower, copy in enumerate(copies, 1):
          copy_slot = optimizer.get_slot(copy, name)
          self.assertEqual('tower_{}/{}'.format(tower, slot.op.name),
                           copy_slot.op.name)
          self.assertEqual(copy.device, copy_slot.device)
          self.assertIn(copy_slot, tf1.local_variables())
      # Checkpoint names as one device gives them.
      self.assertNotIn('tower_1', ' '.join(
          v.op.name for v in tf1.global_variables()))
      with _virtual_session(graph) as session:
        session.run([tf1.global_variables_initializer(),
                     tf1.local_variables_initializer()])
        for name in slot_names:
          first = session.run(optimizer.get_slot(w, name))
          for copy in copies:
            # The optimizer's own initial value (rms: 1, accumulator: 0.25).
            self.assertAllEqual(first,
                                session.run(optimizer.get_slot(copy, name)))
        for _ in range(3):
          session.run(train_op)
        values = session.run([w] + copies)
        self.assertNotAllClose(values[0], [[0.5, -1.0], [2.0, 0.25]])
        for value in values[1:]:
          self.assertAllEqual(values[0], value)

  @parameterized.parameters('rmsprop', 'adagrad')
  def test_initial_slot_values_are_the_optimizers(self, optimizer_name):
    graph, optimizer, _, copies, _, _, _ = self._build(optimizer_name, True)
    name = {'rmsprop': 'rms', 'adagrad': 'accumulator'}[optimizer_name]
    with _virtual_session(graph) as session:
      session.run(tf1.local_variables_initializer())
      # RMSProp's rms starts at 1; Adagrad's accumulator at 0.25.
      expected = {'rmsprop': 1.0, 'adagrad': 0.25}[optimizer_name]
      self.assertAllEqual(np.full((2, 2), expected, np.float32),
                          session.run(optimizer.get_slot(copies[1], name)))

  def test_optimizer_with_its_own_apply_makes_its_slots(self):

    class OwnApply(tf1.train.MomentumOptimizer):

      def apply_gradients(self, *args, **kwargs):
        return super(OwnApply, self).apply_gradients(*args, **kwargs)

    graph = tf.Graph()
    with graph.as_default():
      w = tf1.get_variable('w', [2], use_resource=True)
      optimizer = OwnApply(0.1, 0.9)
      self.assertEqual(0, bulk_variables.create_slot_copies(
          optimizer, [w], [[]], []))
      self.assertIsNone(optimizer.get_slot(w, 'momentum'))


def _rows(num_rows=48):
  rng = np.random.RandomState(3)
  x = rng.uniform(-1, 1, size=(num_rows, 3)).astype(np.float32)
  x += np.arange(num_rows, dtype=np.float32)[:, None] * 0.01
  y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
  return x, y


def _model_fn(features, labels, mode, params):
  net = tf1.layers.dense(features['x'], 4, activation=tf.nn.tanh,
                         kernel_initializer=tf1.glorot_uniform_initializer(
                             seed=1), name='hidden')
  logits = tf1.layers.dense(net, 1, kernel_initializer=(
      tf1.glorot_uniform_initializer(seed=2)), name='logits')
  loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = replicate.TowerOptimizer(_OPTIMIZERS[params['optimizer']]())
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  if params.get('twice'):
    # The same optimizer again, on another loss, after the first update:
    # one slot per variable, which both updates use.
    with tf1.control_dependencies([train_op]):
      train_op = optimizer.minimize(tf.reduce_mean(tf.abs(logits)))
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _input_fn():
  x, y = _rows()
  return tf.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(
      12, drop_remainder=True).repeat()


class ReplicatedEstimatorTest(tf.test.TestCase, parameterized.TestCase):

  def _train(self, optimizer_name, twice=False, **kwargs):
    model_dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    tf1.estimator.Estimator(
        replicate.replicate_model_fn(_model_fn, **kwargs),
        model_dir=model_dir,
        params={'optimizer': optimizer_name, 'twice': twice},
        config=tf1.estimator.RunConfig(
            session_config=replicate.testing.virtual_cpu_config(_NUM_CPUS),
            tf_random_seed=7)).train(_input_fn, steps=3)
    return {name: tf1.train.load_variable(model_dir, name)
            for name, _ in tf1.train.list_variables(model_dir)}

  @parameterized.parameters('momentum', 'adam', 'rmsprop', 'adagrad')
  def test_trains_as_one_device(self, optimizer_name):
    one = self._train(optimizer_name, devices=['/cpu:0'])
    with mock.patch.object(bulk_variables, 'create_variables',
                           wraps=bulk_variables.create_variables) as spy:
      replicated = self._train(
          optimizer_name,
          devices=replicate.testing.virtual_cpu_devices(_NUM_CPUS),
          variable_placement=replicate.VariablePlacement.REPLICATED)
    # The bulk path was taken: 4 variables (2 kernels, 2 biases) x 2
    # copies, then their slots (2 copies x 4 variables x slots per var).
    made = [len(call[0][1]) for call in spy.call_args_list]
    slots = {'momentum': 1, 'adam': 2, 'rmsprop': 2, 'adagrad': 1}
    self.assertEqual([8, 8 * slots[optimizer_name]], made)
    # One copy, under the unreplicated names (slots and beta powers too).
    self.assertEqual(sorted(one), sorted(replicated))
    for name in one:
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    self.assertEqual(3, replicated['global_step'])

  def test_one_optimizer_applied_twice_trains_as_one_device(self):
    # Each copy keeps one momentum slot per variable for both updates, as
    # tower 0's variables and one device do; a second slot per copy would
    # let the towers' copies drift apart.
    one = self._train('momentum', twice=True, devices=['/cpu:0'])
    replicated = self._train(
        'momentum', twice=True,
        devices=replicate.testing.virtual_cpu_devices(_NUM_CPUS),
        variable_placement=replicate.VariablePlacement.REPLICATED)
    self.assertEqual(sorted(one), sorted(replicated))
    for name in one:
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  @parameterized.parameters(True, False)
  def test_build_leaves_the_collector_and_imports_per_batch(self, enabled):
    # Python's garbage collector is never switched, on or off; the imports
    # are one per batch, whatever the number of variables: the copies of
    # the 4 variables, their slots, and the copy round of gradients and
    # loss (tower_cloning).
    was_enabled = gc.isenabled()
    if not enabled:
      gc.disable()
    try:
      with mock.patch.object(
          tf1, 'import_graph_def', wraps=tf1.import_graph_def) as imports, (
              mock.patch.object(gc, 'disable', wraps=gc.disable)) as disable:
        self._train('momentum',
                    devices=replicate.testing.virtual_cpu_devices(_NUM_CPUS),
                    variable_placement=replicate.VariablePlacement.REPLICATED)
      self.assertEqual(enabled, gc.isenabled())
    finally:
      if was_enabled:
        gc.enable()
    self.assertEqual(0, disable.call_count)
    self.assertEqual(3, imports.call_count)


if __name__ == '__main__':
  tf.test.main()

"""MirroredStrategy's slot copies (graph_copy/bulk_variables.py) and copies.

The optimizer makes the primary copies' slots, the other copies' slots are
made from them before `apply_gradients`; a mirrored variable's copies are
made by the variable creators, one by one. Training must equal one device
with Momentum, Adam, RMSProp (whose `rms` starts at 1) and Adagrad (whose
accumulator starts at its initial value), checkpoints must hold one
device's names, and every copy of every slot must stay equal.
"""
import copy as copy_lib
from unittest import mock

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import testing
from replicate._compat import tf1
from replicate.graph_copy import bulk_variables

NUM = 4
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)
GLOBAL = 8  # rows per step; 2 per replica
STEPS = 3
_ROWS = np.random.RandomState(2).uniform(-1, 1, (GLOBAL * STEPS, 3)).astype(
    np.float32)
_LABELS = np.cos(_ROWS.sum(axis=1, keepdims=True) * 2.0).astype(np.float32)
_INITIAL = [np.random.RandomState(20 + i).uniform(-0.8, 0.8, shape).astype(
    np.float32) for i, shape in enumerate([(3, 4), (4, 1)])]
_OPTIMIZERS = {
    'momentum': lambda: tf1.train.MomentumOptimizer(0.1, 0.9),
    'adam': lambda: tf1.train.AdamOptimizer(0.05),
    'rmsprop': lambda: tf1.train.RMSPropOptimizer(0.05, momentum=0.5),
    'adagrad': lambda: tf1.train.AdagradOptimizer(
        0.2, initial_accumulator_value=0.25),
}
_SLOTS = {'momentum': 1, 'adam': 2, 'rmsprop': 2, 'adagrad': 1}


def _train(optimizer_name, replicas):
  """Trains STEPS steps; returns {name: value} of every global variable,
  and (mirrored) whether every slot's copies equal its primary."""
  optimizers = []

  def step(inputs):
    features, labels = inputs
    h = features
    for i, initial in enumerate(_INITIAL):
      h = tf.tanh(tf.matmul(h, tf1.get_variable('w{}'.format(i),
                                                initializer=initial)))
    loss = tf.reduce_sum(tf.square(h - labels)) / GLOBAL
    optimizer = _OPTIMIZERS[optimizer_name]()
    optimizers.append(optimizer)
    if replicas > 1:
      optimizer = replicate.TowerOptimizer(optimizer)
    return optimizer.minimize(loss)

  with tf.Graph().as_default():
    dataset = tf.data.Dataset.from_tensor_slices(
        (_ROWS, _LABELS)).batch(GLOBAL, drop_remainder=True)
    if replicas == 1:
      with tf1.device('/cpu:0'):
        train_op = step(tf1.data.make_one_shot_iterator(dataset).get_next())
    else:
      strategy = replicate.MirroredStrategy(DEVICES)
      with strategy.scope():
        inputs = strategy.experimental_distribute_dataset(
            dataset).make_one_shot_iterator().get_next()
        train_op = strategy.group(strategy.run(step, args=(inputs,)))
    variables = tf1.global_variables()
    slot_copies = []
    if replicas > 1:
      optimizer = optimizers[0]
      for variable in tf1.trainable_variables():
        for name in optimizer.get_slot_names():
          slot_copies.append([optimizer.get_slot(copy, name)
                              for copy in variable.values])
    with tf1.Session(config=CONFIG) as sess:
      sess.run(tf1.global_variables_initializer())
      initial_slots = sess.run(slot_copies)
      for _ in range(STEPS):
        sess.run(train_op)
      values = {v.op.name: sess.run(v) for v in variables}
      trained_slots = sess.run(slot_copies)
  return values, initial_slots, trained_slots


class MirroredBulkSlotsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters('momentum', 'adam', 'rmsprop', 'adagrad')
  def test_trains_as_one_device(self, optimizer_name):
    one, _, _ = _train(optimizer_name, 1)
    made = []
    original = bulk_variables.create_slot_copies

    def create_slot_copies(*args, **kwargs):
      made.append(original(*args, **kwargs))
      return made[-1]

    with mock.patch.object(bulk_variables, 'create_slot_copies',
                           create_slot_copies):
      mirrored, initial_slots, trained_slots = _train(optimizer_name, NUM)
    # The slots of copies 1..3 of w0 and w1 were made before
    # apply_gradients: 3 copies x 2 variables x the optimizer's slots per
    # variable.
    self.assertEqual([3 * 2 * _SLOTS[optimizer_name]], made)
    # One device's names (slots, Adam's beta powers) and values.
    self.assertEqual(sorted(one), sorted(mirrored))
    for name, value in one.items():
      self.assertAllClose(value, mirrored[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    self.assertGreater(np.abs(one['w0'] - _INITIAL[0]).max(), 1e-3)
    # Every copy of a slot starts as its primary (rms at 1, accumulator at
    # 0.25) and stays equal to it.
    for copies in initial_slots + trained_slots:
      for copy in copies[1:]:
        self.assertAllEqual(copies[0], copy)
    if optimizer_name == 'rmsprop':
      # Slot names sorted: w0's momentum, then w0's rms (copy 1 of it).
      self.assertAllEqual(np.ones((3, 4), np.float32), initial_slots[1][1])


class CopiesTest(tf.test.TestCase):

  def test_copies_are_made_by_the_creators_without_import(self):

    def clip(x):
      return tf.clip_by_value(x, -1.0, 1.0)

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES)
      with mock.patch.object(
          tf1, 'import_graph_def', wraps=tf1.import_graph_def) as spy:
        with strategy.scope():
          v = tf1.get_variable(
              'v', initializer=_INITIAL[0], constraint=clip,
              aggregation=tf.VariableAggregation.MEAN)
      self.assertEqual(0, spy.call_count)
      copies = v.values[1:]
      self.assertEqual(['v/replica_1', 'v/replica_2', 'v/replica_3'],
                       [c.op.name for c in copies])
      self.assertEqual(list(v.devices[1:]), [c.device for c in copies])
      for copy in copies:
        self.assertTrue(copy.trainable)
        self.assertIs(copy.constraint, clip)
        self.assertEqual(tf.VariableAggregation.MEAN, copy.aggregation)
        self.assertEqual(v.values[0].synchronization, copy.synchronization)
      self.assertEqual([v], tf1.global_variables())
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        for copy in copies:
          self.assertAllEqual(_INITIAL[0], sess.run(copy))

  def test_mirrored_variable_reads_its_state_outside_replicas(self):
    # Cross-replica code reads the copies' constraint; a shallow copy and a
    # missing dunder are the MirroredVariable's own business, not a copy's.
    def clip(x):
      return tf.clip_by_value(x, -1.0, 1.0)

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES)
      with strategy.scope():
        v = tf1.get_variable('v', initializer=_INITIAL[0], constraint=clip)
        self.assertIs(clip, v.constraint)
      self.assertIs(clip, v.constraint)
      self.assertEqual(v.values, copy_lib.copy(v).values)
      self.assertFalse(hasattr(v, '__not_a_variable_attribute__'))


if __name__ == '__main__':
  tf.test.main()

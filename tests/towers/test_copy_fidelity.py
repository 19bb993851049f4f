"""Copied towers do what a model_fn call per tower would: tables and writes.

Lookup tables are state, like variables: the copies of tower 0 look up in
its table, which its initializer fills once (`tables_initializer`); a copy
never gets an empty table of its own. A write of a shared variable or table
in what the towers copy (a counter in the control dependencies of the
features, an insert) is made by every tower, as another `model_fn` call
would make it; tower 0's `UPDATE_OPS` stay its own (tower_collections.py).
Each model runs against the same model on one device on the same global
batch.
"""
import os
import tempfile

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import lookup_ops  # what heads and columns use

import replicate
from replicate._compat import tf1

_VOCABULARY = ['bird', 'cat', 'dog']
# Distinct per row and per tower: shards of 2 rows on 4 towers hold
# (dog, bird), (cat, cat), (bird, dog), (dog, cat).
_LABELS = np.array([b'dog', b'bird', b'cat', b'cat', b'bird', b'dog', b'dog',
                    b'cat'])
_IDS = np.array([2, 0, 1, 1, 0, 2, 2, 1])


def _features(num_rows=8):
  """Rows whose largest entry is their class (`_IDS`), plus distinct noise."""
  rng = np.random.RandomState(3)
  x = rng.uniform(-0.4, 0.4, size=(num_rows, 3)).astype(np.float32)
  x[np.arange(num_rows), np.tile(_IDS, num_rows // 8)] += 1.0
  return {'x': x}


def _session_run(spec, mode, steps=3):
  """Runs `spec` in a MonitoredSession (variables, tables, the mode's hooks).

  Returns:
    TRAIN: {name: value} of the global variables after `steps` steps; EVAL:
    the metrics after two updates, and 'loss'; PREDICT: the predictions.
  """
  hooks = {mt.TRAIN: spec.training_hooks, mt.EVAL: spec.evaluation_hooks,
           mt.PREDICT: spec.prediction_hooks}[mode]
  with tf1.train.MonitoredSession(
      session_creator=tf1.train.ChiefSessionCreator(
          config=replicate.testing.virtual_cpu_config(4)),
      hooks=hooks) as session:
    if mode == mt.TRAIN:
      for _ in range(steps):
        session.run(spec.train_op)
      return session.run({v.op.name: v for v in tf1.global_variables()})
    if mode == mt.EVAL:
      for _ in range(2):
        session.run([update for _, update in spec.eval_metric_ops.values()])
      values = session.run({name: value for name, (value, _) in
                            spec.eval_metric_ops.items()})
      values['loss'] = session.run(spec.loss)
      return values
    return session.run(spec.predictions)


def _run(model_fn, mode, devices, features, labels=None, params=None,
         steps=3, **replicate_kwargs):
  """Builds `model_fn` replicated on `devices` in a new graph and runs it."""
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    spec = replicate.replicate_model_fn(
        model_fn, devices=devices, **replicate_kwargs)(
            {k: tf.constant(v) for k, v in features.items()},
            None if labels is None else tf.constant(labels), mode,
            params or {})
    return _session_run(spec, mode, steps)


def _table_model_fn(features, labels, mode, params):
  """String labels through a vocabulary table; class names through another.

  The logits layer starts as the identity, so the predicted class of a row
  of `_features` is its `_IDS` entry.
  """
  del params
  logits = tf1.layers.dense(
      features['x'], 3, kernel_initializer=tf1.initializers.identity(),
      name='logits')
  class_ids = tf.argmax(logits, axis=1)
  if mode == mt.PREDICT:
    names = lookup_ops.index_to_string_table_from_tensor(
        tf.constant(_VOCABULARY)).lookup(class_ids)
    return tf1.estimator.EstimatorSpec(
        mode, predictions={'class_ids': class_ids, 'classes': names})
  ids = lookup_ops.index_table_from_tensor(
      tf.constant(_VOCABULARY)).lookup(labels)
  loss = tf1.losses.sparse_softmax_cross_entropy(ids, logits)
  optimizer = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.5))
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, eval_metric_ops={
          'accuracy': tf1.metrics.accuracy(ids, class_ids),
          'mean_id': tf1.metrics.mean(tf.cast(ids, tf.float32)),
      })


_TOWERS = (('2_towers', 2), ('4_towers', 4))
_PLACEMENTS = (
    ('2_towers', 2, replicate.VariablePlacement.CONSOLIDATION_DEVICE),
    ('4_towers', 4, replicate.VariablePlacement.CONSOLIDATION_DEVICE),
    ('4_replicated', 4, replicate.VariablePlacement.REPLICATED),
)


class LookupTableTest(tf.test.TestCase, parameterized.TestCase):
  """Vocabulary tables in model_fn, looked up by every tower."""

  @parameterized.named_parameters(*_PLACEMENTS)
  def test_train_with_string_labels_as_one_device(self, num_towers,
                                                  placement):
    # Before: FailedPreconditionError 'Table not initialized' on
    # tower_1/.../LookupTableFindV2 (each copy made an empty table).
    features = _features()
    got = _run(_table_model_fn, mt.TRAIN, mt.cpus(num_towers), features,
               _LABELS, variable_placement=placement)
    want = _run(_table_model_fn, mt.TRAIN, mt.cpus(1), features, _LABELS)
    self.assertEqual(sorted(want), sorted(got))
    self.assertNotAllClose(np.eye(3), want['logits/kernel'])  # it trained
    for name, value in want.items():
      self.assertAllClose(value, got[name], rtol=1e-6, atol=1e-7, msg=name)

  @parameterized.named_parameters(*_PLACEMENTS)
  def test_eval_metrics_of_looked_up_labels(self, num_towers, placement):
    features = _features()
    got = _run(_table_model_fn, mt.EVAL, mt.cpus(num_towers), features,
               _LABELS, variable_placement=placement)
    # Every row is predicted as its class: accuracy 1; mean id of
    # (2, 0, 1, 1, 0, 2, 2, 1) = 9 / 8.
    self.assertAllClose(1.0, got['accuracy'])
    self.assertAllClose(9.0 / 8.0, got['mean_id'])
    want = _run(_table_model_fn, mt.EVAL, mt.cpus(1), features, _LABELS)
    for key, value in want.items():
      self.assertAllClose(value, got[key], rtol=1e-6, msg=key)

  @parameterized.named_parameters(*_PLACEMENTS)
  def test_predict_class_names_in_batch_order(self, num_towers, placement):
    features = _features()
    got = _run(_table_model_fn, mt.PREDICT, mt.cpus(num_towers), features,
               variable_placement=placement)
    # Row i's class is _IDS[i]; its name _VOCABULARY[_IDS[i]].
    self.assertAllEqual(_IDS, got['class_ids'])
    self.assertAllEqual(_LABELS, got['classes'])

  def test_gpu_names_under_soft_placement(self):
    # GPUs this machine lacks, in a session that allows soft placement: the
    # table stays with tower 0 and tower 1 looks it up wherever TF puts it.
    gpus = ['/gpu:{}'.format(i) for i in range(_num_gpus(), _num_gpus() + 2)]
    features = _features()
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(_table_model_fn, devices=gpus)(
          {'x': tf.constant(features['x'])}, tf.constant(_LABELS), mt.TRAIN,
          {})
      tables = [op for op in tf1.get_default_graph().get_operations()
                if op.type in ('HashTable', 'HashTableV2')]
      self.assertLen(tables, 1)  # tower 0's, shared
      self.assertEqual('/device:GPU:{}'.format(_num_gpus()), tables[0].device)
      config = tf1.ConfigProto(allow_soft_placement=True)
      with tf1.Session(config=config) as session:
        session.run([tf1.global_variables_initializer(),
                     tf1.tables_initializer()])
        for _ in range(3):
          session.run(spec.train_op)
        got = session.run(tf1.trainable_variables()[0])
    want = _run(_table_model_fn, mt.TRAIN, mt.cpus(1), features, _LABELS)
    self.assertAllClose(want['logits/kernel'], got, rtol=1e-6, atol=1e-7)

  def test_mutable_table_gets_every_towers_inserts(self):
    # Each tower inserts its shard's labels before it looks them up: on 4
    # towers, tower 1 finds its own (cat, cat) only if it inserted them.
    def model_fn(features, labels, mode, params):
      del params
      table = lookup_ops.MutableHashTable(tf.string, tf.int64, -1)
      ids = lookup_ops.index_table_from_tensor(
          tf.constant(_VOCABULARY)).lookup(labels)
      with tf1.control_dependencies([table.insert(labels, ids * 10)]):
        found = table.lookup(labels) // 10
      logits = tf1.layers.dense(
          features['x'], 3,
          kernel_initializer=tf1.glorot_uniform_initializer(seed=7),
          name='logits')
      loss = tf1.losses.sparse_softmax_cross_entropy(found, logits)
      optimizer = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.5))
      tf1.add_to_collection('table_size', table.size())
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss,
          train_op=optimizer.minimize(loss, tf1.train.get_global_step()))

    features = _features()
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(model_fn, devices=mt.cpus(4))(
          {'x': tf.constant(features['x'])}, tf.constant(_LABELS), mt.TRAIN,
          {})
      tables = [op for op in tf1.get_default_graph().get_operations()
                if op.type == 'MutableHashTableV2']
      self.assertLen(tables, 1)
      self.assertEqual('/device:CPU:0', tables[0].device)  # a parameter
      size = tf1.get_collection('table_size')[0]
      with tf1.Session(
          config=replicate.testing.virtual_cpu_config(4)) as session:
        session.run([tf1.global_variables_initializer(),
                     tf1.tables_initializer()])
        session.run(spec.train_op)
        self.assertEqual(3, session.run(size))  # bird, cat, dog
        got = session.run(tf1.trainable_variables())
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      spec = model_fn({'x': tf.constant(features['x'])},
                      tf.constant(_LABELS), mt.TRAIN, {})
      with tf1.Session() as session:
        session.run([tf1.global_variables_initializer(),
                     tf1.tables_initializer()])
        session.run(spec.train_op)
        want = session.run(tf1.trainable_variables())
    for value, expected in zip(got, want):
      self.assertAllClose(expected, value, rtol=1e-6, atol=1e-7)


_ANIMALS = np.array([b'cat', b'dog', b'dog', b'bird', b'cat', b'fish',
                     b'bird', b'dog'])  # 'fish': out of the vocabulary


def _feature_column_model_fn(features, labels, mode, params):
  """A vocabulary column, embedded and one-hot, next to a numeric one.

  The vocabulary is a list, or the file `params['vocabulary_file']`.
  """
  if params.get('vocabulary_file'):
    animal = tf1.feature_column.categorical_column_with_vocabulary_file(
        'animal', params['vocabulary_file'], vocabulary_size=3)
  else:
    animal = tf1.feature_column.categorical_column_with_vocabulary_list(
        'animal', _VOCABULARY)
  columns = [
      tf1.feature_column.numeric_column('x', shape=(3,)),
      tf1.feature_column.embedding_column(
          animal, 2, initializer=tf1.truncated_normal_initializer(seed=4)),
      tf1.feature_column.indicator_column(animal),
  ]
  net = tf1.feature_column.input_layer(features, columns)
  logits = tf1.layers.dense(
      net, 3, kernel_initializer=tf1.glorot_uniform_initializer(seed=5),
      name='logits')
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  optimizer = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.5))
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss,
      train_op=optimizer.minimize(loss, tf1.train.get_global_step()))


def _feature_column_input_fn():
  features = dict(_features(), animal=_ANIMALS)
  return tf1.data.Dataset.from_tensor_slices(
      (features, _IDS)).batch(8, drop_remainder=True).repeat()


class FeatureColumnEstimatorTest(tf.test.TestCase, parameterized.TestCase):
  """A vocabulary feature column through real Estimators."""

  def _train(self, model_fn, params):
    estimator = tf1.estimator.Estimator(
        model_fn, model_dir=tempfile.mkdtemp(dir=self.get_temp_dir()),
        params=params,
        config=tf1.estimator.RunConfig(
            tf_random_seed=0, save_summary_steps=None,
            log_step_count_steps=None,
            session_config=replicate.testing.virtual_cpu_config(4)))
    estimator.train(_feature_column_input_fn, steps=3)
    return {name: estimator.get_variable_value(name)
            for name in estimator.get_variable_names()}

  @parameterized.named_parameters(
      ('list_2_towers', 2, False), ('list_4_towers', 4, False),
      ('file_4_towers', 4, True))
  def test_trains_as_one_device(self, num_towers, from_file):
    params = {}
    if from_file:
      path = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()),
                          'animals.txt')
      with open(path, 'w') as vocabulary:
        vocabulary.write('\n'.join(_VOCABULARY) + '\n')
      params['vocabulary_file'] = path
    got = self._train(replicate.replicate_model_fn(
        _feature_column_model_fn, devices=mt.cpus(num_towers)), params)
    want = self._train(_feature_column_model_fn, params)
    self.assertEqual(sorted(want), sorted(got))
    embedding = [name for name in want if 'embedding_weights' in name]
    self.assertLen(embedding, 1)
    for name, value in want.items():
      self.assertAllClose(value, got[name], rtol=1e-6, atol=1e-7, msg=name)


def _counter_model_fn(features, labels, mode, params):
  """Counts the rows it sees in a variable written before the features."""
  seen = tf1.get_variable(
      'examples_seen', shape=[], initializer=tf1.zeros_initializer(),
      trainable=False, use_resource=params.get('resource', False))
  rows = tf.cast(tf.shape(features['x'])[0], tf.float32)
  count = tf1.assign_add(seen, rows, use_locking=True)
  if params.get('update_ops'):
    tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, count)
  with tf1.control_dependencies([count]):
    x = tf.identity(features['x'])
  logits = tf1.layers.dense(
      x, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=6),
      name='logits')
  if mode == mt.PREDICT:
    return tf1.estimator.EstimatorSpec(mode, predictions={'logits': logits})
  loss = tf1.losses.mean_squared_error(labels, logits)
  optimizer = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss,
      train_op=optimizer.minimize(loss, tf1.train.get_global_step()))


def _counter_data():
  x = (np.arange(96, dtype=np.float32).reshape(32, 3) % 7) / 7.0
  return {'x': x}, np.linspace(-1, 1, 32, dtype=np.float32)[:, None]


class ForwardWriteTest(tf.test.TestCase, parameterized.TestCase):
  """Writes of shared variables in what the towers copy."""

  @parameterized.named_parameters(
      ('2_towers_ref', 2, False), ('4_towers_ref', 4, False),
      ('4_towers_resource', 4, True))
  def test_every_tower_counts_its_rows(self, num_towers, resource):
    # Before: 32 (tower 0's 8 rows, 4 steps) on 4 towers, 64 on 2.
    features, labels = _counter_data()
    params = {'resource': resource}
    got = _run(_counter_model_fn, mt.TRAIN, mt.cpus(num_towers), features,
               labels, params=params, steps=4)
    want = _run(_counter_model_fn, mt.TRAIN, mt.cpus(1), features, labels,
                params=params, steps=4)
    # 4 steps of 32 rows, as one device and TF 1.15's contrib (a model_fn
    # call per tower) count them.
    self.assertEqual(128.0, got['examples_seen'])
    self.assertEqual(want['examples_seen'], got['examples_seen'])
    self.assertAllClose(want['logits/kernel'], got['logits/kernel'],
                        rtol=1e-6, atol=1e-7)

  @parameterized.named_parameters(('eval', mt.EVAL), ('predict', mt.PREDICT))
  def test_every_tower_counts_in_eval_and_predict(self, mode):
    features, labels = _counter_data()
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      spec = replicate.replicate_model_fn(
          _counter_model_fn, devices=mt.cpus(4))(
              {'x': tf.constant(features['x'])},
              None if mode == mt.PREDICT else tf.constant(labels), mode, {})
      seen, = [v for v in tf1.global_variables()
               if v.op.name == 'examples_seen']
      with tf1.Session(
          config=replicate.testing.virtual_cpu_config(4)) as session:
        session.run([tf1.global_variables_initializer(),
                     tf1.local_variables_initializer()])
        session.run(spec.loss if mode == mt.EVAL else spec.predictions)
        self.assertEqual(32.0, session.run(seen))  # one pass over 32 rows

  def test_update_ops_write_stays_tower_0s(self):
    # In UPDATE_OPS, the count is tower 0's (as batch-norm statistics are):
    # 4 steps of its 8 rows = 32 on 4 towers.
    features, labels = _counter_data()
    got = _run(_counter_model_fn, mt.TRAIN, mt.cpus(4), features, labels,
               params={'update_ops': True}, steps=4)
    self.assertEqual(32.0, got['examples_seen'])

  def test_contrib_side_effects_test(self):
    # TF 1.15's contrib test (ReplicateWithTwoOptimizersTest): a write in the
    # control dependencies of compute_gradients, 2 towers, loss reduction
    # SUM. c: 10 - 1.0 * 3 (SGD; d loss / dc = 1 + 2) - ~1 (Adam) = 6;
    # side_effects: one write per tower, 2.
    def model_fn(features, labels, mode, params):
      del params
      c = tf1.get_variable('c', initializer=tf.constant(10, tf.float64))
      side_effects = tf1.get_variable(
          'side_effects', initializer=tf.constant(0, tf.float64),
          trainable=False)
      predictions = features * c
      loss = tf.reduce_sum(tf1.losses.absolute_difference(
          labels, predictions, reduction=tf1.losses.Reduction.SUM))
      first = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(1.0))
      second = replicate.TowerOptimizer(tf1.train.AdamOptimizer(1.0))
      # Locked: the two towers' writes run at once on two devices, and an
      # unlocked add to a reference variable (after disable_v2_behavior)
      # can lose one of them, as per-tower calls could in contrib.
      with tf1.control_dependencies([side_effects.assign_add(
          1.0, use_locking=True)]):
        grads_and_vars = first.compute_gradients(loss)
      train_op = tf.group(first.apply_gradients(grads_and_vars),
                          second.minimize(loss))
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with tf.Graph().as_default():
      spec = replicate.replicate_model_fn(
          model_fn, loss_reduction=tf1.losses.Reduction.SUM,
          devices=mt.cpus(2))(
              tf.constant([[1.0], [2.0]], tf.float64),
              tf.constant([[1.0], [2.0]], tf.float64), mt.TRAIN, {})
      with tf1.Session(
          config=replicate.testing.virtual_cpu_config(2)) as session:
        session.run(tf1.global_variables_initializer())
        # (1 * 10 - 1) + (2 * 10 - 2) = 27.
        self.assertEqual(27.0, session.run(spec.loss))
        session.run(spec.train_op)
        values = {v.op.name: session.run(v) for v in tf1.global_variables()}
    self.assertNear(6.0, values['c'], 1e-6)
    self.assertNear(2.0, values['side_effects'], 1e-6)


def _dropout_model_fn(features, labels, mode, params):
  """PREDICT: each row's dropout mask of ones (`params['seed']`: op seed)."""
  del labels
  ones = tf.ones_like(features['x'])
  mask = tf1.nn.dropout(ones, rate=0.5, seed=params.get('seed'))
  return tf1.estimator.EstimatorSpec(mode, predictions={'mask': mask})


class RandomSeedTest(tf.test.TestCase, parameterized.TestCase):
  """Copies draw what a model_fn call per tower would draw."""

  def _masks(self, graph_seed, op_seed, build):
    with tf.Graph().as_default():
      if graph_seed is not None:
        tf1.set_random_seed(graph_seed)
      spec = replicate.replicate_model_fn(
          _dropout_model_fn, devices=mt.cpus(4), tower_build=build)(
              {'x': tf.zeros([16, 6])}, None, mt.PREDICT, {'seed': op_seed})
      with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as s:
        return s.run(spec.predictions)['mask'].reshape(4, 4, 6)

  def test_op_level_seed_draws_as_calls(self):
    # No graph seed, op seed 3: every call's dropout gets seeds
    # (DEFAULT_GRAPH_SEED, 3), so every tower draws tower 0's mask; the
    # copies keep those seeds.
    copied = self._masks(None, 3, replicate.TowerBuild.CLONE)
    called = self._masks(None, 3, replicate.TowerBuild.CALL_PER_TOWER)
    self.assertAllEqual(called, copied)
    for tower in range(1, 4):
      self.assertAllEqual(copied[0], copied[tower])

  @parameterized.parameters(3, 12345)
  def test_op_level_seed_with_a_graph_seed_draws_as_calls(self, op_seed):
    # Graph seed 7 and op seed s: every call's dropout gets seeds (7, s),
    # so every tower draws tower 0's mask; the copies keep s, which is not
    # one TF would have derived from the graph (the id of the op made just
    # before the dropout's).
    copied = self._masks(7, op_seed, replicate.TowerBuild.CLONE)
    called = self._masks(7, op_seed, replicate.TowerBuild.CALL_PER_TOWER)
    self.assertAllEqual(called, copied)
    for tower in range(1, 4):
      self.assertAllEqual(copied[0], copied[tower])

  def test_seed_drawn_from_numpy_random_draws_as_calls(self):
    # Keras's backend.dropout without a seed takes its op seed from
    # numpy.random, so each call draws its own; copies of tower 0 would
    # draw its mask in every tower. The copying build makes a call per
    # tower instead: with numpy.random seeded alike, it draws the masks
    # the calls draw, one per tower.
    def model_fn(features, labels, mode, params):
      del labels, params
      mask = tf1.keras.backend.dropout(tf.ones_like(features['x']), 0.5)
      return tf1.estimator.EstimatorSpec(mode, predictions={'mask': mask})

    def masks(build):
      state = np.random.get_state()
      np.random.seed(11)
      try:
        with tf.Graph().as_default():
          spec = replicate.replicate_model_fn(
              model_fn, devices=mt.cpus(4), tower_build=build)(
                  {'x': tf.zeros([16, 6])}, None, mt.PREDICT, {})
          with tf1.Session(
              config=replicate.testing.virtual_cpu_config(4)) as s:
            return s.run(spec.predictions)['mask'].reshape(4, 4, 6)
      finally:
        np.random.set_state(state)

    copied = masks(replicate.TowerBuild.CLONE)
    self.assertAllEqual(masks(replicate.TowerBuild.CALL_PER_TOWER), copied)
    for tower in range(1, 4):
      self.assertFalse(np.array_equal(copied[0], copied[tower]), tower)

  def test_graph_seed_draws_per_tower(self):
    # Graph seed 7, no op seed: the op seed derives from the op's place in
    # the graph, which differs per call; copies get their own seed2.
    copied = self._masks(7, None, replicate.TowerBuild.CLONE)
    for tower in range(1, 4):
      self.assertFalse(np.array_equal(copied[0], copied[tower]), tower)
    self.assertAllEqual(copied, self._masks(7, None,
                                            replicate.TowerBuild.CLONE))


def _num_gpus():
  return len(tf1.config.experimental.list_physical_devices('GPU'))


if __name__ == '__main__':
  tf.test.main()

"""Less common model_fns, against the reference and the unreplicated model.

Each model exercises a path the plain MLP of test_contrib_oracle.py does not:
a partitioned variable read through `embedding_lookup` (`IndexedSlices`
gradients, one per partition), per-tower gradient clipping with a decayed
learning rate, two `TowerOptimizer`s on disjoint variable lists, and a
`SparseTensor` feature split along its first dimension.

Two references:
* TF 1.15's `tf.contrib.estimator.replicate_model_fn`: every variable, metric
  and prediction must match; live on TF 1.15, recorded on TF 2.x
  (reference/contrib_models/, written by record_reference.py). The initial
  values come from numpy, so both TFs start from the same variables.
* The same `model_fn` without replication, on the whole batch (both TFs):
  the default loss reduction averages each tower's loss and the towers'
  gradients are summed, so the summed gradient is the whole batch's and
  training must reach the same variables. Per-tower clipping is the
  exception (clipping four partial gradients is not clipping their sum), so
  that model is compared with the reference only.
"""
from absl.testing import parameterized
import model_testing as mt
import numpy as np
import reference_lib
import tensorflow as tf

import replicate
from replicate._compat import tf1

_BATCH = 16
_NUM_IDS = 10
_GROUP = 'contrib_models'
REFERENCE_IMPLEMENTATION = ('tf.contrib.estimator.replicate_model_fn, '
                            'TowerOptimizer')


def _data():
  rng = np.random.RandomState(3)
  ids = rng.randint(0, _NUM_IDS, size=(_BATCH, 2)).astype(np.int64)
  x = rng.normal(size=(_BATCH, 4)).astype(np.float32)
  labels = (ids[:, 0] % 3).astype(np.int64)
  return ids, x, labels


def _initial_values():
  """Every model's initial kernels and tables, by variable name."""
  rng = np.random.RandomState(5)
  shapes = (('embedding/table', (_NUM_IDS, 3)), ('embedding/logits', (7, 3)),
            ('clipped/hidden', (4, 6)), ('clipped/logits', (6, 3)),
            ('first/dense', (4, 5)), ('second/dense', (5, 3)),
            ('sparse/weights', (_NUM_IDS, 3)), ('sparse/dense', (4, 3)))
  return {name: rng.uniform(-0.7, 0.7, size=shape).astype(np.float32)
          for name, shape in shapes}


def _initializer(name):
  """Initializes to `_initial_values()[name]`, or a partition's rows of it."""
  value = _initial_values()[name]

  def initializer(shape, dtype=tf.float32, partition_info=None):
    rows = value
    if partition_info is not None:  # a part of a partitioned variable
      offset = partition_info.var_offset[0]
      rows = value[offset:offset + shape[0]]
    return tf.constant(rows, dtype=dtype, shape=shape)

  return initializer


def _inputs():
  ids, x, labels = _data()
  inputs = dict(_initial_values())
  inputs.update(ids=ids, x=x, labels=labels)
  return inputs


def _features(ids, x):
  """Dense ids and x, and the ids again as a [batch, 2] SparseTensor."""
  indices = np.array([[row, col] for row in range(_BATCH) for col in range(2)],
                     dtype=np.int64)
  sparse = tf.SparseTensor(indices, tf.constant(ids.reshape(-1)), [_BATCH, 2])
  return {'ids': tf.constant(ids), 'x': tf.constant(x), 'sparse_ids': sparse}


def _spec(mode, logits, labels, loss, train_op):
  if mode == mt.PREDICT:
    return tf1.estimator.EstimatorSpec(mode, predictions={'logits': logits})
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metric_ops={
          'accuracy': tf1.metrics.accuracy(labels, tf.argmax(logits, 1)),
          'mean_logit': tf1.metrics.mean(logits),
      })


def _partitioned_embedding(features, labels, mode, params):
  with tf1.variable_scope('embedding',
                          partitioner=tf1.fixed_size_partitioner(2)):
    table = tf1.get_variable(
        'table', [_NUM_IDS, 3],
        initializer=_initializer('embedding/table'))
  # TF 1's lookup ('mod' partitions): TF 2's tf.nn one splits by 'div'.
  embedded = tf.reduce_sum(tf1.nn.embedding_lookup(
      table, features['ids'], partition_strategy='mod'), 1)
  logits = tf1.layers.dense(
      tf.concat([embedded, features['x']], 1), 3,
      kernel_initializer=_initializer('embedding/logits'), name='logits')
  if mode == mt.PREDICT:
    return _spec(mode, logits, None, None, None)
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  optimizer = params['wrapper'](tf1.train.AdagradOptimizer(0.1))
  return _spec(mode, logits, labels, loss,
               optimizer.minimize(loss, tf1.train.get_global_step()))


def _clipped_momentum(features, labels, mode, params):
  hidden = tf1.layers.dense(
      features['x'], 6, activation=tf.nn.tanh,
      kernel_initializer=_initializer('clipped/hidden'), name='hidden')
  logits = tf1.layers.dense(
      hidden, 3, kernel_initializer=_initializer('clipped/logits'),
      name='logits')
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  # Halved every step: the towers must read the global step before the
  # update increments it.
  learning_rate = tf1.train.exponential_decay(
      0.5, tf1.train.get_global_step(), decay_steps=1, decay_rate=0.5)
  optimizer = params['wrapper'](tf1.train.MomentumOptimizer(learning_rate,
                                                           0.9))
  clipped = [(tf.clip_by_norm(grad, 0.1), var)
             for grad, var in optimizer.compute_gradients(loss)]
  return _spec(mode, logits, labels, loss,
               optimizer.apply_gradients(clipped,
                                         tf1.train.get_global_step()))


def _two_optimizers(features, labels, mode, params):
  with tf1.variable_scope('first'):
    hidden = tf1.layers.dense(
        features['x'], 5, kernel_initializer=_initializer('first/dense'))
  with tf1.variable_scope('second'):
    logits = tf1.layers.dense(
        hidden, 3, kernel_initializer=_initializer('second/dense'))
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  first = params['wrapper'](tf1.train.GradientDescentOptimizer(0.3))
  second = params['wrapper'](tf1.train.AdamOptimizer(0.1))
  first_op = first.minimize(loss, var_list=tf1.trainable_variables('first'))
  with tf.control_dependencies([first_op]):
    train_op = second.minimize(loss,
                               var_list=tf1.trainable_variables('second'),
                               global_step=tf1.train.get_global_step())
  return _spec(mode, logits, labels, loss, train_op)


def _sparse_feature(features, labels, mode, params):
  weights = tf1.get_variable(
      'weights', [_NUM_IDS, 3],
      initializer=_initializer('sparse/weights'))
  logits = tf1.nn.embedding_lookup_sparse(
      weights, features['sparse_ids'], None, combiner='sum')
  logits += tf1.layers.dense(
      features['x'], 3,
      kernel_initializer=_initializer('sparse/dense'), name='dense')
  if mode == mt.PREDICT:
    return _spec(mode, logits, None, None, None)
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  optimizer = params['wrapper'](tf1.train.GradientDescentOptimizer(0.2))
  return _spec(mode, logits, labels, loss,
               optimizer.minimize(loss, tf1.train.get_global_step()))


_MODELS = {
    'partitioned_embedding': _partitioned_embedding,
    'clipped_momentum': _clipped_momentum,
    'two_optimizers': _two_optimizers,
    'sparse_feature': _sparse_feature,
}


def _run(model_name, mode, replicate_fn=None, wrapper=None, steps=3):
  """Trains (variables), evaluates (metrics and loss) or predicts.

  Args:
    model_name: a key of `_MODELS`.
    mode: a `ModeKeys` value.
    replicate_fn: `replicate_model_fn` (ours or contrib's) over 4 CPUs, or
      None for the unreplicated model on CPU:0.
    wrapper: the optimizer wrapper matching `replicate_fn` (None: none).
    steps: training steps.
  """
  ids, x, labels = _data()
  model_fn = _MODELS[model_name]
  params = {'wrapper': wrapper or (lambda optimizer: optimizer)}
  with tf.Graph().as_default():
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    features = _features(ids, x)
    label_tensor = None if mode == mt.PREDICT else tf.constant(labels)
    if replicate_fn is None:
      with tf1.device('/device:CPU:0'):
        spec = model_fn(features, label_tensor, mode, params)
    else:
      spec = replicate_fn(model_fn, devices=mt.cpus(4))(
          features, label_tensor, mode, params)
    return mt.run_spec(spec, mode, steps=steps)

def _ours(model_name, mode):
  return _run(model_name, mode, replicate.replicate_model_fn,
              replicate.TowerOptimizer)


_CASES = (
    ('partitioned_embedding_train', 'partitioned_embedding', mt.TRAIN),
    ('partitioned_embedding_eval', 'partitioned_embedding', mt.EVAL),
    ('partitioned_embedding_predict', 'partitioned_embedding', mt.PREDICT),
    ('clipped_momentum_train', 'clipped_momentum', mt.TRAIN),
    ('two_optimizers_train', 'two_optimizers', mt.TRAIN),
    ('two_optimizers_eval', 'two_optimizers', mt.EVAL),
    ('sparse_feature_train', 'sparse_feature', mt.TRAIN),
    ('sparse_feature_eval', 'sparse_feature', mt.EVAL),
)


def _case(name, model_name, mode):
  contrib = lambda: tf.contrib.estimator  # pylint: disable=no-member
  return reference_lib.Case(
      _GROUP, name,
      lambda: _run(model_name, mode, contrib().replicate_model_fn,
                   contrib().TowerOptimizer),
      _inputs)


REFERENCE_CASES = tuple(_case(*case) for case in _CASES)
_REFERENCES = {case.name: case for case in REFERENCE_CASES}
# The same float32 math: equal to the bit on TF 1.15; TF 2.15's kernels round
# some ops differently, an ulp here and there, carried over three steps.
_TOL = dict(rtol=1e-5, atol=1e-6)


class ContribModelsOracleTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      *[(name, name, model_name, mode) for name, model_name, mode in _CASES])
  def test_same_results_as_contrib(self, case_name, model_name, mode):
    theirs = reference_lib.reference_results(self, _REFERENCES[case_name],
                                             **_TOL)
    ours = _ours(model_name, mode)
    reference_lib.assert_same_results(self, theirs, ours, **_TOL)


class UnreplicatedModelsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('partitioned_embedding', 'partitioned_embedding'),
      ('two_optimizers', 'two_optimizers'),
      ('sparse_feature', 'sparse_feature'))
  def test_training_matches_the_whole_batch(self, model_name):
    ours = _ours(model_name, mt.TRAIN)
    single = _run(model_name, mt.TRAIN)
    self.assertEqual(sorted(single), sorted(ours))
    # Global step 3 after 3 steps: each step applies one update, whatever
    # the number of towers or optimizers.
    self.assertEqual(3, ours['global_step'])
    for name in single:
      # The sums of 4 towers' gradients add the batch's terms in another
      # order than the one-device reductions: equal within float rounding.
      self.assertAllClose(single[name], ours[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  def test_per_tower_clipping_differs_from_clipping_the_sum(self):
    # Guards the comparison above: the oracle tests would also pass if the
    # towers saw the whole batch. Clipping 4 partial gradients to norm 0.1
    # and summing them is not clipping the batch gradient to 0.1, so here
    # the unreplicated model must end elsewhere.
    ours = _ours('clipped_momentum', mt.TRAIN)
    single = _run('clipped_momentum', mt.TRAIN)
    self.assertGreater(
        np.max(np.abs(ours['hidden/kernel'] - single['hidden/kernel'])), 1e-3)


if __name__ == '__main__':
  tf.test.main()

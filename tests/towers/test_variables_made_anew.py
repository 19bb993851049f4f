"""Variables `model_fn` makes anew (`tf.Variable`, not `get_variable`).

Each `model_fn` call makes its own such variable, where `get_variable`
shares tower 0's. A copy would write tower 0's: a non-trainable one written
by what the copies compute (a running count of rows in the forward pass)
makes the towers be built by calls, with a warning
(tower_copier.reason_variables_made_anew). In EVAL they are the copies' own
metric state; trainable ones made anew (a Keras layer's) stay shared, as
calls refuse them.
"""
import tempfile
from unittest import mock

from absl.testing import parameterized
import model_testing as mt
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.towers import tower_cloning

CLONE = replicate.TowerBuild.CLONE
PER_TOWER = replicate.TowerBuild.CALL_PER_TOWER
TOWERS = 4
# 7 distinct rows: towers of 2, 2, 2 and 1.
ROWS = 7


def _model_fn(features, labels, mode, params):
  # `made` counts the rows its call sees: a tf.Variable per call (per tower
  # under calls). `shared` (get_variable) counts every tower's rows.
  made = tf1.Variable(0., trainable=False, name='made')
  shared = tf1.get_variable('shared', [], trainable=False,
                            initializer=tf1.zeros_initializer())
  rows = tf.cast(tf.shape(features['x'])[0], tf.float32)
  # Locked: the towers add at once, and an unlocked add to a TF 1.15
  # reference variable can lose one (with calls as well).
  writes = [tf1.assign_add(shared, rows, use_locking=True)]
  if params.get('write_made', True):
    writes.append(tf1.assign_add(made, rows, use_locking=True))
  with tf.control_dependencies(writes):
    x = tf.identity(features['x'])
  first = tf1.get_variable('first', [3, 1],
                           initializer=tf1.constant_initializer(0.1))
  second = tf1.get_variable('second', [3, 1],
                            initializer=tf1.constant_initializer(-0.2))
  prediction = tf.matmul(x, first) + tf.matmul(tf.square(x), second)
  if mode == mt.PREDICT:
    return tf1.estimator.EstimatorSpec(mode, predictions={'p': prediction})
  loss = tf1.losses.mean_squared_error(labels, prediction)
  if mode == mt.EVAL:
    return tf1.estimator.EstimatorSpec(
        mode, loss=loss, eval_metric_ops={'mean': tf1.metrics.mean(x)})
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _run(tower_build, mode, params=None, **kwargs):
  """Every variable after one step (TRAIN), prediction (PREDICT) or metric
  update (EVAL); the predictions or metrics; the fallback reasons logged."""
  features, labels = mt.data(batch_size=ROWS)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    with mock.patch.object(tower_cloning, 'warn_not_cloned') as warn:
      spec = replicate.replicate_model_fn(
          _model_fn, devices=mt.cpus(TOWERS), tower_build=tower_build,
          **kwargs)({'x': tf.constant(features['x'])}, tf.constant(labels),
                    mode, params or {})
    with tf1.Session(config=replicate.testing.virtual_cpu_config(
        TOWERS)) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      if mode == mt.EVAL:
        # One step: the loss and the update in one run.
        outputs = sess.run({'loss': spec.loss,
                            'update': spec.eval_metric_ops['mean'][1]})
        outputs['mean'] = sess.run(spec.eval_metric_ops['mean'][0])
      else:
        outputs = sess.run(spec.train_op if mode == mt.TRAIN
                           else spec.predictions)
      values = {v.op.name: sess.run(v)
                for v in tf1.global_variables() + tf1.local_variables()}
  return values, outputs, [c[0][0] for c in warn.call_args_list]


class MadeAnewTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('train', mt.TRAIN),
                                  ('eval', mt.EVAL),
                                  ('predict', mt.PREDICT))
  def test_written_in_the_forward_pass_builds_by_calls(self, mode):
    calls, called_outputs, no_reasons = _run(PER_TOWER, mode)
    self.assertEqual([], no_reasons)
    # Each call's own `made` counts its tower's rows: 2, 2, 2, 1; `shared`
    # counts all 7.
    self.assertEqual(2., calls['made'])
    self.assertEqual(1., calls['tower_3/made'])
    self.assertEqual(7., calls['shared'])
    default, outputs, reasons = _run(CLONE, mode)
    self.assertLen(reasons, 1)
    self.assertRegex(reasons[0], r'^model_fn makes variable made anew \(not '
                     r'with get_variable\) and writes it, where each call '
                     r'makes its own$')
    self.assertCountEqual(calls, default)
    for name in calls:
      self.assertAllEqual(calls[name], default[name], msg=name)
    if mode != mt.TRAIN:
      self.assertCountEqual(called_outputs, outputs)
      for key in called_outputs:
        self.assertAllEqual(called_outputs[key], outputs[key], msg=key)

  @parameterized.named_parameters(('train', mt.TRAIN),
                                  ('eval', mt.EVAL),
                                  ('predict', mt.PREDICT))
  def test_not_written_is_copied(self, mode):
    # Only `shared` is written: copies share tower 0's `made`, which keeps
    # its initial 0 as every call's would.
    values, _, reasons = _run(CLONE, mode, params={'write_made': False})
    self.assertEqual([], reasons)
    self.assertEqual(0., values['made'])
    self.assertNotIn('tower_1/made', values)
    self.assertEqual(7., values['shared'])

  def test_replicated_variables_refuse_it(self):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        'model_fn makes variable made anew'):
      _run(CLONE, mt.TRAIN,
           variable_placement=replicate.VariablePlacement.REPLICATED)

  def test_keras_layer_made_in_model_fn_stays_copied(self):
    # A Keras layer made in model_fn makes its variables anew, trainable
    # ones too: calls refuse them (each call would train its own), copies
    # share tower 0's, and its non-trainable moving statistics are not a
    # reason to build by calls.
    def model_fn(features, labels, mode, params):
      del params
      layer = tf.keras.layers.BatchNormalization()
      normalized = layer(features['x'], training=True)
      loss = tf1.losses.mean_squared_error(
          labels, tf.reduce_sum(normalized, 1, keepdims=True))
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss, train_op=tf.group(train_op, *layer.updates))

    features, labels = mt.data(batch_size=ROWS)
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      with mock.patch.object(tower_cloning, 'warn_not_cloned') as warn:
        replicate.replicate_model_fn(model_fn, devices=mt.cpus(2))(
            {'x': tf.constant(features['x'])}, tf.constant(labels), mt.TRAIN,
            {})
    self.assertEqual([], warn.call_args_list)


def _noisy_model_fn(features, labels, mode, params):
  # Each call makes its own generator from seed 7: every tower adds the
  # same first draws to its rows. One generator shared by copies would give
  # tower i the (i+1)-th draws instead.
  del params
  generator = tf.random.experimental.Generator.from_seed(7)
  x = features['x'] + generator.normal(tf.shape(features['x']))
  weights = tf1.get_variable('w', [3, 1],
                             initializer=tf1.constant_initializer(0.1))
  prediction = tf.matmul(x, weights)
  if mode == mt.PREDICT:
    return tf1.estimator.EstimatorSpec(mode, predictions={'p': prediction})
  loss = tf1.losses.mean_squared_error(labels, prediction)
  train_op = replicate.TowerOptimizer(
      tf1.train.AdamOptimizer(0.1)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metric_ops={'mean': tf1.metrics.mean(prediction)})


class RandomGeneratorTest(tf.test.TestCase):
  """A `tf.random` `Generator` made in `model_fn` keeps its state in a
  `tf.Variable` each call makes anew: through an Estimator, every mode
  builds by calls and equals `CALL_PER_TOWER`."""

  def _estimate(self, tower_build):
    features, labels = mt.data(batch_size=ROWS)
    def input_fn():
      return tf1.data.Dataset.from_tensors(
          ({'x': features['x']}, labels)).repeat(2)
    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(
            _noisy_model_fn, devices=mt.cpus(TOWERS),
            tower_build=tower_build),
        model_dir=tempfile.mkdtemp(dir=self.get_temp_dir()),
        config=tf1.estimator.RunConfig(
            session_config=replicate.testing.virtual_cpu_config(TOWERS)))
    with mock.patch.object(tower_cloning, 'warn_not_cloned') as warn:
      estimator.train(input_fn, steps=2)
      metrics = estimator.evaluate(input_fn, steps=1)
      predictions = [p['p'] for p in estimator.predict(input_fn)]
    variables = {name: estimator.get_variable_value(name)
                 for name in estimator.get_variable_names()}
    return variables, metrics, predictions, [
        c[0][0] for c in warn.call_args_list]

  def test_every_mode_equals_calls(self):
    calls = self._estimate(PER_TOWER)
    default = self._estimate(CLONE)
    # TRAIN, EVAL and PREDICT each fall back, naming the generator's state.
    self.assertLen(default[3], 3)
    for reason in default[3]:
      self.assertIn('anew (not with get_variable)', reason)
    self.assertCountEqual(calls[0], default[0])
    for name in calls[0]:
      self.assertAllEqual(calls[0][name], default[0][name], msg=name)
    self.assertEqual(calls[1], default[1])
    self.assertAllEqual(calls[2], default[2])


if __name__ == '__main__':
  tf.test.main()

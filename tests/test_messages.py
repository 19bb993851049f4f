"""What users read: log lines through tf.compat.v1.logging, the caller's
location in warnings, and the errors that name the supported route."""
import logging
import tempfile

import model_testing as mt
import tensorflow as tf

import replicate
from replicate import cross_tower_ops
from replicate import errors
from replicate.core import logs


def _input_fn():
  features, labels = mt.data(batch_size=8)
  return tf.compat.v1.data.Dataset.from_tensors((features, labels)).repeat()


class LoggingTest(tf.test.TestCase):

  def test_warnings_go_through_tensorflow_logger_with_caller_location(self):
    with self.assertLogs('tensorflow', level='WARNING') as captured:
      # Two GPUs this process does not see: reduction to one device, with a
      # warning.
      cross_tower_ops.choose_for(['/device:GPU:0', '/device:GPU:1'], [])
    self.assertLen(captured.records, 1)
    self.assertRegex(captured.output[0],
                     r'not visible .*\[called from .*test_messages\.py:\d+\]')

  def test_set_verbosity_controls_replicate_logs(self):
    logger = logging.getLogger('tensorflow')
    old = tf.compat.v1.logging.get_verbosity()
    try:
      tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
      self.assertFalse(logger.isEnabledFor(logs.WARNING))
      tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
      self.assertTrue(logger.isEnabledFor(logs.INFO))
    finally:
      tf.compat.v1.logging.set_verbosity(old)

  def test_log_first_n_counts_per_call_site(self):
    with self.assertLogs('tensorflow', level='WARNING') as captured:
      for i in range(3):
        logs.log_first_n(logs.WARNING, 'first site %d', 2, i)
        logs.log_first_n(logs.WARNING, 'second site %d', 1, i)
    self.assertEqual([r.getMessage().split(' [')[0] for r in captured.records],
                     ['first site 0', 'second site 0', 'first site 1'])

  def test_one_info_line_when_a_replicated_model_is_built(self):
    devices = replicate.testing.virtual_cpu_devices(2)
    estimator = tf.estimator.Estimator(
        replicate.replicate_model_fn(mt.mlp_model_fn, devices=devices),
        config=tf.estimator.RunConfig(
            model_dir=tempfile.mkdtemp(),
            session_config=replicate.testing.virtual_cpu_config(2)))
    with self.assertLogs('tensorflow', level='INFO') as captured:
      estimator.train(_input_fn, steps=1)
    lines = [r.getMessage() for r in captured.records
             if r.getMessage().startswith('replicate_model_fn: building')]
    self.assertLen(lines, 1)
    self.assertIn('building train with 2 tower(s) on '
                  '/device:CPU:0, /device:CPU:1', lines[0].replace(
                      '/job:localhost/replica:0/task:0', ''))
    self.assertIn('loss reduction: weighted_sum_by_nonzero_weights', lines[0])
    self.assertIn('variables: consolidation_device', lines[0])


class SupportedRouteTest(tf.test.TestCase):

  def test_mirrored_strategy_as_train_distribute_names_the_routes(self):
    devices = replicate.testing.virtual_cpu_devices(2)
    estimator = tf.estimator.Estimator(
        mt.mlp_model_fn,
        config=tf.estimator.RunConfig(
            model_dir=tempfile.mkdtemp(),
            train_distribute=replicate.MirroredStrategy(devices),
            session_config=replicate.testing.virtual_cpu_config(2)))
    with self.assertRaisesRegex(
        errors.InvalidTypeError,
        r"cannot be an Estimator's RunConfig\(train_distribute=...\).*"
        r'replicate\.replicate_model_fn\(model_fn.*Session loop'):
      estimator.train(_input_fn, steps=1)

  def test_tf_get_replica_context_is_not_ours(self):
    # The documented pitfall: TF's get_replica_context() does not know our
    # replicas and returns TF's default context (one replica), so its
    # all_reduce does not reduce across our replicas.
    devices = replicate.testing.virtual_cpu_devices(2)
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(devices)

      def fn():
        ours = replicate.get_replica_context()
        theirs = tf.distribute.get_replica_context()
        value = tf.constant(2.)
        return (ours.all_reduce(replicate.ReduceOp.SUM, value),
                theirs.all_reduce(tf.distribute.ReduceOp.SUM, value),
                theirs.num_replicas_in_sync)

      ours, theirs, theirs_count = strategy.run(fn)
      self.assertEqual(theirs_count, 1)  # equal in both replicas: regrouped
      with self.session(config=replicate.testing.virtual_cpu_config(2)) as s:
        # Two replicas of 2.0: ours sums to 4.0, TF's default gives 2.0.
        self.assertAllEqual(s.run(list(ours.values)), [4., 4.])
        self.assertAllEqual(s.run(list(theirs.values)), [2., 2.])


# contrib's replicate_model_fn (TF 1.15, tensorflow_estimator/contrib/
# estimator/python/estimator/replicate_model_fn.py) raises these ValueErrors;
# its tests match them with the regexes below. replicate's messages say more
# (and are ValueErrors too), and keep contrib's words so that those regexes
# still match:
#
# * 'Tower losses need to be reduced in some way, yet {} reduction is
#   specified.' -- '.+none.+reduction.+is.+specified.+': matches.
# * 'Please wrap optimizers with TowerOptimizer in order to use
#   replicate_model_fn with multiple `devices`.' --
#   'Please.+wrap.+with.+TowerOptimizer': matches.
# * 'Each invocation of model_fn was supposed to make the same optimizer
#   calls.' -- '.+was.+supposed.+to.+make.+same.+optimizer.+calls.+': matches
#   (replicate's messages for towers making more or fewer calls, tested
#   below; the one for calls in another order carries the same words).
# * 'Different `EstimatorSpec.eval_metric_ops` across `model_fn()` calls.
#   Expected {} local variables, but got {} instead.' --
#   '.+Expected.+local.+variables.+but.+got.+instead.+': matches.
# * 'Batch size {} needs to be divisible by the number of GPUs, which is
#   {}.' -- '.*Batch.+size.+needs.+to.+be.+divisible.+by.+GPUs.+': does not
#   match; that error goes away by design.
# * 'The name {} is not expected to be given to IndexedSlices {}' -- raised
#   by a private helper (`_compute_sum_on_device`) that replicate does not
#   have; not reachable through the public API.
#
# TowerOptimizer itself raises nothing in contrib.


def _contrib_model_fn(features, labels, mode, params):
  """A linear model; `params` choose how it differs from contrib's rules."""
  logits = tf.compat.v1.layers.dense(features['x'], 1, name='logits')
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  if params.get('metric_of_tower') == replicate.get_tower_context().tower_id:
    metric = tf.compat.v1.metrics.auc(labels, tf.nn.sigmoid(logits))
  else:
    metric = tf.compat.v1.metrics.mean(logits)
  optimizers = [tf.compat.v1.train.GradientDescentOptimizer(0.1)]
  if params.get('wrap', True):
    optimizers = [replicate.TowerOptimizer(o) for o in optimizers]
  if params.get('second_optimizer_in_tower') == (
      replicate.get_tower_context().tower_id):
    optimizers.append(replicate.TowerOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1)))
  step = tf.compat.v1.train.get_global_step()
  train_op = tf.group([o.minimize(loss, step) for o in optimizers])
  return tf.compat.v1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, eval_metric_ops={'m': metric})


class ContribPhrasesTest(tf.test.TestCase):
  """Each regex of contrib's tests against replicate's message (see above)."""

  def _build(self, mode, **params):
    features, labels = mt.data(batch_size=8)
    with tf.Graph().as_default():
      tf.compat.v1.train.get_or_create_global_step()
      replicate.replicate_model_fn(
          _contrib_model_fn, devices=mt.cpus(2),
          tower_build=replicate.TowerBuild.CALL_PER_TOWER)(
              {'x': tf.constant(features['x'])}, tf.constant(labels), mode,
              params)

  def test_none_reduction(self):
    with self.assertRaisesRegex(ValueError,
                                '.+none.+reduction.+is.+specified.+'):
      replicate.replicate_model_fn(_contrib_model_fn,
                                   tf.compat.v1.losses.Reduction.NONE)

  def test_optimizer_without_tower_optimizer(self):
    with self.assertRaisesRegex(ValueError,
                                'Please.+wrap.+with.+TowerOptimizer'):
      self._build(mt.TRAIN, wrap=False)

  def test_different_optimizer_calls(self):
    # contrib's case: one tower makes an optimizer call the other does not.
    for tower_id in (0, 1):
      with self.assertRaisesRegex(
          ValueError, '.+was.+supposed.+to.+make.+same.+optimizer.+calls.+'):
        self._build(mt.TRAIN, second_optimizer_in_tower=tower_id)

  def test_different_metric_variables(self):
    # auc (4 variables) in tower 1, mean (2) in tower 0: 6 of the expected 4.
    with self.assertRaisesRegex(
        ValueError, '.+Expected.+local.+variables.+but.+got.+instead.+'):
      self._build(mt.EVAL, metric_of_tower=1)


if __name__ == '__main__':
  tf.test.main()

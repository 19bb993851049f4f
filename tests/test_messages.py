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


if __name__ == '__main__':
  tf.test.main()

"""End to end through tf.estimator: checkpoints, datasets, SyncReplicas."""
import time

from absl.testing import parameterized
import model_testing as mt
import tensorflow as tf

import replicate
from replicate._compat import tf1


def _input_fn(batch_size=8, drop_remainder=True, count=None):
  features, labels = mt.data(batch_size=16)

  def input_fn():
    dataset = tf1.data.Dataset.from_tensor_slices((features, labels))
    return dataset.repeat(count).batch(batch_size,
                                       drop_remainder=drop_remainder)

  return input_fn


def _estimator(model_dir, devices, params=None):
  model_fn = mt.mlp_model_fn
  if devices is not None:
    model_fn = replicate.replicate_model_fn(
        mt.mlp_model_fn, loss_reduction=tf1.losses.Reduction.MEAN,
        devices=devices)
  config = tf1.estimator.RunConfig(
      model_dir=model_dir, tf_random_seed=0,
      session_config=replicate.testing.virtual_cpu_config(4),
      save_summary_steps=None, log_step_count_steps=None)
  return tf1.estimator.Estimator(model_fn, config=config, params=params or {})


class CheckpointTest(tf.test.TestCase):

  def _interchange(self, first_devices, second_devices):
    model_dir = self.get_temp_dir() + '/{}_{}'.format(
        len(first_devices or []), len(second_devices or []))
    first = _estimator(model_dir, first_devices)
    first.train(_input_fn(), steps=2)
    names = sorted(first.get_variable_names())
    second = _estimator(model_dir, second_devices)
    second.train(_input_fn(), steps=1)  # restores, then one more step
    self.assertEqual(3, second.get_variable_value('global_step'))
    self.assertEqual(names, sorted(second.get_variable_names()))
    return second

  def test_replicated_checkpoint_resumes_unreplicated(self):
    self._interchange(mt.cpus(4), None)

  def test_unreplicated_checkpoint_resumes_replicated(self):
    self._interchange(None, mt.cpus(4))

  def test_interchange_matches_uninterrupted_training(self):
    # 2 steps on 4 towers + 1 step unreplicated == 3 steps unreplicated.
    resumed = self._interchange(mt.cpus(4), None)
    straight = _estimator(self.get_temp_dir() + '/straight', None)
    straight.train(_input_fn(), steps=3)
    for name in ('hidden/kernel', 'logits/kernel', 'logits/bias'):
      self.assertAllClose(straight.get_variable_value(name),
                          resumed.get_variable_value(name), rtol=1e-5,
                          atol=1e-6)


class EstimatorTest(tf.test.TestCase, parameterized.TestCase):

  def test_train_evaluate_predict(self):
    estimator = _estimator(self.get_temp_dir(), mt.cpus(4))
    estimator.train(_input_fn(), steps=4)
    metrics = estimator.evaluate(_input_fn(count=1), steps=None)
    single = _estimator(self.get_temp_dir() + '/single', None)
    single.train(_input_fn(), steps=4)
    expected = single.evaluate(_input_fn(count=1), steps=None)
    # Same data, same initial values, same updates: same metrics.
    for key in ('accuracy', 'mean_probability', 'loss'):
      self.assertAllClose(expected[key], metrics[key], rtol=1e-5)
    predictions = list(
        estimator.predict(lambda: tf1.data.Dataset.from_tensor_slices(
            mt.data(batch_size=16)[0]).batch(8)))
    expected_predictions = list(
        single.predict(lambda: tf1.data.Dataset.from_tensor_slices(
            mt.data(batch_size=16)[0]).batch(8)))
    self.assertLen(predictions, 16)
    self.assertAllClose([p['probabilities'] for p in expected_predictions],
                        [p['probabilities'] for p in predictions], rtol=1e-5)

  def test_last_partial_batch_trains(self):
    # 16 examples in batches of 6 on 4 towers: [2, 2, 1, 1] rows twice, then
    # [1, 1, 1, 1]; the shape is dynamic (no drop_remainder). It used to fail
    # as "not divisible by the number of towers".
    estimator = _estimator(self.get_temp_dir(), mt.cpus(4))
    estimator.train(_input_fn(batch_size=6, drop_remainder=False, count=1))
    self.assertEqual(3, estimator.get_variable_value('global_step'))

  @parameterized.named_parameters(
      ('copies', replicate.TowerBuild.CLONE),
      # The update built by the last tower: nothing it builds may wait for
      # the batch (the hook runs SyncReplicas' local_step_init_op when the
      # session starts, before any batch).
      ('calls', replicate.TowerBuild.CALL_PER_TOWER))
  def test_sync_replicas_optimizer(self, tower_build):
    # SyncReplicasOptimizer with one replica aggregating one gradient set per
    # step applies what its wrapped optimizer would. The hook (from the
    # applying tower) checks that apply_gradients was called on its optimizer.
    # Its chief queue runner applies updates in the background, so the test
    # waits (bounded) for the global step before reading the variables.
    # Driven by MonitoredTrainingSession as the Estimator does, with a short
    # grace period: at shutdown TF's token queue runner otherwise waits 120 s.
    def model_fn(features, labels, mode, params):
      logits = tf1.layers.dense(
          features['x'], 1,
          kernel_initializer=tf1.glorot_uniform_initializer(seed=5))
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      optimizer = tf1.train.GradientDescentOptimizer(0.5)
      if params['sync']:
        optimizer = tf1.train.SyncReplicasOptimizer(
            optimizer, replicas_to_aggregate=1, total_num_replicas=1)
      optimizer = replicate.TowerOptimizer(optimizer)
      train_op = optimizer.minimize(loss, tf1.train.get_global_step())
      hooks = []
      if params['sync']:
        hooks.append(optimizer.make_session_run_hook(is_chief=True))
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss, train_op=train_op, training_hooks=hooks)

    features, labels = mt.data(batch_size=8)
    results = {}
    for sync in (False, True):
      with tf.Graph().as_default():
        tf1.set_random_seed(0)
        tf1.train.get_or_create_global_step()
        # Fed, as a queue's batch would be taken: only when a step runs.
        x = tf1.placeholder(tf.float32, features['x'].shape)
        feed = {x: features['x']}
        spec = replicate.replicate_model_fn(
            model_fn, devices=mt.cpus(4), tower_build=tower_build)(
                {'x': x}, tf.constant(labels), mt.TRAIN, {'sync': sync})
        kernel = [v for v in tf1.trainable_variables()
                  if v.op.name == 'dense/kernel'][0]
        with tf1.train.MonitoredTrainingSession(
            hooks=spec.training_hooks, stop_grace_period_secs=1,
            config=replicate.testing.virtual_cpu_config(4)) as sess:
          global_step = tf1.train.get_global_step()
          sess.run(spec.train_op, feed)
          _wait_for(lambda: sess.run(global_step) >= 1)
          results[sync] = sess.run(kernel)
          # SyncReplicas may drop a stale gradient set (unreplicated too), so
          # keep stepping, boundedly, until two more updates were applied.
          for _ in range(20):
            if sess.run(global_step) >= 3:
              break
            sess.run(spec.train_op, feed)
          _wait_for(lambda: sess.run(global_step) >= 3)
    # One step of SGD, whether or not it went through SyncReplicas' queues.
    self.assertAllClose(results[False], results[True], rtol=1e-5)


def _wait_for(condition, timeout_secs=30):
  deadline = time.time() + timeout_secs
  while not condition():
    if time.time() > deadline:
      raise AssertionError('Condition not met within {} s'.format(timeout_secs))
    time.sleep(0.05)


if __name__ == '__main__':
  tf.test.main()

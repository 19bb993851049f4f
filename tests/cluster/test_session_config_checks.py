"""The all-reduce session config's checks, called directly
(cluster/session_configs.py): a wrong group leader or device filters that
reach other training tasks fail at once, where training with them would
hang until the operation timeout."""
from absl.testing import parameterized
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.cluster import session_configs


class SessionConfigsTest(tf.test.TestCase, parameterized.TestCase):

  SPEC = tf1.train.ClusterSpec({'chief': ['127.0.0.1:1'],
                                'worker': ['127.0.0.1:2', '127.0.0.1:3']})

  def _run_config(self, session_config):
    return tf1.estimator.RunConfig(session_config=session_config)

  def _config(self, leader, filters):
    config = tf1.ConfigProto(device_filters=filters)
    config.experimental.collective_group_leader = leader
    return config

  def test_default_config_allows_soft_placement(self):
    # config=None: the Estimator's default for clusters.
    config = session_configs.all_reduce_session_config(self.SPEC, 'worker', 1)
    self.assertTrue(config.allow_soft_placement)
    self.assertEqual('/job:chief/replica:0/task:0',
                     config.experimental.collective_group_leader)
    self.assertEqual(['/job:worker/task:1'], list(config.device_filters))
    self.assertEqual(60000, config.operation_timeout_in_ms)

  def test_leader_of_the_right_job_but_another_task_is_refused(self):
    spec = tf1.train.ClusterSpec({'worker': ['a:1', 'b:2', 'c:3']})
    config = self._config('/job:worker/replica:0/task:1',
                          ['/job:worker/task:2'])
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"leader is '/job:worker/replica:0/task:1'.*"
        r"'/job:worker/replica:0/task:0'"):
      session_configs.check_session_config(self._run_config(config), spec,
                                           'worker', 2)
    # The right leader passes.
    session_configs.check_session_config(
        self._run_config(self._config('/job:worker/replica:0/task:0',
                                      ['/job:worker/task:2'])),
        spec, 'worker', 2)

  @parameterized.parameters(
      # No filters: every task.
      ([], r'device_filters \[\] let the session of /job:worker/task:1 reach '
           r'the training task\(s\) /job:chief/task:0, /job:worker/task:0;'),
      # '/task:0' is task 0 of chief and of worker.
      (['/task:0'],
       r"device_filters \['/task:0'\] let the session of /job:worker/task:1 "
       r'reach the training task\(s\) /job:chief/task:0, /job:worker/task:0;'),
      # A whole job: its other tasks (the check itself, with no training, so
      # that a wrong check fails fast, not by a hang).
      (['/job:worker'],
       r"device_filters \['/job:worker'\] let the session of "
       r'/job:worker/task:1 reach the training task\(s\) /job:worker/task:0;'))
  def test_filters_reaching_other_training_tasks_are_refused(self, filters,
                                                             pattern):
    config = self._config('/job:chief/replica:0/task:0', filters)
    with self.assertRaisesRegex(errors.InvalidArgumentError, pattern):
      session_configs.check_session_config(self._run_config(config),
                                           self.SPEC, 'worker', 1)

  def test_leader_of_another_job_with_the_same_task_is_refused(self):
    config = self._config('/job:worker/replica:0/task:0',
                          ['/job:worker/task:1'])
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r"leader is '/job:worker/replica:0/task:0'.*"
        r"'/job:chief/replica:0/task:0'"):
      session_configs.check_session_config(self._run_config(config),
                                           self.SPEC, 'worker', 1)


if __name__ == '__main__':
  tf.test.main()

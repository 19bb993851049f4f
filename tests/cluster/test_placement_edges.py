"""Edges of cluster placement (cluster/placement.py) beside
test_multi_worker.py's: local EVAL/PREDICT graphs, round robin without a ps
job, bad ps_strategy indices, a group leader for REPLICATED across tasks,
ops pinned to other tasks, the greedy strategy's loads. Graphs only; no
servers are started.
"""
import tensorflow as tf
import test_multi_worker as multi_worker

import replicate
from replicate._compat import tf1

_run_config = multi_worker._run_config
_model_fn = multi_worker.PlacementTest._model_fn


class PlacementEdgesTest(tf.test.TestCase):

  PS_CLUSTER = {'ps': ['127.0.0.1:1', '127.0.0.1:2'],
                'chief': ['127.0.0.1:3'],
                'worker': ['127.0.0.1:4', '127.0.0.1:5']}

  def _build(self, config, mode=tf1.estimator.ModeKeys.TRAIN,
             devices=('/cpu:0', '/cpu:1'), **kwargs):
    graph = tf.Graph()
    with graph.as_default():
      tf1.train.create_global_step()
      replicate.replicate_model_fn(_model_fn, devices=list(devices),
                                   **kwargs)(
                                       tf.ones([4, 3]), tf.ones([4, 1]), mode,
                                       None, config)
      devices = {v.op.name: v.device for v in tf1.global_variables()
                 if v.op.name != 'global_step'}
    return graph, devices

  def test_parameter_servers_evaluate_without_a_cluster(self):
    # Only TRAIN graphs run on the cluster: an Estimator evaluates
    # (EVAL, PREDICT) in a local session, where PARAMETER_SERVERS falls back
    # to the consolidation device (CPU:0 of several towers); no error.
    for mode in (tf1.estimator.ModeKeys.EVAL,
                 tf1.estimator.ModeKeys.PREDICT):
      _, devices = self._build(
          tf1.estimator.RunConfig(session_config=tf1.ConfigProto(
              device_count={'CPU': 2})), mode=mode,
          variable_placement=replicate.VariablePlacement.PARAMETER_SERVERS)
      self.assertEqual({'/device:CPU:0'}, set(devices.values()), msg=mode)

  def test_round_robin_without_ps_spreads_over_this_tasks_towers(self):
    # A cluster without a ps job: ROUND_ROBIN spreads this task's variables
    # over its own tower devices in creation order (big/kernel, big/bias,
    # small/kernel, small/bias -> CPU:0, CPU:1, CPU:0, CPU:1), where the
    # other placements keep all of them on the consolidation device.
    config = _run_config({'chief': ['127.0.0.1:3'],
                          'worker': ['127.0.0.1:4']}, 'worker', 0)
    _, devices = self._build(
        config, variable_placement=replicate.VariablePlacement.ROUND_ROBIN)
    self.assertEqual(
        {'big/kernel': '/job:worker/task:0/device:CPU:0',
         'big/bias': '/job:worker/task:0/device:CPU:1',
         'small/kernel': '/job:worker/task:0/device:CPU:0',
         'small/bias': '/job:worker/task:0/device:CPU:1'}, devices)

  def test_ps_strategy_negative_or_boolean_index_is_refused(self):
    # Only 0 and 1 name ps tasks here: -1 would index from the end in Python
    # (a device "/job:ps/task:-1"), and True is an int but no task index.
    for bad in (-1, True):
      with self.assertRaisesRegex(
          replicate.errors.InvalidArgumentError,
          r"ps_strategy returned {} for op 'big/kernel'; it must return a ps "
          r'task index in \[0, 2\)'.format(bad)):
        self._build(_run_config(self.PS_CLUSTER, 'worker', 0),
                    ps_strategy=lambda op, bad=bad: bad)

  def test_replicated_across_two_tasks_needs_a_group_leader(self):
    # Two training tasks (a chief and one worker): their towers all-reduce
    # with collectives, which hang without a group leader; refused at build.
    config = _run_config({'chief': ['127.0.0.1:3'],
                          'worker': ['127.0.0.1:4']}, 'worker', 0,
                         device_filters=['/job:worker/task:0'])
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'across 2 training tasks.*collective_group_leader.*names none'):
      self._build(config,
                  variable_placement=replicate.VariablePlacement.REPLICATED)

  def test_op_pinned_to_another_task_keeps_that_device_on_every_tower(self):
    # An op the user pins to ps 0 (no device type): a ps has only CPU:0, so
    # no tower's device type or index is merged in: tower 0's op and tower
    # 1's copy both stay on '/job:ps/task:0'; an unpinned op goes to this
    # task's tower device.
    # The same for an op pinned to another task of this task's own job.
    def model_fn(features, labels, mode):
      with tf1.device('/job:ps/task:0'):
        features = tf.identity(features, name='on_ps')
      with tf1.device('/job:worker/task:1'):
        features = tf.identity(features, name='on_worker_1')
      return _model_fn(features, labels, mode)

    graph = tf.Graph()
    with graph.as_default():
      tf1.train.create_global_step()
      replicate.replicate_model_fn(model_fn, devices=['/cpu:0', '/cpu:1'])(
          tf.ones([4, 3]), tf.ones([4, 1]), tf1.estimator.ModeKeys.TRAIN,
          None, _run_config(self.PS_CLUSTER, 'worker', 0))
    self.assertEqual('/job:ps/task:0',
                     graph.get_operation_by_name('on_ps').device)
    self.assertEqual('/job:ps/task:0',
                     graph.get_operation_by_name('tower_1/on_ps').device)
    self.assertEqual('/job:worker/task:1',
                     graph.get_operation_by_name('on_worker_1').device)
    self.assertEqual(
        '/job:worker/task:1',
        graph.get_operation_by_name('tower_1/on_worker_1').device)
    self.assertEqual('/job:worker/task:0/device:CPU:1',
                     graph.get_operation_by_name('tower_1/big/MatMul').device)


class GreedyLoadBalancingTest(tf.test.TestCase):

  def test_unknown_dimensions_weigh_as_one(self):
    # A [None, 5] float32 variable weighs 1 * 5 * 4 = 20 bytes.
    with tf.Graph().as_default():
      variable = tf1.placeholder(tf.float32, [None, 5]).op
      # A placeholder has shape and dtype attributes, as variable ops do.
      self.assertEqual(20, replicate.byte_size_load_fn(variable))

  def test_loads_accumulate(self):
    # Loads 5, 1, 1, 1, 3 on 2 tasks: 5 -> task 0 (tie, lowest index);
    # 1 -> task 1 (0 < 5); 1 -> 1 (1 < 5); 1 -> 1 (2 < 5); 3 -> 1 (3 < 5);
    # the task 1 total is then 6.
    loads = iter([5, 1, 1, 1, 3, 0])
    strategy = replicate.GreedyLoadBalancingStrategy(
        2, load_fn=lambda op: next(loads))
    self.assertEqual([0, 1, 1, 1, 1, 0],
                     [strategy(None) for _ in range(6)])


if __name__ == '__main__':
  tf.test.main()

"""Multi-worker training on localhost clusters.

* placement and errors, on graphs built for a cluster described by TF_CONFIG
  (no servers needed), and the pre-session cluster checks;
* parameter servers: an in-process cluster (ps with one CPU, chief and worker
  with two virtual CPUs each) trained by two Estimators reading TF_CONFIG, in
  two threads: synchronous steps, identical variables, agreement with the
  single-process math, and bounded failures (lost worker, wrong port,
  missing device under train_and_evaluate);
* all-reduce across two in-process workers: MirroredStrategy in-graph with
  MultiWorkerAllReduce, and between-graph with CollectiveAllReduce;
* the example script, which starts a cluster as separate processes.

Everything that could block is bounded: `operation_timeout_in_ms` in the
session configs, thread joins and subprocesses with timeouts.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.cluster import cluster_check

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_OP_TIMEOUT_MS = 10000
_THREAD_TIMEOUT_SECS = 90
_LR = 0.1
_STEPS = 4
# Worker k trains on rows 4k..4k+3 every step (two towers of two rows).
# What each worker's _RecordHook saw, by id of the test's record dict.
_RECORDS = {}
_X = (np.arange(16, dtype=np.float32).reshape(8, 2) / 10.).astype(np.float32)
_Y = (_X.dot(np.array([[1.], [-2.]], np.float32)) + 0.5).astype(np.float32)




def _run_config(cluster, task_type, task_id, **session_kwargs):
  """A RunConfig() built from TF_CONFIG, as users create it."""
  old = os.environ.get('TF_CONFIG')
  os.environ['TF_CONFIG'] = json.dumps({
      'cluster': cluster, 'task': {'type': task_type, 'index': task_id}})
  try:
    session_kwargs.setdefault('operation_timeout_in_ms', _OP_TIMEOUT_MS)
    return tf1.estimator.RunConfig(
        session_config=tf1.ConfigProto(device_count={'CPU': 2},
                                       **session_kwargs),
        save_checkpoints_steps=None, save_checkpoints_secs=None,
        save_summary_steps=None, log_step_count_steps=None)
  finally:
    if old is None:
      del os.environ['TF_CONFIG']
    else:
      os.environ['TF_CONFIG'] = old


def _expected_variables(steps):
  """Gradient descent on the mean squared error over all 8 rows (numpy)."""
  w = np.zeros((2, 1))
  b = np.zeros(1)
  for _ in range(steps):
    residual = _X.dot(w) + b - _Y
    w -= _LR * 2 * _X.T.dot(residual) / len(_X)
    b -= _LR * 2 * residual.sum(axis=0) / len(_X)
  return w, b


class _RecordHook(tf1.train.SessionRunHook):
  """Counts this worker's steps; reads the variables (from the ps) at end."""

  def __init__(self, record):
    self._record = record
    self._record['steps'] = 0

  def after_run(self, run_context, run_values):
    self._record['steps'] += 1

  def end(self, session):
    names = [v.op.name for v in tf1.trainable_variables()]
    values = session.run(tf1.trainable_variables())
    self._record['variables'] = dict(zip(names, values))
    self._record['global_step'] = session.run(tf1.train.get_global_step())
    self._record['devices'] = {
        v.op.name: v.device for v in tf1.global_variables()}


def _sync_model_fn(features, labels, mode, params, config):
  """Linear regression trained with TowerOptimizer(SyncReplicasOptimizer)."""
  predictions = tf1.layers.dense(
      features, 1, kernel_initializer=tf1.zeros_initializer())
  loss = tf1.losses.mean_squared_error(labels, predictions)
  optimizer = replicate.TowerOptimizer(tf1.train.SyncReplicasOptimizer(
      tf1.train.GradientDescentOptimizer(_LR),
      replicas_to_aggregate=params['num_workers'],
      total_num_replicas=params['num_workers']))
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  # num_tokens=0: each worker contributes exactly one gradient per step.
  hooks = [optimizer.make_session_run_hook(config.is_chief, num_tokens=0),
           _RecordHook(_RECORDS[params['record_key']])]
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, training_hooks=hooks)


def _input_fn(worker_index):
  rows = slice(4 * worker_index, 4 * worker_index + 4)

  def input_fn():
    return tf.data.Dataset.from_tensors((_X[rows], _Y[rows])).repeat()

  return input_fn


def _train_in_thread(config, worker_index, record, num_workers=2):
  """Starts `Estimator.train` in a daemon thread; returns the thread."""
  estimator = tf1.estimator.Estimator(
      replicate.replicate_model_fn(
          _sync_model_fn, devices=['/device:CPU:0', '/device:CPU:1']),
      model_dir=record['model_dir'], config=config,
      # Estimators deep-copy params: pass a key to the record, not the record.
      params={'num_workers': num_workers, 'record_key': id(record)})
  _RECORDS[id(record)] = record

  def train():
    try:
      estimator.train(_input_fn(worker_index), max_steps=_STEPS)
    except Exception as e:  # pylint: disable=broad-except
      record['error'] = e

  thread = threading.Thread(target=train, daemon=True)
  thread.start()
  return thread


def _join(test, thread):
  thread.join(_THREAD_TIMEOUT_SECS)
  test.assertFalse(thread.is_alive(),
                   'training did not end within {} s'.format(
                       _THREAD_TIMEOUT_SECS))


class PlacementTest(tf.test.TestCase, parameterized.TestCase):
  """Graphs built for a cluster described by TF_CONFIG; no servers needed."""

  CLUSTER = {'ps': ['127.0.0.1:1', '127.0.0.1:2'], 'chief': ['127.0.0.1:3'],
             'worker': ['127.0.0.1:4', '127.0.0.1:5']}

  def _build(self, model_fn=None, mode=tf1.estimator.ModeKeys.TRAIN,
             cluster=None, task=('worker', 1), devices=('/cpu:0', '/cpu:1'),
             **kwargs):
    config = _run_config(cluster or self.CLUSTER, *task)
    graph = tf.Graph()
    with graph.as_default():
      tf1.train.create_global_step()
      replicated = replicate.replicate_model_fn(
          model_fn or self._model_fn, devices=list(devices), **kwargs)
      spec = replicated(tf.ones([4, 3]), tf.ones([4, 1]), mode, None, config)
    return graph, spec

  @staticmethod
  def _model_fn(features, labels, mode):
    hidden = tf1.layers.dense(features, 100, name='big')
    predictions = tf1.layers.dense(hidden, 1, name='small')
    loss = tf1.losses.mean_squared_error(labels, predictions)
    train_op = None
    if mode == tf1.estimator.ModeKeys.TRAIN:
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op, predictions=predictions)

  def _variable_devices(self, graph):
    with graph.as_default():
      return {v.op.name: v.device for v in tf1.global_variables()
              if v.op.name != 'global_step'}

  def test_towers_on_this_task_variables_round_robin_on_ps(self):
    graph, spec = self._build()
    # Variables in creation order: big/kernel, big/bias, small/kernel,
    # small/bias -> ps tasks 0, 1, 0, 1.
    self.assertEqual(
        {'big/kernel': '/job:ps/task:0/device:CPU:0',
         'big/bias': '/job:ps/task:1/device:CPU:0',
         'small/kernel': '/job:ps/task:0/device:CPU:0',
         'small/bias': '/job:ps/task:1/device:CPU:0'},
        self._variable_devices(graph))
    # Tower 1's ops run on this task's (worker 1's) second CPU.
    matmul = graph.get_operation_by_name('tower_1/big/MatMul')
    self.assertEqual('/job:worker/task:1/device:CPU:1', matmul.device)
    matmul0 = graph.get_operation_by_name('big/MatMul')
    self.assertEqual('/job:worker/task:1/device:CPU:0', matmul0.device)
    self.assertTrue(any(isinstance(h, cluster_check.ClusterCheckHook)
                        for h in spec.training_hooks))

  def test_chief_towers_on_chief_task(self):
    graph, _ = self._build(task=('chief', 0))
    matmul = graph.get_operation_by_name('tower_1/big/MatMul')
    self.assertEqual('/job:chief/task:0/device:CPU:1', matmul.device)

  def test_explicit_parameter_servers_same_as_default_in_ps_cluster(self):
    graph, _ = self._build(
        variable_placement=replicate.VariablePlacement.PARAMETER_SERVERS)
    self.assertEqual('/job:ps/task:1/device:CPU:0',
                     self._variable_devices(graph)['small/bias'])

  def test_sync_replicas_state_placement(self):

    def model_fn(features, labels, mode):
      predictions = tf1.layers.dense(features, 1)
      loss = tf1.losses.mean_squared_error(labels, predictions)
      optimizer = replicate.TowerOptimizer(tf1.train.SyncReplicasOptimizer(
          tf1.train.GradientDescentOptimizer(0.1), 2, 2))
      train_op = optimizer.minimize(loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss, train_op=train_op,
          training_hooks=[optimizer.make_session_run_hook(False)])

    config = _run_config(self.CLUSTER, 'worker', 1)
    graph = tf.Graph()
    with graph.as_default():
      # As the Estimator does: its replica_device_setter around everything.
      with tf1.device(tf1.train.replica_device_setter(
          ps_tasks=2, worker_device='/job:worker/task:1', merge_devices=True,
          cluster=config.cluster_spec)):
        tf1.train.create_global_step()
        replicate.replicate_model_fn(model_fn, devices=['/cpu:0', '/cpu:1'])(
            tf.ones([4, 3]), tf.ones([4, 1]), tf1.estimator.ModeKeys.TRAIN,
            None, config)
      local_step, = [v for v in tf1.local_variables()
                     if 'sync_rep_local_step' in v.op.name]
    # Each worker's local step stays on the worker (never shared on a ps),
    # on the applying tower's device (tower 0: towers are copied in TRAIN).
    self.assertEqual('/job:worker/task:1/device:CPU:0', local_step.device)
    # The token queue sits next to the global step on ps 0, with no tower
    # device type or index merged in (a ps has only CPU:0).
    queue = tf1.DeviceSpec.from_string(
        graph.get_operation_by_name('sync_token_q').device)
    self.assertEqual(('ps', 0), (queue.job, queue.task))
    self.assertNotEqual(1, queue.device_index)
    # (Resource)ConditionalAccumulator: one per variable, on its ps task.
    accumulators = [op.device for op in graph.get_operations()
                    if op.type.endswith('ConditionalAccumulator')]
    self.assertEqual(['/job:ps/task:0/device:CPU:0',
                      '/job:ps/task:1/device:CPU:0'], accumulators)

  def test_greedy_ps_strategy(self):
    graph, _ = self._build(
        variable_placement=replicate.VariablePlacement.PARAMETER_SERVERS,
        ps_strategy=replicate.GreedyLoadBalancingStrategy(
            2, replicate.byte_size_load_fn))
    # Greedy by bytes: big/kernel (3x100 floats) -> ps 0; big/bias (100) ->
    # ps 1 (empty); small/kernel (100 < 300) -> ps 1; small/bias (1) -> ps 1
    # (ps 1 holds 200 floats < 300).
    self.assertEqual(
        {'big/kernel': '/job:ps/task:0/device:CPU:0',
         'big/bias': '/job:ps/task:1/device:CPU:0',
         'small/kernel': '/job:ps/task:1/device:CPU:0',
         'small/bias': '/job:ps/task:1/device:CPU:0'},
        self._variable_devices(graph))

  def test_fully_qualified_devices_are_kept(self):
    graph, _ = self._build(devices=('/job:worker/task:1/device:CPU:0',
                                    '/job:worker/task:1/device:CPU:1'))
    matmul = graph.get_operation_by_name('tower_1/big/MatMul')
    self.assertEqual('/job:worker/task:1/device:CPU:1', matmul.device)

  @parameterized.parameters(tf1.estimator.ModeKeys.EVAL,
                            tf1.estimator.ModeKeys.PREDICT)
  def test_eval_and_predict_graphs_stay_local(self, mode):
    # The Estimator runs EVAL/PREDICT graphs in a local session.
    graph, _ = self._build(mode=mode)
    self.assertEqual('/device:CPU:0',
                     self._variable_devices(graph)['big/kernel'])
    self.assertEqual('/device:CPU:1',
                     graph.get_operation_by_name('tower_1/big/MatMul').device)

  def test_cluster_without_ps_keeps_variables_on_this_task(self):
    graph, _ = self._build(cluster={'chief': ['127.0.0.1:3'],
                                    'worker': ['127.0.0.1:4']},
                           task=('worker', 0))
    self.assertEqual('/job:worker/task:0/device:CPU:0',
                     self._variable_devices(graph)['big/kernel'])

  def test_parameter_servers_without_ps_job(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'PARAMETER_SERVERS needs a "ps" job in the cluster, but TF_CONFIG.s '
        r"cluster has only the jobs \['chief', 'worker'\]. Add \"ps\""):
      self._build(cluster={'chief': ['127.0.0.1:3'], 'worker': ['127.0.0.1:4']},
                  task=('worker', 0),
                  variable_placement=replicate.VariablePlacement
                  .PARAMETER_SERVERS)

  def test_parameter_servers_without_cluster(self):
    with tf.Graph().as_default():
      replicated = replicate.replicate_model_fn(
          self._model_fn, devices=['/cpu:0'],
          variable_placement=replicate.VariablePlacement.PARAMETER_SERVERS)
      with self.assertRaisesRegex(
          replicate.errors.InvalidArgumentError,
          r'PARAMETER_SERVERS needs a cluster with a "ps" job, but the '
          r'RunConfig names no cluster .*Set TF_CONFIG'):
        replicated(tf.ones([2, 3]), tf.ones([2, 1]),
                   tf1.estimator.ModeKeys.TRAIN, None,
                   tf1.estimator.RunConfig())

  def test_round_robin_in_ps_cluster(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'variable_placement=ROUND_ROBIN .* the cluster has a "ps" job.*'
        r'Use VariablePlacement.PARAMETER_SERVERS'):
      self._build(variable_placement=replicate.VariablePlacement.ROUND_ROBIN)

  def test_device_job_not_in_cluster(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"names the job 'trainer', which is not in the cluster \(its jobs "
        r"are \['chief', 'ps', 'worker'\]\)"):
      self._build(devices=('/job:trainer/task:0/device:CPU:0',))

  def test_device_task_out_of_range(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"needs a task index of job 'worker' in \[0, 2\)"):
      self._build(devices=('/job:worker/task:2/device:CPU:0',))

  def test_device_on_ps_job(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'puts a tower on a parameter server'):
      self._build(devices=('/job:ps/task:0/device:CPU:0',))

  def test_building_on_a_ps_task(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"This task is 'ps' \(task 0\), which does not train"):
      self._build(task=('ps', 0))

  def test_ps_strategy_not_callable(self):
    with self.assertRaisesRegex(replicate.errors.InvalidTypeError,
                                r'ps_strategy must be a callable op -> ps '
                                r'task index.*got 3 of type int'):
      replicate.replicate_model_fn(self._model_fn, ps_strategy=3)

  def test_ps_strategy_with_round_robin(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'variable_placement=ROUND_ROBIN puts variables on the tower devices'):
      replicate.replicate_model_fn(
          self._model_fn, ps_strategy=lambda op: 0,
          variable_placement=replicate.VariablePlacement.ROUND_ROBIN)

  def test_ps_strategy_without_ps_job(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'ps_strategy=.* needs a "ps" job in the cluster'):
      self._build(cluster={'chief': ['127.0.0.1:3']}, task=('chief', 0),
                  ps_strategy=lambda op: 0)

  def test_greedy_strategy_bad_arguments(self):
    with self.assertRaisesRegex(replicate.errors.InvalidArgumentError,
                                r'num_tasks must be a positive integer .*got '
                                r'0'):
      replicate.GreedyLoadBalancingStrategy(0)
    with self.assertRaisesRegex(replicate.errors.InvalidTypeError,
                                r'load_fn must be a callable op -> load'):
      replicate.GreedyLoadBalancingStrategy(2, load_fn='bytes')

  def test_byte_size_load_fn_needs_a_variable_op(self):
    with tf.Graph().as_default():
      op = tf.constant(1.).op
      with self.assertRaisesRegex(
          replicate.errors.InvalidArgumentError,
          r"byte_size_load_fn weighs variable ops .* op 'Const' of type "
          r"'Const' has none"):
        replicate.byte_size_load_fn(op)

  def test_ps_strategy_bad_index(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"ps_strategy returned 7 for op 'big/kernel'; it must return a ps "
        r'task index in \[0, 2\)'):
      self._build(ps_strategy=lambda op: 7)


class ClusterCheckTest(tf.test.TestCase):
  """The pre-session checks, without a cluster."""

  def test_unreachable_task_fails_with_address(self):
    port = replicate.testing.pick_unused_port()  # Nothing listens here.
    spec = tf1.train.ClusterSpec({'ps': ['127.0.0.1:%d' % port]})
    start = time.time()
    with self.assertRaisesRegex(
        replicate.errors.UnavailableError,
        r'within 0.5 s: /job:ps/task:0 at 127.0.0.1:%d did not accept '
        r'connections.*check TF_CONFIG' % port):
      cluster_check.wait_for_tasks(spec, [('ps', 0)], 0.5)
    self.assertLess(time.time() - start, 5)

  def test_needed_tasks_follow_device_filters(self):
    spec = tf1.train.ClusterSpec({'ps': ['a:1', 'a:2'], 'chief': ['b:1'],
                                  'worker': ['c:1', 'c:2']})
    self.assertEqual([('ps', 0), ('ps', 1), ('worker', 1)],
                     cluster_check.needed_tasks(
                         spec, ['/job:ps', '/job:worker/task:1']))
    self.assertLen(cluster_check.needed_tasks(spec, []), 5)

  def test_missing_tower_device(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"Tower device\(s\) \['/job:worker/task:0/device:CPU:1'\] do not "
        r'exist in the cluster session.*device_count'):
      cluster_check.check_devices(
          ['/job:worker/task:0/device:CPU:0',
           '/job:worker/task:0/device:CPU:1'],
          ['/job:worker/replica:0/task:0/device:CPU:0',
           '/job:ps/replica:0/task:0/device:CPU:0'])


class LocalClusterTest(tf.test.TestCase):
  """A ps, a chief and a worker as in-process servers, 2 virtual CPUs each."""

  @classmethod
  def setUpClass(cls):
    super(LocalClusterTest, cls).setUpClass()
    cls.cluster = {'ps': ['127.0.0.1:%d' % replicate.testing.pick_unused_port()],
                   'chief': ['127.0.0.1:%d' % replicate.testing.pick_unused_port()],
                   'worker': ['127.0.0.1:%d' % replicate.testing.pick_unused_port()]}
    spec = tf1.train.ClusterSpec(cls.cluster)
    # The ps has one CPU, as real ones do: nothing may land on its CPU:1.
    cls.servers = {
        job: tf1.train.Server(
            spec, job_name=job, task_index=0,
            config=tf1.ConfigProto(device_count={'CPU': 1 if job == 'ps'
                                                 else 2}))
        for job in ('ps', 'chief', 'worker')}

  def setUp(self):
    super(LocalClusterTest, self).setUp()
    # Variables, sync queues and accumulators live on the servers across
    # sessions; start every test from empty containers.
    tf1.Session.reset(self.servers['ps'].target)

  def _wait_for_chief_init(self, chief_record, timeout_secs=60):
    """Waits until the chief initialized global_step on the ps.

    A non-chief worker that finds the model uninitialized sleeps 30 s
    (SessionManager's recovery_wait_secs) before looking again.
    """
    deadline = time.time() + timeout_secs
    with tf.Graph().as_default():
      with tf1.device('/job:ps/task:0'):
        step = tf1.get_variable('global_step', [], tf.int64,
                                trainable=False)
        ready = tf1.is_variable_initialized(step)
      with tf1.Session(self.servers['ps'].target,
                       config=tf1.ConfigProto(
                           operation_timeout_in_ms=5000)) as sess:
        while not sess.run(ready):
          if 'error' in chief_record:
            raise chief_record['error']
          self.assertLess(time.time(), deadline, 'chief never initialized')
          time.sleep(0.1)

  def test_sync_training_agrees_with_single_process(self):
    records = [{'model_dir': tempfile.mkdtemp()} for _ in range(2)]
    records[1]['model_dir'] = records[0]['model_dir']
    chief = _train_in_thread(_run_config(self.cluster, 'chief', 0), 0,
                             records[0])
    self._wait_for_chief_init(records[0])
    worker = _train_in_thread(_run_config(self.cluster, 'worker', 0), 1,
                              records[1])
    _join(self, worker)
    _join(self, chief)
    for record in records:
      self.assertNotIn('error', record)
      # Synchronous: the global step advanced once per step of each worker.
      self.assertEqual(_STEPS, record['global_step'])
      self.assertEqual(_STEPS, record['steps'])
    # Variables live on the ps; towers only on each worker.
    self.assertEqual('/job:ps/task:0/device:CPU:0',
                     records[1]['devices']['dense/kernel'])
    # Both workers read identical variables.
    for name, value in records[0]['variables'].items():
      self.assertAllEqual(value, records[1]['variables'][name])
    # 2 workers x 2 towers x 2 rows: the mean of the 4 tower gradients is
    # the gradient of the mean squared error over all 8 rows, so training
    # follows single-process gradient descent on the full batch.
    w, b = _expected_variables(_STEPS)
    self.assertAllClose(w, records[0]['variables']['dense/kernel'],
                        rtol=1e-5, atol=1e-6)
    self.assertAllClose(b, records[0]['variables']['dense/bias'],
                        rtol=1e-5, atol=1e-6)

  def test_lost_worker_fails_within_operation_timeout(self):
    # The worker task's server is up but its trainer never comes: the chief
    # waits for its gradients until operation_timeout_in_ms, then fails.
    record = {'model_dir': tempfile.mkdtemp()}
    start = time.time()
    chief = _train_in_thread(
        _run_config(self.cluster, 'chief', 0, operation_timeout_in_ms=2000),
        0, record)
    _join(self, chief)
    self.assertIsInstance(record.get('error'), tf.errors.DeadlineExceededError)
    self.assertLess(time.time() - start, 60)

  def test_wrong_ps_port_fails_with_clear_error(self):
    cluster = dict(self.cluster, ps=['127.0.0.1:%d' % replicate.testing.pick_unused_port()])
    record = {'model_dir': tempfile.mkdtemp()}
    chief = _train_in_thread(
        _run_config(cluster, 'chief', 0, operation_timeout_in_ms=1000), 0,
        record)
    _join(self, chief)
    self.assertIsInstance(record.get('error'),
                          replicate.errors.UnavailableError)
    self.assertRegex(str(record['error']),
                     r'/job:ps/task:0 at %s did not accept connections' %
                     cluster['ps'][0])


class TrainAndEvaluateTest(tf.test.TestCase):
  """tf.estimator.train_and_evaluate starts the task's server itself."""

  def test_missing_virtual_cpu_is_a_clear_error(self):
    # train_and_evaluate's server ignores session_config.device_count, so the
    # chief has one CPU; soft placement (the Estimator's default in a
    # cluster) would silently put tower 1 on CPU:0. (Without soft placement
    # TF itself fails: "Cannot assign a device".)
    ps_address = '127.0.0.1:%d' % replicate.testing.pick_unused_port()
    cluster = {'ps': [ps_address], 'chief': ['127.0.0.1:%d' % replicate.testing.pick_unused_port()]}
    ps = tf1.train.Server(tf1.train.ClusterSpec(cluster), job_name='ps',
                          task_index=0)
    del ps  # Serves until the process exits.

    def model_fn(features, labels, mode):
      predictions = tf1.layers.dense(features, 1)
      loss = tf1.losses.mean_squared_error(labels, predictions)
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(_LR)).minimize(
              loss, tf1.train.get_global_step())
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(model_fn,
                                     devices=['/cpu:0', '/cpu:1']),
        model_dir=tempfile.mkdtemp(),
        config=_run_config(cluster, 'chief', 0, allow_soft_placement=True))
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"Tower device\(s\) \['/job:chief/task:0/device:CPU:1'\] do not "
        r'exist in the cluster session'):
      tf1.estimator.train_and_evaluate(
          estimator,
          tf1.estimator.TrainSpec(_input_fn(0), max_steps=2),
          tf1.estimator.EvalSpec(_input_fn(0), steps=1))


def _all_reduce_step(inputs):
  """One replica's step: loss summed over its rows / the global batch (8)."""
  x, y = inputs
  w = tf1.get_variable('w', [2, 1], initializer=tf1.zeros_initializer())
  b = tf1.get_variable('b', [1], initializer=tf1.zeros_initializer())
  loss = tf.reduce_sum(tf.square(tf.matmul(x, w) + b - y)) / len(_X)
  optimizer = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(_LR))
  return optimizer.minimize(loss, global_step=tf1.train.get_global_step())


def _train_mirrored(strategy, target, x, y, config):
  """Trains `_STEPS` steps; returns every copy of w, b and global_step."""
  with tf.Graph().as_default():
    iterator = strategy.make_dataset_iterator(
        tf.data.Dataset.from_tensors((x, y)).repeat())
    with strategy.scope():
      global_step = tf1.train.get_or_create_global_step()
      train = strategy.group(strategy.experimental_run(_all_reduce_step,
                                                       iterator))
    w, b = tf1.trainable_variables()
    options = tf1.RunOptions(timeout_in_ms=_OP_TIMEOUT_MS)
    with tf1.Session(target, config=config) as sess:
      sess.run([tf1.global_variables_initializer(), iterator.initialize()],
               options=options)
      for _ in range(_STEPS):
        sess.run(train, options=options)
      return {
          'w': sess.run(list(w.values), options=options),
          'b': sess.run(list(b.values), options=options),
          'global_step': sess.run(list(global_step.values), options=options),
          'devices': [v.device for v in w.values],
      }


def _without_replica(device):
  spec = tf1.DeviceSpec.from_string(device)
  return '/job:{}/task:{}/device:{}:{}'.format(
      spec.job, spec.task, spec.device_type, spec.device_index)


class AllReduceAcrossWorkersTest(tf.test.TestCase):
  """MirroredStrategy over two workers (2 virtual CPUs each), in-process."""

  @classmethod
  def setUpClass(cls):
    super(AllReduceAcrossWorkersTest, cls).setUpClass()
    cls.spec = tf1.train.ClusterSpec(
        {'worker': ['127.0.0.1:%d' % replicate.testing.pick_unused_port() for _ in range(2)]})
    cls.configs = [
        replicate.multi_worker.collective_config(
            cls.spec, 'worker', i, tf1.ConfigProto(device_count={'CPU': 2}))
        for i in range(2)]
    cls.servers = [tf1.train.Server(cls.spec, job_name='worker', task_index=i,
                                    config=cls.configs[i])
                   for i in range(2)]

  def setUp(self):
    super(AllReduceAcrossWorkersTest, self).setUp()
    for server in self.servers:
      tf1.Session.reset(server.target)

  def _check(self, result, num_copies):
    w, b = _expected_variables(_STEPS)
    self.assertLen(result['w'], num_copies)
    for copy_w, copy_b in zip(result['w'], result['b']):
      # Every copy identical ...
      self.assertAllEqual(result['w'][0], copy_w)
      self.assertAllEqual(result['b'][0], copy_b)
      # ... and equal to gradient descent on the full batch of 8 rows: each
      # replica's loss is its rows' squared errors / 8, and the replicas'
      # gradients are summed.
      self.assertAllClose(w, copy_w, rtol=1e-5, atol=1e-6)
      self.assertAllClose(b, copy_b, rtol=1e-5, atol=1e-6)
    self.assertAllEqual([_STEPS] * num_copies, result['global_step'])

  def test_in_graph_multi_worker_all_reduce(self):
    # One client graph over 4 devices of 2 workers; all-reduce by
    # MultiWorkerAllReduce (pscpu within each worker, then across workers).
    devices = replicate.multi_worker.worker_devices(self.spec, 2)
    strategy = replicate.MirroredStrategy(
        devices, cross_tower_ops=replicate.MultiWorkerAllReduce(
            replicate.multi_worker.worker_tasks(self.spec), 0,
            all_reduce_spec=('pscpu/pscpu', 2, -1)))
    result = _train_mirrored(strategy, self.servers[0].target, _X, _Y,
                             tf1.ConfigProto(device_count={'CPU': 2}))
    self._check(result, 4)
    # One copy per device, on both workers.
    self.assertEqual(
        ['/job:worker/task:0/device:CPU:0', '/job:worker/task:0/device:CPU:1',
         '/job:worker/task:1/device:CPU:0', '/job:worker/task:1/device:CPU:1'],
        [_without_replica(d) for d in result['devices']])

  def test_between_graph_collective_all_reduce(self):
    # Each worker builds its own graph over its 2 CPUs and feeds its 4 rows;
    # CollectiveAllReduce sums the 4 replicas' gradients at run time.
    results = {}

    def worker(task_id):
      try:
        strategy = replicate.MirroredStrategy(
            replicate.multi_worker.worker_devices(self.spec, 2,
                                                  task_id=task_id),
            cross_tower_ops=replicate.CollectiveAllReduce(num_workers=2))
        rows = slice(4 * task_id, 4 * task_id + 4)
        results[task_id] = _train_mirrored(
            strategy, self.servers[task_id].target, _X[rows], _Y[rows],
            self.configs[task_id])
      except Exception as e:  # pylint: disable=broad-except
        results[task_id] = e

    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(2)]
    for thread in threads:
      thread.start()
    for thread in threads:
      _join(self, thread)
    for task_id in range(2):
      if isinstance(results[task_id], Exception):
        raise results[task_id]
      self._check(results[task_id], 2)
    # Identical variables on both workers.
    self.assertAllEqual(results[0]['w'][0], results[1]['w'][0])
    self.assertAllEqual(results[0]['b'][0], results[1]['b'][0])

  def test_helper_errors(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"Job 'trainer' is not in the cluster \(its jobs are \['worker'\]\)"):
      replicate.multi_worker.worker_devices(self.spec, 2, job='trainer')
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"task_id 5 is not a task of job 'worker' \(its tasks are \[0, 1\]\)"):
      replicate.multi_worker.collective_config(self.spec, 'worker', 5)
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'num_devices_per_worker must be a positive integer, got 0'):
      replicate.multi_worker.worker_devices(self.spec, 0)
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'device_type must be "CPU" or "GPU", got .TPU.'):
      replicate.multi_worker.worker_devices(self.spec, 1, device_type='TPU')
    with self.assertRaisesRegex(
        replicate.errors.InvalidTypeError,
        r'cluster_spec must be a tf.compat.v1.train.ClusterSpec, got \{'):
      replicate.multi_worker.worker_tasks({'worker': ['a:1']})

  def test_collective_config(self):
    base = tf1.ConfigProto(device_count={'CPU': 2},
                           device_filters=['/job:ps'])
    config = replicate.multi_worker.collective_config(self.spec, 'worker', 1,
                                                      base)
    self.assertEqual('/job:worker/replica:0/task:0',
                     config.experimental.collective_group_leader)
    self.assertEqual(['/job:worker/task:1'], list(config.device_filters))
    self.assertEqual(2, config.device_count['CPU'])
    self.assertEqual(['/job:ps'], list(base.device_filters))  # Unchanged.


class ExampleScriptTest(tf.test.TestCase):
  """examples/local_cluster.py: ps, chief and worker as separate processes."""

  def test_example_workers_end_with_same_variables(self):
    out_dir = tempfile.mkdtemp()
    env = dict(os.environ, PYTHONPATH=_ROOT)
    env.pop('TF_CONFIG', None)
    result = subprocess.run(
        [sys.executable, os.path.join(_ROOT, 'examples', 'local_cluster.py'),
         '--steps', '3', '--out_dir', out_dir, '--timeout_secs', '150'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=180, check=False)
    output = result.stdout.decode('utf-8', 'replace')
    self.assertEqual(0, result.returncode, output[-3000:])
    finals = {}
    for task in ('chief', 'worker'):
      with open(os.path.join(out_dir, task + '.json')) as f:
        finals[task] = json.load(f)
    self.assertEqual(3, finals['chief']['global_step'])
    self.assertEqual(3, finals['worker']['global_step'])
    # Synchronous: each worker ran exactly one local step per global step.
    self.assertEqual(3, finals['chief']['steps'])
    self.assertEqual(3, finals['worker']['steps'])
    self.assertEqual(['/job:ps/task:0/device:CPU:0'],
                     sorted(set(finals['worker']['devices'].values())))
    self.assertEqual(finals['chief']['variables'],
                     finals['worker']['variables'])
    self.assertIn('All workers end with the same variables', output)


if __name__ == '__main__':
  tf.test.main()

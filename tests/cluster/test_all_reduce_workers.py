"""VariablePlacement.REPLICATED across the tasks of a cluster without a ps.

* Two tasks (chief + worker) as separate processes on localhost
  (`all_reduce_task.py`), two virtual CPUs and two towers each, all-reduce
  their gradients with collective ops: both end with identical variables
  (tower 1's copies too), equal to one process training the same model on
  all 16 rows; the worker's own initial values differ from the chief's, so
  this also checks the broadcast; only the chief writes checkpoints, and a
  restarted cluster resumes from them.
* A lost task ends the other's training with an error naming it, within the
  operation timeout.
* examples/local_cluster.py --mode allreduce.
* Misuse, through real Estimators (no servers needed): a `ps` job, a session
  config without the collective group leader or with a wrong one, device
  filters that reach the other tasks; and the config helpers.

Every child process ends itself after 80 s; the tests wait at most 85 s.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.cluster import placement as cluster_placement
from replicate.core import device_util

_HERE = os.path.dirname(os.path.abspath(__file__))
_TASK_SCRIPT = os.path.join(_HERE, 'all_reduce_task.py')
_CHILD_SECS = 80
_WAIT_SECS = 85


def _load_task_module():
  spec = importlib.util.spec_from_file_location('all_reduce_task',
                                                _TASK_SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


task_lib = _load_task_module()


def _tf_config(cluster, task_type, task_id):
  return json.dumps({'cluster': cluster,
                     'task': {'type': task_type, 'index': task_id}})


class _Cluster(object):
  """Runs a chief and a worker process; collects their results and logs."""

  def __init__(self, root):
    self.root = root
    port = replicate.testing.pick_unused_port
    self.cluster = {'chief': ['127.0.0.1:%d' % port()],
                    'worker': ['127.0.0.1:%d' % port()]}

  def model_dir(self, task):
    return os.path.join(self.root, task + '_model')

  def run(self, optimizer, steps, die_at_step=None, env_by_task=None):
    """Trains both tasks to `steps`; returns {task: (exit status, result)}."""
    children = {}
    for task in ('chief', 'worker'):
      env = dict(os.environ, TF_CONFIG=_tf_config(self.cluster, task, 0),
                 TF_CPP_MIN_LOG_LEVEL='2', **(env_by_task or {}).get(task, {}))
      args = [sys.executable, _TASK_SCRIPT, self._out(task),
              self.model_dir(task), optimizer, str(steps), str(_CHILD_SECS)]
      if die_at_step is not None and task == 'worker':
        args.append(str(die_at_step))
      if os.path.exists(self._out(task)):
        os.remove(self._out(task))
      log = open(self._log(task), 'w')
      children[task] = subprocess.Popen(args, env=env, stdout=log,
                                        stderr=subprocess.STDOUT)
      log.close()
    results = {}
    try:
      for task, child in children.items():
        code = child.wait(timeout=_WAIT_SECS)
        result = None
        if os.path.exists(self._out(task)):
          with open(self._out(task)) as f:
            result = json.load(f)
        results[task] = (code, result)
    finally:
      for child in children.values():
        if child.poll() is None:
          child.kill()
          child.wait()
    return results

  def log(self, task):
    with open(self._log(task)) as f:
      return f.read()

  def _out(self, task):
    return os.path.join(self.root, task + '.json')

  def _log(self, task):
    return os.path.join(self.root, task + '.log')


def _one_process(optimizer, steps):
  """The unreplicated model on all 16 rows, one process, one device."""
  model_dir = tempfile.mkdtemp()
  try:
    estimator = tf1.estimator.Estimator(
        task_lib.model_fn_for(tf, tf1, optimizer, 0.0), model_dir=model_dir,
        config=tf1.estimator.RunConfig(log_step_count_steps=None,
                                       save_summary_steps=None))

    def input_fn():
      return tf.data.Dataset.from_tensors(
          (task_lib.ROWS_X, task_lib.ROWS_Y)).repeat()

    estimator.train(input_fn, max_steps=steps)
    return {name: estimator.get_variable_value(name)
            for name in ('dense/kernel', 'dense/bias')}
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)


class AllReduceAcrossTasksTest(tf.test.TestCase, parameterized.TestCase):

  def setUp(self):
    super(AllReduceAcrossTasksTest, self).setUp()
    self.assertNotIn('TF_CONFIG', os.environ)
    self._root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self._root, ignore_errors=True)

  def _check_ok(self, cluster, results):
    for task in ('chief', 'worker'):
      code, result = results[task]
      self.assertEqual(0, code, '{} exited with {}: {}'.format(
          task, code, cluster.log(task)[-3000:]))
      self.assertNotIn('error', result)

  @parameterized.parameters('sgd', 'adam')
  def test_two_tasks_equal_one_process_on_all_rows(self, optimizer):
    steps = 4
    cluster = _Cluster(self._root)
    results = cluster.run(optimizer, steps)
    self._check_ok(cluster, results)
    chief = results['chief'][1]['variables']
    worker = results['worker'][1]['variables']
    # Same names and bit-identical values on both tasks: each applies the
    # same all-reduced gradients to the same broadcast initial values.
    self.assertEqual(sorted(chief), sorted(worker))
    for name in chief:
      self.assertAllEqual(np.array(chief[name]), np.array(worker[name]),
                          msg=name)
    # Tower 1's copies (and, with Adam, their slots) equal tower 0's.
    self.assertAllEqual(chief['dense/kernel'], chief['tower_1/dense/kernel'])
    self.assertAllEqual(chief['dense/bias'], chief['tower_1/dense/bias'])
    # Lockstep global steps.
    self.assertEqual(steps, chief['global_step'])
    self.assertEqual(steps, worker['global_step'])
    # Four towers of 4 rows with the mean loss each, averaged over tasks:
    # the gradient of the mean over all 16 rows, as in one process.
    expected = _one_process(optimizer, steps)
    self.assertAllClose(expected['dense/kernel'],
                        np.array(chief['dense/kernel']), rtol=1e-5, atol=1e-6)
    self.assertAllClose(expected['dense/bias'], np.array(chief['dense/bias']),
                        rtol=1e-5, atol=1e-6)
    # The worker's own initializer gives kernel + 0.5; its tower 0's first
    # loss is that of the chief's initial weights on its rows 8..11, so the
    # chief's values were broadcast before the first step.
    rows = slice(8, 12)
    first = (task_lib.ROWS_X[rows].dot(task_lib.INITIAL_KERNEL) - 0.2 -
             task_lib.ROWS_Y[rows])
    self.assertAllClose(np.mean(first ** 2), results['worker'][1]['first_loss'],
                        rtol=1e-5)
    # Checkpoints are the chief's only.
    self.assertIsNotNone(
        tf1.train.latest_checkpoint(cluster.model_dir('chief')))
    self.assertIsNone(tf1.train.latest_checkpoint(cluster.model_dir('worker')))

  def test_restart_resumes_from_the_chiefs_checkpoint(self):
    cluster = _Cluster(self._root)
    self._check_ok(cluster, cluster.run('sgd', 2))
    # A new cluster (new processes, fresh worker variables) to step 4: the
    # chief restores step 2, the worker takes it from the chief.
    results = cluster.run('sgd', 4)
    self._check_ok(cluster, results)
    chief = results['chief'][1]['variables']
    worker = results['worker'][1]['variables']
    self.assertEqual(4, chief['global_step'])
    self.assertEqual(4, worker['global_step'])
    self.assertAllEqual(chief['dense/kernel'], worker['dense/kernel'])
    expected = _one_process('sgd', 4)
    self.assertAllClose(expected['dense/kernel'],
                        np.array(worker['dense/kernel']), rtol=1e-5,
                        atol=1e-6)

  def test_lost_task_ends_training_with_an_error_naming_it(self):
    cluster = _Cluster(self._root)
    # The worker process ends after its third step; the chief would train
    # for 100000 steps.
    results = cluster.run('sgd', 100000, die_at_step=3)
    self.assertEqual(4, results['worker'][0])
    code, result = results['chief']
    # Status 1: an exception from Estimator.train, not the watchdog's 3.
    self.assertEqual(1, code, cluster.log('chief')[-3000:])
    self.assertIn('error', result)
    # TF 1.15: DeadlineExceededError after the operation timeout, the task
    # named by the cluster watcher's ERROR; TF 2.15: UnavailableError at
    # once, then the one-session guard's error naming the task.
    self.assertIn('/job:worker/task:0 at ' + cluster.cluster['worker'][0],
                  cluster.log('chief'))


  def test_tasks_with_variables_in_another_order_fail_at_start(self):
    # Same names and shapes, another order on the worker: the broadcast and
    # the gradients match values by position, so without the check each
    # task would silently take the other's. The worker's session start
    # fails naming the cause; the chief then loses it.
    cluster = _Cluster(self._root)
    results = cluster.run('sgd', 4, env_by_task={
        'chief': {'ALL_REDUCE_TASK_EXTRA_VARIABLES': 'ab'},
        'worker': {'ALL_REDUCE_TASK_EXTRA_VARIABLES': 'ba'}})
    self.assertEqual(1, results['worker'][0], cluster.log('worker')[-3000:])
    self.assertIn('The training tasks built different models',
                  cluster.log('worker'))
    self.assertNotEqual(0, results['chief'][0])
    self.assertNotEqual(3, results['chief'][0], cluster.log('chief')[-3000:])

  def test_tasks_with_other_numbers_of_towers_fail_at_start(self):
    # Chief 2 towers, worker 1: the gradients' all-reduce would have group
    # sizes 4 and 2 (TF's "has group_size 2 ... but that group has size 4"
    # on one task, a timeout on the other). Both session starts fail
    # naming the cause and each task's count, long before the timeout.
    cluster = _Cluster(self._root)
    results = cluster.run('sgd', 4, env_by_task={
        'worker': {'ALL_REDUCE_TASK_TOWERS': '1'}})
    for task, own in (('chief', 2), ('worker', 1)):
      self.assertEqual(1, results[task][0], cluster.log(task)[-3000:])
      log = cluster.log(task)
      self.assertIn('The training tasks have different numbers of towers',
                    log)
      self.assertIn('this task has {})'.format(own), log)
      # x: the chief's 2 towers, then the worker's 1.
      self.assertIn('[2 1]', log)
      self.assertNotIn('group_size', log)


class ExampleTest(tf.test.TestCase):
  """examples/local_cluster.py --mode allreduce: chief and worker, no ps."""

  def test_example_tasks_end_equal_to_one_process(self):
    out_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, out_dir, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(_HERE)))
    env.pop('TF_CONFIG', None)
    result = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(os.path.dirname(_HERE)),
                                      'examples', 'local_cluster.py'),
         '--mode', 'allreduce', '--steps', '3', '--out_dir', out_dir,
         '--timeout_secs', str(_CHILD_SECS)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=_WAIT_SECS, check=False)
    output = result.stdout.decode('utf-8', 'replace')
    self.assertEqual(0, result.returncode, output[-3000:])
    finals = {}
    for task in ('chief', 'worker'):
      with open(os.path.join(out_dir, task + '.json')) as f:
        finals[task] = json.load(f)
      self.assertEqual(3, finals[task]['global_step'])
      self.assertEqual(3, finals[task]['steps'])
    # Each task's variables live on its own task.
    self.assertEqual(['/job:worker/task:0/device:CPU:0'],
                     sorted(set(finals['worker']['devices'].values())))
    self.assertEqual(finals['chief']['variables'],
                     finals['worker']['variables'])
    self.assertIn('All workers end with the same variables', output)
    self.assertIn('They equal one process training on both workers', output)


class GradientAllReduceTest(tf.test.TestCase):
  """multi_worker.WorkerAllReduce on two local CPUs (one task, no server)."""

  def test_packed_and_alone_values_summed_and_scaled(self):
    devices = replicate.testing.virtual_cpu_devices(2)
    rng = np.random.RandomState(3)
    # Per device: a 4x4 float32 and a float32 vector (constants, ready at
    # once: one bucket, packed) and a float64 vector (a bucket of its own:
    # reduced alone).
    arrays = [[rng.standard_normal(shape).astype(dtype) for shape, dtype in
               (((4, 4), np.float32), ((3,), np.float32),
                ((2,), np.float64))] for _ in devices]
    with tf.Graph().as_default():
      values = []
      for k in range(3):
        per_device = {}
        for d, device in enumerate(devices):
          with tf1.device(device):
            per_device[device] = tf.constant(arrays[d][k])
        values.append((replicate.PerDevice(per_device), devices))
      all_reduce = replicate.multi_worker.WorkerAllReduce(
          num_workers=1, scale=0.5)
      reduced = all_reduce.batch_reduce(replicate.ReduceOp.SUM, values)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as s:
        results = s.run([[m.get(d) for d in devices] for m in reduced])
    for k in range(3):
      # (device 0's value + device 1's) * scale, on both devices.
      expected = (arrays[0][k] + arrays[1][k]) * 0.5
      for result in results[k]:
        self.assertAllClose(expected, result)
        self.assertEqual(expected.dtype, result.dtype)
    self.assertEqual(
        ['/replica:0/task:0/device:CPU:0', '/replica:0/task:0/device:CPU:1'],
        sorted(reduced[0].devices))

  def test_results_land_on_the_destinations_only(self):
    # Two values on /cpu:0 and /cpu:1, both asked for on /cpu:1 only: they
    # are not packed with the all-reduced ones, and come back there.
    devices = replicate.testing.virtual_cpu_devices(2)
    with tf.Graph().as_default():
      values = []
      for k in range(2):
        per_device = {}
        for i, device in enumerate(devices):
          with tf1.device(device):
            # Value k on device i: 10 k + i + [0, 1, 2].
            per_device[device] = tf.constant(
                10. * k + i + np.arange(3, dtype=np.float32))
        values.append((replicate.PerDevice(per_device), [devices[1]]))
      all_reduce = replicate.multi_worker.WorkerAllReduce(num_workers=1)
      reduced = all_reduce.batch_reduce(replicate.ReduceOp.SUM, values)
      for mirrored in reduced:
        self.assertEqual(('/replica:0/task:0/device:CPU:1',),
                         tuple(mirrored.devices))
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as s:
        results = s.run([m.values[0] for m in reduced])
    for k, result in enumerate(results):
      # (10 k + [0, 1, 2]) + (10 k + 1 + [0, 1, 2]) = 20 k + 1 + [0, 2, 4].
      self.assertAllEqual(20. * k + 1. + np.array([0., 2., 4.]), result)

  def test_gradient_all_reduce_scales_for_the_mean_only(self):
    mean = replicate.multi_worker.gradient_all_reduce(
        4, tf1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS)
    total = replicate.multi_worker.gradient_all_reduce(
        4, tf1.losses.Reduction.SUM)
    self.assertEqual(0.25, mean._scale)  # pylint: disable=protected-access
    self.assertEqual(1.0, total._scale)  # pylint: disable=protected-access

  def test_results_and_ops_on_their_devices(self):
    # A packed bucket (two float32 values) and a value reduced alone
    # (float64), scaled by 0.5: every op the reduction adds (packing,
    # collectives, scaling, splitting) is on one of the towers' devices (in
    # a cluster a device-less op lands on the task's default device), and
    # each result on the device it is mirrored for. Value k on device i is
    # 10 k + i + [0, 1, 2], so a piece taken from another device shows.
    devices = [device_util.canonicalize(d)
               for d in replicate.testing.virtual_cpu_devices(2)]
    dtypes = (np.float32, np.float32, np.float64)
    with tf.Graph().as_default() as graph:
      values = []
      for k, dtype in enumerate(dtypes):
        per_device = {}
        for i, device in enumerate(devices):
          with tf1.device(device):
            per_device[device] = tf.constant(
                (10. * k + i + np.arange(3)).astype(dtype))
        values.append((replicate.PerDevice(per_device), devices))
      before = set(graph.get_operations())
      reduced = replicate.multi_worker.WorkerAllReduce(
          num_workers=1, scale=0.5).batch_reduce(replicate.ReduceOp.SUM,
                                                 values)
      for op in set(graph.get_operations()) - before:
        self.assertIn(device_util.resolve(op.device), devices, op.name)
      for mirrored in reduced:
        self.assertEqual(sorted(devices), sorted(mirrored.devices))
        for device in devices:
          self.assertEqual(device, device_util.resolve(
              mirrored.get(device).device))
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as s:
        results = s.run([[m.get(d) for d in devices] for m in reduced])
    for k, per_device in enumerate(results):
      # ((10 k + [0, 1, 2]) + (10 k + 1 + [0, 1, 2])) * 0.5.
      expected = (20. * k + 1. + 2. * np.arange(3)).astype(dtypes[k]) * 0.5
      for result in per_device:
        self.assertAllEqual(expected, result)
        self.assertEqual(dtypes[k], result.dtype)

  def test_a_mean_is_not_scaled(self):
    # scale turns sums of per-task means into one mean; a MEAN already
    # divides by the number of values. 2 and 4 (and 10 and 30 beside them,
    # the batch a packed one), scale 0.25 (not 1/2, which would make a
    # scaled sum look like the mean): SUM gives 6 * 0.25 = 1.5 and
    # 40 * 0.25 = 10; MEAN gives 3 and 20, not 0.75 and 5 (scaled) nor 1.5
    # and 10 (the scaled sum).
    devices = replicate.testing.virtual_cpu_devices(2)
    with tf.Graph().as_default():
      values = []
      for pair in ((2., 4.), (10., 30.)):
        per_device = {}
        for device, x in zip(devices, pair):
          with tf1.device(device):
            per_device[device] = tf.constant([x])
        values.append((replicate.PerDevice(per_device), devices))
      all_reduce = replicate.multi_worker.WorkerAllReduce(
          num_workers=1, scale=0.25)
      sums = all_reduce.batch_reduce(replicate.ReduceOp.SUM, values)
      means = all_reduce.batch_reduce(replicate.ReduceOp.MEAN, values)
      mean = all_reduce.reduce(replicate.ReduceOp.MEAN, values[0][0],
                               devices)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(2)) as s:
        got = s.run([[m.values for m in sums], [m.values for m in means],
                     mean.values])
    self.assertAllEqual([[[1.5], [1.5]], [[10.], [10.]]], got[0])
    self.assertAllEqual([[[3.], [3.]], [[20.], [20.]]], got[1])
    self.assertAllEqual([[3.], [3.]], got[2])


class MisuseTest(tf.test.TestCase):
  """Errors raised while the model is built: no servers are started."""

  CLUSTER = {'chief': ['127.0.0.1:1'], 'worker': ['127.0.0.1:2',
                                                  '127.0.0.1:3']}

  def _run_config(self, cluster=None, task=('worker', 1),
                  session_config=None):
    os.environ['TF_CONFIG'] = _tf_config(cluster or self.CLUSTER, *task)
    try:
      return tf1.estimator.RunConfig(session_config=session_config)
    finally:
      del os.environ['TF_CONFIG']

  def _train(self, config, **kwargs):
    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(
            task_lib.model_fn_for(tf, tf1, 'sgd', 0.0),
            devices=['/device:CPU:0', '/device:CPU:1'],
            variable_placement=replicate.VariablePlacement.REPLICATED,
            **kwargs),
        model_dir=tempfile.mkdtemp(dir=self.get_temp_dir()), config=config)

    def input_fn():
      return tf.data.Dataset.from_tensors(
          (task_lib.ROWS_X[:8], task_lib.ROWS_Y[:8])).repeat()

    estimator.train(input_fn, steps=1)

  def test_ps_job(self):
    cluster = dict(self.CLUSTER, ps=['127.0.0.1:4'])
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'REPLICATED.*"ps" job \(1 task\(s\)\).*Remove "ps"'):
      self._train(self._run_config(cluster))

  def test_cross_tower_ops_in_a_cluster(self):
    # A CrossTowerOps of one task's towers would sum, not average, across
    # the tasks: refused before anything is built.
    session_config = replicate.multi_worker.all_reduce_run_config(
        self._run_config()).session_config
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'3 training tasks.*Drop cross_tower_ops'):
      self._train(self._run_config(session_config=session_config),
                  cross_tower_ops=replicate.ReductionToOneDevice())

  def test_no_group_leader(self):
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r'across 3 training tasks.*collective_group_leader.*names none.*'
        r'all_reduce_run_config'):
      self._train(self._run_config(session_config=tf1.ConfigProto(
          device_filters=['/job:worker/task:1'])))

  def test_other_group_leader(self):
    session_config = tf1.ConfigProto(device_filters=['/job:worker/task:1'])
    session_config.experimental.collective_group_leader = (
        '/job:worker/replica:0/task:0')
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"leader is '/job:worker/replica:0/task:0'.*"
        r"'/job:chief/replica:0/task:0'"):
      self._train(self._run_config(session_config=session_config))

  def test_filters_reaching_other_tasks(self):
    session_config = tf1.ConfigProto(device_filters=['/job:worker'])
    session_config.experimental.collective_group_leader = (
        '/job:chief/replica:0/task:0')
    with self.assertRaisesRegex(
        replicate.errors.InvalidArgumentError,
        r"device_filters \['/job:worker'\] let the session of "
        r'/job:worker/task:1 reach the training task\(s\) /job:worker/task:0;'):
      self._train(self._run_config(session_config=session_config))

  def test_all_reduce_run_config(self):
    config = replicate.multi_worker.all_reduce_run_config(self._run_config(
        session_config=tf1.ConfigProto(device_count={'CPU': 2},
                                       operation_timeout_in_ms=5000)))
    session_config = config.session_config
    self.assertEqual('/job:chief/replica:0/task:0',
                     session_config.experimental.collective_group_leader)
    self.assertEqual(['/job:worker/task:1'],
                     list(session_config.device_filters))
    self.assertEqual(5000, session_config.operation_timeout_in_ms)
    self.assertEqual(2, session_config.device_count['CPU'])
    self.assertEqual(('worker', 1), (config.task_type, config.task_id))
    # No session config: the Estimator's default for clusters, plus a
    # bounded operation timeout.
    default = replicate.multi_worker.all_reduce_run_config(
        self._run_config(task=('chief', 0))).session_config
    self.assertTrue(default.allow_soft_placement)
    self.assertEqual(60000, default.operation_timeout_in_ms)
    self.assertEqual(['/job:chief/task:0'], list(default.device_filters))

  def test_helpers_refuse_what_cannot_all_reduce(self):
    with self.assertRaisesRegex(replicate.errors.InvalidArgumentError,
                                'training task of a cluster'):
      replicate.multi_worker.all_reduce_run_config(tf1.estimator.RunConfig())
    with self.assertRaises(replicate.errors.InvalidTypeError):
      replicate.multi_worker.all_reduce_run_config(tf1.ConfigProto())
    with self.assertRaisesRegex(replicate.errors.InvalidArgumentError,
                                'all_reduce_run_config first'):
      replicate.multi_worker.all_reduce_server(self._run_config())

  def test_placement_counts_the_training_tasks(self):
    graph = tf.Graph()
    config = replicate.multi_worker.all_reduce_run_config(self._run_config())
    with graph.as_default():
      placement = cluster_placement.placement(
          config, tf1.estimator.ModeKeys.TRAIN, ['/device:CPU:0',
                                                 '/device:CPU:1'],
          replicate.VariablePlacement.REPLICATED)
      evaluation = cluster_placement.placement(
          config, tf1.estimator.ModeKeys.EVAL, ['/device:CPU:0'],
          replicate.VariablePlacement.REPLICATED)
    self.assertEqual(3, placement.num_workers)
    self.assertEqual(['/job:worker/task:1/device:CPU:0',
                      '/job:worker/task:1/device:CPU:1'],
                     placement.tower_devices)
    self.assertEqual('/job:worker/task:1/device:CPU:0',
                     placement.choose_parameter_device(None))
    self.assertIsNone(evaluation)  # EVAL and PREDICT stay local.


if __name__ == '__main__':
  tf.test.main()

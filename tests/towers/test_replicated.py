"""`VariablePlacement.REPLICATED` through real Estimators.

Every tower owns a copy of each trainable variable; the gradients are
all-reduced and every copy gets the same update. So the model must train as
the unreplicated one (equal within float rounding of the sums' order), the
copies must stay bitwise equal to tower 0's, checkpoints must hold one copy
under the unreplicated names and move both ways between placements, and
EVAL and PREDICT must read each tower's own copy.
"""
import re
import tempfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1

_NUM_CPUS = 4


class _LazyMomentum(tf1.train.MomentumOptimizer):
  """Momentum that makes its slot when it applies, not in `_create_slots`:
  the copies' slots are then the optimizer's own, made in each tower's
  update, and must still be local (never saved) and initialized."""

  def _create_slots(self, var_list):
    pass

  def _apply_dense(self, grad, var):
    self._zeros_slot(var, 'momentum', self._name)
    return super(_LazyMomentum, self)._apply_dense(grad, var)

  def _resource_apply_dense(self, grad, var):
    self._zeros_slot(var, 'momentum', self._name)
    return super(_LazyMomentum, self)._resource_apply_dense(grad, var)


_OPTIMIZERS = {
    'sgd': lambda: tf1.train.GradientDescentOptimizer(0.5),
    'momentum': lambda: tf1.train.MomentumOptimizer(0.3, 0.9),
    'lazy_momentum': lambda: _LazyMomentum(0.3, 0.9),
    'adam': lambda: tf1.train.AdamOptimizer(0.05),
}
_ONE = dict(devices=['/cpu:0'])
_REPLICATED = dict(devices=replicate.testing.virtual_cpu_devices(_NUM_CPUS),
                   variable_placement=replicate.VariablePlacement.REPLICATED)


def _rows(num_rows=64):
  """Distinct rows (a row offset per index), so a mix-up of shards shows."""
  rng = np.random.RandomState(0)
  x = rng.uniform(-1, 1, size=(num_rows, 3)).astype(np.float32)
  x += np.arange(num_rows, dtype=np.float32)[:, None] * 0.01
  y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
  return x, y


def _model_fn(features, labels, mode, params):
  """Three hidden layers, two of them of one shape (4x4), seeded weights."""
  net = features['x']
  for index, name in enumerate(['first', 'second', 'third']):
    init = tf1.glorot_uniform_initializer(seed=index + 1)
    if params.get('keras'):
      net = tf.keras.layers.Dense(4, activation=tf.nn.tanh,
                                  kernel_initializer=init, name=name)(net)
    else:
      # The constraint binds: glorot weights of a 4x4 kernel reach 0.87.
      constraint = (
          (lambda w: tf.clip_by_value(w, -0.3, 0.3))
          if params.get('constraint') and name == 'second' else None)
      net = tf1.layers.dense(net, 4, activation=tf.nn.tanh,
                             kernel_initializer=init, name=name,
                             kernel_constraint=constraint)
  logits = tf1.layers.dense(
      net, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=9),
      name='logits')
  if params.get('warm_start'):  # the first layer from a checkpoint
    tf1.train.init_from_checkpoint(params['warm_start'], {'first/': 'first/'})
  # A local_init_op of model_fn's own: made before the towers' copies.
  def scaffold():
    if params.get('saver'):  # restores and saves tower 0's variables
      return tf1.train.Scaffold(saver=tf1.train.Saver(max_to_keep=2))
    if params.get('init_fn'):  # sets a bias once, when the session starts
      with tf1.variable_scope('second', reuse=True):
        bias = tf1.get_variable('bias')
      assign = tf1.assign(bias, tf.range(0.1, 0.5, 0.1))
      return tf1.train.Scaffold(init_fn=lambda _, sess: sess.run(assign))
    if params.get('scaffold'):
      return tf1.train.Scaffold(local_init_op=tf.group(
          tf1.local_variables_initializer(), tf1.tables_initializer()))
    return None
  if mode == tf1.estimator.ModeKeys.PREDICT:
    return tf1.estimator.EstimatorSpec(mode, predictions={'logits': logits},
                                       scaffold=scaffold())
  loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = replicate.TowerOptimizer(
      _OPTIMIZERS[params.get('optimizer', 'sgd')],
      **params.get('tower_optimizer', {}))
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  metrics = {'mean_logit': tf1.metrics.mean(logits)}
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                     eval_metric_ops=metrics,
                                     scaffold=scaffold())


def _estimator(model_dir, params=None, **replicate_kwargs):
  return tf1.estimator.Estimator(
      replicate.replicate_model_fn(_model_fn, **replicate_kwargs),
      model_dir=model_dir, params=params or {},
      config=tf1.estimator.RunConfig(
          session_config=replicate.testing.virtual_cpu_config(_NUM_CPUS),
          tf_random_seed=7))


def _input_fn(batch_size=16):
  x, y = _rows()

  def input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(({'x': x}, y))
    return dataset.batch(batch_size, drop_remainder=True).repeat()
  return input_fn


def _checkpoint(model_dir):
  return {name: tf1.train.load_variable(model_dir, name)
          for name, _ in tf1.train.list_variables(model_dir)}


class _CopiesHook(tf1.train.SessionRunHook):
  """Reads, when training ends, every tower's copy of each trainable variable
  and of its optimizer slots, and where the copies live."""

  def begin(self):
    graph = tf1.get_default_graph()
    local = {v.op.name: v for v in graph.get_collection(
        tf1.GraphKeys.LOCAL_VARIABLES)}
    self.global_names = set(v.op.name for v in tf1.global_variables())
    self.copies = {}
    for variable in tf1.global_variables():
      copies = [local.get('tower_{}/{}'.format(i, variable.op.name))
                for i in range(1, _NUM_CPUS)]
      if any(c is not None for c in copies):
        self.copies[variable.op.name] = [variable] + copies

  def end(self, session):
    self.values = session.run(self.copies)
    self.devices = {name: [v.device for v in variables]
                    for name, variables in self.copies.items()}


class ReplicatedTest(tf.test.TestCase, parameterized.TestCase):

  def _train(self, steps, params=None, model_dir=None, hooks=None,
             input_fn=None, **kwargs):
    model_dir = model_dir or tempfile.mkdtemp(dir=self.get_temp_dir())
    _estimator(model_dir, params, **kwargs).train(
        input_fn or _input_fn(), steps=steps, hooks=hooks)
    return model_dir

  @parameterized.parameters('sgd', 'momentum', 'lazy_momentum', 'adam')
  def test_trains_as_one_device(self, optimizer):
    params = {'optimizer': optimizer}
    one = _checkpoint(self._train(4, params, **_ONE))
    replicated = _checkpoint(self._train(4, params, **_REPLICATED))
    # One copy, under the unreplicated names (slots and beta powers too).
    self.assertEqual(sorted(one), sorted(replicated))
    for name in one:
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    # Training moved the weights: an untrained model would also "agree".
    self.assertEqual(replicated['global_step'], 4)

  @parameterized.parameters('sgd', 'adam')
  def test_constraints_apply_to_every_copy(self, optimizer):
    # The optimizer projects each variable with its constraint after the
    # update: every tower's copy too, or towers 1.. train on unclipped
    # weights from step 2 on.
    params = {'optimizer': optimizer, 'constraint': True}
    one = _checkpoint(self._train(4, params, **_ONE))
    hook = _CopiesHook()
    replicated = _checkpoint(self._train(4, params, hooks=[hook],
                                         **_REPLICATED))
    for name in one:
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    kernel = hook.values['second/kernel']
    self.assertAllClose(0.3, np.max(np.abs(kernel[0])))  # it binds
    for copy in kernel[1:]:
      self.assertAllEqual(kernel[0], copy)

  # SGD and Momentum too: Adam's step does not change with the gradient's
  # scale, so a sum scaled by 1/N (or N) would show only with them.
  @parameterized.parameters('sgd', 'momentum', 'adam')
  def test_keras_layer_objects(self, optimizer):
    params = {'optimizer': optimizer, 'keras': True}
    one = _checkpoint(self._train(3, params, **_ONE))
    replicated = _checkpoint(self._train(3, params, **_REPLICATED))
    self.assertEqual(sorted(one), sorted(replicated))
    for name in one:
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  def test_copies_stay_identical_and_live_on_their_towers(self):
    hook = _CopiesHook()
    self._train(5, {'optimizer': 'adam'}, hooks=[hook], **_REPLICATED)
    # 4 kernels + 4 biases, each with Adam's m and v slots.
    self.assertLen(hook.copies, 24)
    for name, values in hook.values.items():
      for tower_id, value in enumerate(values[1:], 1):
        # The same all-reduced gradient meets the same value: bitwise equal.
        self.assertAllEqual(values[0], value,
                            msg='{} tower {}'.format(name, tower_id))
      for tower_id, device in enumerate(hook.devices[name]):
        self.assertTrue(device.endswith('CPU:{}'.format(tower_id)),
                        '{} tower {} on {}'.format(name, tower_id, device))
    # Copies and their slots are never saved.
    self.assertFalse([n for n in hook.global_names if n.startswith('tower_')])

  @parameterized.named_parameters(
      ('replicated_then_one', _REPLICATED, _ONE),
      ('one_then_replicated', _ONE, _REPLICATED),
      ('replicated_then_consolidated', _REPLICATED,
       dict(devices=replicate.testing.virtual_cpu_devices(_NUM_CPUS))))
  def test_checkpoints_move_between_placements(self, first, second):
    params = {'optimizer': 'adam'}
    # Each train() call starts the input over: the expected model is one
    # device trained in the same two calls.
    expected_dir = self._train(3, params, **_ONE)
    _estimator(expected_dir, params, **_ONE).train(_input_fn(), steps=2)
    expected = _checkpoint(expected_dir)
    model_dir = self._train(3, params, **first)
    # Restoring sets tower 0's variables and slots; the copies must follow
    # (a copy left at its initial value, or with zero Adam slots, would
    # change the next two updates).
    _estimator(model_dir, params, **second).train(_input_fn(), steps=2)
    resumed = _checkpoint(model_dir)
    self.assertEqual(sorted(expected), sorted(resumed))
    for name in expected:
      self.assertAllClose(expected[name], resumed[name], rtol=1e-5,
                          atol=1e-6, msg=name)

  @parameterized.parameters('sgd', 'adam')
  def test_variable_without_copies_in_var_list_is_applied_once(
      self, optimizer):
    # A variable made trainable=False and passed to minimize by hand has no
    # copies: every tower names it. It was updated once per tower (4 times).
    def model_fn(features, labels, mode, params):
      del params
      scale = tf1.get_variable('scale', [], trainable=False,
                               initializer=tf1.constant_initializer(1.5))
      logits = scale * tf1.layers.dense(
          features['x'], 1, name='logits',
          kernel_initializer=tf1.glorot_uniform_initializer(seed=9))
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      train_op = replicate.TowerOptimizer(_OPTIMIZERS[optimizer]).minimize(
          loss, tf1.train.get_global_step(),
          var_list=tf1.trainable_variables() + [scale])
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    results = []
    for kwargs in (_ONE, _REPLICATED):
      model_dir = tempfile.mkdtemp(dir=self.get_temp_dir())
      tf1.estimator.Estimator(
          replicate.replicate_model_fn(model_fn, **kwargs),
          model_dir=model_dir, config=tf1.estimator.RunConfig(
              session_config=replicate.testing.virtual_cpu_config(
                  _NUM_CPUS))).train(_input_fn(), steps=3)
      results.append(_checkpoint(model_dir))
    one, replicated = results
    self.assertEqual(sorted(one), sorted(replicated))
    self.assertNotAllClose(1.5, one['scale'])  # it trains
    for name in one:
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  @parameterized.parameters('sgd', 'adam')
  def test_saver_of_model_fn_restores_every_copy(self, optimizer):
    # The scaffold's Saver restores tower 0's variables when the second
    # train() starts; its restore ops write them, and are no forward-pass
    # write to refuse. The copies must follow tower 0's restored values.
    params = {'optimizer': optimizer, 'saver': True}
    dirs = []
    for kwargs in (_ONE, _REPLICATED):
      model_dir = self._train(3, params, **kwargs)
      _estimator(model_dir, params, **kwargs).train(_input_fn(), steps=2)
      dirs.append(_checkpoint(model_dir))
    expected, resumed = dirs
    self.assertEqual(resumed['global_step'], 5)
    self.assertEqual(sorted(expected), sorted(resumed))
    for name in expected:
      self.assertAllClose(expected[name], resumed[name], rtol=1e-5,
                          atol=1e-6, msg=name)

  @parameterized.parameters('init_fn', 'warm_start')
  def test_writes_when_the_session_starts(self, how):
    # init_from_checkpoint and a scaffold's init_fn write tower 0's variables
    # once, before the copies are set from them: not a step's write to
    # refuse (they were refused; on TF 1.15 init_from_checkpoint crashed).
    # The warm start reads a checkpoint trained with Adam (weights unlike
    # the seeded ones); the init_fn sets second/bias to [0.1 .. 0.4].
    params = {how: True}
    if how == 'warm_start':
      params['warm_start'] = self._train(3, {'optimizer': 'adam'}, **_ONE)
    one = _checkpoint(self._train(3, params, **_ONE))
    replicated = _checkpoint(self._train(3, params, **_REPLICATED))
    plain = _checkpoint(self._train(3, {}, **_ONE))
    for name in one:
      self.assertAllClose(one[name], replicated[name], rtol=1e-5, atol=1e-6,
                          msg=name)
    changed = 'first/kernel' if how == 'warm_start' else 'second/bias'
    self.assertNotAllClose(plain[changed], one[changed])

  @parameterized.parameters({}, {'scaffold': True})
  def test_eval_and_predict_as_one_device(self, **params):
    # With model_fn's own local_init_op, the copies (local variables made
    # after it) must still be initialized, in every mode.
    model_dir = self._train(3, dict(params, optimizer='momentum'),
                            **_REPLICATED)
    one = _estimator(model_dir, params, **_ONE)
    replicated = _estimator(model_dir, params, **_REPLICATED)
    self.assertAllClose(one.evaluate(_input_fn(), steps=2),
                        replicated.evaluate(_input_fn(), steps=2), rtol=1e-5)
    x, _ = _rows(16)

    def predict_input_fn():
      return tf.data.Dataset.from_tensor_slices({'x': x}).batch(16)
    self.assertAllClose(
        [p['logits'] for p in one.predict(predict_input_fn)],
        [p['logits'] for p in replicated.predict(predict_input_fn)],
        rtol=1e-5, atol=1e-6)

  @parameterized.parameters('sgd', 'momentum', 'adam')
  def test_accumulation(self, optimizer):
    # Two micro-steps of 8 rows make one update as one step on 16 rows: the
    # sums scaled by 1/2, which only SGD and Momentum see (Adam's step does
    # not change with the gradient's scale).
    params = {'optimizer': optimizer}
    one = _checkpoint(self._train(3, params, **_ONE))
    accumulated = _checkpoint(self._train(
        3, dict(params, tower_optimizer={'accumulation_steps': 2}),
        input_fn=_input_fn(batch_size=8), **_REPLICATED))
    # Adam's beta powers (and Momentum's accumulators) keep their names
    # under accumulation too.
    self.assertEqual(sorted(one), sorted(accumulated))
    for name in one:
      self.assertAllClose(one[name], accumulated[name], rtol=1e-5, atol=1e-6,
                          msg=name)

  def test_fp16_compression(self):
    params = {'optimizer': 'sgd'}
    exact = _checkpoint(self._train(3, params, **_REPLICATED))
    compressed = _checkpoint(self._train(
        3, dict(params, tower_optimizer={
            'compression': replicate.Compression.fp16}), **_REPLICATED))
    for name in exact:
      # float16 keeps 11 significant bits: relative error about 5e-4 per
      # gradient, over 3 steps of learning rate 0.5.
      self.assertAllClose(exact[name], compressed[name], rtol=1e-2, atol=2e-3,
                          msg=name)


class ReplicatedGraphTest(tf.test.TestCase, parameterized.TestCase):
  """What a REPLICATED graph holds, built by hand (no hardware needed)."""

  def _build(self, mode, devices, **kwargs):
    x, y = _rows(8)
    features = {'x': tf.constant(x)}
    labels = None if mode == tf1.estimator.ModeKeys.PREDICT else tf.constant(y)
    tf1.train.get_or_create_global_step()
    return replicate.replicate_model_fn(
        _model_fn, devices=devices,
        variable_placement=replicate.VariablePlacement.REPLICATED, **kwargs)(
            features, labels, mode, {}, None)

  @parameterized.parameters('momentum', 'lazy_momentum')
  def test_slot_copies_are_local_variables(self, optimizer):
    # Copies (and their slots, however the optimizer makes them) are local:
    # initialized by local_variables_initializer, never saved.
    x, y = _rows(8)
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      replicate.replicate_model_fn(_model_fn, **_REPLICATED)(
          {'x': tf.constant(x)}, tf.constant(y), tf1.estimator.ModeKeys.TRAIN,
          {'optimizer': optimizer}, None)
      local = [v.op.name for v in tf1.local_variables()]
      saved = [v.op.name for v in tf1.global_variables()]
    # 4 kernels and 4 biases: a Momentum slot each, on towers 1..3.
    self.assertLen([n for n in local if n.endswith('/Momentum')], 8 * 3)
    self.assertLen([n for n in saved if n.endswith('/Momentum')], 8)
    self.assertFalse([n for n in saved if n.startswith('tower_')])

  def test_gpu_towers_all_reduce_with_nccl_on_their_copies(self):
    devices = ['/gpu:0', '/gpu:1']
    with tf.Graph().as_default() as graph:
      self._build(tf1.estimator.ModeKeys.TRAIN, devices,
                  cross_tower_ops=replicate.NcclAllReduce())
    nccl = [op for op in graph.get_operations()
            if op.type == 'NcclAllReduce']
    self.assertNotEmpty(nccl)
    self.assertCountEqual(
        set(op.device for op in nccl), ['/device:GPU:0', '/device:GPU:1'])
    variables = {op.name: op.device for op in graph.get_operations()
                 if op.type in ('VariableV2', 'VarHandleOp')}
    self.assertEqual(variables['second/kernel'], '/device:GPU:0')
    self.assertEqual(variables['tower_1/second/kernel'], '/device:GPU:1')
    # Each tower's update runs where its copy lives.
    updates = [op for op in graph.get_operations()
               if op.type in ('ApplyGradientDescent',
                              'ResourceApplyGradientDescent')]
    self.assertCountEqual(
        [op.device for op in updates],
        ['/device:GPU:0'] * 8 + ['/device:GPU:1'] * 8)

  def test_copies_are_read_as_tower_0_reads_its_variables(self):
    # A tower that made its variables would read each as tower 0 does: a
    # ref variable through its own `<name>/read`, a resource variable
    # through its `Read/ReadVariableOp` plus one read per use. So each copy
    # has as many reads as its original (a second read of a ref copy, beside
    # its unused own `read`, would make 2 where tower 0 has 1; reads of tower
    # 0's variables to set the copies would add to the originals'), and a ref
    # copy's kernel reaches the MatMul through its own `read`.
    devices = replicate.testing.virtual_cpu_devices(3)
    with tf.Graph().as_default() as graph:
      self._build(tf1.estimator.ModeKeys.TRAIN, devices,
                  cross_tower_ops=replicate.AllReduceCrossTowerOps(
                      'hierarchical_copy'))
    reads = {}
    for op in graph.get_operations():
      if op.type in ('Identity', 'ReadVariableOp') and op.inputs and (
          op.inputs[0].op.type in ('VariableV2', 'VarHandleOp')):
        reads.setdefault(op.inputs[0].op.name, []).append(op)
    originals = [v.op.name for v in graph.get_collection(
        tf1.GraphKeys.TRAINABLE_VARIABLES)]
    self.assertLen(originals, 8)  # 4 kernels, 4 biases
    for name in originals:
      for tower in (1, 2):
        copy = 'tower_{}/{}'.format(tower, name)
        self.assertEqual(len(reads[name]), len(reads[copy]), copy)
        if reads[copy][0].type == 'Identity':
          self.assertEqual([op.name for op in reads[copy]], [copy + '/read'])
    matmul = graph.get_operation_by_name('tower_2/second/MatMul')
    if matmul.inputs[1].op.type == 'Identity':
      self.assertEqual(matmul.inputs[1].op.name, 'tower_2/second/kernel/read')

  def test_eval_metric_variables_live_on_their_towers(self):
    # A tower's own call makes its metric variables on its device under
    # REPLICATED (as every variable of its): the copies' too, so that each
    # GPU counts its shard in its own memory. Default placement keeps them
    # on the consolidation device, as calls do.
    for placement, expected in (
        (replicate.VariablePlacement.REPLICATED, '/device:GPU:{}'),
        (replicate.VariablePlacement.CONSOLIDATION_DEVICE, '/device:CPU:0')):
      with tf.Graph().as_default() as graph:
        x, y = _rows(8)
        tf1.train.get_or_create_global_step()
        replicate.replicate_model_fn(
            _model_fn, devices=['/gpu:0', '/gpu:1', '/gpu:2'],
            variable_placement=placement)(
                {'x': tf.constant(x)}, tf.constant(y),
                tf1.estimator.ModeKeys.EVAL, {}, None)
      metric_variables = graph.get_collection(
          tf1.GraphKeys.METRIC_VARIABLES)
      self.assertNotEmpty(metric_variables)
      for variable in metric_variables:
        tower = re.match(r'tower_(\d+)/', variable.op.name)
        self.assertEqual(
            expected.format(int(tower.group(1)) if tower else 0),
            tf.DeviceSpec.from_string(variable.device).to_string(),
            variable.op.name)

  def test_predict_towers_read_their_own_copies(self):
    devices = replicate.testing.virtual_cpu_devices(2)
    with tf.Graph().as_default() as graph:
      self._build(tf1.estimator.ModeKeys.PREDICT, devices)
    matmuls = [op for op in graph.get_operations() if op.type == 'MatMul']
    self.assertLen(matmuls, 8)
    for op in matmuls:
      variable = _variable_read_by(op.inputs[1])
      tower_scope = op.name.startswith('tower_1/')
      self.assertEqual(variable.startswith('tower_1/'), tower_scope,
                       '{} reads {}'.format(op.name, variable))


def _variable_read_by(tensor):
  """The variable op a kernel tensor is read from (through identities)."""
  op = tensor.op
  while op.type not in ('VariableV2', 'VarHandleOp'):
    op = op.inputs[0].op
  return op.name


class ReplicatedMisuseTest(tf.test.TestCase):

  def test_call_per_tower_is_refused(self):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'CALL_PER_TOWER'):
      replicate.replicate_model_fn(
          _model_fn, tower_build=replicate.TowerBuild.CALL_PER_TOWER,
          **_REPLICATED)

  def test_cross_tower_ops_needs_replicated(self):
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'variable_placement=VariablePlacement'):
      replicate.replicate_model_fn(_model_fn, devices=['/cpu:0', '/cpu:1'],
                                   cross_tower_ops=replicate.NcclAllReduce())
    with self.assertRaisesRegex(errors.InvalidTypeError, "'nccl'"):
      replicate.replicate_model_fn(_model_fn, cross_tower_ops='nccl',
                                   **_REPLICATED)

  def test_towers_that_cannot_be_copied_fail_at_train(self):

    def model_fn(features, labels, mode, params):
      replicate.get_tower_context()  # makes copying tower 0 unsafe
      return _model_fn(features, labels, mode, params)

    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(model_fn, **_REPLICATED),
        model_dir=tempfile.mkdtemp(dir=self.get_temp_dir()),
        config=tf1.estimator.RunConfig(
            session_config=replicate.testing.virtual_cpu_config(_NUM_CPUS)))
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'get_tower_context'):
      estimator.train(_input_fn(), steps=1)

  def test_sync_replicas_optimizer_is_refused(self):

    def model_fn(features, labels, mode):
      logits = tf1.layers.dense(features['x'], 1)
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      optimizer = replicate.TowerOptimizer(tf1.train.SyncReplicasOptimizer(
          tf1.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=1))
      return tf1.estimator.EstimatorSpec(
          mode, loss=loss,
          train_op=optimizer.minimize(loss, tf1.train.get_global_step()))

    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(model_fn, **_REPLICATED),
        model_dir=tempfile.mkdtemp(dir=self.get_temp_dir()),
        config=tf1.estimator.RunConfig(
            session_config=replicate.testing.virtual_cpu_config(_NUM_CPUS)))
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'SyncReplicasOptimizer'):
      estimator.train(_input_fn(), steps=1)

  def _train_writing(self, write, trainable=True):
    """Trains 1 step of a model_fn that writes a variable with `write`."""

    def model_fn(features, labels, mode):
      seen = tf1.get_variable('seen', [], trainable=trainable,
                              initializer=tf1.zeros_initializer())
      x = features['x']
      if write == 'forward':  # a counter of rows in the forward pass
        # Locked: the towers add at once (see test_copy_fidelity).
        with tf1.control_dependencies([tf1.assign_add(
            seen, tf.cast(tf.shape(x)[0], tf.float32), use_locking=True)]):
          x = tf.identity(x)
      logits = tf1.layers.dense(x, 1, name='out')
      loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf1.train.get_global_step())
      if write == 'after_minimize':  # a projection after the update
        kernel = tf1.trainable_variables('out/kernel')[0]
        with tf1.control_dependencies([train_op]):
          train_op = kernel.assign(tf.clip_by_value(kernel, -0.1, 0.1))
      return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    model_dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    tf1.estimator.Estimator(
        replicate.replicate_model_fn(model_fn, **_REPLICATED),
        model_dir=model_dir,
        config=tf1.estimator.RunConfig(
            session_config=replicate.testing.virtual_cpu_config(
                _NUM_CPUS))).train(_input_fn(), steps=1)
    return _checkpoint(model_dir)

  def test_writes_besides_the_optimizer_are_refused(self):
    # Each would reach tower 0's copy only (after minimize), or each
    # tower's own copy (forward pass), where DEFAULT writes one variable.
    # (AssignAddVariableOp and AssignVariableOp on TF 2's resource variables.)
    for write, name, op_type in [('forward', 'seen', 'AssignAdd'),
                                 ('after_minimize', 'out/kernel', 'Assign')]:
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'REPLICATED keeps one copy of trainable variable {} per tower.*'
          r'\({}(VariableOp)?\) writes it too.*trainable=False.*'
          r'kernel_constraint'.format(name, op_type)):
        self._train_writing(write)

  def test_non_trainable_variables_written_by_every_tower(self):
    # Not copied: the one counter counts every tower's rows, 16 a step.
    self.assertEqual(16, self._train_writing('forward', trainable=False)[
        'seen'])


if __name__ == '__main__':
  tf.test.main()

"""Every misuse of replicate_model_fn / TowerOptimizer raises a clear error."""
from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1


def _spec(mode, loss, train_op=None, **kwargs):
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                     **kwargs)


def _sgd_spec(mode, loss):
  """`_spec` whose train op is a step of SGD (rate 0.1) on `loss`."""
  return _spec(mode, loss, replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(
          loss, tf1.train.get_global_step()))


def _weights(**kwargs):
  """The [3, 1] variable `w`, starting at [0.5, -0.25, 1.0]."""
  return tf1.get_variable('w', [3, 1], initializer=(
      tf1.constant_initializer([[0.5], [-0.25], [1.0]])), **kwargs)


def _build(model_fn, devices, features=None, labels=None, mode=mt.TRAIN,
           **kwargs):
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    if features is None:
      features = {'x': np.zeros([8, 3], np.float32)}
    # Inputs are given as NumPy values and become constants of this graph.
    features = tf.nest.map_structure(tf.constant, features)
    if labels is not None:
      labels = tf.constant(labels)
    replicate.replicate_model_fn(model_fn, devices=devices, **kwargs)(
        features, labels, mode)
  return graph


def _linear_model_fn(features, labels, mode):
  del labels
  w = tf1.get_variable('w', [3, 1])
  loss = tf.reduce_mean(tf.matmul(features['x'], w))
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
  return _spec(mode, loss, train_op)


class ArgumentErrorsTest(tf.test.TestCase):

  def test_reduction_none(self):
    with self.assertRaisesRegex(ValueError,
                                'loss_reduction NONE is not supported'):
      replicate.replicate_model_fn(_linear_model_fn,
                                   loss_reduction=tf1.losses.Reduction.NONE)

  def test_unknown_reduction(self):
    with self.assertRaisesRegex(ValueError, "Unknown loss_reduction 'average'"):
      replicate.replicate_model_fn(_linear_model_fn, loss_reduction='average')

  def test_model_fn_not_callable(self):
    with self.assertRaisesRegex(TypeError, 'model_fn must be callable'):
      replicate.replicate_model_fn('my_model_fn')

  def test_devices_empty(self):
    with self.assertRaisesRegex(ValueError, 'devices is empty'):
      replicate.replicate_model_fn(_linear_model_fn, devices=[])

  def test_devices_a_string(self):
    with self.assertRaisesRegex(TypeError, 'devices must be a list'):
      replicate.replicate_model_fn(_linear_model_fn, devices='/gpu:0')

  def test_devices_repeated(self):
    # '/cpu:0' and '/device:CPU:0' are the same device.
    with self.assertRaisesRegex(ValueError, "'/device:CPU:0' is listed twice"):
      replicate.replicate_model_fn(_linear_model_fn,
                                   devices=['/cpu:0', '/device:CPU:0'])

  def test_device_unparsable(self):
    with self.assertRaisesRegex(ValueError, "Cannot parse device '/gpu:zero'"):
      replicate.replicate_model_fn(_linear_model_fn, devices=['/gpu:zero'])

  def test_device_not_a_string(self):
    with self.assertRaisesRegex(TypeError, 'Devices must be strings'):
      replicate.replicate_model_fn(_linear_model_fn, devices=[0, 1])

  def test_variable_placement_string(self):
    with self.assertRaisesRegex(ValueError, 'must be a replicate.VariablePlacement'):
      replicate.replicate_model_fn(_linear_model_fn,
                                   variable_placement='round_robin')

  def test_device_missing_from_session_config(self):
    # The default session has one CPU: CPU:1 would silently fall back to CPU:0.
    config = tf1.estimator.RunConfig()
    with tf.Graph().as_default():
      fn = replicate.replicate_model_fn(_linear_model_fn, devices=mt.cpus(2))
      with self.assertRaisesRegex(
          ValueError, r'Device /device:CPU:1 does not exist: the session has '
          r'1 CPU device\(s\).*device_count=\{"CPU": 2\}'):
        fn({'x': tf.zeros([8, 3])}, None, mt.TRAIN, config=config)

  def test_missing_device_with_explicit_soft_placement_warns(self):
    # contrib-era tests name GPUs on CPU-only machines and ask for soft
    # placement explicitly: that is honoured, with one warning.
    config = tf1.estimator.RunConfig(
        session_config=tf1.ConfigProto(allow_soft_placement=True))
    with tf.Graph().as_default():
      tf1.train.get_or_create_global_step()
      fn = replicate.replicate_model_fn(_linear_model_fn,
                                        devices=['/gpu:0', '/gpu:1'])
      with self.assertLogs(level='WARNING') as logs:
        spec = fn({'x': tf.zeros([8, 3])}, None, mt.TRAIN, config=config)
      self.assertIn('session_config allows soft placement',
                    '\n'.join(logs.output))
      with tf1.Session(config=config.session_config) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(spec.train_op)

  def test_tower_optimizer_wraps_optimizers_only(self):
    with self.assertRaisesRegex(TypeError, 'TowerOptimizer wraps a '
                                'tf.compat.v1.train.Optimizer'):
      replicate.TowerOptimizer(0.1)

  def test_optimizer_fn_must_return_optimizer(self):
    optimizer = replicate.TowerOptimizer(lambda: 'sgd')
    with tf.Graph().as_default():
      with self.assertRaisesRegex(TypeError, "returned 'sgd' of type str"):
        optimizer.compute_gradients(tf.constant(1.))


class _ClipByGlobalNorm(tf1.train.GradientDescentOptimizer):
  """A wrapper-style optimizer: clips by the global norm in apply_gradients
  (as tf.contrib.estimator.clip_gradients_by_norm's optimizer does)."""

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    grads, variables = zip(*grads_and_vars)
    grads, _ = tf.clip_by_global_norm(grads, 0.1)
    return super(_ClipByGlobalNorm, self).apply_gradients(
        zip(grads, variables), global_step, name)


def _train_estimator(model_fn, devices, **kwargs):
  """One step of `model_fn` replicated on `devices`, through an Estimator."""
  x = np.arange(24, dtype=np.float32).reshape([8, 3]) / 10.0
  estimator = tf1.estimator.Estimator(
      replicate.replicate_model_fn(model_fn, devices=devices, **kwargs),
      config=tf1.estimator.RunConfig(
          session_config=replicate.testing.virtual_cpu_config(4)))
  estimator.train(lambda: tf1.data.Dataset.from_tensors(({'x': x}, x[:, :1])),
                  steps=1)
  return estimator


def _extra_optimizer_call_in(tower_id):
  """A model_fn whose tower `tower_id` makes one more optimizer call."""

  def model_fn(features, labels, mode):
    del labels
    w = tf1.get_variable('w', [3, 1])
    loss = tf.reduce_mean(tf.matmul(features['x'], w))
    optimizer = replicate.TowerOptimizer(
        tf1.train.GradientDescentOptimizer(0.1))
    ops = [optimizer.minimize(loss)]
    if replicate.get_tower_context().tower_id == tower_id:
      ops.append(optimizer.minimize(2 * loss))
    return _spec(mode, loss, tf.group(*ops))

  return model_fn


class ModelFnErrorsTest(tf.test.TestCase, parameterized.TestCase):

  def test_feature_rows_differ_from_the_batch(self):
    with self.assertRaisesRegex(
        ValueError, r"features\['y'\] has 4 rows in dimension 0, but the batch "
        r"has 6 \(features\['x'\], the first value split\).*unsplit_features"):
      _build(_linear_model_fn, mt.cpus(4),
             features={'x': np.zeros([6, 3], np.float32),
                       'y': np.zeros([4, 3], np.float32)})

  def test_dynamic_feature_rows_differ_at_run_time(self):
    with tf.Graph().as_default():
      x = tf1.placeholder(tf.float32, [None, 3])
      y = tf1.placeholder(tf.float32, [None, 3])
      def model_fn(features, mode):
        return _linear_model_fn(
            {'x': tf.concat([features['x'], features['y']], 0)}, None, mode)

      spec = replicate.replicate_model_fn(model_fn, devices=mt.cpus(4))(
          {'x': x, 'y': y}, None, mt.TRAIN)
      with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(spec.train_op, {x: np.zeros([6, 3]), y: np.zeros([6, 3])})
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError,
            r'has \(known at run time\) rows in dimension 0, but the batch '
            r'has \(known at run time\).*unsplit_features'):
          sess.run(spec.train_op, {x: np.zeros([6, 3]), y: np.zeros([5, 3])})

  @parameterized.parameters(1, 4)
  def test_integer_loss(self, num_towers):
    # TF's optimizer refuses a loss that is not floating point. Scaled per
    # tower, the integer loss became a float64 one without gradients, and
    # the error said "No gradients provided for any variable" instead.
    def model_fn(features, labels, mode):
      del labels
      logits = tf1.layers.dense(features['x'], 1, name='dense')
      loss = tf.reduce_sum(tf.cast(logits > 0, tf.int32), name='positives')
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf1.train.get_global_step())
      return _spec(mode, loss, train_op)

    with self.assertRaisesRegex(
        ValueError, r'Invalid type tf.int32 for positives:0, expected: '
        r'\[tf.float32, tf.float64, tf.float16, tf.bfloat16\]'):
      _train_estimator(model_fn, mt.cpus(num_towers))

  def test_replicated_twice(self):
    # The outer towers each called a replicated model_fn, which split again
    # and then blamed a missing TowerOptimizer (contrib too).
    inner = replicate.replicate_model_fn(_linear_model_fn, devices=mt.cpus(2))
    with self.assertRaisesRegex(
        ValueError, 'called inside a tower of another replicate_model_fn.*'
        'Wrap the model_fn once'):
      _train_estimator(inner, mt.cpus(4))

  def test_missing_tower_optimizer(self):
    def model_fn(features, labels, mode):
      del labels
      w = tf1.get_variable('w', [3, 1])
      loss = tf.reduce_mean(tf.matmul(features['x'], w))
      train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
      return _spec(mode, loss, train_op)

    with self.assertRaisesRegex(
        ValueError, 'Please wrap optimizers with replicate.TowerOptimizer'):
      _build(model_fn, mt.cpus(2))
    _build(model_fn, mt.cpus(1))  # one device: a plain optimizer is fine

  @parameterized.parameters(
      {}, {'tower_build': replicate.TowerBuild.CALL_PER_TOWER},
      {'variable_placement': replicate.VariablePlacement.REPLICATED})
  def test_second_optimizer_not_wrapped(self, **kwargs):
    # One optimizer wrapped, one plain: the plain one applied one tower's
    # unscaled gradients to its variables, silently (contrib too).
    def model_fn(features, labels, mode):
      del labels
      a = tf1.get_variable('a', [3, 1])
      b = tf1.get_variable('b', [3, 1])
      loss = tf.reduce_mean(tf.matmul(features['x'], a + b))
      wrapped = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, var_list=[a], global_step=tf1.train.get_global_step())
      plain = tf1.train.AdagradOptimizer(0.1).minimize(loss, var_list=[b])
      return _spec(mode, loss, tf.group(wrapped, plain))

    with self.assertRaisesRegex(
        ValueError, r'Trainable variable b is updated by .*ApplyAdagrad.*, '
        'which no TowerOptimizer made: an optimizer that is not wrapped would '
        "apply one tower's gradients alone. Wrap every optimizer"):
      _build(model_fn, mt.cpus(2), **kwargs)

  def test_canned_estimator_with_a_plain_linear_optimizer(self):
    # DNNLinearCombinedClassifier's linear_optimizer defaults to 'Ftrl', a
    # plain optimizer: wrapping only dnn_optimizer trained the linear part
    # on tower 0's rows alone.
    column = tf1.feature_column.numeric_column('x', shape=[3])
    canned = tf1.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=[column], dnn_feature_columns=[column],
        dnn_hidden_units=[2], dnn_optimizer=replicate.TowerOptimizer(
            tf1.train.GradientDescentOptimizer(0.1)))
    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(
            canned.model_fn, loss_reduction=tf1.losses.Reduction.SUM,
            devices=mt.cpus(2)),
        config=tf1.estimator.RunConfig(
            session_config=replicate.testing.virtual_cpu_config(2)))

    def input_fn():
      features, labels = mt.data(batch_size=8)
      return tf.data.Dataset.from_tensors((features, labels))

    with self.assertRaisesRegex(
        ValueError, r'Trainable variable linear/linear_model/.* is updated '
        r'by .*ApplyFtrl.*linear_optimizer='):
      estimator.train(input_fn, steps=1)

  def test_gradients_not_computed_by_tower_optimizer(self):
    # tf.gradients of the unscaled tower loss: 4 towers' sum would apply 4
    # times one device's step (contrib refused this too).
    def model_fn(features, labels, mode):
      w = tf1.get_variable('w', [3, 1])
      loss = tf.reduce_mean(tf.square(tf.matmul(features['x'], w) - labels))
      grads = tf.gradients(loss, [w])
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).apply_gradients(
              zip(grads, [w]), tf1.train.get_global_step())
      return _spec(mode, loss, train_op)

    for placement in (replicate.VariablePlacement.CONSOLIDATION_DEVICE,
                      replicate.VariablePlacement.REPLICATED):
      with self.assertRaisesRegex(
          ValueError,
          r'apply_gradients got gradients that no TowerOptimizer\.'
          r'compute_gradients \(or minimize\) of this tower computed, e\.g\. '
          r'from tf\.gradients.*apply 4 times one device'):
        _train_estimator(model_fn, mt.cpus(4), variable_placement=placement)
    _train_estimator(model_fn, mt.cpus(1))  # one device: nothing to scale

  def test_gradient_terms_not_computed_by_tower_optimizer(self):
    # A term from tf.gradients of the tower's (unscaled) loss, beside or
    # added to compute_gradients' own: the towers' sum would count it N
    # times (with 2 towers b moved -0.2764 for one device's -0.1578).
    def model_fn_of(case):
      def model_fn(features, labels, mode):
        w = tf1.get_variable('w', [3, 1])
        b = tf1.get_variable('b', [1], initializer=tf1.zeros_initializer())
        loss = tf.reduce_mean(
            tf.square(tf.matmul(features['x'], w) + b - labels))
        optimizer = replicate.TowerOptimizer(
            tf1.train.GradientDescentOptimizer(0.1))
        if case == 'beside':
          pairs = optimizer.compute_gradients(loss, var_list=[w])
          pairs.append((tf.gradients(loss, b)[0], b))
        elif case == 'sparse':  # an IndexedSlices term, of an embedding
          e = tf1.get_variable('e', [4, 1])
          loss += tf.reduce_sum(tf.gather(e, [0, 2]) * labels[:2])
          pairs = optimizer.compute_gradients(loss, var_list=[w, b])
          pairs.append((tf.gradients(loss, e)[0], e))
        elif case == 'added':
          pairs = optimizer.compute_gradients(loss, var_list=[w, b])
          aux = tf.gradients(tf.reduce_mean(features['x']) * b, [b])[0]
          pairs = [pairs[0], (pairs[1][0] + aux, b)]
        else:  # transformations of the computed gradients only
          pairs = optimizer.compute_gradients(loss)
          grads, _ = tf.clip_by_global_norm([g for g, _ in pairs], 1.0)
          pairs = [(g * 0.5, v) for g, (_, v) in zip(grads, pairs)]
        return _spec(mode, loss, optimizer.apply_gradients(
            pairs, tf1.train.get_global_step()))
      return model_fn

    for placement in (replicate.VariablePlacement.CONSOLIDATION_DEVICE,
                      replicate.VariablePlacement.REPLICATED):
      for case, variable in (('beside', 'b'), ('added', 'b'),
                             ('sparse', 'e')):
        with self.assertRaisesRegex(
            ValueError,
            r'apply_gradients got a gradient for {}:0 that depends on the '
            r'rows of tower 0 of 2 other than through the gradients '
            r'TowerOptimizer\.compute_gradients returned.*count that term 2 '
            r'times'.format(variable)):
          _train_estimator(model_fn_of(case), mt.cpus(2),
                           variable_placement=placement)
      _train_estimator(model_fn_of('clipped'), mt.cpus(2),
                       variable_placement=placement)
    _train_estimator(model_fn_of('beside'), mt.cpus(1))  # nothing to scale
    # SUM scales no tower loss: a term of a row sum adds up to one device's.
    _train_estimator(model_fn_of('beside'), mt.cpus(2),
                     loss_reduction=tf1.losses.Reduction.SUM)

  def test_regularization_added_by_every_call(self):
    # Each call adds c * l2(w) to REGULARIZATION_LOSSES; tower 1 also sees
    # tower 0's (so that regularizers of shared variables count once): its
    # get_total_loss() would count the term twice (1.5 times one device's
    # over 2 towers), every tower's under SUM (2 times).
    def model_fn_of(first_tower_only=False):
      def model_fn(features, labels, mode):
        w = _weights()
        tf1.losses.mean_squared_error(labels, tf.matmul(features['x'], w))
        if not first_tower_only or (
            replicate.get_tower_context() is None or
            replicate.get_tower_context().is_first_tower):
          tf1.losses.add_loss(0.5 * tf.nn.l2_loss(w),
                              tf1.GraphKeys.REGULARIZATION_LOSSES)
        loss = tf1.losses.get_total_loss()
        return _sgd_spec(mode, loss)
      return model_fn

    per_tower = replicate.TowerBuild.CALL_PER_TOWER
    with self.assertRaisesRegex(
        ValueError,
        r'The loss of tower 1 of 2 counts the regularization loss '
        r'tower_1/mul:0, which its model_fn call added to '
        r"REGULARIZATION_LOSSES again as tower 0's call added mul:0, which "
        r'every tower sees too.*apply it 2 times.*because tower_build is '
        r'TowerBuild.CALL_PER_TOWER'):
      _train_estimator(model_fn_of(), mt.cpus(2), tower_build=per_tower)
    with self.assertRaisesRegex(
        ValueError,
        r'tower_1/mul:0.*every tower adds its loss unscaled under '
        r'Reduction.SUM: the step would apply it 2 times'):
      _train_estimator(model_fn_of(), mt.cpus(2),
                       loss_reduction=tf1.losses.Reduction.SUM)
    _train_estimator(model_fn_of(), mt.cpus(2))  # copies count it once
    # The ways out the message names equal one device: tower 0 only.
    features, labels = mt.data()
    results = []
    for devices in (None, mt.cpus(2)):
      with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        model_fn = model_fn_of(first_tower_only=True)
        if devices:
          model_fn = replicate.replicate_model_fn(model_fn, devices=devices)
        spec = model_fn({'x': tf.constant(features['x'])},
                        tf.constant(labels), mt.TRAIN)
        results.append(mt.run_spec(spec, mt.TRAIN))
    self.assertAllClose(results[0]['w'], results[1]['w'], rtol=1e-6,
                        atol=1e-6)

  @parameterized.named_parameters(
      ('copies', {}),
      ('calls', {'tower_build': replicate.TowerBuild.CALL_PER_TOWER}),
      ('replicated',
       {'variable_placement': replicate.VariablePlacement.REPLICATED}))
  def test_sum_of_a_term_without_rows(self, kwargs):
    # Under SUM each tower's loss is added unscaled: the penalty |w|_1,
    # read from no row, would count once per tower (4 times), where one
    # device counts it once. Before: w moved by 4 x 0.1 x sign(w) more than
    # one device's, silently (contrib too). Copies are refused at tower 0's
    # term, calls at tower 1's (tower 0 may add a term alone).
    def model_fn(features, labels, mode):
      w = _weights()
      tf1.losses.mean_squared_error(labels, tf.matmul(features['x'], w),
                                    reduction=tf1.losses.Reduction.SUM)
      tf1.losses.add_loss(tf.reduce_sum(tf.abs(w), name='l1'))
      loss = tf1.losses.get_total_loss()
      return _sgd_spec(mode, loss)

    with self.assertRaisesRegex(
        ValueError,
        r"loss_reduction is Reduction.SUM, so the 4 towers' losses are added "
        r'unscaled, and the term (l1:0 of the loss of tower 0|tower_1/l1:0 '
        r'of the loss of tower 1) reads none of '
        r"the tower's rows .*every tower whose loss has it counts it again "
        r'\(4 times when every tower does\), where one device counts it '
        r'once\. Make it a regularizer of its variable'):
      _train_estimator(model_fn, mt.cpus(4),
                       loss_reduction=tf1.losses.Reduction.SUM, **kwargs)

  def test_sum_of_a_penalty_the_ways_out(self):
    # The ways out the message names equal one device's step on the whole
    # batch: the penalty as the variable's regularizer (towers fall back to
    # calls, and only tower 0 counts it under SUM), or added in tower 0
    # only.
    def model_fn_of(way):
      def model_fn(features, labels, mode):
        regularizer = (lambda w: tf.reduce_sum(tf.abs(w))) if (
            way == 'regularizer') else None
        w = _weights(regularizer=regularizer)
        loss = tf1.losses.mean_squared_error(
            labels, tf.matmul(features['x'], w),
            reduction=tf1.losses.Reduction.SUM)
        if way == 'regularizer':
          loss += tf1.losses.get_regularization_loss()
        elif (replicate.get_tower_context() is None or
              replicate.get_tower_context().is_first_tower):
          loss += tf.reduce_sum(tf.abs(w))
        return _sgd_spec(mode, loss)
      return model_fn

    features, labels = mt.data()
    for way in ('regularizer', 'first_tower'):
      results = []
      for devices in (None, mt.cpus(4)):
        with tf.Graph().as_default():
          tf1.train.get_or_create_global_step()
          model_fn = model_fn_of(way)
          if devices:
            model_fn = replicate.replicate_model_fn(
                model_fn, devices=devices,
                loss_reduction=tf1.losses.Reduction.SUM)
          spec = model_fn({'x': tf.constant(features['x'])},
                          tf.constant(labels), mt.TRAIN)
          results.append(mt.run_spec(spec, mt.TRAIN))
      self.assertAllClose(results[0]['w'], results[1]['w'], rtol=1e-6,
                          atol=1e-6, msg=way)

  def test_regularization_added_by_a_custom_getter(self):
    # The same term, added by a custom getter each time it is asked for w.
    # get_variable clears the name scope while the getter runs, so the
    # term's ops are named outside tower 1's scope (mul_1, not
    # tower_1/mul): the check must still pair them with tower 0's.
    def l2_getter(getter, *args, **kwargs):
      variable = getter(*args, **kwargs)
      tf1.losses.add_loss(0.5 * tf.nn.l2_loss(variable),
                          tf1.GraphKeys.REGULARIZATION_LOSSES)
      return variable

    def model_fn(features, labels, mode):
      with tf1.variable_scope('net', custom_getter=l2_getter):
        w = _weights()
      tf1.losses.mean_squared_error(labels, tf.matmul(features['x'], w))
      loss = tf1.losses.get_total_loss()
      return _sgd_spec(mode, loss)

    with self.assertRaisesRegex(
        ValueError,
        r'The loss of tower 1 of 2 counts the regularization loss '
        r'mul_1:0, which its model_fn call added to REGULARIZATION_LOSSES '
        r"again as tower 0's call added mul:0.*apply it 2 times"):
      _train_estimator(model_fn, mt.cpus(2),
                       tower_build=replicate.TowerBuild.CALL_PER_TOWER)
    with self.assertRaisesRegex(
        ValueError, r'mul_1:0.*every tower adds its loss unscaled under '
        r'Reduction.SUM: the step would apply it 2 times'):
      _train_estimator(model_fn, mt.cpus(2),
                       loss_reduction=tf1.losses.Reduction.SUM)
    _train_estimator(model_fn, mt.cpus(2))  # copies count it once

  def test_tower_optimizer_wrapped_twice(self):
    sgd = tf1.train.GradientDescentOptimizer(0.1)
    with self.assertRaisesRegex(TypeError, r'TowerOptimizer got a '
                                r'TowerOptimizer .*wrap the optimizer once'):
      replicate.TowerOptimizer(replicate.TowerOptimizer(sgd))
    optimizer = replicate.TowerOptimizer(
        lambda: replicate.TowerOptimizer(sgd))
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          TypeError, r'optimizer_fn given to TowerOptimizer returned a '
          r'TowerOptimizer'):
        optimizer.compute_gradients(tf.constant(1.))

  def test_replicated_refuses_optimizers_overriding_apply_gradients(self):
    # One apply_gradients call gets all 4 copies' gradients: the global norm
    # would be 2 = sqrt(4) times one device's.
    def model_fn(features, labels, mode):
      w = tf1.get_variable('w', [3, 1])
      loss = tf.reduce_mean(tf.square(tf.matmul(features['x'], w) - labels))
      train_op = replicate.TowerOptimizer(_ClipByGlobalNorm(0.1)).minimize(
          loss, tf1.train.get_global_step())
      return _spec(mode, loss, train_op)

    with self.assertRaisesRegex(
        ValueError, r'REPLICATED applies the gradients of every tower\'s '
        r'copies in one apply_gradients call .*\(_ClipByGlobalNorm\) '
        r'overrides apply_gradients'):
      _train_estimator(model_fn, mt.cpus(4),
                       variable_placement=replicate.VariablePlacement.REPLICATED)
    _train_estimator(
        model_fn, mt.cpus(4),
        variable_placement=replicate.VariablePlacement.CONSOLIDATION_DEVICE)

  def test_different_optimizer_calls(self):
    model_fn = _extra_optimizer_call_in(tower_id=0)
    with self.assertRaisesRegex(
        ValueError, r'made \[2, 1\] apply_gradients calls'):
      _build(model_fn, mt.cpus(2),
             tower_build=replicate.TowerBuild.CALL_PER_TOWER)
    # Copying tower 0 cannot honour a question asked after its gradients
    # were copied: a clear error instead of towers that silently agree.
    with self.assertRaisesRegex(
        errors.ContextError,
        r'get_tower_context\(\) was called after tower 0 was copied'):
      _build(model_fn, mt.cpus(2))

  def test_more_optimizer_calls_in_a_later_tower(self):
    model_fn = _extra_optimizer_call_in(tower_id=1)
    # Tower 1 applies for both towers: before this check it failed with an
    # IndexError looking up tower 0's second call.
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'tower 0 made 1 apply_gradients call\(s\) and tower 1 is making '
        r'call number 2'):
      _build(model_fn, mt.cpus(2),
             tower_build=replicate.TowerBuild.CALL_PER_TOWER)

  def test_different_optimizer_order(self):
    def model_fn(features, labels, mode):
      del labels
      w = tf1.get_variable('w', [3, 1])
      loss = tf.reduce_mean(tf.matmul(features['x'], w))
      sgd = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
      adam = replicate.TowerOptimizer(tf1.train.AdamOptimizer(0.1))
      first, second = (sgd, adam) if replicate.get_tower_context(
      ).tower_id == 0 else (adam, sgd)
      return _spec(mode, loss, tf.group(first.minimize(loss),
                                        second.minimize(loss)))

    with self.assertRaisesRegex(
        ValueError, "used optimizer 'GradientDescent' in tower 0 and 'Adam'"):
      _build(model_fn, mt.cpus(2))

  def test_unshared_variables(self):
    def model_fn(features, labels, mode):
      del labels
      w = tf.Variable(tf.ones([3, 1]), name='unshared')
      outputs = tf.matmul(features['x'], w)
      if mode == mt.PREDICT:
        return tf1.estimator.EstimatorSpec(mode, predictions=outputs)
      loss = tf.reduce_mean(outputs)
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
      return _spec(mode, loss, train_op)

    # Only towers built by their own model_fn call make new variables; the
    # message says why they are (copies share tower 0's, in every mode).
    for mode in (mt.TRAIN, mt.EVAL, mt.PREDICT):
      with self.assertRaisesRegex(
          ValueError,
          r"Tower 1 created trainable variables \['tower_1/unshared'\] "
          r"instead of reusing tower 0's, .* because tower_build is "
          r'TowerBuild.CALL_PER_TOWER; .*a Keras layer object or tf.Variable '
          r'created inside model_fn makes new ones on every call'):
        _build(model_fn, mt.cpus(2), mode=mode,
               tower_build=replicate.TowerBuild.CALL_PER_TOWER)
      _build(model_fn, mt.cpus(2), mode=mode)  # copied: shared

  def test_unshared_variables_with_slots(self):
    # Adam's slots of the new variables are written by the step's update,
    # which is checked first: the error still names the variables.
    def model_fn(features, labels, mode):
      del labels
      w = tf.Variable(tf.ones([3, 1]), name='unshared')
      loss = tf.reduce_mean(tf.matmul(features['x'], w))
      train_op = replicate.TowerOptimizer(
          tf1.train.AdamOptimizer(0.1)).minimize(loss)
      return _spec(mode, loss, train_op)

    with self.assertRaisesRegex(
        ValueError,
        r"Tower 1 created trainable variables \['tower_1/unshared'\] "
        r"instead of reusing tower 0's"):
      _build(model_fn, mt.cpus(2),
             tower_build=replicate.TowerBuild.CALL_PER_TOWER)

  def test_unshared_variables_in_a_fallback(self):
    def model_fn(features, labels, mode):
      del labels
      replicate.get_tower_context()
      w = tf.Variable(tf.ones([3, 1]), name='unshared')
      loss = tf.reduce_mean(tf.matmul(features['x'], w))
      return _spec(mode, loss)

    with self.assertRaisesRegex(
        ValueError,
        r"Tower 1 created trainable variables \['tower_1/unshared'\] .* "
        r'because model_fn calls replicate.get_tower_context\(\)'):
      _build(model_fn, mt.cpus(2), mode=mt.EVAL)

  def test_variables_named_anew_on_every_call(self):
    # A layer object made inside model_fn (Keras' SequenceFeatures) names
    # its variables anew on every call: tower 1's call, reusing tower 0's
    # variables, asks for `w_1`, which TF says "does not exist ... reuse".
    # The error says why the towers are calls and what to do.
    calls = []

    def model_fn(features, labels, mode):
      del labels
      calls.append(mode)
      w = tf1.get_variable('w_{}'.format(len(calls) - 1), [3, 1])
      loss = tf.reduce_mean(tf.matmul(features['x'], w))
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
      return _spec(mode, loss, train_op)

    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'Tower 1 of 2 asked for a variable tower 0 did not create '
        r'\(Variable w_1 does not exist.*\)\. Towers are built here by '
        r'calling model_fn once per tower, because tower_build is '
        r'TowerBuild.CALL_PER_TOWER; .*SequenceFeatures'):
      _train_estimator(model_fn, mt.cpus(2),
                       tower_build=replicate.TowerBuild.CALL_PER_TOWER)
    del calls[:]
    _train_estimator(model_fn, mt.cpus(2))  # copied: one call

  def test_different_metrics(self):
    def model_fn(features, labels, mode):
      del labels
      loss = tf.reduce_mean(features['x'])
      metrics = {'mean': tf1.metrics.mean(features['x'])}
      if replicate.get_tower_context().tower_id == 1:
        metrics = {'total': tf1.metrics.mean(features['x'])}
      return _spec(mode, loss, eval_metric_ops=metrics)

    with self.assertRaisesRegex(
        ValueError, r"same eval_metric_ops, but tower 0 returned keys \['mean'\] "
        r"and tower 1 returned \['total'\]"):
      _build(model_fn, mt.cpus(2), mode=mt.EVAL)

  def test_different_metric_variables(self):
    def model_fn(features, labels, mode):
      del labels
      loss = tf.reduce_mean(features['x'])
      if replicate.get_tower_context().tower_id == 1:
        metric = tf1.metrics.mean_tensor(features['x'])  # 2 variables, shaped
      else:
        metric = tf1.metrics.mean(features['x'])
      return _spec(mode, loss, eval_metric_ops={'m': metric})

    with self.assertRaisesRegex(ValueError, 'does not match'):
      _build(model_fn, mt.cpus(2), mode=mt.EVAL)

  def test_model_fn_returns_wrong_type(self):
    with self.assertRaisesRegex(TypeError, 'must return a '
                                'tf.estimator.EstimatorSpec'):
      _build(lambda features, labels, mode: features, mt.cpus(2))

  def test_labels_without_labels_argument(self):
    def model_fn(features, mode):
      return _spec(mode, tf.reduce_mean(features['x']))

    with self.assertRaisesRegex(ValueError, 'model_fn takes no `labels`'):
      _build(model_fn, mt.cpus(2), labels=np.zeros([8], np.float32), mode=mt.EVAL)

  def test_params_without_params_argument(self):
    # The Estimator refuses params that its model_fn cannot take; it sees
    # the wrapper's signature, which takes them, so the wrapper says so.
    def model_fn(features, labels, mode):
      return _linear_model_fn(features, labels, mode)

    def input_fn():
      return tf.data.Dataset.from_tensors(
          ({'x': np.arange(24, dtype=np.float32).reshape(8, 3)},
           np.zeros([8], np.float32)))

    messages = []
    for wrapped in (model_fn, replicate.replicate_model_fn(
        model_fn, devices=mt.cpus(2))):
      with self.assertRaisesRegex(ValueError, 'does not include params '
                                  'argument, but params') as caught:
        estimator = tf1.estimator.Estimator(
            wrapped, model_dir=self.get_temp_dir(), params={'batch_size': 8},
            config=tf1.estimator.RunConfig(session_config=tf1.ConfigProto(
                device_count={'CPU': 2})))
        estimator.train(input_fn, steps=1)
      messages.append(str(caught.exception))
    self.assertIn("params ({'batch_size': 8}) is passed to Estimator.",
                  messages[1])


class PerRowLossTest(tf.test.TestCase, parameterized.TestCase):
  """A loss of one value per row handed to TowerOptimizer."""

  def _train(self, loss_reduction):
    x = np.arange(30, dtype=np.float32).reshape(10, 3) / 30.
    y = np.linspace(-1., 1., 10).astype(np.float32)[:, None]

    def model_fn(features, labels, mode):
      per_row = tf.square(tf1.layers.dense(
          features['x'], 1, kernel_initializer=tf1.ones_initializer()) -
                          labels)[:, 0]  # shape [None]
      train_op = replicate.TowerOptimizer(
          tf1.train.GradientDescentOptimizer(0.01)).minimize(
              per_row, tf1.train.get_global_step())
      return _spec(mode, tf.reduce_mean(per_row), train_op)

    estimator = tf1.estimator.Estimator(
        replicate.replicate_model_fn(model_fn, devices=mt.cpus(4),
                                     loss_reduction=loss_reduction),
        model_dir=self.get_temp_dir() + '/' + str(loss_reduction),
        config=tf1.estimator.RunConfig(
            session_config=replicate.testing.virtual_cpu_config(4)))
    estimator.train(lambda: tf1.data.Dataset.from_tensor_slices(
        ({'x': x}, y)).batch(10), steps=1)
    return estimator.get_variable_value('dense/kernel')

  def test_per_row_loss_under_a_mean_is_refused(self):
    # TF differentiates the [None] loss as its sum; each tower's would be
    # weighted as a mean over its rows (3/10, 3/10, 2/10, 2/10): a step of
    # about 1/4 of one device's, silently before.
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'TowerOptimizer got the loss \S+ of shape \[None\]: a value per '
        r'row.*about 1/4 of one device.*Reduction\.SUM'):
      self._train(tf1.losses.Reduction.MEAN)

  def test_per_row_loss_under_sum_trains(self):
    # A sum over the rows: each tower's sum, unscaled, adds up to one
    # device's.
    self.assertTrue(np.all(np.isfinite(self._train(
        tf1.losses.Reduction.SUM))))


if __name__ == '__main__':
  tf.test.main()

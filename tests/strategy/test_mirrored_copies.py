"""ReplicaBuild.CLONE (opt-in): MirroredStrategy replicas 1..3 as copies of
replica 0, or an error saying why not (strategy/mirrored_copies.py,
strategy/replica_loop.py)."""
import contextlib

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.cross_tower import values

NUM = 4
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)
GLOBAL = 8  # rows per step; 2 per replica
STEPS = 3
CLONE = replicate.ReplicaBuild.CLONE
PER_REPLICA = replicate.ReplicaBuild.CALL_PER_REPLICA
# Every row distinct (replica i reads rows 2i, 2i+1 of each batch), and so
# is every initial weight: a copy reading another replica's rows or another
# layer's variable changes the numbers.
_ROWS = np.random.RandomState(1).uniform(-1, 1, (GLOBAL * STEPS, 4)).astype(
    np.float32)
_LABELS = np.sin(_ROWS.sum(axis=1, keepdims=True) * 3.0).astype(np.float32)
_INITIAL = [np.random.RandomState(10 + i).uniform(-0.8, 0.8, (4, 4)).astype(
    np.float32) for i in range(3)]


@contextlib.contextmanager
def _nothing():
  yield


def _optimizer(name):
  if name == 'sgd':
    return tf1.train.GradientDescentOptimizer(0.1)
  return tf1.train.MomentumOptimizer(0.1, 0.9)


def _model(features):
  """Three tanh layers with [4, 4] kernels, then a sum: predictions [n, 1]."""
  h = features
  for i, initial in enumerate(_INITIAL):
    w = tf1.get_variable('w{}'.format(i), initializer=initial)
    h = tf.tanh(tf.matmul(h, w))
  return tf.reduce_sum(h, axis=1, keepdims=True)


def _step_fn(kind, optimizer_name, replicas):
  """The step of each kind; its loss is scaled to the global batch."""

  def step(inputs):
    features, labels = inputs
    context = replicate.get_replica_context()
    if kind == 'id_first':
      # Asked before any merge_call: every replica is called.
      features = features * (1.0 + 0.0 * context.replica_id_in_sync_group)
    total = tf.constant(0.0)
    if kind == 'two_merges':
      # First merge: every replica gets the sum of all features.
      total = context.all_reduce(replicate.ReduceOp.SUM,
                                 tf.reduce_sum(features))
    loss = tf.reduce_sum(tf.square(_model(features) - labels)) / GLOBAL
    with tf1.variable_scope('', reuse=True):
      w0 = tf1.get_variable('w0')
    # A term through the first merge's result: the penalty weighs sum(w0^2)
    # by the batch's feature total, split over replicas so that they add up.
    loss += 1e-3 * total * tf.reduce_sum(tf.square(w0)) / replicas
    optimizer = _optimizer(optimizer_name)
    if replicas > 1:
      optimizer = replicate.TowerOptimizer(optimizer)
    train_op = optimizer.minimize(loss)  # A merge_call in the middle.
    with tf.control_dependencies([train_op]):
      # After the merge: this replica's copy of w0, updated.
      after = tf.reduce_sum(tf.identity(w0))
    outputs = {'loss': loss, 'after': after, 'total': total}
    if kind == 'id_late':
      # Asked after the first merge_call.
      outputs['scaled'] = loss * float(context.replica_id_in_sync_group + 1)
    return train_op, outputs

  return step


def _train(build, kind='plain', optimizer_name='sgd'):
  """Per step: each replica's outputs; then the weights and op count."""
  with tf.Graph().as_default() as graph:
    dataset = tf.data.Dataset.from_tensor_slices(
        (_ROWS, _LABELS)).batch(GLOBAL, drop_remainder=True)
    if build is None:  # One device.
      inputs = tf1.data.make_one_shot_iterator(dataset).get_next()
      with tf1.device('/cpu:0'):
        train_op, outputs = _step_fn(kind, optimizer_name, 1)(inputs)
      outputs = {k: [v] for k, v in outputs.items()}
      variables = tf1.global_variables()
    else:
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
      with strategy.scope():
        inputs = strategy.experimental_distribute_dataset(
            dataset).make_one_shot_iterator().get_next()
        train_op, outputs = strategy.run(
            _step_fn(kind, optimizer_name, NUM), args=(inputs,))
        train_op = strategy.group(train_op)
        outputs = {k: list(strategy.experimental_local_results(v))
                   for k, v in outputs.items()}
      variables = tf1.global_variables()
    ops = len(graph.get_operations())
    with tf1.Session(config=CONFIG) as sess:
      sess.run(tf1.global_variables_initializer())
      steps = [sess.run([train_op, outputs])[1] for _ in range(STEPS)]
      weights = {v.name: sess.run(v) for v in variables
                 if v.name in ('w0:0', 'w1:0', 'w2:0')}
  return steps, weights, ops


class ReplicaCopiesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.product(kind=['plain', 'two_merges'],
                         optimizer_name=['sgd', 'momentum'])
  def test_copies_equal_calls_and_one_device(self, kind, optimizer_name):
    cloned, cloned_weights, cloned_ops = _train(CLONE, kind, optimizer_name)
    called, called_weights, called_ops = _train(PER_REPLICA, kind,
                                                optimizer_name)
    single, single_weights, _ = _train(None, kind, optimizer_name)
    self.assertEqual(sorted(single_weights), sorted(cloned_weights))
    for name, value in single_weights.items():
      self.assertAllClose(value, cloned_weights[name], rtol=1e-5, atol=1e-6)
      self.assertAllClose(called_weights[name], cloned_weights[name],
                          rtol=1e-6, atol=1e-7)
      self.assertGreater(np.abs(value - _INITIAL[int(name[1])]).max(), 1e-3)
    for step in range(STEPS):
      for key in ('loss', 'after', 'total'):
        self.assertAllClose(called[step][key], cloned[step][key], rtol=1e-6)
      # The replicas' losses add up to the one device's; each replica reads
      # the updated w0 and (two merges) the batch's whole feature sum.
      self.assertAllClose(single[step]['loss'][0],
                          sum(cloned[step]['loss']), rtol=1e-5)
      self.assertAllClose(single[step]['after'] * NUM,
                          cloned[step]['after'], rtol=1e-5)
      self.assertAllClose(single[step]['total'] * NUM,
                          cloned[step]['total'], rtol=1e-5)
      # Distinct rows: the replicas' losses differ.
      self.assertGreater(np.ptp(cloned[step]['loss']), 1e-4)
    # The copies are about as many ops as the calls build: fewer of the ops
    # no result needs (a gradient `tuple`'s unread identities), which are not
    # copied; more NoOps, the `group` of each merge's copies (one per device
    # and one over them).
    self.assertBetween(cloned_ops, 0.8 * called_ops, 1.06 * called_ops)

  @parameterized.parameters('id_first', 'id_late')
  def test_asking_the_replica_id_is_an_error(self, kind):
    # Copies would build what replica 0 built; the ask raises where it is
    # made, before (id_first) or after (id_late) the optimizer's merge.
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'ReplicaBuild.CLONE\) copies replica 0 onto the other replicas, '
        r'but the replica function asked which replica it builds '
        r'\(replica_id_in_sync_group\).*replica_build=replicate.ReplicaBuild'
        r'.CALL_PER_REPLICA \(the default\)'):
      _train(CLONE, kind, 'momentum')
    # The default calls the function per replica: the same weights as one
    # device.
    _, called_weights, _ = _train(PER_REPLICA, kind, 'momentum')
    _, single_weights, _ = _train(None, kind, 'momentum')
    for name, value in single_weights.items():
      self.assertAllClose(value, called_weights[name], rtol=1e-5, atol=1e-6)

  def test_asking_the_devices_is_an_error(self):
    def fn():
      return tf.constant(float(len(replicate.get_replica_context().devices)))

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  r'asked which replica it builds \(devices'):
        strategy.run(fn)

  def test_python_state_is_an_error(self):
    # A seed drawn from numpy.random (Keras's backend.dropout without one)
    # and a py_func of a closure: each call makes its own, copies cannot.
    def dropout():
      return tf1.keras.backend.dropout(tf.ones([4]), 0.5)

    def closure():
      calls = []
      return tf1.numpy_function(lambda: np.float32(len(calls)), [],
                                tf.float32)

    for fn, words in ((dropout, r'drew numbers from Python\'s random '
                       r'generators .* random op \S*dropout'),
                      (closure, r'built the PyFunc op \S+ calling .*lambda')):
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
        with self.assertRaisesRegex(
            errors.InvalidArgumentError,
            r'copies replica 0 onto the other replicas, but the replica '
            r'function ' + words):
          strategy.run(fn)
      with tf.Graph().as_default():  # the default: a call per replica
        replicate.MirroredStrategy(DEVICES).run(fn)

  def test_merge_handing_out_python_values_is_an_error(self):
    # The merge hands replica i the Python number i + 1; the function
    # scales its value by it after the merge. Copies cannot follow: replica
    # i must be called. Expected with calls: replica i returns 10 * (i + 1).
    def fn():
      def merge_fn(strategy):
        del strategy
        return values.PerReplica({d: i + 1 for i, d in enumerate(DEVICES)})
      factor = replicate.get_replica_context().merge_call(merge_fn)
      return tf.constant(10.0) * factor

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'but a merge_call handed the replicas values that differ other '
          r'than as tensors of one shape \(1 and 2\).*CALL_PER_REPLICA'):
        strategy.run(fn)
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES)
      result = strategy.run(fn)
      with tf1.Session(config=CONFIG) as sess:
        self.assertAllClose([10., 20., 30., 40.], sess.run(list(
            strategy.experimental_local_results(result))))

  def test_building_inside_a_graph_function_is_an_error(self):
    # Known before anything is built: replica 0 is not called.
    calls = []

    def fn():
      calls.append(1)
      return tf.constant(1.0)

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)

      @tf.function(autograph=False)  # TF 1.15's would wrap the error.
      def step():
        return strategy.run(fn)

      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'but the replicas are built inside a graph function or loop '
          r'body.*CALL_PER_REPLICA'):
        step.get_concrete_function()
    self.assertEqual([], calls)

  @parameterized.parameters(False, True)
  def test_summaries_are_an_error(self, writer_inside):
    # Replica 0 alone records: copies of its summary ops would record in
    # every replica. A writer around the call is known before replica 0
    # runs; one entered inside shows in what replica 0 built.
    with tf.Graph().as_default():
      writer = tf.compat.v2.summary.create_file_writer(self.get_temp_dir())

      def fn():
        with writer.as_default() if writer_inside else _nothing():
          return tf.compat.v2.summary.write('a', 1.0, step=0)

      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      with tf.compat.v2.summary.record_if(True), (
          _nothing() if writer_inside else writer.as_default()):
        with self.assertRaisesRegex(
            errors.InvalidArgumentError,
            'but a TF 2-style summary writer is in effect: replica 0 alone '
            'records.*CALL_PER_REPLICA'):
          strategy.run(fn)

  def test_tf1_summaries_are_an_error(self):
    # Calls make replica_1/loss, ... beside replica 0's `loss` and add each
    # to SUMMARIES; copies would repeat the tag `loss` and add none.
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)

      def fn():
        return tf1.summary.scalar('loss', tf.constant(1.0))

      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'the function makes a tf.compat.v1.summary op \(loss\): each '
          r'call tags.*CALL_PER_REPLICA'):
        strategy.run(fn)

  def test_tf1_summaries_of_calls_are_tagged_per_replica(self):
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES,
                                            replica_build=PER_REPLICA)
      strategy.run(lambda: tf1.summary.scalar('loss', tf.constant(1.0)))
      self.assertLen(tf1.get_collection(tf1.GraphKeys.SUMMARIES),
                     len(DEVICES))

  def test_variable_created_after_a_merge(self):
    # After an all-reduce of [1, 2, 3, 4] (sum 10), each replica creates
    # (replica 0) or takes (calls) v and returns sum(v * x_i) * 10 with
    # x_i = i. Copy i of v is set to [[i + 1, 2 (i + 1)]] (each replica must
    # read its own): replica i gives 3 (i + 1) * i * 10 = 30 i (i + 1).
    def fn(x):
      total = replicate.get_replica_context().all_reduce(
          replicate.ReduceOp.SUM, x + 1.0)
      v = tf1.get_variable('v', initializer=[[1.0, 2.0]])
      return tf.reduce_sum(v * x) * tf.reduce_sum(total)

    got = {}
    for build in (CLONE, PER_REPLICA):
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        with strategy.scope():
          x = values.PerReplica({d: tf.constant([[float(i)]])
                                 for i, d in enumerate(DEVICES)})
          result = strategy.run(fn, args=(x,))
        with tf1.Session(config=CONFIG) as sess:
          sess.run(tf1.global_variables_initializer())
          v, = tf1.global_variables()
          for i, copy in enumerate(v.values):
            copy.load([[i + 1.0, 2.0 * (i + 1)]], sess)
          got[build] = sess.run(list(
              strategy.experimental_local_results(result)))
    self.assertAllClose([0., 60., 180., 360.], got[CLONE])
    self.assertAllClose(got[PER_REPLICA], got[CLONE])

  def test_copies_are_named_and_placed_per_replica(self):
    with tf.Graph().as_default() as graph:
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      with strategy.scope():
        w = tf1.get_variable('w', initializer=[[1.0, 2.0]])

        def fn(x):
          return tf.reduce_sum(w * x)
        x = values.PerReplica({d: tf.constant([[float(i)]])
                               for i, d in enumerate(DEVICES)})
        result = strategy.run(fn, args=(x,))
      copies = [op for op in graph.get_operations()
                if op.name.startswith('replica_3/')]
      self.assertTrue(copies)
      # (A resource read may have none: TF places it by its variable's.)
      self.assertEqual({'/device:CPU:3'}, set(
          op.device[op.device.index('/device:'):] for op in copies
          if op.device))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        # Replica i: sum([1, 2] * i) = 3i, from its own copy of w.
        self.assertAllClose([0., 3., 6., 9.], sess.run(list(
            strategy.experimental_local_results(result))))

  def test_replica_build_must_be_the_enum(self):
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'replica_build must be a ReplicaBuild'):
      replicate.MirroredStrategy(DEVICES, replica_build='clone')


class SharedMergeValueTest(tf.test.TestCase, parameterized.TestCase):
  """A merge_call that hands every replica one value which replica 0 also
  holds as its own (its copy of a mirrored variable, its input): every call
  reads that value, where copies would read their replica's own. CLONE
  refuses; before, copy i read its own silently."""

  def _run(self, build, handed):
    """Every replica's sum of what the merge handed it, over 2 steps."""
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
      with strategy.scope():
        v = tf1.get_variable('v', initializer=[1.0, 2.0, 3.0],
                             use_resource=True)

        def fn(x):
          def merge_fn(strategy, x):
            if handed == 'updates':
              # The tuple of every copy's update result (resource variables
              # read after their update), the same tuple for every replica.
              return strategy.extended.update(
                  v, lambda copy: copy.assign_add(tf.ones([3])),
                  group=False)
            return strategy.experimental_local_results(x)[0]
          return tf.reduce_sum(
              replicate.get_replica_context().merge_call(merge_fn,
                                                         args=(x,)))
        x = values.PerReplica({d: tf.constant([10.0 * (i + 1)])
                               for i, d in enumerate(DEVICES)})
        result = list(strategy.experimental_local_results(
            strategy.run(fn, args=(x,))))
      with tf1.Session(config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        return [sess.run(result) for _ in range(2)]

  @parameterized.parameters(
      # Step 1: each of the 4 copies is [2, 3, 4] (9); step 2 [3, 4, 5].
      ('updates', r'\(v:0\), which copies of replica 0 would take for replica '
       r"0's own and read replica 1's in its place \(v/replica_1:0\)",
       [[36.0] * NUM, [48.0] * NUM]),
      # Replica 0's input, [10], in every replica.
      ('first_input', r'\(Const:0\), which copies .* \(Const_1:0\)',
       [[10.0] * NUM] * 2))
  def test_one_value_for_every_replica_is_an_error(self, handed, words,
                                                   expected):
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'but a merge_call handed the replicas one value for every replica '
        + words + r'.*CALL_PER_REPLICA'):
      self._run(CLONE, handed)
    self.assertAllEqual(expected, self._run(PER_REPLICA, handed))


if __name__ == '__main__':
  tf.test.main()

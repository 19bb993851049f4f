"""ReplicaBuild.CLONE: which per-replica inputs and merge shares copies of
replica 0 can read in place of replica 0's, and which they must refuse
(graph_copy/copy_policy.py `reason_inputs_differ`,
strategy/mirrored_copies.py `map_shares`)."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.cross_tower import values

NUM = 2
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)
CLONE = replicate.ReplicaBuild.CLONE
_FIX = r'.*replica_build=replicate.ReplicaBuild.CALL_PER_REPLICA'


def _per_replica(*leaves):
  return values.PerReplica(dict(zip(DEVICES, leaves)))


def _differing_inputs(kind):
  """Arguments whose replica 1 share differs from replica 0's by `kind`, and
  the clause of the refusal."""
  if kind == 'dtype':
    # Same shape and values; only the dtype differs.
    return (_per_replica(tf.constant([1., 2.], tf.float32),
                         tf.constant([1., 2.], tf.float64)),
            r'the input tensors differ in shape or dtype between devices')
  if kind == 'structure':
    # One leaf in replica 0, two in replica 1.
    return (_per_replica((tf.constant([1.]),),
                         (tf.constant([1.]), tf.constant([2.]))),
            r'the arguments differ in structure between devices')
  if kind == 'python':
    return (_per_replica(1, 2),
            r'the arguments differ between devices in a value that is not '
            r'a tensor \(1 and 2\)')
  assert kind == 'tensor_and_python'
  return (_per_replica(tf.constant(1.), 1.),
          r'the arguments differ between devices in a value that is not '
          r'a tensor')


def _fn_of_inputs(calls):
  def fn(x):
    calls.append(1)
    return tf.reduce_sum(tf.cast(tf.concat(
        [tf.reshape(tf.cast(leaf, tf.float64), [-1])
         for leaf in tf.nest.flatten(x)], 0), tf.float32))
  return fn


class CloneInputsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters('dtype', 'structure', 'python',
                            'tensor_and_python')
  def test_inputs_that_differ_are_refused_before_any_call(self, kind):
    calls = []
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      x, clause = _differing_inputs(kind)
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'copies replica 0 onto the other replicas, but ' + clause + _FIX):
        strategy.run(_fn_of_inputs(calls), args=(x,))
    self.assertEqual([], calls)
    # The default build calls the function per replica, on its own share.
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES)
      x, _ = _differing_inputs(kind)
      result = strategy.run(_fn_of_inputs(calls), args=(x,))
      with tf1.Session(config=CONFIG) as sess:
        local = sess.run(list(strategy.experimental_local_results(result)))
    self.assertEqual([1, 1], calls)
    # dtype: 1 + 2 both; structure: 1, then 1 + 2; python: 1, 2;
    # tensor_and_python: 1, 1.
    expected = {'dtype': [3., 3.], 'structure': [1., 3.],
                'python': [1., 2.], 'tensor_and_python': [1., 1.]}[kind]
    self.assertAllEqual(expected, local)

  def test_copies_read_each_replicas_inputs(self):
    # Tensors of one dtype and shape, equal Python values and ops differ
    # between the replicas' arguments as copies can follow: the function is
    # called once and replica i reads its own rows.
    # x_i = [[1, 2], [3, 4]] + 10 i, scaled by the Python factor 3 (equal in
    # both, an int and a float): sums 30 and 30 + 10 * 4 * 3 = 150.
    calls = []

    def fn(x, factor, ready):
      calls.append(1)
      with tf.control_dependencies([ready]):
        return tf.reduce_sum(x * factor)

    rows = [np.array([[1., 2.], [3., 4.]], np.float32) + 10. * i
            for i in range(NUM)]
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      x = _per_replica(*[tf.constant(r) for r in rows])
      factor = _per_replica(3, 3.0)
      ready = _per_replica(tf.no_op(name='ready_0'), tf.no_op(name='ready_1'))
      result = strategy.run(fn, args=(x, factor, ready))
      with tf1.Session(config=CONFIG) as sess:
        local = sess.run(list(strategy.experimental_local_results(result)))
    self.assertEqual([1], calls)
    self.assertAllEqual([30., 150.], local)

  def test_copies_read_each_replicas_indexed_slices_share(self):
    # A merge_call hands each replica its own IndexedSlices (distinct values
    # and indices); replica 0's ops are copied, and the copies must read
    # replica 1's share. Densified to 3 rows of 2:
    #   replica 0: row 0 = [1, 2];   sum of row-weighted values
    #   replica 1: row 2 = [5, 7].
    # The function returns sum(dense * [[1], [10], [100]]): 3 and 1200.
    def fn():
      def merge_fn(strategy):
        del strategy
        return _per_replica(
            tf.IndexedSlices(tf.constant([[1., 2.]]), tf.constant([0]),
                             tf.constant([3, 2])),
            tf.IndexedSlices(tf.constant([[5., 7.]]), tf.constant([2]),
                             tf.constant([3, 2])))
      share = replicate.get_replica_context().merge_call(merge_fn)
      dense = tf.math.unsorted_segment_sum(share.values, share.indices, 3)
      return tf.reduce_sum(dense * tf.constant([[1.], [10.], [100.]]))

    for build in (CLONE, None):
      with tf.Graph().as_default():
        strategy = (replicate.MirroredStrategy(DEVICES) if build is None else
                    replicate.MirroredStrategy(DEVICES, replica_build=build))
        result = strategy.run(fn)
        with tf1.Session(config=CONFIG) as sess:
          local = sess.run(list(strategy.experimental_local_results(result)))
      self.assertAllEqual([3., 1200.], local, msg=str(build))

  def test_merge_shares_of_another_dtype_are_refused(self):
    # Tensors of one shape but two dtypes: a copy of replica 0's ops cannot
    # read replica 1's share.
    def fn():
      def merge_fn(strategy):
        del strategy
        return _per_replica(tf.constant([1., 2.], tf.float32),
                            tf.constant([1., 2.], tf.float64))
      share = replicate.get_replica_context().merge_call(merge_fn)
      return tf.reduce_sum(tf.cast(share, tf.float32))

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'but a merge_call handed the replicas values that differ other '
          r'than as tensors of one shape' + _FIX):
        strategy.run(fn)

  def test_copies_wait_for_their_own_share(self):
    # A control dependency on replica 0's share is one on replica 1's share
    # in replica 1's copy, as a call per replica would build it.
    def fn():
      def merge_fn(strategy):
        del strategy
        shares = []
        for i, device in enumerate(DEVICES):
          with tf.device(device):
            shares.append(tf.identity(tf.constant(float(i)),
                                      name='share_{}'.format(i)))
        return _per_replica(*shares)
      share = replicate.get_replica_context().merge_call(merge_fn)
      with tf.control_dependencies([share]):
        return tf.constant(1.0, name='after_share')

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      result = strategy.run(fn)
      local = strategy.experimental_local_results(result)
    for i, out in enumerate(local):
      self.assertEqual(['share_{}'.format(i)],
                       [op.name for op in out.op.control_inputs])


class CloneReplicaLoopTest(tf.test.TestCase):
  """CLONE with one device, and the copies' UPDATE_OPS (replica_loop.py)."""

  def test_clone_with_one_device_copies_nothing_and_refuses_nothing(self):
    # With one device there is no replica to copy: CLONE builds the one
    # replica by its call, so asking the replica id (which a copied run
    # refuses) is fine and gives 0: 5 + 0 = 5.
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES[:1], replica_build=CLONE)

      def fn():
        context = replicate.get_replica_context()
        return tf.constant(5.0) + float(context.replica_id_in_sync_group)
      result = strategy.run(fn)
      with tf1.Session(config=CONFIG) as sess:
        self.assertAllEqual([5.0], sess.run(list(
            strategy.experimental_local_results(result))))

  def test_clone_adds_each_replicas_update_ops(self):
    # Replica i (x = i + 1) adds 10 x to UPDATE_OPS, as a batch
    # normalization adds its moving-statistics updates. Called per replica
    # there are two entries, [10, 20]; copied, replica 1's copy of replica
    # 0's entry must be added too, reading its own x.
    def fn(x):
      update = tf.multiply(x, 10.0, name='update')
      tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, update)
      return x

    for build in (replicate.ReplicaBuild.CALL_PER_REPLICA, CLONE):
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        strategy.run(fn, args=(_per_replica(tf.constant(1.0),
                                            tf.constant(2.0)),))
        updates = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        self.assertLen(updates, NUM, build)
        with tf1.Session(config=CONFIG) as sess:
          self.assertAllEqual([10.0, 20.0], sorted(sess.run(updates)),
                              msg=build)


  def test_clone_adds_each_replicas_losses_in_call_order(self):
    # Each replica adds a tf.compat.v1.losses loss, merges (an all-reduce),
    # and adds a second one. Calls add, before each merge, replica 0's
    # entry, then replica 1's: with x = 1, 2, the losses
    # (x - 3)^2 = [4, 1] and then (2x - 3)^2 = [1, 1]. Copies must add
    # theirs there too, each reading its own x; before, LOSSES held replica
    # 0's two entries alone.
    def fn(x):
      tf1.losses.mean_squared_error([[3.0]], [[x]])
      total = replicate.get_replica_context().all_reduce(
          replicate.ReduceOp.SUM, x)  # 3
      tf1.losses.mean_squared_error([[total]], [[2.0 * x]])
      return x

    got = {}
    for build in (replicate.ReplicaBuild.CALL_PER_REPLICA, CLONE):
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        strategy.run(fn, args=(_per_replica(tf.constant(1.0),
                                            tf.constant(2.0)),))
        losses = tf1.losses.get_losses()
        self.assertLen(losses, 2 * NUM, build)
        self.assertEqual(
            [0, 1] * 2,
            [tf.DeviceSpec.from_string(t.device).device_index
             for t in losses], build)
        with tf1.Session(config=CONFIG) as sess:
          got[build] = sess.run(losses)
    self.assertAllEqual([4.0, 1.0, 1.0, 1.0], got[CLONE])
    self.assertAllEqual(got[replicate.ReplicaBuild.CALL_PER_REPLICA],
                        got[CLONE])


def _fn_of_shape(calls):
  def fn(x):
    calls.append(1)
    # Replica 0's static shape baked in: its rows, times its columns.
    rows, columns = x.shape.as_list()
    return tf.reduce_sum(x) * float(rows * columns)
  return fn


class CloneInputShapesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('rows', [[1., 2.]], [[1., 2.], [3., 4.]]),
      ('columns', [[1., 2.]], [[1., 2., 3.]]))
  def test_inputs_of_another_static_shape_are_refused(self, first, second):
    calls = []
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(
          DEVICES, replica_build=replicate.ReplicaBuild.CLONE)
      x = _per_replica(tf.constant(first), tf.constant(second))
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          # The whole sentence: the reason, what copies must equal, the fix.
          r'copies replica 0 onto the other replicas, but the input tensors '
          r'differ in shape or dtype between devices \(.*\): copies cannot '
          r'be shown to do what calling the replica function once per '
          r'replica does\. Remove that reason, or pass replica_build='
          r'replicate\.ReplicaBuild\.CALL_PER_REPLICA \(the default\) to '
          r'MirroredStrategy\.'):
        strategy.run(_fn_of_shape(calls), args=(x,))
    self.assertEqual([], calls)
    # Called per replica, each reads its own shape: sum(x) * size(x).
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES)
      x = _per_replica(tf.constant(first), tf.constant(second))
      result = strategy.run(_fn_of_shape(calls), args=(x,))
      with tf1.Session(config=CONFIG) as sess:
        local = sess.run(list(strategy.experimental_local_results(result)))
    self.assertEqual([1, 1], calls)
    size = lambda v: len(v) * len(v[0])
    self.assertAllEqual(
        [sum(map(sum, first)) * size(first),
         sum(map(sum, second)) * size(second)], local)


class CloneInputValuesTest(tf.test.TestCase):

  def test_numpy_arrays_that_differ_are_refused(self):
    # `a == b` of two arrays is an array, whose truth is ambiguous: they
    # cannot be shown equal. A copy of replica 0 would add [1, 2] in
    # replica 1 too (sums 3 and 3 where replica 1's own call gives 7).
    calls = []

    def fn(offset):
      calls.append(1)
      return tf.reduce_sum(tf.constant(offset))

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(
          DEVICES, replica_build=replicate.ReplicaBuild.CLONE)
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'copies replica 0 onto the other replicas, but the arguments '
          r'differ between devices in a value that is not a tensor'):
        strategy.run(fn, args=(_per_replica(np.array([1., 2.]),
                                            np.array([3., 4.])),))
    self.assertEqual([], calls)

  def test_tensors_of_unknown_rank_are_copied(self):
    # Both of unknown rank: nothing baked in that differs; the function is
    # called once and replica i sums its own value: 1 + 2 = 3, 10.
    calls = []

    def fn(x):
      calls.append(1)
      return tf.reduce_sum(x)

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(
          DEVICES, replica_build=replicate.ReplicaBuild.CLONE)
      first = tf1.placeholder(tf.float32, shape=None)
      second = tf1.placeholder(tf.float32, shape=None)
      result = strategy.run(fn, args=(_per_replica(first, second),))
      with tf1.Session(config=CONFIG) as sess:
        local = sess.run(list(strategy.experimental_local_results(result)),
                         {first: [1., 2.], second: [[10.]]})
    self.assertEqual([1], calls)
    self.assertAllEqual([3., 10.], local)


if __name__ == '__main__':
  tf.test.main()

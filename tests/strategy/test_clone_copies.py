"""ReplicaBuild.CLONE against calls per replica (strategy/mirrored_copies.py):
ops pinned off the replica's device, sparse results and inputs, the dense
shapes of IndexedSlices shares, a writer around the call, merge shares of
two shapes, and values the function looks up by its device scope."""
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.cross_tower import values

# Two replicas on CPU:0 and CPU:1; CPU:2 is nobody's replica device.
DEVICES = testing.virtual_cpu_devices(3)[:2]
CONFIG = testing.virtual_cpu_config(3)
PINNED = '/device:CPU:2'
CLONE = replicate.ReplicaBuild.CLONE
PER_REPLICA = replicate.ReplicaBuild.CALL_PER_REPLICA


def _per_replica(*leaves):
  return values.PerReplica(dict(zip(DEVICES, leaves)))


class CloneCopiesTest(tf.test.TestCase):

  def test_op_pinned_off_the_replica_device_stays_there(self):
    # An op under tf.device(CPU:2) inside the function goes to CPU:2 in every
    # replica when called per replica; replica 1's copy must go there too,
    # not to replica 1's device.
    def fn(x):
      with tf.device(PINNED):
        doubled = tf.multiply(x, 2.0, name='pinned')
      return doubled + 1.0

    for build in (PER_REPLICA, CLONE):
      with tf.Graph().as_default() as graph:
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        # Replica i reads [i + 3]: 2 (i + 3) + 1 = 7, 9.
        x = _per_replica(tf.constant([3.0]), tf.constant([4.0]))
        result = strategy.run(fn, args=(x,))
        pinned = [op for op in graph.get_operations()
                  if op.name.endswith('pinned')]
        self.assertLen(pinned, 2, (build, [op.name for op in pinned]))
        for op in pinned:
          self.assertIn('CPU:2', op.device, (build, op.name, op.device))
        with tf1.Session(config=CONFIG) as sess:
          self.assertAllEqual([[7.0], [9.0]], sess.run(list(
              strategy.experimental_local_results(result))))

  def test_sparse_results_are_each_replicas_own(self):
    # Replica i (x = i + 1) returns a SparseTensor whose indices, values and
    # dense_shape each depend on x by separate ops:
    #   indices [[x]], values [10 x], dense_shape [x + 5]
    # replica 0: [[1]], [10], [6]; replica 1: [[2]], [20], [7].
    def fn(x):
      return tf.SparseTensor(indices=tf.reshape(x, [1, 1]),
                             values=tf.cast(x, tf.float32) * 10.0,
                             dense_shape=x + 5)

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      x = _per_replica(tf.constant([1], tf.int64), tf.constant([2], tf.int64))
      result = strategy.run(fn, args=(x,))
      local = strategy.experimental_local_results(result)
      with tf1.Session(config=CONFIG) as sess:
        got = sess.run([(s.indices, s.values, s.dense_shape) for s in local])
    self.assertAllEqual([[1]], got[0][0])
    self.assertAllEqual([10.0], got[0][1])
    self.assertAllEqual([6], got[0][2])
    self.assertAllEqual([[2]], got[1][0])
    self.assertAllEqual([20.0], got[1][1])
    self.assertAllEqual([7], got[1][2])

  def test_writer_around_the_call_is_refused_before_any_call(self):
    # A TF 2-style writer in effect around the call is known before replica
    # 0 runs: the function is never called.
    calls = []

    def fn():
      calls.append(1)
      return tf.compat.v2.summary.write('a', 1.0, step=0)

    with tf.Graph().as_default():
      writer = tf.compat.v2.summary.create_file_writer(self.get_temp_dir())
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      with tf.compat.v2.summary.record_if(True), writer.as_default():
        with self.assertRaisesRegex(
            errors.InvalidArgumentError,
            'but a TF 2-style summary writer is in effect'):
          strategy.run(fn)
    self.assertEqual([], calls)

  def test_merge_shares_of_another_shape_are_refused(self):
    # One dtype, two shapes ([2] and [3]): a copy of replica 0's ops, built
    # for a [2] share, cannot read replica 1's [3] share.
    def fn():
      def merge_fn(strategy):
        del strategy
        return _per_replica(tf.constant([1., 2.]), tf.constant([1., 2., 3.]))
      share = replicate.get_replica_context().merge_call(merge_fn)
      return tf.reduce_sum(share)

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=CLONE)
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'but a merge_call handed the replicas values that differ other '
          r'than as tensors of one shape'):
        strategy.run(fn)

  def test_copies_read_each_replicas_indexed_slices_dense_shape(self):
    # A merge_call hands replica 0 IndexedSlices of dense shape [3, 2] and
    # replica 1 ones of dense shape [4, 2]. Each replica returns its
    # share's dense_shape times 1: [3, 2] and [4, 2], as calls give.
    def fn():
      def merge_fn(strategy):
        del strategy
        return _per_replica(
            tf.IndexedSlices(tf.constant([[1., 2.]]), tf.constant([0]),
                             tf.constant([3, 2])),
            tf.IndexedSlices(tf.constant([[5., 7.]]), tf.constant([2]),
                             tf.constant([4, 2])))
      share = replicate.get_replica_context().merge_call(merge_fn)
      return share.dense_shape * 1

    for build in (PER_REPLICA, CLONE):
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        result = strategy.run(fn)
        with tf1.Session(config=CONFIG) as sess:
          local = sess.run(list(strategy.experimental_local_results(result)))
      self.assertAllEqual([[3, 2], [4, 2]], local, msg=str(build))

  def test_copies_read_each_replicas_sparse_input(self):
    # Replica 0 reads a SparseTensor holding 1 and 2, replica 1 one holding
    # 30 and 40 (same indices and dense shape): each returns its own sum,
    # 3 and 70, copied as called.
    def fn(x):
      return tf1.sparse_reduce_sum(x)

    for build in (PER_REPLICA, CLONE):
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        x = _per_replica(*[
            tf.SparseTensor(tf.constant([[0, 0], [1, 1]], tf.int64),
                            tf.constant(v), tf.constant([2, 2], tf.int64))
            for v in ([1., 2.], [30., 40.])])
        result = strategy.run(fn, args=(x,))
        with tf1.Session(config=CONFIG) as sess:
          local = sess.run(list(strategy.experimental_local_results(result)))
      self.assertAllEqual([3., 70.], local, msg=str(build))


class ScopeLookupTest(tf.test.TestCase):
  """A distributed value the function closes over, read by its device scope
  (`get()` with no device, a `Mirrored` as a tensor), is each replica's own
  in a call: so must it be in a copy."""

  def _local_results(self, build, make_fn):
    """Each replica's result of `make_fn()`'s function (built in the graph)."""
    with tf.Graph().as_default():
      fn = make_fn()
      strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
      result = strategy.run(fn)
      with tf1.Session(config=CONFIG) as sess:
        return sess.run(list(strategy.experimental_local_results(result)))

  def test_per_device_get_reads_each_replicas_value(self):
    # Replica 0's value is [1, 2], replica 1's [30, 40]; the function returns
    # 2 * get() + sum(get()): replica 0 [2, 4] + 3 = [5, 7], replica 1
    # [60, 80] + 70 = [130, 150]. A copy reading replica 0's value would give
    # [5, 7] twice.
    def build_fn():
      per_device = _per_replica(tf.constant([1., 2.]), tf.constant([30., 40.]))

      def fn():
        return 2.0 * per_device.get() + tf.reduce_sum(per_device.get())
      return fn

    for build in (PER_REPLICA, CLONE):
      self.assertAllEqual([[5., 7.], [130., 150.]],
                          self._local_results(build, build_fn), msg=str(build))

  def test_mirrored_as_a_tensor_reads_each_replicas_copy(self):
    # tf.identity(mirrored) takes the copy on the replica's device: replica
    # 1's op must read replica 1's copy (3.0 on CPU:1), not replica 0's.
    for build in (PER_REPLICA, CLONE):
      with tf.Graph().as_default() as graph:
        copies = {}
        for device in DEVICES:
          with tf.device(device):
            copies[device] = tf.constant(3.0, name='copy')
        mirrored = values.Mirrored(copies)
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        result = strategy.run(lambda: tf.identity(mirrored, name='read') * 2.)
        reads = sorted((op for op in graph.get_operations()
                        if op.name.endswith('read')), key=lambda op: op.name)
        self.assertEqual([copies[DEVICES[0]].name, copies[DEVICES[1]].name],
                         [op.inputs[0].name for op in reads], msg=str(build))
        with tf1.Session(config=CONFIG) as sess:
          self.assertAllEqual([6., 6.], sess.run(list(
              strategy.experimental_local_results(result))))

  def test_lookup_pinned_off_the_replica_device_is_the_same_everywhere(self):
    # Inside tf.device(CPU:2) every replica's call reads CPU:2's value (5),
    # so both replicas return 5 + 1 = 6 under both builds.
    def build_fn():
      per_device = values.PerDevice({
          DEVICES[0]: tf.constant(1.0), DEVICES[1]: tf.constant(2.0),
          PINNED: tf.constant(5.0)})

      def fn():
        with tf.device(PINNED):
          value = per_device.get()
        return value + 1.0
      return fn

    for build in (PER_REPLICA, CLONE):
      self.assertAllEqual([6., 6.], self._local_results(build, build_fn),
                          msg=str(build))

  def test_python_values_per_device_are_refused(self):
    # Replica 0 would build with 2, replica 1 with 3: a copy of replica 0's
    # ops cannot stand for replica 1's call.
    per_device = _per_replica(2, 3)

    def build_fn():
      return lambda: tf.constant(1.0) * per_device.get()

    self.assertAllEqual([2., 3.], self._local_results(PER_REPLICA, build_fn))
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'but the replica function read, by its device scope, per-device '
        r'values that differ other than as tensors of one shape \(2 and '
        r'3\)'):
      self._local_results(CLONE, build_fn)


if __name__ == '__main__':
  tf.test.main()

"""ReplicaBuild.CLONE: more merge shares and per-call collection entries
(strategy/mirrored_copies.py `map_shares`, strategy/replica_loop.py
`_Copies._collect_copies`)."""
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.cross_tower import values

NUM = 3
DEVICES = testing.virtual_cpu_devices(NUM)
CONFIG = testing.virtual_cpu_config(NUM)
CLONE = replicate.ReplicaBuild.CLONE
PER_REPLICA = replicate.ReplicaBuild.CALL_PER_REPLICA


def _per_replica(*leaves):
  return values.PerReplica(dict(zip(DEVICES, leaves)))


class CloneMergeSharesTest(tf.test.TestCase):

  def test_a_shared_leaf_before_per_replica_ones(self):
    # The merge hands every replica one constant (100, made by the merge)
    # and then each replica its own tensor, x_i * 2 with x_i = 10 (i + 1),
    # made by the merge: replica i returns 100 + 20 (i + 1) = 120, 140, 160.
    # The shared leaf comes first: the replica's own share after it must
    # still be followed by its copy.
    def fn(x):
      def merge_fn(strategy, x):
        shared = tf.constant(100.0, name='shared')
        own = _per_replica(*[tf.identity(t) * 2.0 for t in
                             strategy.experimental_local_results(x)])
        return shared, own
      shared, own = replicate.get_replica_context().merge_call(
          merge_fn, args=(x,))
      return shared + own

    for build in (PER_REPLICA, CLONE):
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        x = _per_replica(*[tf.constant(10.0 * (i + 1)) for i in range(NUM)])
        result = strategy.run(fn, args=(x,))
        with tf1.Session(config=CONFIG) as sess:
          local = sess.run(list(strategy.experimental_local_results(result)))
      self.assertAllEqual([120.0, 140.0, 160.0], local, msg=build)

  def test_one_op_of_replica_0_for_every_replica_is_an_error(self):
    # The merge hands every replica replica 0's own op (`ready` of replica
    # 0): every call waits for that op, where copies of replica 0 would wait
    # for their own replica's in its place. CLONE refuses, as for a tensor.
    def fn(x):
      ready = tf.identity(x, name='ready').op

      def merge_fn(strategy, ready):
        return strategy.experimental_local_results(ready)[0]
      handed = replicate.get_replica_context().merge_call(
          merge_fn, args=(ready,))
      with tf.control_dependencies([handed]):
        return tf.identity(x)

    def run(build):
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        x = _per_replica(*[tf.constant(float(i)) for i in range(NUM)])
        result = strategy.run(fn, args=(x,))
        with tf1.Session(config=CONFIG) as sess:
          return sess.run(list(strategy.experimental_local_results(result)))

    self.assertAllEqual([0.0, 1.0, 2.0], run(PER_REPLICA))
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'a merge_call handed the replicas one value for every replica '
        r'\(ready\), which copies of replica 0 would take for replica 0\'s '
        r'own and read replica 1\'s in its place \(replica_1/ready\)'):
      run(CLONE)

  def test_two_losses_per_sync_point_in_replica_order(self):
    # Each call adds two tf.compat.v1.losses losses before its end: calls
    # add replica 0's two, then replica 1's two, then replica 2's. Copies
    # must add theirs in that order: replica after replica, not loss after
    # loss. With x_i = i + 1: (x - 3)^2 and (2x - 3)^2 per replica:
    # [4, 1], [1, 1], [0, 9].
    def fn(x):
      tf1.losses.mean_squared_error([[3.0]], [[x]])
      tf1.losses.mean_squared_error([[3.0]], [[2.0 * x]])
      return x

    got = {}
    for build in (PER_REPLICA, CLONE):
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)
        strategy.run(fn, args=(_per_replica(
            *[tf.constant(float(i + 1)) for i in range(NUM)]),))
        losses = tf1.losses.get_losses()
        self.assertEqual(
            [0, 0, 1, 1, 2, 2],
            [tf.DeviceSpec.from_string(t.device).device_index
             for t in losses], build)
        with tf1.Session(config=CONFIG) as sess:
          got[build] = sess.run(losses)
    self.assertAllEqual([4.0, 1.0, 1.0, 1.0, 0.0, 9.0], got[CLONE])
    self.assertAllEqual(got[PER_REPLICA], got[CLONE])


  def test_a_loss_made_before_the_run_is_added_by_every_replica(self):
    # The function adds a tensor made outside it (5) to LOSSES: each call
    # adds it again, 3 entries and a total of 15. Before, copies added it
    # once (its copy is itself): 1 entry, 5.
    for build in (PER_REPLICA, CLONE):
      with tf.Graph().as_default():
        outside = tf.constant(5.0, name='outside_term')
        strategy = replicate.MirroredStrategy(DEVICES, replica_build=build)

        def fn():
          tf1.losses.add_loss(outside)
          return tf.constant(1.0)
        strategy.run(fn)
        self.assertEqual(['outside_term:0'] * NUM,
                         [t.name for t in tf1.losses.get_losses()], build)
        with tf1.Session(config=CONFIG) as sess:
          self.assertEqual(15.0, sess.run(tf1.losses.get_total_loss(
              add_regularization_losses=False)), build)


if __name__ == '__main__':
  tf.test.main()

"""A local graph run by a session on a `tf.train.Server`.

The library's devices name no job, as TF's graph-mode canonical strings (and
contrib's) do, so a server's session places them on its own task. With
`/job:localhost` in them (before 2026-11-28), TF 1.15 refused to run the
graph there: "Cannot assign a device ... explicitly assigned to
/job:localhost/...", for a cross-tower reduction and for a
`MirroredStrategy`'s variables alike.
"""
import tensorflow as tf

import replicate
from replicate._compat import tf1

_DEVICES = ['/cpu:0', '/cpu:1']


class ServerSessionTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.config = tf1.ConfigProto(device_count={'CPU': 2})
    cls.server = tf1.train.Server.create_local_server(config=cls.config)

  def _run(self, fetches, init=False):
    with tf1.Session(self.server.target, config=self.config) as sess:
      if init:
        sess.run(tf1.global_variables_initializer())
      return sess.run(fetches)

  def test_reduction_built_outside_any_device_scope(self):
    with tf.Graph().as_default():
      with tf1.device('/cpu:0'):
        a = tf.constant([1., 2.])
      with tf1.device('/cpu:1'):
        b = tf.constant([3., 5.])
      total = replicate.ReductionToOneDeviceCrossTowerOps().reduce(
          replicate.ReduceOp.SUM, replicate.PerDevice({'/cpu:0': a,
                                                       '/cpu:1': b}),
          destinations=_DEVICES)
      self.assertEqual(('/replica:0/task:0/device:CPU:0',
                        '/replica:0/task:0/device:CPU:1'), total.devices)
      results = self._run(list(total.values))
    # [1, 2] + [3, 5] on each destination.
    for result in results:
      self.assertAllEqual([4., 7.], result)

  def test_mirrored_strategy_variables_and_reduce(self):
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(_DEVICES)
      with strategy.scope():
        v = tf1.get_variable('v', initializer=[1., 2.])

        def step():
          ctx = replicate.get_replica_context()
          # Replica r multiplies by r + 2: [2, 4] and [3, 6].
          return v * tf.cast(ctx.replica_id_in_sync_group + 2, tf.float32)

        per_replica = strategy.extended.call_for_each_replica(step)
        total = strategy.reduce(replicate.ReduceOp.SUM, per_replica,
                                axis=None)
      result = self._run(total, init=True)
    self.assertAllEqual([5., 10.], result)


if __name__ == '__main__':
  tf.test.main()

"""What `MirroredStrategy.run` does per replica: calls of the function, their
Python side effects, and seeded random ops (strategy/replica_loop.py,
strategy/mirrored_copies.py)."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1
from replicate.cross_tower import values

CLONE = replicate.ReplicaBuild.CLONE
PER_REPLICA = replicate.ReplicaBuild.CALL_PER_REPLICA
_DROPOUT_SIZE = 64


def _random_fn():
  """A uniform draw and a dropout mask, seeded by the graph's seed only."""
  uniform = tf.random.uniform([5])
  # rate 0.5: each kept entry of the ones is scaled to 1 / (1 - 0.5) = 2.
  mask = tf1.nn.dropout(tf.ones([_DROPOUT_SIZE]), rate=0.5)
  return uniform, mask


def _draw(num, build, graph_seed=7, fn=_random_fn, runs=1):
  """Each replica's draws, per session run, in a fresh graph."""
  devices = testing.virtual_cpu_devices(num)
  with tf.Graph().as_default():
    if graph_seed is not None:
      tf1.set_random_seed(graph_seed)
    if build is None:
      strategy = replicate.MirroredStrategy(devices)
    else:
      strategy = replicate.MirroredStrategy(devices, replica_build=build)
    with strategy.scope():
      result = strategy.run(fn)
    local = [list(strategy.experimental_local_results(r)) for r in result]
    with tf1.Session(config=testing.virtual_cpu_config(num)) as sess:
      return [sess.run(local) for _ in range(runs)]


class RandomOpsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.product(num=[2, 4], build=[None, PER_REPLICA, CLONE])
  def test_replicas_draw_their_own_numbers_repeatably(self, num, build):
    first = _draw(num, build, runs=2)
    again = _draw(num, build, runs=2)
    for (uniform, mask), (uniform_again, mask_again) in zip(first, again):
      # The same graph and graph seed: the same numbers, run after run.
      self.assertAllEqual(uniform, uniform_again)
      self.assertAllEqual(mask, mask_again)
      for i in range(num):
        self.assertTrue(set(np.unique(mask[i])) <= {0.0, 2.0})
        for j in range(i):
          # Every replica draws its own numbers: no two uniform draws are
          # equal and (64 coin flips each) no two dropout masks.
          self.assertFalse(np.any(uniform[i] == uniform[j]), (i, j))
          self.assertFalse(np.array_equal(mask[i], mask[j]), (i, j))
    # A stateful random op draws anew on each session run.
    self.assertFalse(np.any(first[0][0][0] == first[1][0][0]))

  @parameterized.parameters(2, 4)
  def test_replica_0_draws_as_with_calls(self, num):
    # Copying builds replica 0 by the same call as calling per replica.
    (cloned_uniform, cloned_mask), = _draw(num, CLONE)
    (called_uniform, called_mask), = _draw(num, PER_REPLICA)
    self.assertAllEqual(called_uniform[0], cloned_uniform[0])
    self.assertAllEqual(called_mask[0], cloned_mask[0])

  def test_op_level_seed_draws_the_same_numbers_per_call(self):
    # tf.random.uniform(seed=5) without a graph seed: every call of the
    # function gets the op seed 5, so every replica draws the same numbers
    # (as in TF's MirroredStrategy).
    def fn():
      return tf.random.uniform([5], seed=5)
    (uniform,), = _draw(4, None, graph_seed=None, fn=lambda: (fn(),))
    for i in range(1, 4):
      self.assertAllEqual(uniform[0], uniform[i])

  def test_op_level_seed_copies_draw_as_calls(self):
    # Without a graph seed, copies keep the op seed 5 as every call does:
    # every replica draws the numbers the calls draw.
    def fn():
      return (tf.random.uniform([5], seed=5),)
    (cloned,), = _draw(4, CLONE, graph_seed=None, fn=fn)
    (called,), = _draw(4, PER_REPLICA, graph_seed=None, fn=fn)
    for i in range(4):
      self.assertAllEqual(called[i], cloned[i])
      self.assertAllEqual(cloned[0], cloned[i])

  def test_seeded_initializer_is_not_copied(self):
    # A variable's seeded initializer runs once (the variable is mirrored,
    # made by replica 0 with either build): copying does not refuse it.
    # Replica i returns sum(v) * (i + 1) from its copy of v, all equal.
    def fn(x):
      v = tf1.get_variable(
          'v', [3], initializer=tf1.random_uniform_initializer(seed=3))
      return (tf.reduce_sum(v) * x,)

    got = {}
    for build in (PER_REPLICA, CLONE):
      devices = testing.virtual_cpu_devices(2)
      with tf.Graph().as_default():
        strategy = replicate.MirroredStrategy(devices, replica_build=build)
        with strategy.scope():
          x = values.PerReplica({d: tf.constant(i + 1.0)
                                 for i, d in enumerate(devices)})
          result, = strategy.run(fn, args=(x,))
        with tf1.Session(config=testing.virtual_cpu_config(2)) as sess:
          sess.run(tf1.global_variables_initializer())
          got[build] = sess.run(list(
              strategy.experimental_local_results(result)))
    self.assertAllClose(got[PER_REPLICA][0] * 2, got[PER_REPLICA][1])
    self.assertAllClose(got[PER_REPLICA], got[CLONE], rtol=1e-6)


class CallsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters('run', 'experimental_run_v2',
                            'call_for_each_replica', 'experimental_run')
  def test_default_calls_fn_once_per_replica(self, how):
    # Python side effects happen per replica: call i (replica i) appends
    # its name scope and returns the Python number 10 * (i + 1).
    devices = testing.virtual_cpu_devices(4)
    calls = []

    def fn(*unused_inputs):
      calls.append(tf1.get_default_graph().get_name_scope() or '')
      return tf.constant(10.0 * len(calls))

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(devices)
      with strategy.scope():
        if how == 'experimental_run':
          iterator = strategy.make_dataset_iterator(
              tf.data.Dataset.range(8).batch(8))
          result = strategy.experimental_run(fn, iterator)
        elif how == 'call_for_each_replica':
          result = strategy.extended.call_for_each_replica(fn)
        else:
          result = getattr(strategy, how)(fn)
      with tf1.Session(config=testing.virtual_cpu_config(4)) as sess:
        if how == 'experimental_run':
          sess.run(iterator.initialize())
        got = sess.run(list(strategy.experimental_local_results(result)))
    self.assertEqual(['', 'replica_1', 'replica_2', 'replica_3'], calls)
    self.assertAllClose([10., 20., 30., 40.], got)

  def test_asking_the_replica_id(self):
    # Replica i returns 10 * i.
    calls = []

    def fn():
      replica_id = replicate.get_replica_context().replica_id_in_sync_group
      calls.append(replica_id)
      return tf.constant(10.0 * replica_id)

    devices = testing.virtual_cpu_devices(4)
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(devices)
      result = strategy.run(fn)
      with tf1.Session(config=testing.virtual_cpu_config(4)) as sess:
        got = sess.run(list(strategy.experimental_local_results(result)))
    self.assertEqual([0, 1, 2, 3], calls)
    self.assertAllClose([0., 10., 20., 30.], got)

  def test_copies_call_fn_once(self):
    # The opt-in copies: one call, for replica 0; its Python side effect
    # happens once.
    calls = []

    def fn():
      calls.append(1)
      return tf.constant(1.0)

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(
          testing.virtual_cpu_devices(4), replica_build=CLONE)
      strategy.run(fn)
    self.assertEqual([1], calls)

  def test_copies_refuse_inputs_of_different_shapes(self):
    # Known before anything is built: the function is not called.
    devices = testing.virtual_cpu_devices(2)
    calls = []

    def fn(x):
      calls.append(1)
      return x

    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(devices, replica_build=CLONE)
      x = values.PerReplica({devices[0]: tf.zeros([2]),
                             devices[1]: tf.zeros([3])})
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'copies replica 0 onto the other replicas, but the input tensors '
          r'differ in shape or dtype between devices.*replica_build='
          r'replicate.ReplicaBuild.CALL_PER_REPLICA'):
        strategy.run(fn, args=(x,))
    self.assertEqual([], calls)


if __name__ == '__main__':
  tf.test.main()

"""towers/replicated_variables.py: the session-start sync of the copies.

The hook fetches tower 0's values and runs the copies' initializers with
them fed: every target ends equal to its source, resource and reference
variables alike, on any device, and the graph gets no op of the sync.
"""
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.towers import replicated_variables

_NUM_CPUS = 3


def _pairs():
  """Five (source, target) pairs; sources 0 and 1 share an initial value.

  Source i holds [i + 1, -(i + 1)] once set; target i starts from an initial
  value of its own except targets 0 and 1, made from the same tensor as
  sources 0 and 1, as copies of one variable are.
  """
  shared = tf.constant([7.0, 7.0], name='shared_initial_value')
  pairs = []
  for i in range(5):
    resource = i % 2 == 0
    with tf1.device('/cpu:0'):
      source = tf1.get_variable(
          's{}'.format(i), initializer=shared if i < 2 else tf.constant(
              [0.0, 0.0]), use_resource=resource)
    with tf1.device('/cpu:{}'.format(i % _NUM_CPUS)):
      target = tf1.get_variable(
          't{}'.format(i), initializer=shared if i < 2 else tf.constant(
              [-5.0, 5.0]), use_resource=resource)
    pairs.append((source, target))
  return pairs


class SyncTest(tf.test.TestCase):

  def _run(self, max_bytes=None):
    graph = tf.Graph()
    with graph.as_default():
      pairs = _pairs()
      sets = [s.assign([i + 1.0, -(i + 1.0)]) for i, (s, _) in
              enumerate(pairs)]
      if max_bytes is None:
        hook = replicated_variables._SyncHook(pairs)  # pylint: disable=protected-access
      else:
        hook = replicated_variables._SyncHook.__new__(  # pylint: disable=protected-access
            replicated_variables._SyncHook)  # pylint: disable=protected-access
        hook._rounds = replicated_variables._sync_rounds(pairs, max_bytes)  # pylint: disable=protected-access
      init = tf1.global_variables_initializer()
      ops_before = len(graph.get_operations())
      graph.finalize()  # the hook may not add ops
      with tf1.Session(graph=graph, config=replicate.testing.virtual_cpu_config(
          _NUM_CPUS)) as session:
        session.run(init)
        session.run(sets)
        hook.after_create_session(session, None)
        got = session.run([t for _, t in pairs])
      self.assertLen(graph.get_operations(), ops_before)
    return hook, got

  def test_sets_every_target_from_its_source(self):
    hook, got = self._run()
    # Targets 0 and 1 are fed through one tensor with different values:
    # they cannot share a round.
    self.assertLen(hook._rounds, 2)  # pylint: disable=protected-access
    self.assertAllEqual([[i + 1, -(i + 1)] for i in range(5)], got)

  def test_rounds_hold_at_most_max_bytes(self):
    # 8 bytes a source, 16 a round: rounds of two sources (and targets 0 and
    # 1 apart): [s0, s2], [s1, s3], [s4].
    hook, got = self._run(max_bytes=16)
    self.assertEqual([[s.op.name for s in r.sources]
                      for r in hook._rounds],  # pylint: disable=protected-access
                     [['s0', 's2'], ['s1', 's3'], ['s4']])
    self.assertAllEqual([[i + 1, -(i + 1)] for i in range(5)], got)

  def test_refuses_a_target_not_set_by_an_assignment(self):
    with tf.Graph().as_default():
      source = tf1.get_variable('s', initializer=[1.0])

      class Target(object):
        initializer = tf.no_op(name='not_an_assign')
        op = initializer

      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'Cannot set the REPLICATED copy '
                                  'not_an_assign from s'):
        replicated_variables._SyncHook([(source, Target())])  # pylint: disable=protected-access


if __name__ == '__main__':
  tf.test.main()

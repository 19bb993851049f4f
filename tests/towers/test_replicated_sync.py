"""towers/replicated_variables.py: the session-start sync of the copies.

Each target variable is set from its source by an `assign` placed on the
target's device, resource and reference variables alike, all under one op.
"""
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.towers import replicated_variables

_NUM_CPUS = 3


class SyncTest(tf.test.TestCase):

  def test_sets_every_target_from_its_source_on_its_device(self):
    graph = tf.Graph()
    with graph.as_default():
      # Pair i: source [i, -i] on cpu:0, target zeros on cpu:(i % 3); the
      # last pair is of reference variables.
      pairs = []
      for i in range(4):
        resource = i < 3
        with tf1.device('/cpu:0'):
          source = tf1.get_variable('s{}'.format(i), initializer=[
              float(i), -float(i)], use_resource=resource)
        with tf1.device('/cpu:{}'.format(i % _NUM_CPUS)):
          target = tf1.get_variable('t{}'.format(i), initializer=[0.0, 0.0],
                                    use_resource=resource)
        pairs.append((source, target))
      with tf1.device('/cpu:2'), tf1.name_scope('outer'):
        sync = replicated_variables._assign_all(pairs, 'sync')  # pylint: disable=protected-access
      self.assertEqual('sync', sync.name)
      assigns = [op for op in graph.get_operations()
                 if op.type in ('AssignVariableOp', 'Assign') and
                 op.name.startswith('sync/')]
      self.assertEqual(
          ['/device:CPU:0', '/device:CPU:1', '/device:CPU:2',
           '/device:CPU:0'], [op.device for op in assigns])
      with tf1.Session(graph=graph, config=replicate.testing.virtual_cpu_config(
          _NUM_CPUS)) as session:
        session.run(tf1.global_variables_initializer())
        session.run(sync)
        self.assertAllEqual([[i, -i] for i in range(4)],
                            session.run([t for _, t in pairs]))


if __name__ == '__main__':
  tf.test.main()

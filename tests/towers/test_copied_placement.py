"""Where copied towers' ops run and what they wait for: as the towers'
own `model_fn` calls would put them (graph only)."""
from absl.testing import parameterized
import model_testing as mt
import tensorflow as tf

import replicate
from replicate._compat import tf1

CLONE = replicate.TowerBuild.CLONE
PER_TOWER = replicate.TowerBuild.CALL_PER_TOWER


def _model_fn(features, labels, mode, params):
  """Two tanh layers and a logit; SGD. Options in `params`: `pin` (an op
  under `tf.device` of a tensor's device), `wait` (a reported loss built
  after the optimizer, waiting for the logits), `colocate` and `gate`."""
  h = features['x']
  for i in range(2):
    h = tf1.layers.dense(
        h, 4, activation=tf.nn.tanh,
        kernel_initializer=tf1.glorot_uniform_initializer(seed=i),
        name='layer_{}'.format(i))
  if params.get('pin'):
    # "This tower's device": a call on tower i gets tower i's tensor's.
    with tf1.device(h.device):
      h = tf.identity(h * 2.0, name='pinned')
  logits = tf1.layers.dense(
      h, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=9),
      name='logits')
  loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.5)).minimize(
          loss, tf1.train.get_global_step(),
          gate_gradients=params.get('gate', 1),
          colocate_gradients_with_ops=params.get('colocate', False))
  if params.get('wait'):
    # Copied in a round after the gradients', where the logits were.
    with tf1.control_dependencies([logits.op]):
      loss = tf.identity(loss, name='reported')
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _build(num_towers, params, **kwargs):
  features, labels = mt.data(batch_size=8, num_features=3)
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    replicate.replicate_model_fn(
        _model_fn, devices=mt.cpus(num_towers), **kwargs)(
            {'x': tf.constant(features['x'])}, tf.constant(labels),
            tf1.estimator.ModeKeys.TRAIN, params)
  return graph


def _tower_ops(graph, tower_id):
  prefix = 'tower_{}/'.format(tower_id)
  return [op for op in graph.get_operations() if op.name.startswith(prefix)]


class CopiedPlacementTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters((False, 1, False), (False, 2, False),
                            (True, 1, False), (False, 1, True))
  def test_every_op_of_tower_i_asks_for_its_device(self, colocate, gate, pin):
    for tower_build in (CLONE, PER_TOWER):
      graph = _build(4, {'colocate': colocate, 'gate': gate, 'pin': pin},
                     tower_build=tower_build)
      for tower_id in (1, 2, 3):
        elsewhere = [(op.name, op.device)
                     for op in _tower_ops(graph, tower_id)
                     if op.type != 'ReadVariableOp' and
                     op.device != '/device:CPU:{}'.format(tower_id)]
        self.assertEqual([], elsewhere, tower_build)

  def test_replicated_ops_bound_to_a_variable_go_with_the_towers_own(self):
    # REPLICATED: an op of tower i that takes one of tower i's variable
    # copies runs where that copy is, never on tower 0's variable's device.
    graph = _build(4, {}, variable_placement=(
        replicate.VariablePlacement.REPLICATED))
    for tower_id in (1, 2, 3):
      bound = [op for op in _tower_ops(graph, tower_id)
               if op.type not in ('VarHandleOp', 'VariableV2', 'Assign',
                                  'AssignVariableOp') and
               '/Initializer/' not in op.name and
               any(t.dtype == tf.resource or t.dtype._is_ref_dtype  # pylint: disable=protected-access
                   for t in op.inputs)]
      self.assertNotEmpty(bound)
      elsewhere = [(op.name, op.device) for op in bound
                   if op.device not in ('', '/device:CPU:{}'.format(tower_id))]
      self.assertEqual([], elsewhere, tower_id)

  def test_a_later_round_waits_for_its_towers_copy(self):
    # Tower i's reported loss waits for tower i's logits, as in a call.
    def waits(tower_build):
      graph = _build(3, {'wait': True}, tower_build=tower_build)
      return [sorted(c.name for c in graph.get_operation_by_name(
          'tower_{}/reported'.format(i)).control_inputs) for i in (1, 2)]

    called = waits(PER_TOWER)
    self.assertEqual([['tower_1/logits/BiasAdd'], ['tower_2/logits/BiasAdd']],
                     called)
    self.assertEqual(called, waits(CLONE))


if __name__ == '__main__':
  tf.test.main()

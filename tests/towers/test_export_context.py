"""What `model_fn` sees when `replicate_model_fn` builds an export graph
(towers/serving.py): tower 0 of 1, on no device, with the Estimator's params,
as the unreplicated model_fn's export would."""
import model_testing as mt
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.towers import serving


class ExportContextTest(tf.test.TestCase):

  def _build(self, params):
    seen = []

    def model_fn(features, labels, mode, params):
      del labels
      context = replicate.get_tower_context()
      seen.append((context.tower_id, context.num_towers, context.device,
                   context.is_first_tower, context.is_last_tower, params))
      logits = tf.keras.layers.Dense(1)(features['x'])
      return tf1.estimator.EstimatorSpec(mode, predictions=logits)

    with tf.Graph().as_default() as graph:
      tf1.train.get_or_create_global_step()
      serving.build_for_export(
          model_fn, {'x': tf1.placeholder(tf.float32, [None, 3])}, None,
          mt.PREDICT, params, None, tf1.losses.Reduction.MEAN)
      # Outside the call, no tower is being built.
      self.assertIsNone(replicate.get_tower_context())
    return seen, graph

  def test_model_fn_sees_tower_0_of_1_on_no_device(self):
    seen, graph = self._build({'units': 7})
    # One call, as the unreplicated model: tower 0 of 1, device '' (unplaced:
    # the serving host chooses), first and last tower at once.
    self.assertEqual([(0, 1, '', True, True, {'units': 7})], seen)
    # And so nothing in the graph is pinned.
    self.assertEqual([], [op.name for op in graph.get_operations()
                          if op.device])

  def test_params_reach_model_fn_unchanged(self):
    params = {'units': 7, 'rate': [0.5, 0.25]}
    seen, _ = self._build(params)
    self.assertEqual(params, seen[0][-1])


if __name__ == '__main__':
  tf.test.main()

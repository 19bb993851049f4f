"""`tower_specs`: a tower's spec replaced without checking it all again, and
what merging the towers' specs refuses (metrics that are not pairs, export
outputs of two types, constant predictions whose rows differ)."""
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import EstimatorSpec
from replicate._compat import ModeKeys
from replicate._compat import PredictOutput
from replicate._compat import RegressionOutput
from replicate._compat import tf1
from replicate.towers import tower_specs


class ReplacedTest(tf.test.TestCase):

  def _spec(self):
    loss = tf.constant(2.0)
    metric = tf1.metrics.mean(loss)
    return EstimatorSpec(ModeKeys.EVAL, loss=loss,
                         eval_metric_ops={'mean': metric},
                         predictions={'p': tf.constant([1.0, 2.0])})

  def test_replaces_only_the_given_fields(self):
    with tf.Graph().as_default():
      spec = self._spec()
      loss = tf.constant(3.0)
      new = tower_specs.replaced(spec, loss=loss)
      self.assertIsInstance(new, EstimatorSpec)
      self.assertIs(new.loss, loss)
      for field in spec._fields:
        if field != 'loss':
          self.assertIs(getattr(new, field), getattr(spec, field), field)
      # What the constructor would have made of the same fields.
      self.assertEqual(tuple(new), tuple(spec._replace(loss=loss)))

  def test_does_not_check_the_other_fields_again(self):
    # The constructor checks that every tensor is of the default graph;
    # outside it, `_replace` refuses, and `replaced` does not look.
    with tf.Graph().as_default():
      spec = self._spec()
      loss = tf.constant(3.0)
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, 'default graph'):
        spec._replace(loss=loss)
      self.assertIs(tower_specs.replaced(spec, loss=loss).loss, loss)

  def test_unknown_field_is_refused(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, r"no fields \['los'\]"):
        tower_specs.replaced(self._spec(), los=tf.constant(3.0))


class MergeRefusalsTest(tf.test.TestCase):

  def test_metric_that_is_not_a_value_update_pair_is_refused(self):
    # Tower specs as the towers make them (their fields not checked again):
    # metric 'total' is one tensor, not (value, update_op); the merge needs
    # the update ops to reduce the towers' metric variables.
    with tf.Graph().as_default():
      specs = []
      for tower_id in range(2):
        loss = tf.constant(float(tower_id + 1))
        spec = EstimatorSpec(ModeKeys.EVAL, loss=loss)
        specs.append(tower_specs.replaced(
            spec, eval_metric_ops={'total': loss * 2.0}))
      with self.assertRaisesRegex(
          errors.InvalidTypeError,
          r"reduces metrics given as \(value_tensor, update_op\) pairs.*"
          r"metric 'total' is .*tf.compat.v1.metrics function"):
        tower_specs.eval_spec(specs, [[], []], '/cpu:0')

  def test_export_outputs_of_different_types_are_refused(self):
    # Tower 0 returns a PredictOutput under 'out', tower 1 a
    # RegressionOutput: nothing to concatenate them into.
    with tf.Graph().as_default():
      value = [tf.constant([[1.0], [2.0]]), tf.constant([[3.0], [4.0]])]
      outputs = [PredictOutput({'y': value[0]}), RegressionOutput(value[1])]
      specs = [EstimatorSpec(ModeKeys.PREDICT, predictions={'y': v},
                             export_outputs={'out': o})
               for v, o in zip(value, outputs)]
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r"same export_outputs, but 'out' is a PredictOutput in tower 0 and "
          r'a RegressionOutput in another tower'):
        tower_specs.predict_spec(specs, '/cpu:0')


class ConstantPredictionsTest(tf.test.TestCase):

  def test_constant_whose_first_rows_are_equal_is_refused(self):
    # A per-batch value of 4 entries, the first two equal (a vocabulary
    # starting with two paddings), on a tower of 4 rows (8 rows, 2 towers):
    # its rows are not all equal, so it is one value per batch, which the
    # concatenation would repeat: [8] where one device returns [4].
    def model_fn(features, mode):
      return EstimatorSpec(mode, predictions={
          'x': features['x'],
          'vocab': tf.constant(['pad', 'pad', 'neg', 'pos'])})

    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r"Predictions\['vocab'\] \(Const(_\d+)?:0\) is a constant that "
          r'does not depend on the features or labels, and its rows are not '
          r'all equal'):
        replicate.replicate_model_fn(
            model_fn, devices=replicate.testing.virtual_cpu_devices(2))(
                {'x': tf.zeros([8, 1])}, None, ModeKeys.PREDICT)


if __name__ == '__main__':
  tf.test.main()

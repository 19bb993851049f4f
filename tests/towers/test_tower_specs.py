"""`tower_specs.replaced`: a tower's spec without checking it all again."""
import tensorflow as tf

from replicate._compat import EstimatorSpec
from replicate._compat import ModeKeys
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


if __name__ == '__main__':
  tf.test.main()

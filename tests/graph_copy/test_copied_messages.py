"""A copied tower's failing assertion names the tower's own tensors.

`tf.debugging.assert_*` writes the names of the tensors it shows into its
message (`'x (split_inputs/split:3) = '`). A `model_fn` call per tower names
that tower's tensors; a copy of tower 0's assertion named tower 0's (its
shard `split:0`, its `mul:0`) above tower 3's values, which sends the reader
to the wrong tower.
"""
import re

from absl.testing import parameterized
import model_testing as mt
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

_ROWS = 8


@tf.function
def _checked_in_a_function(x):
  """Checks 2x < 3 inside a function: the message names its own `doubled`."""
  doubled = tf.multiply(x, 2., name='doubled')
  tf1.debugging.assert_less(doubled, 3., message='x too large')
  return x


def _model_fn(features, labels, mode, params):
  """Checks `features['id'] * 2 < 14` (int32), the float feature >= 0, or
  (in a `tf.function`) the float feature * 2 < 3."""
  if params['dtype'] == 'function':
    # An op of the tower with the name the function's op has in its body.
    outer = tf.multiply(features['x'], 1., name='doubled')
    check = tf.identity(_checked_in_a_function(outer)).op
  elif params['dtype'] == 'int32':
    doubled = features['id'] * 2
    check = tf1.debugging.assert_less(doubled, 14, message='id too large')
  else:
    check = tf1.debugging.assert_non_negative(features['x'],
                                              message='negative feature')
  with tf.control_dependencies([check]):
    x = tf.identity(features['x'])
  logits = tf1.layers.dense(
      x, 1, kernel_initializer=tf1.glorot_uniform_initializer(seed=1))
  loss = tf1.losses.mean_squared_error(labels, logits)
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(
          loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _failure(dtype, tower_build):
  """The names in the message of the assertion that fails on tower 3."""
  # Row 7 alone fails: id 7 (7 * 2 = 14 is not < 14), x[7] < 0, and
  # 2 * x[7, 0] = 2 * 1.6 >= 3 (row 6: 2 * 1.3 < 3). With 8 rows on 4
  # towers, row 7 is tower 3's second row.
  x = np.arange(_ROWS * 2, dtype=np.float32).reshape(_ROWS, 2) / 10.
  x[7] = [1.6, -1.]
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    # Not constants, as from an input pipeline: TF 2 checks a constant's
    # values when it builds the assertion.
    features = {
        'id': tf1.placeholder_with_default(np.arange(_ROWS, dtype=np.int32),
                                           [_ROWS]),
        'x': tf1.placeholder_with_default(x, [_ROWS, 2])}
    labels = tf.constant(
        np.linspace(-1., 1., _ROWS, dtype=np.float32)[:, None])
    spec = replicate.replicate_model_fn(
        _model_fn, devices=mt.cpus(4), tower_build=tower_build)(
            features, labels, mt.TRAIN, {'dtype': dtype})
    with tf1.Session(config=replicate.testing.virtual_cpu_config(4)) as sess:
      sess.run(tf1.global_variables_initializer())
      try:
        sess.run(spec.train_op)
      except tf.errors.InvalidArgumentError as e:
        # The message, once per name (the error's text repeats it).
        return sorted(set(re.findall(r'\(([^()\s]+:\d+)\) = ', str(e))))
  raise AssertionError('the assertion did not fail')


class CopiedAssertionMessageTest(tf.test.TestCase, parameterized.TestCase):

  def test_int_assertion_names_tower_3s_tensors(self):
    # Int32 data: the Assert op is in the graph itself, on every TF.
    per_tower = _failure('int32', replicate.TowerBuild.CALL_PER_TOWER)
    copied = _failure('int32', replicate.TowerBuild.CLONE)
    # x is tower 3's `mul` (its own op) and y the constant 14 of its call.
    self.assertEqual(['tower_3/assert_less/y:0', 'tower_3/mul:0'], per_tower)
    self.assertEqual(per_tower, copied)

  def test_float_assertion_names_tower_3s_shard(self):
    per_tower = _failure('float32', replicate.TowerBuild.CALL_PER_TOWER)
    copied = _failure('float32', replicate.TowerBuild.CLONE)
    self.assertLen(per_tower, 1)
    self.assertRegex(per_tower[0], r':3$')  # tower 3's shard of the batch
    # A float assertion is a cond; under v2 control flow its branch, a
    # function, holds the message, and each copy calls its own copy of it.
    self.assertEqual(per_tower, copied)

  def test_function_assertion_keeps_its_own_names(self):
    # A function's body names its own tensors, the same in every call; a
    # tower op of the same name must not make the copy rename them.
    per_tower = _failure('function', replicate.TowerBuild.CALL_PER_TOWER)
    copied = _failure('function', replicate.TowerBuild.CLONE)
    self.assertEqual(['assert_less/y:0', 'doubled:0'], per_tower)
    self.assertEqual(per_tower, copied)


if __name__ == '__main__':
  tf.test.main()

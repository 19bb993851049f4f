"""chief_broadcast's pieces called directly, in one process.

* `model_fingerprint` tells apart models whose variables differ only in
  shape or only in dtype (the broadcast and the gradients' all-reduce match
  values by position, so such tasks would silently mix values up).
* `broadcast_variables` over a group of two members in one graph (two
  virtual CPUs standing for two tasks; TF 1.15 needs a group of two or
  more), both given the same variables: the source's values come back
  bit-exact, int64 above 2**24 and float64 ones included (the wire format
  is float64); without a source, it fails naming the cause.
"""
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.cluster import chief_broadcast

_CPUS = ['/job:localhost/replica:0/task:0/device:CPU:%d' % i
         for i in range(2)]


def _fingerprint(make):
  with tf.Graph().as_default():
    make()
    return chief_broadcast.model_fingerprint(tf1.global_variables())


class FingerprintTest(tf.test.TestCase):

  def test_same_names_other_shapes_or_dtypes_differ(self):
    def model(shape, dtype):
      return lambda: tf1.get_variable('kernel', shape, dtype)

    base = _fingerprint(model([2, 3], tf.float32))
    self.assertEqual(base, _fingerprint(model([2, 3], tf.float32)))
    # Six elements either way: without the shape, [3, 2] would take the
    # chief's [2, 3] values reshaped.
    self.assertNotEqual(base, _fingerprint(model([3, 2], tf.float32)))
    self.assertNotEqual(base, _fingerprint(model([2, 3], tf.float64)))
    # Held exactly by a float64 (52 bits).
    self.assertLess(base, 2. ** 52)
    self.assertEqual(base, float(np.float64(base)))


class BroadcastTwoMembersTest(tf.test.TestCase):

  def _variables(self):
    # Values a float32 wire would change: 2**40 + 1 (int64), 1/3 (float64),
    # 2**24 + 1 (int32), next to an ordinary float32 matrix.
    return [
        tf1.get_variable('big_step', initializer=np.int64(2 ** 40 + 1)),
        tf1.get_variable('third', initializer=np.array([1. / 3, -2.5e-9],
                                                       np.float64)),
        tf1.get_variable('count', initializer=np.int32(2 ** 24 + 1)),
        tf1.get_variable('kernel', initializer=np.array(
            [[0.1, -0.2], [0.3, 0.7]], np.float32)),
    ]

  def test_source_values_come_back_exactly(self):
    with tf.Graph().as_default():
      variables = self._variables()
      before = [v.read_value() for v in variables]
      # Member 0 is the source; member 1 gives zeros (and its tower count).
      broadcast = [chief_broadcast.broadcast_variables(
          variables, i == 0, _CPUS[i], 2, towers=(i, 2)) for i in range(2)]
      config = replicate.testing.virtual_cpu_config(2)
      with tf1.Session(config=config) as session:
        session.run(tf1.global_variables_initializer())
        expected = session.run(before)
        session.run(broadcast)
        got = session.run(variables)
    for name, e, g in zip(['big_step', 'third', 'count', 'kernel'],
                          expected, got):
      self.assertEqual(e.dtype, g.dtype, name)
      self.assertAllEqual(e, g, msg=name)
    self.assertEqual(2 ** 40 + 1, got[0])

  def test_no_source_fails_naming_the_cause(self):
    # Nobody gives the fingerprint (the sum is 0): as if the chief built
    # another model.
    with tf.Graph().as_default():
      variables = self._variables()
      broadcast = [chief_broadcast.broadcast_variables(
          variables, False, _CPUS[i], 2, towers=(i, 2)) for i in range(2)]
      config = replicate.testing.virtual_cpu_config(2)
      with tf1.Session(config=config) as session:
        session.run(tf1.global_variables_initializer())
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError,
            r'The training tasks built different models.*\(4 variables, '
            r'first big_step\)'):
          session.run(broadcast)


if __name__ == '__main__':
  tf.test.main()

"""IndexedSlices of different dense shapes are never reduced into one.

Before: ReductionToOneDevice, AllReduce and MultiWorkerAllReduce concatenated
them and kept the first device's dense_shape, silently.
"""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import values

_DEVICES = [device_util.canonicalize('/cpu:%d' % i) for i in range(3)]
_CONFIG = tf1.ConfigProto(device_count={'CPU': 3})


def _ops(name):
  return {
      'one_device': replicate.ReductionToOneDeviceCrossTowerOps,
      'all_reduce': lambda: replicate.AllReduceCrossTowerOps(
          'hierarchical_copy'),
      'multi_worker': lambda: replicate.MultiWorkerAllReduce(
          ['/job:localhost/replica:0/task:0'], 0),
      'collective': replicate.CollectiveAllReduce,
  }[name]()


def _slices(dense_shapes):
  """PerDevice IndexedSlices, one row each, with these dense shapes."""
  index = {}
  for i, (device, shape) in enumerate(zip(_DEVICES, dense_shapes)):
    with tf.device(device):
      if shape is None or isinstance(shape, tf.Tensor):
        dense_shape = shape
      else:
        dense_shape = tf.constant(shape, tf.int64)
      index[device] = tf.IndexedSlices(
          tf.constant([[float(i + 1)]]), tf.constant([i], tf.int64),
          dense_shape)
  return values.PerDevice(index)


def _reduce(ops, method, value):
  if method == 'reduce':
    return ops.reduce(ReduceOp.SUM, value, value)
  dense = values.PerDevice({d: tf.constant([1.]) for d in _DEVICES})
  return ops.batch_reduce(ReduceOp.SUM, [(dense, dense), (value, value)])[1]


_ALL = [(name, method)
        for name in ('one_device', 'all_reduce', 'multi_worker', 'collective')
        for method in ('reduce', 'batch_reduce')]
_SPARSE = [p for p in _ALL if p[0] != 'collective']


class StaticDenseShapeTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(*_ALL)
  def test_known_shapes_that_differ_raise_when_built(self, name, method):
    with tf.Graph().as_default():
      value = _slices([[4, 1], [4, 1], [5, 1]])
      with self.assertRaisesRegex(
          errors.InvalidArgumentError,
          r'different dense_shape: \[4, 1\] on .*CPU:0 but \[5, 1\] on '
          r'.*CPU:2'):
        _reduce(_ops(name), method, value)

  @parameterized.parameters(*_SPARSE)
  def test_dense_value_against_slices_of_another_shape(self, name, method):
    with tf.Graph().as_default():
      index = dict(zip(_DEVICES, _slices([[4, 1]] * 3).values))
      with tf.device(_DEVICES[1]):
        index[_DEVICES[1]] = tf.zeros([6, 1])
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  r'\[4, 1\] on .*CPU:0 but \[6, 1\]'):
        _reduce(_ops(name), method, values.PerDevice(index))

  def test_collective_still_refuses_matching_slices(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(errors.InvalidArgumentError,
                                  'cannot reduce IndexedSlices'):
        _reduce(_ops('collective'), 'reduce', _slices([[4, 1]] * 3))


class RuntimeDenseShapeTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(*_SPARSE)
  def test_shapes_known_at_run_time_are_asserted(self, name, method):
    with tf.Graph().as_default():
      fed = tf1.placeholder(tf.int64, [None])
      result = _reduce(_ops(name), method, _slices([[4, 1], fed, [4, 1]]))
      reduced = tf.convert_to_tensor(result.values[0])
      with tf1.Session(config=_CONFIG) as sess:
        self.assertAllClose([[1.], [2.], [3.], [0.]],
                            sess.run(reduced, {fed: [4, 1]}))
        for wrong in ([5, 1], [4, 1, 1]):
          with self.assertRaisesRegex(
              tf.errors.InvalidArgumentError,
              r'different dense_shape: \[{}\] on .*CPU:1 but \[4, 1\] on '
              r'.*CPU:0'.format(', '.join(str(d) for d in wrong))):
            sess.run(result.values[0].values, {fed: wrong})

  def test_no_assertion_where_shapes_are_known(self):
    with tf.Graph().as_default() as graph:
      _reduce(_ops('one_device'), 'reduce', _slices([[4, 1]] * 3))
      self.assertEmpty([op for op in graph.get_operations()
                        if op.type == 'Assert'])

  def test_slices_without_dense_shape_are_not_checked(self):
    with tf.Graph().as_default():
      result = _reduce(_ops('one_device'), 'reduce',
                       _slices([None, None, None]))
      with tf1.Session(config=_CONFIG) as sess:
        self.assertAllClose(np.array([[1.], [2.], [3.]]),
                            sess.run(result.values[0].values))


if __name__ == '__main__':
  tf.test.main()

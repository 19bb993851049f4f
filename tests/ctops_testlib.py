"""Shared helpers for the cross_tower_ops tests: per-device inputs vs NumPy."""
import numpy as np
import tensorflow as tf

from replicate.cross_tower import values

# Mixed shapes: a scalar, odd sizes, and one large tensor.
SHAPES = ((), (3,), (5, 7), (1000, 129))
SMALL_SHAPES = ((), (3,), (5, 7))


def make_inputs(devices, shapes, dtype, seed=0):
  """`PerDevice` values of `shapes` on `devices`, and their NumPy arrays.

  Values are small integers (exact in float16 sums).

  Returns:
    (list of PerDevice, list over shapes of list over devices of arrays).
  """
  rng = np.random.RandomState(seed)
  per_device, arrays = [], []
  for shape in shapes:
    column, index = [], {}
    for d in devices:
      a = rng.randint(-8, 8, size=shape).astype(dtype.as_numpy_dtype)
      with tf.device(d):
        index[d] = tf.constant(a)
      column.append(a)
    per_device.append(values.PerDevice(index))
    arrays.append(column)
  return per_device, arrays


def expected(arrays, mean):
  total = np.sum(np.stack(arrays), axis=0)
  return total / len(arrays) if mean else total


def tolerance(dtype):
  return 1e-2 if dtype == tf.float16 else 1e-6


def make_inputs_arrays(num_devices, shapes, np_dtype, seed=0):
  """The arrays `make_inputs` draws for `num_devices` devices and `seed`."""
  rng = np.random.RandomState(seed)
  arrays = []
  for shape in shapes:
    arrays.append([rng.randint(-8, 8, size=shape).astype(np_dtype)
                   for _ in range(num_devices)])
  return arrays

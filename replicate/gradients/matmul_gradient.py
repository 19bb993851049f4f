"""A `MatMul` gradient for CPU towers that does not re-lay-out the weight.

The input gradient of `y = x . W` is `dx = dy . W^T`. TF computes it as
`matmul(dy, W, transpose_b=True)`, and TF 1.15's Eigen kernel re-lays-out the
transposed right-hand side on every call: a cost in the weight's size, not in
the batch's. One device pays it once per step; N towers pay it N times, each
for 1/N of the rows (docs/performance.md).

Inside replicated towers on CPU devices, `replicate_model_fn` builds the
model under `graph.gradient_override_map` so that `MatMul`s of large
right-hand sides get the gradient below instead: `dx = (W . dy^T)^T`, a
product whose transposed operand is the small `dy`, then a transpose of the
small result. The value is the same product (summed in another order, so
equal within float rounding); the weight gradient is TF's own. GPUs handle
transposed operands natively and never get the override; neither do small
weights, where one more op per layer would cost more than it saves.

A `model_fn` that sets its own `gradient_override_map` for `MatMul` keeps it
(the inner map wins). The forward ops carry the attribute
`_gradient_op_type`, so computing gradients of an imported training graph
needs `replicate` imported (it registers the gradient).
"""
import contextlib

import tensorflow as tf

from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import tuning

GRADIENT_NAME = 'ReplicateCpuMatMul'


@contextlib.contextmanager
def cpu_tower_gradients(graph, device, enabled=True):
  """Builds `MatMul`s with the CPU-friendly gradient on CPU devices.

  Args:
    graph: the graph the tower is built in.
    device: the tower's device string.
    enabled: False makes this a no-op (e.g. outside training).

  Yields:
    Nothing.
  """
  if not enabled or not device_util.is_cpu(device):
    yield
    return
  with graph.gradient_override_map({'MatMul': GRADIENT_NAME}):
    yield


@tf1.RegisterGradient(GRADIENT_NAME)
def _matmul_gradient(op, grad):
  """The gradients of `MatMul` with respect to both inputs (as TF's)."""
  transpose_a = op.get_attr('transpose_a')
  transpose_b = op.get_attr('transpose_b')
  a = tf.math.conj(op.inputs[0])
  b = tf.math.conj(op.inputs[1])
  if not transpose_a and not transpose_b:
    if _transpose_free(op, b, grad):
      grad_a = tf.transpose(tf1.matmul(b, grad, transpose_b=True))
    else:
      grad_a = tf1.matmul(grad, b, transpose_b=True)
    grad_b = tf1.matmul(a, grad, transpose_a=True)
  elif not transpose_a and transpose_b:
    grad_a = tf1.matmul(grad, b)
    grad_b = tf1.matmul(grad, a, transpose_a=True)
  elif transpose_a and not transpose_b:
    grad_a = tf1.matmul(b, grad, transpose_b=True)
    grad_b = tf1.matmul(a, grad)
  else:
    grad_a = tf1.matmul(b, grad, transpose_a=True, transpose_b=True)
    grad_b = tf1.matmul(grad, a, transpose_a=True, transpose_b=True)
  return grad_a, grad_b


def _transpose_free(op, weight, grad):
  """Whether `(W . dy^T)^T` is worth it: on CPU, a large W, a smaller dy."""
  if not device_util.is_cpu(op.device):
    return False
  if not weight.dtype.is_floating:
    return False
  weight_shape = weight.shape
  if not weight_shape.is_fully_defined():
    return False
  elements = weight_shape.num_elements()
  min_elements = tuning.get_tuning().matmul_min_elements
  if min_elements is None or elements < min_elements:
    return False
  grad_shape = grad.shape
  return (not grad_shape.is_fully_defined() or
          grad_shape.num_elements() <= elements)

"""Every TensorFlow-version difference and every private TF import lives here.

The rest of the library is written against the public `tensorflow.compat.v1`
API. When something is only reachable through a private module, or differs
between TF 1.15 and TF 2.15, it is wrapped here, once, so that the other
modules never probe versions themselves.
"""
import functools
import inspect

import tensorflow as tf

tf1 = tf.compat.v1

TF_VERSION = tuple(int(p) for p in tf.__version__.split('.')[:2])
IS_TF2 = TF_VERSION[0] >= 2

# Estimator types: public in both versions through tf.compat.v1.estimator
# (TF 2.15 gets them from the tensorflow-estimator package).
EstimatorSpec = tf1.estimator.EstimatorSpec
ModeKeys = tf1.estimator.ModeKeys
PredictOutput = tf1.estimator.export.PredictOutput
RegressionOutput = tf1.estimator.export.RegressionOutput
ClassificationOutput = tf1.estimator.export.ClassificationOutput


def local_gpu_devices():
  """Returns the canonical names of the GPUs visible to this process.

  Returns:
    A list such as `['/device:GPU:0', '/device:GPU:1']`; empty without GPUs.
  """
  gpus = tf.config.experimental.list_physical_devices('GPU')
  return ['/device:GPU:{}'.format(i) for i in range(len(gpus))]


def fn_args(fn):
  """Returns the names of the arguments `fn` can be called with.

  Understands plain functions, bound methods, `functools.partial` objects
  (positional arguments already bound are dropped) and callable objects.

  Args:
    fn: a callable.

  Returns:
    A tuple of argument names.
  """
  if isinstance(fn, functools.partial):
    args = fn_args(fn.func)
    args = args[len(fn.args):]
    return tuple(a for a in args if a not in (fn.keywords or {}))
  if not inspect.isfunction(fn) and not inspect.ismethod(fn) and hasattr(
      fn, '__call__'):
    fn = fn.__call__
  parameters = inspect.signature(fn).parameters
  return tuple(name for name, p in parameters.items()
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


# --- distribute_lib / mirrored_strategy ---


def variable_to_tensor(variable, dtype=None, name=None, as_ref=False):
  """Converts a resource variable to a tensor, honouring `as_ref`.

  The conversion function of `MirroredVariable` forwards to its local copy
  through this; the public `tf.convert_to_tensor` has no `as_ref`.

  Args:
    variable: a resource variable.
    dtype: the requested dtype, or None.
    name: a name for the read, or None.
    as_ref: whether a reference (the handle-backed variable) is asked for.

  Returns:
    A tensor.
  """
  return variable._dense_var_to_tensor(  # pylint: disable=protected-access
      dtype=dtype, name=name, as_ref=as_ref)

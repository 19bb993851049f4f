"""Errors raised by `replicate`, under one common base class.

Each error also derives from the built-in exception users already catch
(`ValueError`, `TypeError`, `RuntimeError`), so code written against
`tf.contrib` keeps working unchanged.
"""


class Error(Exception):
  """Base class of every error raised by `replicate`."""


class InvalidArgumentError(Error, ValueError):
  """An argument, or a model_fn's output, has a value `replicate` cannot use."""


class InvalidTypeError(Error, TypeError):
  """An argument has a type `replicate` cannot use."""


class InvalidArgumentTypeError(InvalidArgumentError, InvalidTypeError):
  """A wrong type where the contrib / tf.distribute original raises ValueError.

  Both a ValueError and a TypeError, so that code catching either keeps
  working.
  """


class StructureMismatchError(InvalidArgumentError, AssertionError):
  """Replicas produced nests of different structures.

  Also an `AssertionError`, which TF's `values.regroup` raises.
  """


class AssertedArgumentError(InvalidArgumentError, AssertionError):
  """A bad argument that TF checks with an `assert`.

  Also an `AssertionError`, which TF's `MirroredStrategy` raises for repeated
  devices or both `cross_device_ops` and `cross_tower_ops`.
  """


class ContextError(Error, RuntimeError):
  """A method was called in a context (replica, cross-replica, scope) where it is not allowed."""


class UnavailableError(Error, RuntimeError):
  """A task of the cluster could not be reached within the time allowed."""


class ContextArgumentError(ContextError, InvalidArgumentError):
  """A `ContextError` where tf.distribute raises `ValueError`: both."""

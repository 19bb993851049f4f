"""Argument checks shared by every layer, and the arguments a callable takes."""
import functools
import inspect
import numbers

from replicate import errors


def check_int(name, value, minimum):
  """Checks that `value` is an integer (not a bool) of at least `minimum`.

  Args:
    name: the argument's name, for the message.
    value: the value given.
    minimum: the smallest value allowed.

  Raises:
    InvalidTypeError: if `value` is not an integer.
    InvalidArgumentError: if `value` is below `minimum`.
  """
  if not isinstance(value, numbers.Integral) or isinstance(value, bool):
    raise errors.InvalidTypeError(
        '{} must be an integer >= {}, got {!r} of type {}.'.format(
            name, minimum, value, type(value).__name__))
  if value < minimum:
    raise errors.InvalidArgumentError(
        '{} must be an integer >= {}, got {}.'.format(name, minimum, value))


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

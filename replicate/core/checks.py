"""Argument checks shared by every layer."""
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

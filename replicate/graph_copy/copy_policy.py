"""Copy, or say why not: the rule every client of `GraphCopier` follows.

A copy of what device 0 built must do what another call of the user's
function would have built on its device; where that cannot be shown, the
copying build refuses with an error naming the reason and the build that
calls the function per device, and never falls back mid-build. Clients
(replicate_model_fn's towers, MirroredStrategy's replicas) find their own
reasons (e.g. the function asked which copy it builds); the reason that
does not depend on the client is here: copies' inputs that differ other than
as tensors of one shape.
"""
import tensorflow as tf

from replicate import errors


class CopyPolicy(object):
  """One client's wording of "copy, or say why not".

  Example (MirroredStrategy's replicas):

      POLICY = CopyPolicy(
          copies='replicate.MirroredStrategy(replica_build=ReplicaBuild.'
                 'CLONE) copies replica 0 onto the other replicas',
          calls='calling the replica function once per replica',
          fix='pass replica_build=replicate.ReplicaBuild.CALL_PER_REPLICA '
              '(the default) to MirroredStrategy')
      POLICY.check(copy_policy.reason_inputs_differ(inputs))
  """

  def __init__(self, copies, calls, fix):
    """Words of the error.

    Args:
      copies: what the copying build does (a clause).
      calls: what the build it must equal does (a clause).
      fix: how to get that build (a clause).
    """
    self._copies = copies
    self._calls = calls
    self._fix = fix

  def error(self, reason):
    """The error refusing to copy because of `reason` (a clause)."""
    return errors.InvalidArgumentError(
        '{}, but {}: copies cannot be shown to do what {} does. Remove that '
        'reason, or {}.'.format(self._copies, reason, self._calls, self._fix))

  def fallback_message(self, reason):
    """Why a client that may fall back builds by calls instead (a warning).

    `replicate_model_fn`'s towers fall back before any copy is made (at
    tower 0's first optimizer call, or right after its `model_fn` call in
    EVAL and PREDICT), never after.
    """
    return ('{}, but {}: copies cannot be shown to do what {} does, so the '
            'build does that instead. To silence this, {}.'.format(
                self._copies, reason, self._calls, self._fix))

  def check(self, reason):
    """Raises `error(reason)` unless `reason` is None.

    Raises:
      InvalidArgumentError: naming the reason and the fix.
    """
    if reason is not None:
      raise self.error(reason)


def reason_inputs_differ(per_copy_inputs):
  """Why copies cannot read each device's inputs in place of device 0's.

  Args:
    per_copy_inputs: for each device, the flat leaves of its function's
      arguments (composite tensors expanded), device 0's first.

  Returns:
    A clause, or None where every leaf is the same object, an equal Python
    value, or a tensor of device 0's dtype and static shape.
  """
  first = per_copy_inputs[0]
  for inputs in per_copy_inputs[1:]:
    if len(inputs) != len(first):
      return 'the arguments differ in structure between devices'
    for a, b in zip(first, inputs):
      if a is b:
        continue
      if isinstance(a, tf.Tensor) and isinstance(b, tf.Tensor):
        if a.dtype != b.dtype or static_shape(a) != static_shape(b):
          return ('the input tensors differ in shape or dtype between '
                  'devices ({} and {})'.format(a, b))
        continue
      if isinstance(a, tf.Operation) and isinstance(b, tf.Operation):
        continue
      if not tf.is_tensor(a) and equal_python(a, b):
        continue
      return ('the arguments differ between devices in a value that is not '
              'a tensor ({!r} and {!r})'.format(a, b))
  return None


def equal_python(a, b):
  """Whether two Python values compare equal (False where `==` fails)."""
  try:
    return bool(a == b)
  except Exception:  # pylint: disable=broad-except
    return False


def static_shape(tensor):
  """A tensor's static shape as a comparable value (None: unknown rank)."""
  shape = tensor.shape
  return None if shape.rank is None else tuple(shape.as_list())

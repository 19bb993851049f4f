"""`Tuning`: the library's performance knobs, in one immutable object.

Every size threshold of packing and of the all-reduce's buckets is a field
here, with its default. A `Tuning` is read once, where a build starts (a
cross-tower ops object when it is made, `replicate_model_fn`'s towers when
the wrapped `model_fn` is called), and passed down as an argument from
there: no algorithm reads it from a global. Where none is given, that start
takes the calling thread's innermost `tuning_scope`, else the process-wide
default (`set_tuning`). Why each default is what it is: docs/performance.md.
"""
import collections
import contextlib
import threading

from replicate import errors

_FIELDS = collections.OrderedDict([
    # Dense gradients and cross-device values of at most this many bytes
    # are packed (concatenated per device, reduced at once, split back).
    ('pack_max_bytes', 256 * 1024),
    # At most this many values per pack...
    ('pack_max_group', 16),
    # ...unless the pack stays within this many bytes per device.
    ('pack_small_bytes', 64 * 1024),
    # All-reduced gradients go in buckets of up to this many bytes, in the
    # order back-propagation ends them (PyTorch DDP's default bucket size)...
    ('all_reduce_bucket_bytes', 25 * 1024 * 1024),
    # ...and of at most this fraction of all the bytes, 1 / n.
    ('all_reduce_min_buckets', 8),
])


class Tuning(collections.namedtuple('Tuning', list(_FIELDS))):
  """The performance knobs; immutable. `Tuning()` holds the defaults.

  Fields (sizes in bytes):
    pack_max_bytes: largest dense gradient or value that is packed (0: no
      packing).
    pack_max_group: most values in one pack, unless the pack stays within
      `pack_small_bytes`.
    pack_small_bytes: a pack this small takes any number of values.
    all_reduce_bucket_bytes: the all-reduce of gradients (REPLICATED's
      default `AllReduceCrossTowerOps`, and across workers) runs in buckets
      filled in the order back-propagation ends the gradients, the last
      layer's first, so that a bucket's collective starts while the layers
      below are still differentiated; a bucket fills to this size. Smaller:
      more of the communication overlaps, at a launch per bucket.
    all_reduce_min_buckets: a bucket also fills to at most 1/n of all the
      gradient bytes (rounded up), so that the bucket left waiting for the
      first layer's gradient is small on small models too; 1: only
      `all_reduce_bucket_bytes` bounds it.
  """
  __slots__ = ()

  def __new__(cls, **kwargs):
    """Builds a `Tuning`; fields not given keep their defaults.

    Raises:
      InvalidArgumentError: for an unknown field or a size below its
        minimum.
      InvalidTypeError: for a size that is not an int.
    """
    unknown = sorted(set(kwargs) - set(_FIELDS))
    if unknown:
      raise errors.InvalidArgumentError(
          'Unknown Tuning field(s) {}; the fields are {}.'.format(
              unknown, ', '.join(_FIELDS)))
    values = dict(_FIELDS, **kwargs)
    for name, value in values.items():
      _check_field(name, value)
    return super(Tuning, cls).__new__(cls, **values)

  def replace(self, **kwargs):
    """A copy with the given fields changed (validated as in `Tuning()`)."""
    return Tuning(**dict(self._asdict(), **kwargs))

  # Immutable: a copy is the object itself. Pickled by field name, since
  # `__new__` takes keywords only (what copies of a strategy holding one
  # need).
  def __copy__(self):
    return self

  def __deepcopy__(self, memo):
    return self

  def __reduce__(self):
    return (_from_fields, (dict(self._asdict()),))


def _from_fields(fields):
  """`Tuning(**fields)`: what a pickled `Tuning` is rebuilt by."""
  return Tuning(**fields)


def _check_field(name, value):
  if not isinstance(value, int) or isinstance(value, bool):
    raise errors.InvalidTypeError(
        'Tuning.{} must be an int, got {!r}.'.format(name, value))
  minimum = {'pack_max_group': 1, 'all_reduce_bucket_bytes': 1,
             'all_reduce_min_buckets': 1}.get(name, 0)
  if value < minimum:
    raise errors.InvalidArgumentError(
        'Tuning.{} must be at least {}, got {}.'.format(name, minimum, value))


# The process-wide default (`set_tuning`), and each thread's open
# `tuning_scope`s: one thread's scopes never apply to another's builds.
_default = [Tuning()]
_lock = threading.Lock()
_scopes = threading.local()


def _thread_stack():
  stack = getattr(_scopes, 'stack', None)
  if stack is None:
    stack = _scopes.stack = []
  return stack


def get_tuning():
  """The `Tuning` a build started now by this thread takes.

  The calling thread's innermost `tuning_scope`, else the process-wide
  default.
  """
  stack = _thread_stack()
  return stack[-1] if stack else _default[0]


def resolve(tuning):
  """`tuning` checked, or `get_tuning()` for None: where a build starts.

  Raises:
    InvalidTypeError: if `tuning` is neither None nor a `Tuning`.
  """
  if tuning is None:
    return get_tuning()
  _check_tuning(tuning)
  return tuning


def set_tuning(tuning):
  """Makes `tuning` the process-wide default; returns the previous one.

  Args:
    tuning: a `Tuning`.

  Returns:
    The `Tuning` that was the default before.

  Raises:
    InvalidTypeError: if `tuning` is not a `Tuning`.
  """
  _check_tuning(tuning)
  with _lock:
    previous, _default[0] = _default[0], tuning
  return previous


@contextlib.contextmanager
def tuning_scope(tuning):
  """Uses `tuning` for the builds this thread starts inside the block.

  Args:
    tuning: a `Tuning`.

  Yields:
    `tuning`.

  Raises:
    InvalidTypeError: if `tuning` is not a `Tuning`.
    ContextError: on exit, if scopes were not properly nested.
  """
  _check_tuning(tuning)
  stack = _thread_stack()
  stack.append(tuning)
  depth = len(stack)
  try:
    yield tuning
  finally:
    nested = len(stack) == depth and stack[-1] is tuning
    del stack[depth - 1:]
    if not nested:
      raise errors.ContextError(
          'tuning_scope blocks were not properly nested: one entered inside '
          'this one was still open when it exited. Use `with` blocks.')


def _check_tuning(tuning):
  if not isinstance(tuning, Tuning):
    raise errors.InvalidTypeError(
        'Expected a replicate.Tuning, got {!r}; build one with '
        'replicate.Tuning(field=value, ...).'.format(tuning))

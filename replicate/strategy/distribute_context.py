"""The thread-local stack of distribution contexts, and its readers.

Every thread sees a stack of `Context` entries; an empty stack means the
default strategy in its default replica context (`default_strategy.py`
holds it and the readers that fall back on it, so this module stays below
every strategy class). `Strategy.scope()`
pushes a cross-replica entry; each replica thread of `call_for_each_replica`
pushes a replica entry; `ReplicaContext.merge_call` pushes a cross-replica
entry while the merge function runs. Entries are pushed and popped in
`try/finally` by the context managers here.

This stack belongs to `replicate` alone. It never reads or writes
`tf.distribute`'s own stack, so on TF 2.x the two default strategies live side
by side without interfering.
"""
import contextlib
import threading

from replicate import errors

_state = threading.local()


class Context(object):
  """One entry of the stack.

  Exactly one of `cross_replica_context` (a Strategy) and `replica_context`
  (a ReplicaContext) is set.
  """

  __slots__ = ('strategy', 'cross_replica_context', 'replica_context')

  def __init__(self, strategy, cross_replica_context=None,
               replica_context=None):
    self.strategy = strategy
    self.cross_replica_context = cross_replica_context
    self.replica_context = replica_context


def _stack():
  if not hasattr(_state, 'stack'):
    _state.stack = []
  return _state.stack


def innermost():
  """The innermost `Context` of this thread, or None.

  None stands for the bottom of every stack: the default strategy in its
  default replica context (see `default_strategy.current_context`).
  """
  stack = _stack()
  return stack[-1] if stack else None


@contextlib.contextmanager
def pushed(context):
  """Pushes `context` for the duration of the `with` block.

  Args:
    context: a `Context`.

  Yields:
    Nothing.

  Raises:
    ContextError: when the block exits and `context` is not the innermost
      entry (some scope was left open or closed out of order).
  """
  stack = _stack()
  stack.append(context)
  depth = len(stack)
  try:
    yield
  finally:
    if len(stack) != depth or stack[-1] is not context:
      # Restore a consistent stack before reporting the misuse.
      del stack[depth - 1:]
      raise errors.ContextError(
          'Distribution contexts were not properly nested: a scope entered '
          'inside this one was still open when it exited. Exit scopes in the '
          'reverse order of entering them (use `with` blocks).')
    stack.pop()


def push_cross_replica(strategy):
  """A context manager pushing the cross-replica context of `strategy`."""
  return pushed(Context(strategy, cross_replica_context=strategy))


def push_replica(replica_context):
  """A context manager pushing `replica_context` (a `ReplicaContext`)."""
  return pushed(Context(replica_context.strategy,
                         replica_context=replica_context))


# --- Update device ---------------------------------------------------------


def _update_stack():
  if not hasattr(_state, 'update_devices'):
    _state.update_devices = []
  return _state.update_devices


def get_update_device():
  """The device being updated inside `StrategyExtended.update`, or None.

  Mirrored variables read this to pick the copy an update function sees.

  Returns:
    A device string inside an `UpdateContext`, else None.
  """
  stack = _update_stack()
  return stack[-1] if stack else None


class UpdateContext(object):
  """Context manager naming the device whose copies are being updated.

  `StrategyExtended.update` enters one per device around the update
  function, so that `get_update_device()` (and mirrored variables) know which
  copy is meant.
  """

  def __init__(self, device):
    """Creates the context for `device` (a device string)."""
    self._device = device

  def __enter__(self):
    _update_stack().append(self._device)

  def __exit__(self, exc_type, exc_value, traceback):
    stack = _update_stack()
    if not stack or stack[-1] != self._device:
      raise errors.ContextError(
          'UpdateContext({!r}) exited while another update context was '
          'innermost; nest update contexts with `with` blocks.'.format(
              self._device))
    stack.pop()


# --- Variables a strategy must not mirror -------------------------------------


@contextlib.contextmanager
def unmirrored_variables():
  """Variables created in this block are plain, even inside a strategy scope.

  Used for the library's own bookkeeping variables (e.g. NumPy input loaded
  through a session, or optimizer slots of one mirrored copy).

  Yields:
    Nothing.
  """
  _state.unmirrored = getattr(_state, 'unmirrored', 0) + 1
  try:
    yield
  finally:
    _state.unmirrored -= 1


def creating_unmirrored_variables():
  """Whether an `unmirrored_variables()` block is open in this thread."""
  return getattr(_state, 'unmirrored', 0) > 0


@contextlib.contextmanager
def in_loop_body():
  """Marks the body of a graph loop the strategy builds (run_steps).

  Replicas built there are called per replica: copies imported into a TF1
  `while_loop` body would sit outside its frame (mirrored_copies.py).

  Yields:
    Nothing.
  """
  _state.loop_bodies = getattr(_state, 'loop_bodies', 0) + 1
  try:
    yield
  finally:
    _state.loop_bodies -= 1


def building_loop_body():
  """Whether an `in_loop_body()` block is open in this thread."""
  return getattr(_state, 'loop_bodies', 0) > 0

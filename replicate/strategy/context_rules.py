"""The context rules of strategies: which calls need which context.

`require_cross_replica_or_default_context` (most `Strategy` and
`StrategyExtended` methods) and `require_replica_context` (`ReplicaContext`
methods) state them once for every strategy, with TF's phrases first.

May import: `errors` and `strategy.distribute_context`.
"""
from replicate import errors
from replicate.strategy import distribute_context


def wrong_strategy_error(strategy, context):
  return errors.ContextError(
      'Mixing different tf.distribute.Strategy objects: {} is not {}. '  # TF
      'Mixing different strategies: {} was used inside the {} of another '
      'strategy, {}. Use one strategy at a time: leave the other scope first.'
      .format(context.strategy, strategy, describe_strategy(strategy),
              _describe_context(context), describe_strategy(context.strategy)))


def describe_strategy(strategy):
  return '{} (id {:#x})'.format(type(strategy).__name__, id(strategy))


def _describe_context(context):
  if context.replica_context is not None:
    return 'replica context'
  return 'scope'


def require_cross_replica_or_default_context(extended, method):
  """Raises unless `method` of `extended` may run in the current context.

  Allowed: the cross-replica context of this strategy, or no strategy at all
  (the default replica context).

  Args:
    extended: a `StrategyExtended`.
    method: the method's name, for the message.

  Raises:
    ContextError: in a replica context of this strategy, or in any context of
      another strategy.
  """
  context = distribute_context.innermost()
  if context is None:
    return  # No strategy at all: the default replica context.
  strategy = extended._container_strategy()  # pylint: disable=protected-access
  if context.cross_replica_context is strategy:
    return
  if context.strategy is not strategy:
    raise wrong_strategy_error(strategy, context)
  raise errors.ContextError(
      'Method requires being in cross-replica context, use '
      'get_replica_context().merge_call(). '  # TF's phrase
      '{} must be called in a cross-replica context, but was called inside a '
      'replica (replica {}). Call it from a merge function: '
      'get_replica_context().merge_call(fn) runs fn(strategy, ...) in the '
      'cross-replica context.'.format(
          method, context.replica_context._replica_id_in_sync_group))


def require_replica_context(replica_ctx, method=None):
  """Raises unless `replica_ctx` is the current context.

  Public as `distribute_lib.require_replica_context(replica_ctx)`, as in TF.

  Args:
    replica_ctx: a `ReplicaContext`.
    method: the `ReplicaContext` method's name, for the message (None: the
      public check).

  Raises:
    ContextError: (a RuntimeError, as TF's) in a cross-replica context, or in
      another replica's context.
  """
  what = ('ReplicaContext.' + method if method
          else 'require_replica_context(replica_ctx)')
  context = distribute_context.innermost()
  if context is None:
    # The default replica context, the bottom of every stack.
    if replica_ctx.strategy.extended._is_default_strategy():  # pylint: disable=protected-access
      return
    raise errors.ContextError(
        '{} was called outside its replica (no strategy is current). Call '
        'it from the function given to call_for_each_replica.'.format(what))
  if context.replica_context is replica_ctx:
    return
  if context.replica_context is None:
    raise errors.ContextError(
        'Need to be inside `call_for_each_replica()`. '  # TF's phrase
        '{} must be called in its replica context, but was called in a '
        'cross-replica context (a strategy scope or a merge function). Call '
        'it from the function given to call_for_each_replica.'.format(what))
  raise errors.ContextError(
      'Mismatching ReplicaContext. '  # TF's phrase
      '{} was called on a replica context that is not the current one '
      '(current: replica {} of {}, called on: replica {} of {}). '
      'Use get_replica_context() for the current one.'.format(
          what, context.replica_context._replica_id_in_sync_group,
          describe_strategy(context.strategy),
          replica_ctx._replica_id_in_sync_group,
          describe_strategy(replica_ctx.strategy)))

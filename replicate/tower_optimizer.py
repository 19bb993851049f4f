"""`TowerOptimizer`: the optimizer wrapper that gathers gradients of all towers.

Inside a `model_fn` replicated by `replicate_model_fn` on several devices,
every tower computes its gradients; the last tower's `apply_gradients` sums
them per variable (on the variable's device) and applies them once. Outside
`replicate_model_fn`, or with a single tower, it is a plain pass-through to
the wrapped optimizer, so the same training script runs unreplicated.
"""
import weakref

from replicate import errors
from replicate._compat import tf1
from replicate.core import compression as compression_lib
from replicate.core import logs as logging
from replicate.core.checks import check_int
from replicate.gradients import gradient_gating
from replicate.strategy import default_strategy
from replicate.towers import tower_context
from replicate.towers import tower_gradients

# The graphs in which a TowerOptimizer was used (`has_been_used`); weak, so a
# graph that goes away leaves it.
_GRAPHS_USED_IN = weakref.WeakSet()


def _check_not_keras(value, what):
  """Raises if `value` is a Keras optimizer, naming the v1 one to use."""
  keras_class = next((c for c in type(value).__mro__
                      if 'keras' in c.__module__ and 'Optimizer' in c.__name__),
                     None)
  if keras_class is None:
    return
  name = type(value).__name__
  v1_name = _V1_OPTIMIZERS.get(name)
  fix = ('tf.compat.v1.train.{}'.format(v1_name) if v1_name else
         'a tf.compat.v1.train.*Optimizer (e.g. AdamOptimizer)')
  raise errors.InvalidTypeError(
      '{} the Keras optimizer {} ({}); TowerOptimizer wraps graph-mode '
      'optimizers: use {} instead.'.format(
          what, name, type(value).__module__, fix))


def _check_not_tower_optimizer(value, what):
  """Raises if `value` is a `TowerOptimizer`: wrapped twice, every tower's
  gradients would be scaled and gathered twice."""
  if isinstance(value, TowerOptimizer):
    raise errors.InvalidTypeError(
        '{} a TowerOptimizer ({}); wrap the optimizer once: '
        'TowerOptimizer(optimizer).'.format(
            what, value.get_name()))


# Keras optimizer -> its tf.compat.v1.train counterpart, for the message.
_V1_OPTIMIZERS = {
    'SGD': 'GradientDescentOptimizer (or MomentumOptimizer)',
    'Adam': 'AdamOptimizer', 'Adagrad': 'AdagradOptimizer',
    'Adadelta': 'AdadeltaOptimizer', 'RMSprop': 'RMSPropOptimizer',
    'Ftrl': 'FtrlOptimizer',
}


class TowerOptimizer(tf1.train.Optimizer):
  """Wraps an optimizer so that `replicate_model_fn` can aggregate gradients.

  Usage inside `model_fn`:

      optimizer = replicate.TowerOptimizer(tf.train.AdamOptimizer(1e-3))
      train_op = optimizer.minimize(loss, tf.train.get_global_step())

  Only `compute_gradients` and `apply_gradients` differ from the wrapped
  optimizer, and `minimize`, which calls them (not the wrapped optimizer's
  own `minimize`); everything else is passed through. Several optimizers may be
  used in one `model_fn` (e.g. for a GAN) as long as every tower calls them
  in the same order.
  """

  def __init__(self, optimizer_or_optimizer_fn, accumulation_steps=1,
               compression=None):
    """Wraps an optimizer, or a function that builds one.

    Args:
      optimizer_or_optimizer_fn: a `tf.compat.v1.train.Optimizer` (including a
        `SyncReplicasOptimizer`), or a function with no arguments returning
        one. A function is called lazily, once per graph, so that tensors it
        creates (e.g. a decayed learning rate) live in the graph being built.
      accumulation_steps: apply once every this many steps (runs of the train
        op) the gradients summed over them: scaled by `1 / accumulation_steps`
        (a loss averaged over the batch, `replicate_model_fn`'s default),
        unscaled under `loss_reduction=SUM`. The global step advances once per
        update, so `Estimator.train(steps=n)` makes n updates of
        `accumulation_steps` batches each. Not inside `MirroredStrategy`
        replicas. See `gradients/accumulation.py`.
      compression: `replicate.Compression.fp16` sends each tower's (or
        replica's) gradients across devices as float16 and casts the sums back
        (Horovod's semantics); None or `Compression.none`: as they are.

    Raises:
      InvalidTypeError: if the optimizer is neither an optimizer nor callable,
        is a `TowerOptimizer` or a Keras optimizer, `accumulation_steps` is
        not an integer, or `compression` is not a `replicate.Compression`
        compressor.
      InvalidArgumentError: if `accumulation_steps` is below 1.
    """
    _check_not_keras(optimizer_or_optimizer_fn, 'TowerOptimizer got')
    _check_not_tower_optimizer(optimizer_or_optimizer_fn,
                               'TowerOptimizer got')
    if not isinstance(optimizer_or_optimizer_fn, tf1.train.Optimizer) and (
        not callable(optimizer_or_optimizer_fn)):
      raise errors.InvalidTypeError(
          'TowerOptimizer wraps a tf.compat.v1.train.Optimizer or a function '
          'with no arguments that returns one, got {!r} of type {}.'.format(
              optimizer_or_optimizer_fn,
              type(optimizer_or_optimizer_fn).__name__))
    check_int('accumulation_steps', accumulation_steps, 1)
    if compression is not None and not compression_lib.is_compressor(
        compression):
      raise errors.InvalidTypeError(
          'compression must be replicate.Compression.fp16 or '
          'replicate.Compression.none (or None), got {!r}.'.format(
              compression))
    self._optimizer_or_optimizer_fn = optimizer_or_optimizer_fn
    self._settings = tower_gradients.Settings(
        compression=(None if compression is compression_lib.Compression.none
                     else compression),
        accumulation_steps=accumulation_steps)
    self._optimizers_by_graph = weakref.WeakKeyDictionary()
    self._warned_minimize = weakref.WeakSet()  # wrapped optimizers
    super(TowerOptimizer, self).__init__(
        use_locking=False, name='TowerOptimizer')

  # contrib kept its per-graph state in this collection; replicate keeps no
  # state in collections, so it stays empty (the name is for code reading it).
  COLLECTION_FOR_GRAPH_STATES = 'replicate_model_fn_graph_states'

  @staticmethod
  def has_been_used():
    """Whether a `TowerOptimizer` was used in the default graph (as contrib).

    True once any `TowerOptimizer` computed or applied gradients (or was
    otherwise asked for its wrapped optimizer) while the current default
    graph was being built.
    """
    return tf1.get_default_graph() in _GRAPHS_USED_IN

  def _get_optimizer(self):
    """The wrapped optimizer for the current graph (built on first use)."""
    _GRAPHS_USED_IN.add(tf1.get_default_graph())
    if isinstance(self._optimizer_or_optimizer_fn, tf1.train.Optimizer):
      return self._optimizer_or_optimizer_fn
    graph = tf1.get_default_graph()
    optimizer = self._optimizers_by_graph.get(graph)
    if optimizer is None:
      optimizer = self._optimizer_or_optimizer_fn()
      _check_not_keras(optimizer, 'The optimizer_fn given to TowerOptimizer '
                       'returned')
      _check_not_tower_optimizer(
          optimizer, 'The optimizer_fn given to TowerOptimizer returned')
      if not isinstance(optimizer, tf1.train.Optimizer):
        raise errors.InvalidTypeError(
            'The optimizer_fn given to TowerOptimizer must return a '
            'tf.compat.v1.train.Optimizer, but it returned {!r} of type {}.'
            .format(optimizer, type(optimizer).__name__))
      self._optimizers_by_graph[graph] = optimizer
    return optimizer

  def minimize(self, loss, global_step=None, var_list=None,
               gate_gradients=tf1.train.Optimizer.GATE_OP,
               aggregation_method=None, colocate_gradients_with_ops=False,
               name=None, grad_loss=None):
    """`Optimizer.minimize`: this class's `compute_gradients`, then its
    `apply_gradients`.

    The wrapped optimizer's own `minimize` is not called (nor was it by
    contrib's `TowerOptimizer`): where its class overrides it, a WARNING
    says that what the override adds is not done.
    """
    optimizer = self._get_optimizer()
    if type(optimizer).minimize is not tf1.train.Optimizer.minimize and (
        optimizer not in self._warned_minimize):
      self._warned_minimize.add(optimizer)
      logging.warning(
          '%s overrides minimize, which TowerOptimizer.minimize does not '
          'call: it calls the wrapped optimizer\'s compute_gradients for '
          'each tower and apply_gradients once, as contrib\'s did. Whatever '
          'the override adds besides them (a loss term, a counter, an '
          'argument it reads) is not done; move it into compute_gradients '
          'or apply_gradients, or into model_fn.', type(optimizer).__name__)
    return super(TowerOptimizer, self).minimize(
        loss, global_step=global_step, var_list=var_list,
        gate_gradients=gate_gradients, aggregation_method=aggregation_method,
        colocate_gradients_with_ops=colocate_gradients_with_ops, name=name,
        grad_loss=grad_loss)

  def compute_gradients(self, loss, var_list=None, **kwargs):
    """Computes the gradients of this tower's share of the loss.

    The loss is first scaled as the loss reduction requires (unless the
    reduction is `SUM`, weighted by the tower's share of the batch's rows:
    `1 / num_towers` for an even split), so that summing the towers'
    gradients gives the gradient of the unreplicated loss. In a
    replica of `replicate.MirroredStrategy` the loss is not scaled (each
    replica scales its loss to the global batch).

    Args:
      loss: the tower's loss.
      var_list: as for `Optimizer.compute_gradients`.
      **kwargs: passed to the wrapped optimizer's `compute_gradients`
        (`gate_gradients` included: each tower gates its gradients as one
        device would).

    Returns:
      A list of `(gradient, variable)` pairs.

    Raises:
      InvalidArgumentError: if `gate_gradients` is not one of `GATE_NONE`,
        `GATE_OP` or `GATE_GRAPH` (in a replicated tower or a
        `MirroredStrategy` replica), or `loss` is a callable in a replicated
        tower (a replica passes a callable to the wrapped optimizer).
    """
    replication = tower_context.current_replication()
    optimizer = self._get_optimizer()
    replica = _gradient_routing_replica()
    if replication is None and replica is not None:
      gradient_gating.check_gate_gradients(kwargs)
      # A callable loss too: the wrapped optimizer differentiates it with a
      # tape.
      return optimizer.compute_gradients(loss, var_list=var_list, **kwargs)
    if replication is None or replication.num_towers == 1:
      return optimizer.compute_gradients(loss, var_list=var_list, **kwargs)
    return tower_gradients.compute_gradients(replication, optimizer, loss,
                                             var_list, kwargs)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Applies gradients: once, in the last tower, summed over all towers.

    Inside `call_for_each_replica` of a `MirroredStrategy`, it instead sums
    each variable's gradient over the replicas (`merge_call` and
    `batch_reduce_to`) and updates every mirrored copy.

    The applying tower sums each variable's gradients across towers on the
    variable's device and applies the sums with the wrapped optimizer, under
    the scopes of tower 0's call (so that slots and ops get the names of the
    unreplicated model); the other towers only record their gradients
    and return a `no_op` that depends on them. When the towers are copies of
    tower 0 (`TowerBuild.CLONE`), tower 0's call first copies its gradients
    onto the other towers and applies; otherwise the last tower applies
    (towers/tower_gradients.py).

    Args:
      grads_and_vars: list of `(gradient, variable)` pairs.
      global_step: optional variable to increment (once per step).
      name: optional name of the returned operation.

    Returns:
      An `Operation`.

    Raises:
      InvalidArgumentError: if the towers do not make the same optimizer
        calls, with `accumulation_steps` > 1 in a `MirroredStrategy`
        replica, under a `tf.cond` whose predicate comes from the tower's
        rows (another optimizer wrapping this one), or where towers built
        by their own `model_fn` calls would update state of one call only
        (replicate/towers/step_checks.py).
    """
    replication = tower_context.current_replication()
    optimizer = self._get_optimizer()
    replica = _gradient_routing_replica()
    if replication is None and replica is not None:
      # Inside call_for_each_replica of a MirroredStrategy: the replica
      # context sums over replicas and updates every mirrored copy.
      if self._settings.accumulation_steps > 1:
        raise errors.InvalidArgumentError(
            'accumulation_steps={} is not supported inside MirroredStrategy '
            'replicas; accumulate with replicate_model_fn, or use a larger '
            'batch.'.format(self._settings.accumulation_steps))
      return replica._apply_gradients(  # pylint: disable=protected-access
          optimizer, grads_and_vars, global_step, name,
          self._settings.compression)
    if replication is None:
      return tower_gradients.apply_once(optimizer, list(grads_and_vars),
                                        global_step, name, self._settings)
    return tower_gradients.apply_gradients(replication, optimizer,
                                           grads_and_vars, global_step, name,
                                           self._settings)

  # Everything below passes straight through to the wrapped optimizer.

  def get_slot(self, *args, **kwargs):
    return self._get_optimizer().get_slot(*args, **kwargs)

  def get_slot_names(self, *args, **kwargs):
    return self._get_optimizer().get_slot_names(*args, **kwargs)

  def get_name(self, *args, **kwargs):
    return self._get_optimizer().get_name(*args, **kwargs)

  def variables(self, *args, **kwargs):
    return self._get_optimizer().variables(*args, **kwargs)

  def __getattr__(self, name):
    # Optimizer-specific methods, e.g. SyncReplicasOptimizer's
    # `make_session_run_hook`. Only reached for names not found normally.
    if name.startswith('__') or name in ('_optimizer_or_optimizer_fn',
                                         '_optimizers_by_graph',
                                         '_warned_minimize'):
      raise AttributeError(name)
    return getattr(self._get_optimizer(), name)


def _gradient_routing_replica():
  """The current strategy replica context if it routes gradients, else None.

  A `MirroredStrategy` replica sums gradients across replicas itself
  (`ReplicaContext._apply_gradients`); the default context does not.
  """
  replica = default_strategy.get_replica_context()
  if replica is not None and replica._routes_gradients():  # pylint: disable=protected-access
    return replica
  return None

"""`TowerOptimizer`: the optimizer wrapper that gathers gradients of all towers.

Inside a `model_fn` replicated by `replicate_model_fn` on several devices,
every tower computes its gradients; the last tower's `apply_gradients` sums
them per variable (on the variable's device) and applies them once. Outside
`replicate_model_fn`, or with a single tower, it is a plain pass-through to
the wrapped optimizer, so the same training script runs unreplicated.
"""
import weakref

import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import compression as compression_lib
from replicate.core.checks import check_int
from replicate.cross_tower import gradient_all_reduce
from replicate.gradients import accumulation
from replicate.gradients import gradient_aggregation
from replicate.gradients import gradient_gating
from replicate.strategy import default_strategy
from replicate.towers import tower_cloning
from replicate.towers import tower_collections
from replicate.towers import tower_context

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
  optimizer; everything else is passed through. Several optimizers may be
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
        `accumulation_steps` is not an integer, or `compression` is not a
        `replicate.Compression` compressor.
      InvalidArgumentError: if `accumulation_steps` is below 1.
    """
    _check_not_keras(optimizer_or_optimizer_fn, 'TowerOptimizer got')
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
    self._accumulation_steps = accumulation_steps
    self._compression = (None if compression is compression_lib.Compression.none
                         else compression)
    self._optimizers_by_graph = weakref.WeakKeyDictionary()
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
      if not isinstance(optimizer, tf1.train.Optimizer):
        raise errors.InvalidTypeError(
            'The optimizer_fn given to TowerOptimizer must return a '
            'tf.compat.v1.train.Optimizer, but it returned {!r} of type {}.'
            .format(optimizer, type(optimizer).__name__))
      self._optimizers_by_graph[graph] = optimizer
    return optimizer

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
      **kwargs: passed to the wrapped optimizer's `compute_gradients`. In a
        replicated tower or a `MirroredStrategy` replica,
        `gate_gradients=GATE_OP` (the default) is carried out per variable:
        each gradient waits for the tower's gradient ops that read its
        variable, which prevents the same races and saves a `tuple` per
        gradient op (see gradient_gating.py).

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
      return self._compute_replica_gradients(replica, optimizer, loss,
                                             var_list, kwargs)
    if replication is None or replication.num_towers == 1:
      return optimizer.compute_gradients(loss, var_list=var_list, **kwargs)
    if callable(loss):
      raise errors.InvalidArgumentError(
          'TowerOptimizer.compute_gradients needs the loss tensor in graph '
          'mode, got the callable {!r}; pass the tensor instead.'.format(loss))
    if replication.tower.tower_id == tower_collections.UPDATE_TOWER_ID:
      return self._compute_tower_gradients(replication, optimizer, loss,
                                           var_list, kwargs)
    # The other towers keep their update ops out of the step: neither the
    # scaled loss nor the gradients may depend on the
    # `control_dependencies(update_ops)` block models usually put around
    # `minimize` (see tower_collections.py).
    with tf1.control_dependencies(None):
      return self._compute_tower_gradients(replication, optimizer, loss,
                                           var_list, kwargs)

  def _compute_tower_gradients(self, replication, optimizer, loss, var_list,
                               kwargs):
    """One tower's gradients; GATE_OP becomes per-variable gating.

    With `GATE_OP` (the default, and what `minimize` passes) the gradients
    are computed ungated and each variable's gradient waits for the ops of
    this tower's gradient computation that read the variable (see
    gradient_gating.py); with `GATE_NONE` they are left ungated. `GATE_GRAPH`
    is passed through as it is.
    """
    self._check_gate_gradients(kwargs)
    if replication.cloner is not None:
      replication.gradient_losses.append(loss)
    return self._gated_gradients(
        replication.graph, optimizer, replication.scale_loss(loss), var_list,
        kwargs)

  def _compute_replica_gradients(self, replica, optimizer, loss, var_list,
                                 kwargs):
    """One strategy replica's gradients, gated per variable.

    As in a tower (`_compute_tower_gradients`), without scaling the loss (a
    replica scales its loss to the global batch itself).
    """
    self._check_gate_gradients(kwargs)
    if callable(loss):
      # The wrapped optimizer differentiates a callable with a tape.
      return optimizer.compute_gradients(loss, var_list=var_list, **kwargs)
    return self._gated_gradients(
        tf1.get_default_graph(), optimizer, loss, var_list, kwargs)

  def _check_gate_gradients(self, kwargs):
    gate_gradients = kwargs.get('gate_gradients', self.GATE_OP)
    if gate_gradients not in (self.GATE_NONE, self.GATE_OP, self.GATE_GRAPH):
      raise errors.InvalidArgumentError(
          'gate_gradients must be TowerOptimizer.GATE_NONE, GATE_OP or '
          'GATE_GRAPH, got {!r}.'.format(gate_gradients))

  def _gated_gradients(self, graph, optimizer, loss, var_list, kwargs):
    """The `(gradient, variable)` pairs of `loss`, as `gate_gradients` asks.

    `GATE_OP` becomes per-variable gating; `GATE_NONE` and `GATE_GRAPH` are
    passed through.
    """
    if kwargs.get('gate_gradients', self.GATE_OP) != self.GATE_OP:
      return optimizer.compute_gradients(loss, var_list=var_list, **kwargs)
    kwargs = dict(kwargs, gate_gradients=self.GATE_NONE)
    grads_and_vars, gradient_ops = gradient_gating.ops_created_by(
        graph, lambda: optimizer.compute_gradients(
            loss, var_list=var_list, **kwargs))
    return gradient_gating.gate_by_variable(grads_and_vars, gradient_ops)

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
    onto the other towers and applies; otherwise the last tower applies.

    Args:
      grads_and_vars: list of `(gradient, variable)` pairs.
      global_step: optional variable to increment (once per step).
      name: optional name of the returned operation.

    Returns:
      An `Operation`.

    Raises:
      InvalidArgumentError: if the towers do not make the same optimizer calls.
    """
    replication = tower_context.current_replication()
    optimizer = self._get_optimizer()
    replica = _gradient_routing_replica()
    if replication is None and replica is not None:
      # Inside call_for_each_replica of a MirroredStrategy: the replica
      # context sums over replicas and updates every mirrored copy.
      if self._accumulation_steps > 1:
        raise errors.InvalidArgumentError(
            'accumulation_steps={} is not supported inside MirroredStrategy '
            'replicas; accumulate with replicate_model_fn, or use a larger '
            'batch.'.format(self._accumulation_steps))
      return replica._apply_gradients(  # pylint: disable=protected-access
          optimizer, grads_and_vars, global_step, name, self._compression)
    if replication is None or (replication.num_towers == 1 and
                               replication.replicated is None):
      return self._apply(optimizer, list(grads_and_vars), global_step, name,
                         replication)
    grads_and_vars = list(grads_and_vars)
    if replication.num_towers == 1:
      # One tower of several workers (REPLICATED): all-reduce, then apply.
      _check_replicable(optimizer)
      return self._apply_replicated(replication.replicated, optimizer,
                                    [grads_and_vars], global_step, name,
                                    replication)
    call_index = replication.record_optimizer_call(optimizer.get_name(),
                                                   grads_and_vars)
    if replication.cloner is not None:
      tower_cloning.clone_optimizer_call(replication, call_index)
    if replication.tower.tower_id != replication.applying_tower_id:
      gradients = [g for g, _ in grads_and_vars if g is not None]
      with tf1.control_dependencies(_tensors_of(gradients)):
        recorded = tf.no_op(name='tower_gradients_recorded')
      replication.record_returned_op(call_index, recorded)
      return recorded
    if replication.tower.tower_id == tower_collections.UPDATE_TOWER_ID:
      return self._apply_sums(replication, optimizer, call_index,
                              global_step, name)
    # The last tower applies for every tower, but only tower 0's update ops
    # may run (see tower_collections.py): instead of what this call is made
    # under (e.g. `control_dependencies(update_ops)` of the last tower), the
    # update waits for what tower 0's same call was made under.
    first_tower_call = replication.returned_op(
        tower_collections.UPDATE_TOWER_ID, call_index)
    with tf1.control_dependencies(None), tf1.control_dependencies(
        [first_tower_call]):
      return self._apply_sums(replication, optimizer, call_index,
                              global_step, name)

  def _apply_sums(self, replication, optimizer, call_index, global_step,
                  name):
    """Sums every tower's gradients of call `call_index` and applies them.

    Built under the scopes of tower 0's call, where one device builds it
    (so that the optimizer's variables get one device's names). Under
    `VariablePlacement.REPLICATED` the sums are all-reduced onto every
    tower, and one `apply_gradients` updates every tower's copies.
    """
    replicated = replication.replicated
    if replicated is not None:
      _check_replicable(optimizer)
    tower_grads = replication.gradients_of_call(call_index)

    def apply():
      with replication.first_tower_call_scopes(call_index):
        if replicated is not None:
          return self._apply_replicated(replicated, optimizer, tower_grads,
                                        global_step, name, replication)
        with tf1.name_scope('gradient_aggregation'):
          summed = self._sum(tower_grads, replication.tuning)
        return self._apply(optimizer, summed, global_step, name, replication)

    if replication.cloner is None:
      return apply()
    # Tower 0 applies for copied towers: what it builds here is the one
    # update of the step, never to be copied (e.g. when a later optimizer
    # call of tower 0 depends on this one).
    train_op, created = gradient_gating.ops_created_by(replication.graph,
                                                       apply)
    replication.cloner.share(created)
    return train_op

  def _apply_replicated(self, replicated, optimizer, tower_grads,
                        global_step, name, replication):
    """All-reduces the towers' gradients; applies them to every copy."""
    devices = replicated.devices
    with tf1.name_scope('gradient_all_reduce'):
      compressed, contexts = self._compressed(tower_grads)
      reduced = gradient_all_reduce.all_reduce_gradients(
          compressed, devices, replicated.gradient_all_reduce)
      reduced = [[(self._decompressed(grad, contexts, var), var)
                  for grad, var in pairs] for pairs in reduced]
    replicated.make_slots(optimizer, reduced)
    train_op = self._apply(optimizer, [pair for pairs in reduced
                                       for pair in pairs],
                           global_step, name, replication)
    replicated.adopt_slots(optimizer, reduced)
    return train_op

  def _compressed(self, tower_grads):
    """`(tower_grads compressed, contexts by variable)` (`compression`)."""
    contexts = {}
    if self._compression is None:
      return tower_grads, contexts
    compressed = []
    for grads_and_vars in tower_grads:
      pairs = []
      for grad, var in grads_and_vars:
        if grad is not None:
          grad, contexts[id(var)] = self._compression.compress(grad)
        pairs.append((grad, var))
      compressed.append(pairs)
    return compressed, contexts

  def _decompressed(self, grad, contexts, var):
    if grad is None or self._compression is None:
      return grad
    return self._compression.decompress(grad, contexts[id(var)])

  def _sum(self, tower_grads, tuning):
    """Each variable's gradients summed over towers, compressed in transit."""
    if self._compression is None:
      return gradient_aggregation.sum_gradients_by_variable(tower_grads,
                                                            tuning)
    compressed, contexts = self._compressed(tower_grads)
    summed = gradient_aggregation.sum_gradients_by_variable(compressed, tuning)
    return [(self._decompressed(grad, contexts, var), var)
            for grad, var in summed]

  def _apply(self, optimizer, grads_and_vars, global_step, name, replication):
    """`optimizer.apply_gradients`, every `accumulation_steps` runs."""
    if self._accumulation_steps == 1:
      return optimizer.apply_gradients(grads_and_vars,
                                       global_step=global_step, name=name)
    scale = 1.0 / self._accumulation_steps
    if (replication is not None and
        replication.loss_reduction == tf1.losses.Reduction.SUM):
      scale = 1.0  # The sum over a k-times larger batch is the sum of sums.
    return accumulation.apply_accumulated(
        lambda pairs, step, op_name: optimizer.apply_gradients(
            pairs, global_step=step, name=op_name),
        grads_and_vars, self._accumulation_steps, scale, global_step, name)

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
                                         '_optimizers_by_graph'):
      raise AttributeError(name)
    return getattr(self._get_optimizer(), name)


def _check_replicable(optimizer):
  """Raises for optimizers that cannot update per-tower copies.

  Raises:
    InvalidArgumentError: for a `SyncReplicasOptimizer`, whose shared queues
      and accumulators need parameter servers.
  """
  if isinstance(optimizer, tf1.train.SyncReplicasOptimizer):
    raise errors.InvalidArgumentError(
        'variable_placement=REPLICATED all-reduces the gradients itself; a '
        'SyncReplicasOptimizer ({}) aggregates them on parameter servers. '
        'Pass its wrapped optimizer to TowerOptimizer, or use '
        'VariablePlacement.PARAMETER_SERVERS.'.format(optimizer.get_name()))


def _tensors_of(gradients):
  """The tensors a list of gradients consists of (IndexedSlices unpacked)."""
  tensors = []
  for grad in gradients:
    if isinstance(grad, tf.IndexedSlices):
      tensors.extend([grad.values, grad.indices])
    else:
      tensors.append(grad)
  return tensors


def _gradient_routing_replica():
  """The current strategy replica context if it routes gradients, else None.

  A `MirroredStrategy` replica sums gradients across replicas itself
  (`ReplicaContext._apply_gradients`); the default context does not.
  """
  replica = default_strategy.get_replica_context()
  if replica is not None and replica._routes_gradients():  # pylint: disable=protected-access
    return replica
  return None

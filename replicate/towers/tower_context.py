"""Which tower is being built, and the state of one replication in progress.

`replicate_model_fn` builds one tower per device (by calling the user's
`model_fn` for tower 0 and copying it, or once per device). While it does,
two objects describe what is going on:

* `TowerContext` (public): which tower `model_fn` is building, out of how
  many, on which device. `get_tower_context()` returns it inside `model_fn`
  and `None` elsewhere, so a `model_fn` can, e.g., log only from tower 0.
* `Replication` (private): what the towers share while they are built --
  the loss reduction, and the gradients each `TowerOptimizer` call collected
  with the scopes it was made under. `TowerOptimizer` reads it.

Both live on a thread-local stack that is pushed and popped in `try/finally`,
never in graph collections, so nothing is left behind in the graph (or in an
exported MetaGraph) once `model_fn` returns.
"""
import contextlib
import threading

import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import tuning as tuning_lib


class TowerContext(object):
  """Describes the tower that `model_fn` is being called to build.

  Attributes:
    tower_id: index of the tower, `0 <= tower_id < num_towers`. Tower 0 is
      built under no extra name scope; tower `i > 0` under `tower_<i>`.
    num_towers: how many towers the model is replicated into.
    device: the device the tower's ops are placed on, e.g. `/device:GPU:1`;
      `''` (none) in a graph the Estimator builds for a SavedModel, which
      holds the unreplicated model (tower 0 of 1, see towers/serving.py).
  """

  __slots__ = ('_tower_id', '_num_towers', '_device')

  def __init__(self, tower_id, num_towers, device):
    self._tower_id = tower_id
    self._num_towers = num_towers
    self._device = device

  @property
  def tower_id(self):
    return self._tower_id

  @property
  def num_towers(self):
    return self._num_towers

  @property
  def device(self):
    return self._device

  @property
  def is_first_tower(self):
    """True for tower 0, whose ops carry the names of the unreplicated model."""
    return self._tower_id == 0

  @property
  def is_last_tower(self):
    """True for the tower that applies the gathered gradients."""
    return self._tower_id == self._num_towers - 1

  def __repr__(self):
    return 'TowerContext(tower_id={}, num_towers={}, device={!r})'.format(
        self._tower_id, self._num_towers, self._device)


class _OptimizerCall(object):
  """One `TowerOptimizer.apply_gradients` call of a tower.

  Attributes:
    optimizer_name: the wrapped optimizer's name.
    grads_and_vars: the `(gradient, variable)` pairs the call was given.
    scopes: `(variable_scope, name_scope_string)` the call was made under;
      None for a call copied from tower 0's.
    ready_op: in a tower that does not apply, an op waiting for whatever
      the call was made under (its open control dependencies), else None;
      the step's update waits for tower 0's.
    returned_op: in a tower that does not apply, the op the call returned:
      it waits for the gradients, `ready_op` and, once the applying tower
      has built it, the update of the step.
    losses: the losses the tower gave `TowerOptimizer.compute_gradients`
      since its previous call (none recorded for a copied call).
  """

  __slots__ = ('optimizer_name', 'grads_and_vars', 'scopes', 'ready_op',
               'returned_op', 'losses')

  def __init__(self, optimizer_name, grads_and_vars, scopes, losses=()):
    self.optimizer_name = optimizer_name
    self.grads_and_vars = grads_and_vars
    self.scopes = scopes
    self.ready_op = None
    self.returned_op = None
    self.losses = list(losses)


class Replication(object):
  """State shared by the towers of one `replicate_model_fn` call.

  Attributes:
    graph: the graph the towers are built in.
    num_towers: number of towers.
    loss_reduction: a `tf.compat.v1.losses.Reduction`.
    tower: the `TowerContext` being built, or `None` between towers.
    cloner: a `tower_copier.TowerCloner` while tower 0 is being built and
      may be copied onto the other towers, else `None`.
    towers_cloned: whether towers 1..N-1 are copies of tower 0 (then tower 0
      applies the gradients; else the last tower does).
    tower_context_requested: whether `model_fn` asked `get_tower_context()`
      which tower it builds.
    not_cloned_reason: in TRAIN, why tower 0 was not copied (a sentence), or
      None.
    gradient_losses: the losses tower 0 gave `TowerOptimizer`s while
      `cloner` was set (copied with the gradients: the spec's loss is, as a
      rule, one of them, and then needs no copying round of its own).
    replicated: under `VariablePlacement.REPLICATED`, the towers' own
      variables (`replicated_variables.ReplicatedVariables`), else None.
    tuning: the `Tuning` this build packs gradient sums by.
    tower_rows: None where every tower gets `1 / num_towers` of a static
      batch; else each tower's row count (an int64 scalar, see
      batch_split.py), and `batch_size` the batch's.
    tower_inputs: the tensors of the batch that the tower being built
      reads (its shards of the features and labels).
    name_scopes: each built tower's name scope ('' or ending in '/'), by
      tower id.
    computed_gradient_ops: by tower id, the ops of the gradients its
      `TowerOptimizer.compute_gradients` calls returned.
    copied_controls: by optimizer call index, the copies (towers 1..N-1)
      of what the control dependencies open around tower 0's call name of
      its gradients, for the copied towers' update to wait for too.
    ops_before_updates: with copied towers, the graph's ops before the
      first copying round (nothing of an update among them), else None.
  """

  def __init__(self, graph, num_towers, loss_reduction, replicated=None,
               tuning=None):
    self.graph = graph
    self.tuning = tuning_lib.resolve(tuning)
    self.num_towers = num_towers
    self.loss_reduction = loss_reduction
    self.replicated = replicated
    self.tower_rows = None
    # Towers that called TowerOptimizer.compute_gradients (tower ids).
    self.towers_computing = set()
    self.batch_size = None
    self.tower = None
    self.tower_inputs = ()
    self.name_scopes = {}
    self.computed_gradient_ops = {}
    self.cloner = None
    self.towers_cloned = False
    self.tower_context_requested = False
    self.not_cloned_reason = None
    self.gradient_losses = []
    self.copied_controls = {}
    self.ops_before_updates = None
    # The ops of TowerOptimizer's updates of the step (step_checks.py).
    self.tower_optimizer_updates = set()
    self._calls = [[] for _ in range(num_towers)]
    self._losses_since_call = [[] for _ in range(num_towers)]

  @property
  def applying_tower_id(self):
    """The tower whose `apply_gradients` sums and applies every tower's."""
    return 0 if self.towers_cloned else self.num_towers - 1

  def scale_loss(self, loss, tower_id=None):
    """Scales one tower's loss so that summing the towers' gives the total.

    `SUM` keeps tower losses as they are. Every other reduction takes each
    tower's loss as a mean over its rows and weights it by its share of the
    batch: `1 / num_towers` where a static batch splits evenly (as contrib's
    `replicate_model_fn` did), else `rows / batch_size`, and exactly 0 for a
    tower without rows (whose mean over no rows may be NaN).

    Args:
      loss: a tower's loss tensor, or `None`.
      tower_id: the tower whose loss it is; None for the tower being built.

    Returns:
      The scaled loss (`None` for `None`).
    """
    if loss is None or self.loss_reduction == tf1.losses.Reduction.SUM:
      return loss
    if self.tower_rows is None:
      return tf.math.truediv(
          loss, tf.cast(self.num_towers, loss.dtype), name='averaged_loss')
    rows = self.tower_rows[self.tower.tower_id if tower_id is None
                           else tower_id]
    with tf1.name_scope('weighted_loss'):
      share = tf.math.divide_no_nan(tf.cast(rows, loss.dtype),
                                    tf.cast(self.batch_size, loss.dtype))
      weighted = loss * share
      # Not 0 * loss: the loss of no rows may be NaN, and so its gradients.
      return tf1.where(rows > 0, weighted, tf.zeros_like(weighted))

  def record_optimizer_call(self, optimizer_name, grads_and_vars,
                            tower_id=None):
    """Records one `apply_gradients` call of a tower.

    For the tower being built, the variable and name scopes the call is
    made under are recorded too (see `first_tower_call_scopes`).

    Args:
      optimizer_name: the wrapped optimizer's name, to explain mismatches.
      grads_and_vars: the list of `(gradient, variable)` pairs it was given.
      tower_id: the tower that made the call (a copy of tower 0's, for a
        cloned tower); None for the tower being built.

    Returns:
      The index of this call among the tower's optimizer calls.

    Raises:
      InvalidArgumentError: if a tower after the first makes more calls than
        tower 0 (which is always built first).
    """
    scopes = None
    losses = ()
    if tower_id is None:
      tower_id = self.tower.tower_id
      name_scope = self.graph.get_name_scope()
      scopes = (tf1.get_variable_scope(),
                name_scope + '/' if name_scope else '')
      losses = self._losses_since_call[tower_id]
      self._losses_since_call[tower_id] = []
    calls = self._calls[tower_id]
    if tower_id and len(calls) >= len(self._calls[0]):
      raise errors.InvalidArgumentError(_more_calls_message(
          0, len(self._calls[0]), tower_id, len(calls)))
    calls.append(_OptimizerCall(optimizer_name, list(grads_and_vars),
                                scopes, losses))
    return len(calls) - 1

  def record_loss(self, loss):
    """Records a loss the tower being built differentiates with
    `TowerOptimizer`; its next optimizer call is of it."""
    self._losses_since_call[self.tower.tower_id].append(loss)

  def losses_of_call(self, tower_id, call_index):
    """The losses recorded for tower `tower_id`'s call `call_index`."""
    return list(self._calls[tower_id][call_index].losses)

  def num_optimizer_calls(self, tower_id):
    return len(self._calls[tower_id])

  def optimizer_call(self, tower_id, call_index):
    """`(optimizer_name, grads_and_vars)` of one recorded call."""
    call = self._calls[tower_id][call_index]
    return call.optimizer_name, call.grads_and_vars

  @contextlib.contextmanager
  def first_tower_call_scopes(self, call_index):
    """Re-enters the scopes of tower 0's optimizer call `call_index`.

    The one update of the step is built where the unreplicated model's
    `apply_gradients` would be, whichever tower applies: so the variables
    the optimizer creates (slots, Adam's beta powers, the save names of
    partitioned variables' slots) get exactly one device's names, e.g.
    `model/model/dense/kernel/Momentum` for a `minimize` inside
    `variable_scope('model')`.
    """
    var_scope, name_scope = self._calls[0][call_index].scopes
    current = self.graph.get_name_scope()
    if (tf1.get_variable_scope() is var_scope and
        (current + '/' if current else '') == name_scope):
      # Tower 0's own call (copied towers): already there. Re-entering a
      # variable scope forgets, on leaving, the scopes opened inside it, so
      # a later optimizer's slots would take this one's names (TF's
      # "Variable .../Momentum/ already exists", where one device names
      # them `Momentum_1`).
      yield
      return
    with tf1.variable_scope(var_scope, auxiliary_name_scope=False):
      with tf1.name_scope(name_scope):
        yield

  def record_returned_op(self, call_index, ready_op, returned_op):
    """Records the ops of the current tower's call `call_index` (above)."""
    call = self._calls[self.tower.tower_id][call_index]
    call.ready_op, call.returned_op = ready_op, returned_op

  def ready_op(self, tower_id, call_index):
    """The `ready_op` of tower `tower_id`'s call `call_index` (see above)."""
    return self._calls[tower_id][call_index].ready_op

  def returned_ops(self, call_index):
    """The `returned_op`s of call `call_index` in the towers that have one."""
    return [calls[call_index].returned_op for calls in self._calls
            if len(calls) > call_index and
            calls[call_index].returned_op is not None]

  def gradients_of_call(self, call_index):
    """The `(gradient, variable)` lists of call `call_index`, one per tower.

    Args:
      call_index: which optimizer call (0 for the first one in `model_fn`).

    Returns:
      A list with one list of `(gradient, variable)` pairs per tower built so
      far (all towers, when called from the applying tower).

    Raises:
      InvalidArgumentError: if an earlier tower made fewer optimizer calls, or
        called another optimizer at that position.
    """
    this_call = self._calls[self.tower.tower_id][call_index]
    per_tower = []
    built = self.num_towers if self.towers_cloned else self.tower.tower_id + 1
    for tower_id in range(built):
      calls = self._calls[tower_id]
      if call_index >= len(calls):
        raise errors.InvalidArgumentError(_more_calls_message(
            tower_id, len(calls), self.tower.tower_id, call_index))
      if calls[call_index].optimizer_name != this_call.optimizer_name:
        raise errors.InvalidArgumentError(
            'Each invocation of model_fn was supposed to make the same '
            'optimizer calls: every tower must make the same TowerOptimizer '
            'calls in the same order, but apply_gradients call number {} '
            'used optimizer {!r} in tower {} and {!r} in tower {}. Make '
            'model_fn call its optimizers in the same order on every '
            'call.'.format(
                call_index + 1, calls[call_index].optimizer_name, tower_id,
                this_call.optimizer_name, self.tower.tower_id))
      per_tower.append(calls[call_index].grads_and_vars)
    return per_tower

  def check_same_optimizer_calls(self):
    """Raises unless every tower made the same number of optimizer calls.

    Raises:
      InvalidArgumentError: naming the towers and their call counts.
    """
    counts = [len(calls) for calls in self._calls]
    if len(set(counts)) > 1:
      raise errors.InvalidArgumentError(
          'Each invocation of model_fn was supposed to make the same '
          'optimizer calls: every tower must make the same TowerOptimizer '
          'calls, but the towers made {} apply_gradients calls '
          'respectively. Make model_fn build the same training ops on every '
          'call.'.format(counts))


def _more_calls_message(tower_id, num_calls, other_tower_id, call_index):
  """Why tower `other_tower_id` may not make call `call_index` (0-based)."""
  return ('Each invocation of model_fn was supposed to make the same '
          'optimizer calls: every tower must make the same TowerOptimizer '
          'calls in the same order, but tower {} made {} apply_gradients '
          'call(s) and tower {} is making call number {}. Make model_fn build '
          'the same training ops on every call.'.format(
              tower_id, num_calls, other_tower_id, call_index + 1))


class _Stack(threading.local):

  def __init__(self):
    super(_Stack, self).__init__()
    self.replications = []


_STACK = _Stack()


@contextlib.contextmanager
def replication_scope(replication):
  """Makes `replication` current for the duration of the block."""
  _STACK.replications.append(replication)
  try:
    yield replication
  finally:
    _STACK.replications.pop()


@contextlib.contextmanager
def tower_scope(replication, tower):
  """Marks `tower` (a `TowerContext`) as the tower being built."""
  replication.tower = tower
  try:
    yield tower
  finally:
    replication.tower = None


def current_replication():
  """The `Replication` whose tower is being built in this graph, or None."""
  if not _STACK.replications:
    return None
  replication = _STACK.replications[-1]
  if replication.tower is None:
    return None
  if replication.graph is not tf1.get_default_graph():
    return None
  return replication


def get_tower_context():
  """Returns the `TowerContext` of the tower being built, or None.

  Inside a `model_fn` wrapped by `replicate_model_fn` this tells which tower
  the call builds (also with a single device: tower 0 of 1). Anywhere else it
  returns `None`. Asking makes `replicate_model_fn` call `model_fn` once per
  tower in TRAIN too, instead of copying tower 0 (see tower_cloning.py).

  Returns:
    A `TowerContext` or `None`.

  Raises:
    ContextError: if called in TRAIN after tower 0's first
      `TowerOptimizer.apply_gradients`, once tower 0 was copied onto the
      other towers (`TowerBuild.CLONE`).
  """
  replication = current_replication()
  if replication is None:
    return None
  if replication.towers_cloned:
    raise errors.ContextError(
        'replicate.get_tower_context() was called after tower 0 was copied '
        'onto the other towers (at its first TowerOptimizer.apply_gradients), '
        'so the answer could no longer make the towers differ. Call it before '
        'the optimizer, or pass tower_build=replicate.TowerBuild.'
        'CALL_PER_TOWER to replicate_model_fn to call model_fn once per '
        'tower.')
  replication.tower_context_requested = True
  return replication.tower

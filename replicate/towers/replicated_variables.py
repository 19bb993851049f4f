"""`VariablePlacement.REPLICATED`: every tower trains its own variables.

Tower 0's trainable variables are the model's: they keep the unreplicated
names, live on tower 0's device and are what checkpoints hold. Every other
tower gets a copy of each on its own device (`TowerCloner.own_variables`),
named `tower_<i>/<name>`; the copied ops of tower i read it. The copies and
their optimizer slots are local variables: never saved, so checkpoints
move both ways between REPLICATED, the other placements and one device.

The copies start equal to tower 0's variables and stay equal: a hook sets
them (and their slots) from tower 0's when a session starts, after the
checkpoint is restored, by running their initializers with tower 0's values
fed (no op of its own in the graph); in every step each tower applies the same
all-reduced gradients to its own copy, in one `apply_gradients` call over
all copies, so that per-call state such as Adam's beta powers advances once.
Non-trainable variables (the global step, moving statistics) stay single,
as tower 0's.
"""
import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.core import op_kinds
from replicate.graph_copy import bulk_variables

_COPY_COLLECTIONS = (tf1.GraphKeys.LOCAL_VARIABLES,)


class ReplicatedVariables(object):
  """The per-tower copies of one replicated model's trainable variables.

  Attributes:
    all_reduce: `all_reduce(tower_grads_and_vars)` all-reduces the towers'
      gradients: one list of `(gradient, variable)` pairs per tower in, the
      same with every gradient summed over the towers (on each tower's
      device) out (cross_tower/replicated_gradients.py, bound to the
      model's `CrossTowerOps` by `replicate_model_fn`).
    devices: the towers' devices, tower 0's first.
  """

  def __init__(self, all_reduce, devices):
    self.all_reduce = all_reduce
    self.devices = list(devices)
    self._existing = set()  # ids of trainable variables not tower 0's
    self._copies = {}  # tower-0 variable op name -> [variable per tower]
    self._pairs = []   # (tower-0 variable, copy) set at session start
    self._updates = set()  # the ops of the optimizer's one update

  def note_existing(self, variables):
    """Records the trainable variables that exist before tower 0 is built.

    They are not tower 0's own and get no copies.
    """
    self._existing = set(id(v) for v in variables)

  def make_copies(self, cloner):
    """Gives towers 1..N-1 their copies of tower 0's trainable variables.

    Tower 0's are the trainable variables created since `note_existing`;
    those that have copies already are skipped.

    Args:
      cloner: the `TowerCloner` copying tower 0.

    Raises:
      InvalidArgumentError: if a variable has no fully known shape.
    """
    variables = [v for v in tf1.trainable_variables()
                 if id(v) not in self._existing and
                 v.op.name not in self._copies]
    if not variables:
      return
    for variable in variables:
      if not variable.shape.is_fully_defined():
        raise errors.InvalidArgumentError(
            'variable_placement=REPLICATED needs trainable variables of a '
            'fully known shape, to copy them onto every tower; {} has shape '
            '{}. Give it a static shape, or use CONSOLIDATION_DEVICE.'.format(
                variable.op.name, variable.shape))
    per_tower = cloner.own_variables(variables, _COPY_COLLECTIONS,
                                     on_tower_devices=True)
    for index, variable in enumerate(variables):
      self._copies[variable.op.name] = [tower[index] for tower in per_tower]
    for tower in per_tower[1:]:
      self._pairs.extend(zip(variables, tower))

  def note_updates(self, ops):
    """Records the ops of the optimizer's update of every copy."""
    self._updates.update(ops)

  def check_writes(self, step):
    """Raises if anything but the optimizer writes a copied variable.

    Every tower keeps its own copy, and the copies stay equal because only
    the one update of all of them (and their constraints) writes them.
    Another write in tower 0 (a counter of rows in the forward pass, a
    projection after `minimize`) would reach one copy, or each tower's copy
    its own, where a `model_fn` call per tower writes the one variable.
    Writes that a step does not run are left alone: those run once when the
    session starts (`init_from_checkpoint`, a scaffold's `init_fn`) come
    before the copies are set from tower 0's.

    TF 2 functions that get a variable's handle (a `While` body) are not
    looked into: a write there is not found.

    Args:
      step: the ops and tensors a step runs (the spec's train op, loss,
        metrics and predictions); writes outside their cone are not steps'.

    Raises:
      InvalidArgumentError: naming the variable, the op and the fixes.
    """
    cone = op_kinds.backward_cone(
        op for op in (op_kinds.op_of(item) for item in step) if op is not None)
    for name in sorted(self._copies):
      variable = self._copies[name][0]
      for write in op_kinds.variable_writes(variable.op, within=cone):
        if write in self._updates or _calls_a_function(write):
          continue
        raise errors.InvalidArgumentError(
            'variable_placement=REPLICATED keeps one copy of trainable '
            'variable {} per tower, equal because only the optimizer\'s '
            'update writes them; but op {} ({}) writes it too, and would '
            'write one copy only, or each tower its own. Make the variable '
            'non-trainable (trainable=False: one variable, written by every '
            'tower), project it with a variable constraint '
            '(kernel_constraint=...), or use VariablePlacement.'
            'CONSOLIDATION_DEVICE.'.format(name, write.name, write.type))

  def copy_of(self, tower_id, variable):
    """Tower `tower_id`'s copy of tower 0's `variable` (itself if none)."""
    copies = self._copies.get(variable.op.name)
    return variable if copies is None else copies[tower_id]

  def make_slots(self, optimizer, tower_grads_and_vars):
    """Makes the copies' slots before the one `apply_gradients`.

    The optimizer makes tower 0's slots itself (as `apply_gradients` would:
    their names, initial values and checkpoint keys are unchanged); each
    copy's slot is made from tower 0's (graph_copy/bulk_variables.py), a local
    variable, set from tower 0's at session start by `adopt_slots`' pairs.
    An optimizer without the structure this needs makes every slot in
    `apply_gradients`.

    Args:
      optimizer: the wrapped optimizer about to apply.
      tower_grads_and_vars: as for `adopt_slots`.
    """
    firsts, copies = [], []
    for index, (grad, first) in enumerate(tower_grads_and_vars[0]):
      if grad is not None:
        firsts.append(first)
        copies.append([pairs[index][1] for pairs in tower_grads_and_vars[1:]
                       if pairs[index][1] is not first])
    bulk_variables.create_slot_copies(optimizer, firsts, copies,
                                   list(_COPY_COLLECTIONS))

  def adopt_slots(self, optimizer, tower_grads_and_vars):
    """Makes the slots `optimizer` created for the copies local copies too.

    Called after one `apply_gradients` over every tower's pairs: each copy's
    slot leaves the global variables (and so the checkpoints) and is set
    from tower 0's slot when a session starts.

    Args:
      optimizer: the wrapped optimizer that applied.
      tower_grads_and_vars: the pairs applied, one list per tower (tower 0's
        first), pair `k` of every tower for the same variable.
    """
    graph = tf1.get_default_graph()
    global_variables = graph.get_collection_ref(
        tf1.GraphKeys.GLOBAL_VARIABLES)
    local_variables = graph.get_collection_ref(tf1.GraphKeys.LOCAL_VARIABLES)
    local_ids = set(id(v) for v in local_variables)
    leaving = set()
    slot_names = optimizer.get_slot_names()
    for index, (grad, first) in enumerate(tower_grads_and_vars[0]):
      if grad is None:
        continue
      for name in slot_names:
        source = optimizer.get_slot(first, name)
        if source is None:
          continue
        for pairs in tower_grads_and_vars[1:]:
          slot = optimizer.get_slot(pairs[index][1], name)
          if slot is None or slot is source:
            continue
          leaving.add(id(slot))
          if id(slot) not in local_ids:
            local_ids.add(id(slot))
            local_variables.append(slot)
          self._pairs.append((source, slot))
    if leaving:
      global_variables[:] = [v for v in global_variables
                             if id(v) not in leaving]

  def scaffold_initializing_copies(self, scaffold):
    """`scaffold`, with the copies in the `local_init_op` `model_fn` gave.

    The copies and their slots are local variables, made after `model_fn`
    returned tower 0's spec: TF's default `local_init_op` (made when the
    session starts) initializes them, but one that `model_fn` set did not
    know them, and the session would never be ready.

    Args:
      scaffold: the spec's `tf.compat.v1.train.Scaffold`, or None.

    Returns:
      `scaffold` itself where it sets no `local_init_op`, else a copy whose
      `local_init_op` also runs the copies' initializers.
    """
    if scaffold is None or scaffold.local_init_op is None or not self._pairs:
      return scaffold
    with tf1.name_scope('replicated_copies'):
      local_init_op = tf.group(
          scaffold.local_init_op,
          tf1.variables_initializer([copy for _, copy in self._pairs]),
          name='local_init_op')
    return tf1.train.Scaffold(local_init_op=local_init_op,
                              copy_from_scaffold=scaffold)

  def sync_hook(self):
    """A `SessionRunHook` setting every copy from tower 0's at session start.

    Returns:
      The hook, or None when there is nothing to copy.
    """
    if not self._pairs:
      return None
    return _SyncHook(self._pairs)


def _calls_a_function(op):
  """Whether `op` runs a library function (TF 2 control flow, a call)."""
  return (op.type in op_kinds.FUNCTION_CALL_OP_TYPES or
          _compat.is_graph_function(op.graph, op.type))


# The most bytes of tower-0 values the sync holds on the host at once.
_SYNC_BATCH_BYTES = 256 << 20


class _SyncRound(object):
  """One fetch of tower-0 values, then one run of initializers fed them."""

  def __init__(self):
    self.sources = []
    self.feeds = {}  # name of the fed tensor -> index into sources
    self.initializers = []
    self._index = {}  # id(source) -> index into sources
    self._bytes = 0

  def takes(self, source, feed, size, max_bytes):
    index = self._index.get(id(source))
    if self.feeds.get(feed, index) != index:
      return False  # the tensor is fed another source's value
    return (index is not None or not self.sources or
            self._bytes + size <= max_bytes)

  def add(self, source, feed, size, initializer):
    index = self._index.get(id(source))
    if index is None:
      index = self._index[id(source)] = len(self.sources)
      self.sources.append(source)
      self._bytes += size
    self.feeds[feed] = index
    self.initializers.append(initializer)


def _sync_rounds(pairs, max_bytes=_SYNC_BATCH_BYTES):
  """Groups `(source, target)` pairs into `_SyncRound`s.

  A target is set by running its initializer with the value it assigns fed
  (`tf.Variable.load`'s way): no op is added to the graph. Copies of one
  variable share their initial value tensor, so one fed value sets them
  all; a round never feeds one tensor for two sources (two variables made
  from one tensor), and holds at most `max_bytes` of values (or one source).

  Raises:
    InvalidArgumentError: if a target's initializer is not an assignment of
      its initial value.
  """
  rounds = []
  for source, target in pairs:
    initializer = target.initializer
    if initializer.type not in ('Assign', 'AssignVariableOp') or len(
        initializer.inputs) != 2:
      raise errors.InvalidArgumentError(
          'Cannot set the REPLICATED copy {} from {}: its initializer is a '
          '{} op, not an assignment of its initial value.'.format(
              target.op.name, source.op.name, initializer.type))
    feed = initializer.inputs[1].name
    size = source.shape.num_elements() * source.dtype.size
    for sync_round in rounds:
      if sync_round.takes(source, feed, size, max_bytes):
        break
    else:
      sync_round = _SyncRound()
      rounds.append(sync_round)
    sync_round.add(source, feed, size, initializer)
  return rounds


class _SyncHook(tf1.train.SessionRunHook):
  """Sets the copies from tower 0's once the session is created.

  `after_create_session` runs after restoring (chief) and after the local
  variables' initializers, in training, evaluation and prediction sessions
  alike, and again whenever a `MonitoredSession` recreates its session.
  Each round fetches tower 0's values, then runs the copies' initializers
  with them fed (`_sync_rounds`): the sync adds no op to the graph.
  """

  def __init__(self, pairs):
    self._rounds = _sync_rounds(pairs)

  def after_create_session(self, session, coord):
    del coord  # unused
    for sync_round in self._rounds:
      values = session.run(sync_round.sources)
      session.run(sync_round.initializers, feed_dict={
          feed: values[index] for feed, index in sync_round.feeds.items()})

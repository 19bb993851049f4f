"""`VariablePlacement.REPLICATED`: every tower trains its own variables.

Tower 0's trainable variables are the model's: they keep the unreplicated
names, live on tower 0's device and are what checkpoints hold. Every other
tower gets a copy of each on its own device (`TowerCloner.own_variables`),
named `tower_<i>/<name>`; the copied ops of tower i read it. The copies and
their optimizer slots are local variables: never saved, so checkpoints
move both ways between REPLICATED, the other placements and one device.

The copies start equal to tower 0's variables and stay equal: a hook sets
them (and their slots) from tower 0's when a session starts, after the
checkpoint is restored; in every step each tower applies the same
all-reduced gradients to its own copy, in one `apply_gradients` call over
all copies, so that per-call state such as Adam's beta powers advances once.
Non-trainable variables (the global step, moving statistics) stay single,
as tower 0's.
"""
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
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

  def sync_hook(self):
    """A `SessionRunHook` setting every copy from tower 0's at session start.

    Returns:
      The hook, or None when there is nothing to copy.
    """
    if not self._pairs:
      return None
    return _SyncHook(_assign_all(self._pairs,
                                 'replicated_variables_sync/sync'))


def _assign_all(pairs, name):
  """One op setting each target variable to its source's value.

  Each assignment is placed on its target's device and grouped per device
  first: a control edge across devices costs a transfer when the op runs.
  """
  graph = tf1.get_default_graph()
  per_device = {}
  with tf1.name_scope(None), tf1.control_dependencies(None), (
      graph.colocate_with(None, ignore_existing=True)), tf1.device(None), (
          tf1.name_scope(name)) as scope:
    for source, target in pairs:
      with tf1.device(target.device):
        per_device.setdefault(target.device, []).append(
            target.assign(source.value(), read_value=False))
    groups = []
    for device, assigns in per_device.items():
      with tf1.device(device):
        groups.append(tf.group(*assigns))
    return tf.group(*groups, name=scope)


class _SyncHook(tf1.train.SessionRunHook):
  """Runs the copies' sync once the session is created and initialized.

  `after_create_session` runs after restoring (chief) and after the local
  variables' initializers, in training, evaluation and prediction sessions
  alike, and again whenever a `MonitoredSession` recreates its session.
  """

  def __init__(self, sync_op):
    self._sync_op = sync_op

  def after_create_session(self, session, coord):
    del coord  # unused
    session.run(self._sync_op)

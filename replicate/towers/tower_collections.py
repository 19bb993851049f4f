"""Each tower's own view of the loss and update-op graph collections.

`tf.compat.v1` models find their losses and batch-norm updates through graph
collections (`tf.losses.get_total_loss()`, `tf.losses.get_regularization_loss()`,
`tf.get_collection(tf.GraphKeys.UPDATE_OPS)`). When one `model_fn` is called
once per tower, every later tower would see the entries of every earlier one:
contrib's `replicate_model_fn` let tower 3 count the losses of
towers 0-2, and ran the moving-average updates of all towers concurrently on
the same variables, so two identical runs ended with different statistics.

While tower `i` is built, the collections below hold the entries that existed
before replication plus tower `i`'s own, and nothing of the other towers:

* `LOSSES`: tower `i`'s losses only. Afterwards: all towers' losses.
* `REGULARIZATION_LOSSES`: regularizers are created with the shared variables,
  i.e. once, in tower 0. Every tower sees them so that, after the loss
  reduction averages the tower losses, they count exactly once, as in the
  unreplicated model. Under `Reduction.SUM` tower losses are added, not
  averaged, so only tower 0 sees them (again: exactly once overall).
* `UPDATE_OPS`: the policy for batch-norm moving statistics is "tower 0's
  updates only". The update of the variables waits for tower 0's updates
  as the model asks (usually a `tf.control_dependencies(update_ops)` block
  around `minimize`, or around `apply_gradients`); the updates other towers
  build are never run. Towers copied from tower 0 share its updates instead
  of copying them. Towers built by their own `model_fn` call compute their
  gradients under that block less their own `UPDATE_OPS`, and the last
  tower, which applies for all, waits for what tower 0's same
  `apply_gradients` call was made under, and for its own block less its
  `UPDATE_OPS` (tower_gradients.py). One writer per variable per step
  makes the moving statistics deterministic: two identical runs give
  bit-identical values. They are estimated from one tower's shard per step,
  tower 0's, as in tf_cnn_benchmarks. Afterwards the collection holds tower
  0's updates.

The lists are changed in place through the public `get_collection_ref` and
restored in `finally` blocks; no state of this library is stored in the graph.
"""
import contextlib
import re

from replicate import _compat
from replicate._compat import tf1
from replicate.core import op_kinds

_KEYS = (tf1.GraphKeys.LOSSES, tf1.GraphKeys.REGULARIZATION_LOSSES,
         tf1.GraphKeys.UPDATE_OPS)
# The tower whose UPDATE_OPS run (see the module docstring).
UPDATE_TOWER_ID = 0


class TowerCollections(object):
  """Switches the loss and update-op collections between per-tower views."""

  def __init__(self, graph, num_towers, share_regularization):
    """Records the collections as they are before any tower is built.

    Args:
      graph: the graph the towers are built in.
      num_towers: number of towers.
      share_regularization: whether towers after the first see the
        regularization losses created in tower 0 (see the module docstring).
    """
    self._graph = graph
    self._share_regularization = share_regularization
    self._before = {key: list(graph.get_collection(key)) for key in _KEYS}
    self._added = {key: [[] for _ in range(num_towers)] for key in _KEYS}

  def _view(self, key, tower_id):
    view = list(self._before[key])
    if (key == tf1.GraphKeys.REGULARIZATION_LOSSES and tower_id > 0 and
        self._share_regularization):
      view.extend(self._added[key][0])
    return view

  @contextlib.contextmanager
  def tower(self, tower_id):
    """Shows tower `tower_id`'s view while the block builds that tower."""
    views = {}
    for key in _KEYS:
      views[key] = self._view(key, tower_id)
      self._set(key, views[key])
    try:
      yield
    finally:
      for key in _KEYS:
        seen = set(id(item) for item in views[key])
        self._added[key][tower_id] = [
            item for item in self._graph.get_collection(key)
            if id(item) not in seen
        ]

  def added(self, tower_id, key):
    """What tower `tower_id` added to collection `key`."""
    return list(self._added[key][tower_id])

  def record_copied_losses(self, tower_id, losses):
    """Records the losses of a tower copied from tower 0 (tower_cloning.py).

    Args:
      tower_id: the copied tower.
      losses: its copies of tower 0's `LOSSES` entries.
    """
    self._added[tf1.GraphKeys.LOSSES][tower_id] = list(losses)

  def finish(self):
    """Leaves the collections as described in the module docstring."""
    for key in _KEYS:
      if key == tf1.GraphKeys.UPDATE_OPS:
        added = self._added[key][UPDATE_TOWER_ID]
      else:
        added = [item for tower in self._added[key] for item in tower]
      self._set(key, self._before[key] + added)

  def _set(self, key, items):
    # An absent collection stays absent (as in the unreplicated model) unless
    # there is something to put in it.
    if items or key in self._graph.get_all_collection_keys():
      self._graph.get_collection_ref(key)[:] = items


_OTHER_TOWER = re.compile(r'tower_[1-9][0-9]*/')


def order_update_writes(tower_0_updates, train_op):
  """Makes tower 0's update ops' writes wait for the other towers' reads.

  On one device a model reads what its update ops write before they write
  it (batch renormalization reads `renorm_mean` in the forward pass and
  updates it after; so do spectral normalization's power iteration and
  running normalizers). Tower 0's updates are the only ones that run, and
  nothing ordered them after the other towers' reads of the same
  variables: a race, different from step to step. Every variable write in
  the ops the update ops wait for is made to wait for the reads, by the
  other towers' ops that `train_op` runs, of that variable (a reference
  variable's reads are the consumers of its snapshot, which aliases it).
  A write that such a read itself waits for is left as it is.

  Args:
    tower_0_updates: tower 0's `UPDATE_OPS` entries.
    train_op: the step's training op.
  """
  cone = op_kinds.backward_cone(
      filter(None, map(op_kinds.op_of, tower_0_updates)))
  in_step = None
  for variable_op in sorted(cone, key=lambda op: op.name):
    if variable_op.type not in op_kinds.VARIABLE_OP_TYPES:
      continue
    writes = op_kinds.variable_writes(variable_op, within=cone)
    reads = _other_tower_reads(variable_op) if writes else None
    if not reads:
      continue
    if in_step is None:
      in_step = op_kinds.backward_cone([op_kinds.op_of(train_op)])
    reads = [read for read in reads if read in in_step]
    if not reads:
      continue
    after_writes = op_kinds.backward_cone(reads)
    for write in writes:
      if write not in after_writes:
        _compat.add_control_inputs(write, reads)


def _other_tower_reads(variable_op):
  """The ops of towers 1..N-1 that read the variable of `variable_op`."""
  reads = []
  for op in variable_op.outputs[0].consumers():
    if op.type == 'ReadVariableOp' and _OTHER_TOWER.match(op.name):
      reads.append(op)  # a resource read copies before a later write
    elif op.type == 'Identity' and op.outputs[0].dtype != tf1.resource:
      reads.extend(consumer for consumer in op.outputs[0].consumers()
                   if _OTHER_TOWER.match(consumer.name))
  return sorted(set(reads), key=lambda op: op.name)

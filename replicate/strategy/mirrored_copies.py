"""Replicas 1..N-1 of a mirrored `call_for_each_replica` as copies of replica 0.

Calling the replica function once per replica pays its Python (layer
construction, `tf.gradients`) N times. With `ReplicaBuild.CLONE` the
function runs once, for replica 0, and at each sync point (every
`merge_call`, and the end) what replica 0 built since the last one and the
sync point needs is copied onto the other replicas' devices with
`graph_copy.GraphCopier` (one `tf.import_graph_def` per sync point). The
copies read their replica's own inputs and their own copy of each mirrored
(and sync-on-read) variable; a value a `merge_call` handed replica 0 reads,
in copy i, what it handed replica i. The merge function gets per-replica
arguments (replica i's: the copies of replica 0's) and runs once, as with
per-replica calls.

Where copying cannot be shown to be right the replicas are built by calling
the function (mirrored_run.py says how a run switches mid-way) and one
warning says why: replica 0 asked `replica_id_in_sync_group` or `devices`
(the replicas may differ); the replicas' inputs differ in structure or in
Python values; a `merge_call` handed the replicas different Python values.
Python state the function keeps (a counter, a Python random number) is not
seen: it is the same for every copy. `ReplicaBuild.CALL_PER_REPLICA` calls
the function per replica, as TF does.
"""
import enum

import tensorflow as tf

from replicate.core import logs as logging
from replicate.graph_copy import graph_copier
from replicate.strategy import distribute_context


class ReplicaBuild(enum.Enum):
  """How a `MirroredStrategy` builds replicas 1..N-1.

  Attributes:
    CLONE: run the replica function once, for replica 0, and copy its graph
      onto the other replicas at each sync point; where copying cannot be
      shown to be right, call it per replica, with a warning. The default.
    CALL_PER_REPLICA: call the function once per replica, as TF does.
  """
  CLONE = 'clone'
  CALL_PER_REPLICA = 'call_per_replica'


def warn_not_cloned(reason):
  """Logs once why replicas are built by calling the replica function."""
  logging.log_first_n(
      logging.WARNING,
      'MirroredStrategy builds every replica by calling the replica function, '
      'because %s. Pass replica_build=ReplicaBuild.CALL_PER_REPLICA to '
      'MirroredStrategy to silence this; see '
      'replicate/strategy/mirrored_copies.py.', 1, reason)


class ReplicaCopier(graph_copier.GraphCopier):
  """Copies replica 0's ops onto replicas 1..N-1 (named `replica_<i>/`).

  A copy goes to replica i's device where its original went to replica 0's,
  and where the original was pinned elsewhere (a `tf.device` inside the
  function) to the same place, as a per-replica call would put it.
  """

  def __init__(self, graph, devices, first_op_index, replica_inputs):
    super(ReplicaCopier, self).__init__(
        graph, devices, first_op_index, replica_inputs, scope_name='replica')

  def map_mirrored(self, variables):
    """Copies of ops reading or writing a mirrored variable use their copy.

    Args:
      variables: `MirroredVariable`s (one copy per device, in device order).
    """
    variables = [v for v in variables if len(v.values) == len(self._devices)]
    if variables:
      self.map_variables([v.values[0] for v in variables],
                         [[v.values[i] for v in variables]
                          for i in range(len(self._devices))])

  def _requested_device(self, op):
    return op.device or None

  def _tower_device(self, requested, device):
    del device  # Pinned on purpose: every replica's op goes there.
    return requested


def flat_inputs(structure):
  """The leaves of a replica's arguments, composite tensors expanded."""
  return tf.nest.flatten(structure, expand_composites=True)


def reason_not_to_clone(graph, per_replica_inputs):
  """Why replicas cannot be copies, known before replica 0 runs, or None.

  Args:
    graph: the graph the replicas are built in.
    per_replica_inputs: for each replica, `flat_inputs` of its arguments.
  """
  if graph.building_function or distribute_context.building_loop_body():
    return ('the replicas are built inside a graph function or loop body, '
            'where imported copies would sit outside it')
  first = per_replica_inputs[0]
  for inputs in per_replica_inputs[1:]:
    if len(inputs) != len(first):
      return 'the replicas\' arguments differ in structure'
    for a, b in zip(first, inputs):
      if a is b:
        continue
      if isinstance(a, tf.Tensor) and isinstance(b, tf.Tensor):
        if a.dtype != b.dtype or _shape(a) != _shape(b):
          return ('the replicas\' input tensors differ in shape or dtype '
                  '({} and {})'.format(a, b))
        continue
      if isinstance(a, tf.Operation) and isinstance(b, tf.Operation):
        continue
      if not tf.is_tensor(a) and _equal_python(a, b):
        continue
      return ('the replicas\' arguments differ in a value that is not a '
              'tensor ({!r} and {!r})'.format(a, b))
  return None


def tensors_of(structure):
  """The tensors and ops a nest of replica values holds (for `clone`)."""
  out = []
  for leaf in tf.nest.flatten(structure):
    if isinstance(leaf, (tf.Tensor, tf.Operation)):
      out.append(leaf)
    elif isinstance(leaf, tf.IndexedSlices):
      out.extend(t for t in (leaf.values, leaf.indices, leaf.dense_shape)
                 if t is not None)
    elif isinstance(leaf, tf.SparseTensor):
      out.extend([leaf.indices, leaf.values, leaf.dense_shape])
    elif hasattr(leaf, '_replica_tensors'):
      out.extend(leaf._replica_tensors())  # pylint: disable=protected-access
  return out


def copy_of(copier, replica_id, structure):
  """Replica `replica_id`'s copy of a nest of replica 0's values.

  Tensors, ops, `IndexedSlices` and `SparseTensor`s become their copies; an
  object with `_replica_copy(get)` (e.g. the raw gradients of
  mirrored_gradients.py) copies itself; anything else is the same object.
  """
  def get(value):
    return copier.get(replica_id, value)

  def copy_leaf(leaf):
    if isinstance(leaf, (tf.Tensor, tf.Operation, tf.IndexedSlices)):
      return get(leaf)
    if isinstance(leaf, tf.SparseTensor):
      return tf.SparseTensor(get(leaf.indices), get(leaf.values),
                             get(leaf.dense_shape))
    if hasattr(leaf, '_replica_copy'):
      return leaf._replica_copy(get)  # pylint: disable=protected-access
    return leaf
  return tf.nest.map_structure(copy_leaf, structure)


def map_shares(copier, replica_id, first_share, share):
  """Makes copies read replica `replica_id`'s share where replica 0's is read.

  Args:
    copier: the `ReplicaCopier`.
    replica_id: a replica other than 0.
    first_share: what a `merge_call` handed replica 0.
    share: what it handed replica `replica_id`.

  Returns:
    None, or why copies cannot follow (the shares differ in a Python value).
  """
  for a, b in zip(tf.nest.flatten(first_share), tf.nest.flatten(share)):
    if a is b:
      continue
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
      pairs = [(a.values, b.values), (a.indices, b.indices)]
      if a.dense_shape is not None and b.dense_shape is not None:
        pairs.append((a.dense_shape, b.dense_shape))
    elif isinstance(a, tf.Operation) and isinstance(b, tf.Operation):
      pairs = [(a, b)]
    elif isinstance(a, tf.Tensor) and isinstance(b, tf.Tensor) and (
        a.dtype == b.dtype and _shape(a) == _shape(b)):
      pairs = [(a, b)]
    elif _equal_python(a, b):
      continue
    else:
      return ('a merge_call handed the replicas values that differ other '
              'than as tensors of one shape ({!r} and {!r})'.format(a, b))
    for original, copy in pairs:
      copier.set_copy(replica_id, original, copy)
  return None


def _equal_python(a, b):
  try:
    return bool(a == b)
  except Exception:  # pylint: disable=broad-except
    return False


def _shape(tensor):
  """A tensor's static shape as a comparable value (None: unknown rank)."""
  shape = tensor.shape
  return None if shape.rank is None else tuple(shape.as_list())

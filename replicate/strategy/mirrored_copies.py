"""Replicas 1..N-1 of a mirrored `call_for_each_replica` as copies of replica 0.

By default (`ReplicaBuild.CALL_PER_REPLICA`) the replica function is called
once per replica, as TF does. Calling it pays its Python (layer
construction, `tf.gradients`) N times; with the opt-in `ReplicaBuild.CLONE`
the function runs once, for replica 0, and at each sync point (every
`merge_call`, and the end) what replica 0 built since the last one and the
sync point needs is copied onto the other replicas' devices with
`graph_copy.GraphCopier` (one `tf.import_graph_def` per sync point). The
copies read their replica's own inputs and their own copy of each mirrored
(and sync-on-read) variable; a value a `merge_call` handed replica 0, or
replica 0 looked up by its device scope (`PerDevice.get()`), reads, in copy
i, replica i's; with a graph seed, seeded random ops
draw their own numbers per copy, and without one an op-level seed draws the
same numbers in every copy, as in every call (node_defs.reseeds). The merge function gets per-replica arguments (replica i's: the
copies of replica 0's) and runs once, as with per-replica calls.

Where copying cannot be shown to be right, `CLONE` raises
`InvalidArgumentError` naming the reason (`POLICY`, graph_copy/copy_policy.py)
and never switches to calls mid-run: before anything is built, when the
replicas are built inside a graph function or loop body or their inputs
differ other than as tensors of one shape; during the run, when replica 0
asks `replica_id_in_sync_group` or `devices`, or a `merge_call` hands the
replicas different Python values.
Python side effects of the function (a counter, a Python random number)
happen once, not per replica.
"""
import enum

import tensorflow as tf

from replicate import _compat
from replicate.core import op_kinds
from replicate.graph_copy import copy_policy
from replicate.graph_copy import graph_copier
from replicate.graph_copy import python_state
from replicate.strategy import distribute_context


class ReplicaBuild(enum.Enum):
  """How a `MirroredStrategy` builds replicas 1..N-1.

  Attributes:
    CALL_PER_REPLICA: call the replica function once per replica, as TF
      does. The default.
    CLONE: run the function once, for replica 0, and copy its graph onto the
      other replicas at each sync point; where copying cannot be shown to be
      right, raise `InvalidArgumentError` saying why.
  """
  CALL_PER_REPLICA = 'call_per_replica'
  CLONE = 'clone'


POLICY = copy_policy.CopyPolicy(
    copies='replicate.MirroredStrategy(replica_build=ReplicaBuild.CLONE) '
           'copies replica 0 onto the other replicas',
    calls='calling the replica function once per replica',
    fix='pass replica_build=replicate.ReplicaBuild.CALL_PER_REPLICA (the '
        'default) to MirroredStrategy')


class ReplicaCopier(graph_copier.GraphCopier):
  """Copies replica 0's ops onto replicas 1..N-1 (named `replica_<i>/`).

  A copy goes to replica i's device where its original went to replica 0's,
  and where the original was pinned elsewhere (a `tf.device` inside the
  function) to the same place, as a per-replica call would put it.
  """

  def __init__(self, graph, devices, first_op_index, replica_inputs):
    super(ReplicaCopier, self).__init__(
        graph, devices, first_op_index, replica_inputs, scope_name='replica')
    self._python_state = python_state.PythonState()

  def reason_python_state(self, ops):
    """Why copies of replica 0's new `ops` would not be another call's
    (python_state.py), or None."""
    reason = self._python_state.reason_not_to_copy(
        python_state.copied_ops(ops))
    return None if reason is None else 'the replica function ' + reason

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
  if _compat.summary_state()[0] is not None:
    return _SUMMARY_REASON
  return copy_policy.reason_inputs_differ(per_replica_inputs)


_SUMMARY_REASON = (
    'a TF 2-style summary writer is in effect: replica 0 alone records, and '
    "copies of its summary ops would record in every replica")


_SUMMARY_V1_REASON = (
    'the function makes a tf.compat.v1.summary op ({}): each call tags its '
    "summary with its replica's name scope (replica_1/...) and adds it to "
    "the SUMMARIES collection, where copies would repeat replica 0's tag "
    'and add nothing')


def reason_summaries_written(ops):
  """Why replicas cannot be copies, given replica 0's new `ops`, or None."""
  if any(op.type in op_kinds.SUMMARY_WRITE_OP_TYPES for op in ops):
    return _SUMMARY_REASON
  for op in ops:
    if op.type in op_kinds.SUMMARY_V1_OP_TYPES:
      return _SUMMARY_V1_REASON.format(op.name)
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
  return out


def copy_of(copier, replica_id, structure):
  """Replica `replica_id`'s copy of a nest of replica 0's values.

  Tensors, ops, `IndexedSlices` and `SparseTensor`s become their copies;
  anything else is the same object.
  """
  def get(value):
    return copier.get(replica_id, value)

  def copy_leaf(leaf):
    if isinstance(leaf, (tf.Tensor, tf.Operation, tf.IndexedSlices)):
      return get(leaf)
    if isinstance(leaf, tf.SparseTensor):
      return tf.SparseTensor(get(leaf.indices), get(leaf.values),
                             get(leaf.dense_shape))
    return leaf
  return tf.nest.map_structure(copy_leaf, structure)


def map_shares(copier, replica_id, first_share, share,
               source='a merge_call handed the replicas'):
  """Makes copies read replica `replica_id`'s share where replica 0's is read.

  Args:
    copier: the `ReplicaCopier`.
    replica_id: a replica other than 0.
    first_share: what a `merge_call` handed replica 0 (or what replica 0
      looked up by its device scope).
    share: what it handed replica `replica_id` (or what replica
      `replica_id` would have looked up).
    source: where the shares come from, for the reason.

  Returns:
    None, or why copies cannot follow (the shares differ in a Python value).
  """
  for a, b in zip(tf.nest.flatten(first_share), tf.nest.flatten(share)):
    if a is b:
      read = _read_in_copies(copier, replica_id, a)
      if read is not None:
        return ('{} one value for every replica ({}), which copies of replica '
                "0 would take for replica 0's own and read replica {}'s in its "
                'place ({}), where every call reads the one value'.format(
                    source, read[0].name, replica_id, read[1].name))
      continue
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
      pairs = [(a.values, b.values), (a.indices, b.indices)]
      if a.dense_shape is not None and b.dense_shape is not None:
        pairs.append((a.dense_shape, b.dense_shape))
    elif isinstance(a, tf.Operation) and isinstance(b, tf.Operation):
      pairs = [(a, b)]
    elif isinstance(a, tf.Tensor) and isinstance(b, tf.Tensor) and (
        a.dtype == b.dtype and
        copy_policy.static_shape(a) == copy_policy.static_shape(b)):
      pairs = [(a, b)]
    elif copy_policy.equal_python(a, b):
      continue
    else:
      return ('{} values that differ other than as tensors of one shape '
              '({!r} and {!r})'.format(source, a, b))
    for original, copy in pairs:
      copier.set_copy(replica_id, original, copy)
  return None


def _read_in_copies(copier, replica_id, value):
  """(what replica 0 reads of `value`, what copy `replica_id` would read in
  its place) where they differ, else None. A variable is read through its
  handle (a resource variable, an update's result) or its ref: one of
  replica 0's copies of a mirrored variable is its own copy to replica 0,
  which copies map to theirs."""
  if isinstance(value, tf.Variable):
    handle = getattr(value, 'handle', None)
    value = value.op.outputs[0] if handle is None else handle
  if not isinstance(value, (tf.Tensor, tf.Operation)):
    return None
  read = copier.get(replica_id, value)
  return None if read is value else (value, read)

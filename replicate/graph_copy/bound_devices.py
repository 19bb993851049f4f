"""Ops that TF's placer binds to the device of a resource they read.

TF's placer puts an op with the resource it takes (a variable's handle, a
stack), and an op with the ops it is colocated with, whatever device the op
asked for. A copy of such an op bound to a variable the copies share must
go where that variable is: e.g. the stack (`f_acc`) in which a TF1
`tf.while_loop`'s gradient keeps the values of a resource variable read
inside the loop is colocated with the read, and the read sits with the
variable; on the tower's device, the copies of the stack's ops would ask
for two devices at once. Function calls (`If`, `While`, `PartitionedCall`,
...) place their bodies themselves and are bound to nothing.
"""
import tensorflow as tf

from replicate.graph_copy import node_defs


def anchors(ops, is_copied):
  """`{op: the op not copied whose device the copies of op must take}`.

  Args:
    ops: the `Operation`s to copy.
    is_copied: whether an `Operation` is copied (in this round or before).

  Returns:
    A dict, with entries only for the ops so bound.
  """
  found = {}
  for op in ops:
    if any(t.dtype == tf.resource for t in op.inputs) or (
        node_defs.colocation_targets(op.node_def)):
      anchor = _anchor(op, is_copied)
      if anchor is not None:
        found[op] = anchor
  return found


def _anchor(op, is_copied):
  """The first op not copied, with a device, that `op` is bound to."""
  seen = set()
  stack = [op]
  while stack:
    current = stack.pop()
    if current in seen:
      continue
    seen.add(current)
    copied = is_copied(current)
    if not copied and current.device:
      return current
    if node_defs.calls_functions(current.node_def):
      continue
    # A read not copied without a device (TF 2's plain read of a resource
    # variable) is placed by its variable: go on to the variable.
    stack.extend(t.op for t in current.inputs if t.dtype == tf.resource)
    if copied:
      stack.extend(current.graph.get_operation_by_name(name)
                   for name in node_defs.colocation_targets(current.node_def))
  return None

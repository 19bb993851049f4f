"""Summing tower gradients: plain functions over per-tower lists.

Nothing here decides placement beyond the rule "sum on the device of the
variable the gradient belongs to", which keeps the update next to the
variable and avoids copying the sum back.

Small dense gradients are packed before they are summed: every tower
concatenates its gradients of the same dtype and trailing shape (on the
tower's own device) into one tensor, the packs are added with one `add_n` on
the variables' device, and the sum is split back along dimension 0. A model
with many small variables then sends one tensor per tower and group instead
of one per variable, and runs one `add_n` instead of one per variable: on
100 dense layers of 64 units that removes ~600 cross-device transfers and
~200 ops from every training step (see benchmarks/results/profile_notes.md).
Each packed sum adds the towers in order, ((g0 + g1) + g2) + g3, element by
element, exactly as a per-variable `add_n` kernel does (tests check it bit for
bit against NumPy; Grappler's arithmetic optimizer may reassociate small
`add_n`s, packed or not, within float rounding). Large gradients are summed one by one, since
copying them into a pack costs more memory traffic than it saves.
"""
import collections

from absl import logging
import tensorflow as tf

from replicate._compat import tf1

# Gradients of at most this many bytes are packed; larger ones are summed
# individually (a concat copies its inputs, which for multi-MB tensors costs
# more than the per-tensor overhead it removes).
PACK_MAX_BYTES = 256 * 1024
# At most this many variables per pack: smaller packs are ready (and their
# updates can run) while the towers still back-propagate through earlier
# layers, instead of every update waiting for the whole backward pass.
PACK_MAX_GROUP = 16


def sum_gradients_by_variable(tower_grads_and_vars, pack_max_bytes=None):
  """Sums the gradients of each variable across towers.

  Args:
    tower_grads_and_vars: one list of `(gradient, variable)` pairs per tower,
      as returned by `Optimizer.compute_gradients`. `None` gradients are
      skipped.
    pack_max_bytes: dense gradients of at most this many bytes, with a fully
      known static shape of rank >= 1 in every tower, are packed per tower
      (grouped by variable device, dtype and shape after dimension 0, at
      most `PACK_MAX_GROUP` variables per pack) and summed with one `add_n`
      per pack; 0 disables packing; None means `PACK_MAX_BYTES`.

  Returns:
    A list of `(summed_gradient, variable)` pairs, one per variable that has
    a gradient in some tower, in the order variables first appear. Dense
    gradients are added with `add_n`; `IndexedSlices` stay sparse: their
    values and indices are concatenated (duplicates are summed when applied).
  """
  if pack_max_bytes is None:
    pack_max_bytes = PACK_MAX_BYTES
  grads_by_var = collections.OrderedDict()
  variables = {}
  for grads_and_vars in tower_grads_and_vars:
    for grad, var in grads_and_vars:
      if grad is None:
        continue
      key = _variable_key(var)
      variables[key] = var
      grads_by_var.setdefault(key, []).append(grad)

  summed = {}
  groups = collections.OrderedDict()
  for key, grads in grads_by_var.items():
    group = _pack_group(grads, variables[key].device, pack_max_bytes)
    if group is None:
      summed[key] = sum_on_device(grads, variables[key].device)
    else:
      groups.setdefault(group, []).append(key)
  for (device, _, _), group_keys in groups.items():
    for start in range(0, len(group_keys), PACK_MAX_GROUP):
      keys = group_keys[start:start + PACK_MAX_GROUP]
      if len(keys) == 1:
        summed[keys[0]] = sum_on_device(grads_by_var[keys[0]], device)
        continue
      for key, total in zip(keys, _sum_packed(
          [grads_by_var[key] for key in keys], device)):
        summed[key] = total
  return [(summed[key], variables[key]) for key in grads_by_var]


def _variable_key(var):
  # Variables are hashable by identity in TF1 but not in TF2; their op names
  # are unique within a graph in both.
  return var.op.name


def _pack_group(grads, device, pack_max_bytes):
  """The packing group of one variable's tower gradients, or None.

  Packable: at least two towers, every gradient a dense Tensor of the same
  dtype and fully known static shape of rank >= 1, at most `pack_max_bytes`.
  Gradients are grouped by (variable device, dtype, shape[1:]) so that a
  group concatenates along dimension 0 without any reshape.
  """
  if pack_max_bytes <= 0 or len(grads) < 2:
    return None
  first = grads[0]
  if isinstance(first, tf.IndexedSlices):
    return None
  shape = first.shape
  if shape.rank is None or shape.rank < 1 or not shape.is_fully_defined():
    return None
  if shape.num_elements() * first.dtype.size > pack_max_bytes:
    return None
  for grad in grads[1:]:
    if (isinstance(grad, tf.IndexedSlices) or grad.dtype != first.dtype or
        not grad.shape.is_fully_defined() or grad.shape != shape):
      return None
  return (device, first.dtype, tuple(shape.as_list()[1:]))


def _sum_packed(grads_per_var, device):
  """Sums a group of packable gradients with one concat per tower.

  Args:
    grads_per_var: for each variable of the group, its list of per-tower
      gradients (all lists equally long, towers in the same order).
    device: the device of the group's variables.

  Returns:
    The summed gradient of each variable, in the order given.
  """
  num_towers = len(grads_per_var[0])
  if any(len(grads) != num_towers for grads in grads_per_var):
    # A variable without a gradient in some tower: sum it on its own.
    return [sum_on_device(grads, device) for grads in grads_per_var]
  packs = []
  for tower in range(num_towers):
    tower_grads = [grads[tower] for grads in grads_per_var]
    # On the tower's device: one tensor crosses to `device`, not one per
    # variable.
    with tf1.device(tower_grads[0].device):
      packs.append(tf.concat(tower_grads, axis=0, name='packed_gradients'))
  with tf1.device(device):
    total = tf.math.add_n(packs, name='packed_sum')
    sizes = [grads[0].shape.as_list()[0] for grads in grads_per_var]
    return tf.split(total, sizes, axis=0, name='unpacked_sum')


def sum_on_device(values, device, name=None):
  """Sums `values` (Tensors or IndexedSlices) on `device`.

  Args:
    values: a non-empty list of `Tensor`s, or of `IndexedSlices`.
    device: where to place the sum.
    name: optional name of the result (dense sums only).

  Returns:
    A `Tensor`, or an `IndexedSlices` when all values are `IndexedSlices`.
  """
  with tf1.device(device):
    if len(values) == 1 and name is None:
      return values[0]
    if all(isinstance(v, tf.IndexedSlices) for v in values):
      return tf.IndexedSlices(
          tf.concat([v.values for v in values], axis=0),
          tf.concat([v.indices for v in values], axis=0),
          values[0].dense_shape)
    if any(isinstance(v, tf.IndexedSlices) for v in values):
      logging.log_first_n(
          logging.WARNING,
          'Some towers produced a sparse (IndexedSlices) and others a dense '
          'gradient for the same variable; summing them densely.', 1)
      values = [tf1.convert_to_tensor(v) for v in values]
    return tf.math.add_n(values, name=name)

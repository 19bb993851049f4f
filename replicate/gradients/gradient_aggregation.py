"""Summing tower gradients: plain functions over per-tower lists.

Each variable's gradients are summed on the variable's device with `add_n`.
Small dense gradients are summed in packs (one concat per tower, one
`add_n`, one split): one transfer per tower and pack instead of one per
variable, and the same element-wise order as a per-variable `add_n`.
Thresholds: `Tuning`.
"""
import collections

import tensorflow as tf

from replicate._compat import tf1
from replicate.core import logs as logging
from replicate.core import packing


def sum_gradients_by_variable(tower_grads_and_vars, tuning,
                              pack_max_bytes=None):
  """Sums the gradients of each variable across towers.

  Args:
    tower_grads_and_vars: one list of `(gradient, variable)` pairs per tower,
      as returned by `Optimizer.compute_gradients`. `None` gradients are
      skipped.
    tuning: the `Tuning` whose pack fields size the packs.
    pack_max_bytes: dense gradients of at most this many bytes, with a fully
      known static shape of rank >= 1 in every tower, are packed per tower
      (grouped by variable device, dtype and shape after dimension 0, at
      most `Tuning.pack_max_group` variables per pack unless the pack stays
      within `Tuning.pack_small_bytes`) and summed with one `add_n` per
      pack; 0 disables packing; None means `Tuning.pack_max_bytes`.

  Returns:
    A list of `(summed_gradient, variable)` pairs, one per variable that has
    a gradient in some tower, in the order variables first appear. Dense
    gradients are added with `add_n`; `IndexedSlices` stay sparse: their
    values and indices are concatenated (duplicates are summed when applied).
  """
  if pack_max_bytes is None:
    pack_max_bytes = tuning.pack_max_bytes
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
    chunks = packing.pack_chunks(
        [packing.num_bytes(grads_by_var[key][0]) for key in group_keys],
        tuning.pack_max_group, tuning.pack_small_bytes)
    for chunk in chunks:
      keys = [group_keys[index] for index in chunk]
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
  key = packing.concat_group_key(first, device, pack_max_bytes)
  if key is None:
    return None
  for grad in grads[1:]:
    if (isinstance(grad, tf.IndexedSlices) or grad.dtype != first.dtype or
        not grad.shape.is_fully_defined() or grad.shape != first.shape):
      return None
  return key


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
  # Each tower concatenates on its own device: one tensor crosses to
  # `device`, not one per variable.
  towers = [grads_per_var[0][tower].device for tower in range(num_towers)]
  return packing.reduce_concatenated(
      grads_per_var, towers,
      lambda packs: sum_on_device(packs, device, name='packed_sum'),
      [device], name='packed_gradients')[0]


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

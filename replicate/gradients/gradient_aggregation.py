"""Summing tower gradients: plain functions over per-tower lists.

Each variable's gradients are summed on the variable's device. Small dense
gradients are summed in packs (one concat per tower, one `add_n`, one split;
the same element-wise order as a per-variable `add_n`; on CPUs packs keep
one size whatever the number of towers). Large `MatMul`
weight gradients of CPU towers of one task are fused: the sum over towers
of `X_i^T . dY_i` is computed as one product `concat(X_i)^T . concat(dY_i)`,
equal within float rounding; other devices always sum, since a product on
the variable's device would move the work off them. Thresholds: `Tuning`;
why they pay off: docs/performance.md.
"""
import collections

import tensorflow as tf

from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import logs as logging
from replicate.core import packing
from replicate.core import tuning as tuning_lib
from replicate.gradients import gradient_gating


def sum_gradients_by_variable(tower_grads_and_vars, pack_max_bytes=None,
                              raw_gradients=None, fuse_min_bytes=None):
  """Sums the gradients of each variable across towers.

  Args:
    tower_grads_and_vars: one list of `(gradient, variable)` pairs per tower,
      as returned by `Optimizer.compute_gradients`. `None` gradients are
      skipped.
    pack_max_bytes: dense gradients of at most this many bytes, with a fully
      known static shape of rank >= 1 in every tower, are packed per tower
      (grouped by variable device, dtype and shape after dimension 0, at
      most `Tuning.pack_max_group` variables per pack unless the pack stays
      within `Tuning.pack_small_bytes`, and on CPU devices below
      `packing.one_thread_pack_bytes` for `Tuning.pack_size_sources`
      towers) and summed with one `add_n` per pack; 0 disables packing;
      None means `Tuning.pack_max_bytes`.
    raw_gradients: optional dict from gradient tensor names (as given in
      `tower_grads_and_vars`) to the `gradient_gating.RawGradient` they gate.
      A variable whose tower gradients all map to `MatMul` outputs of at
      least `fuse_min_bytes`, on CPU devices of the variable's task, gets one
      fused product instead of a sum (see the module docstring). None: no
      fusion.
    fuse_min_bytes: the smallest gradient that is fused; None means
      `Tuning.fuse_min_bytes` (itself None: no fusion).

  Returns:
    A list of `(summed_gradient, variable)` pairs, one per variable that has
    a gradient in some tower, in the order variables first appear. Dense
    gradients are added with `add_n`; `IndexedSlices` stay sparse: their
    values and indices are concatenated (duplicates are summed when applied).
  """
  tuning = tuning_lib.get_tuning()
  if pack_max_bytes is None:
    pack_max_bytes = tuning.pack_max_bytes
  if fuse_min_bytes is None:
    fuse_min_bytes = tuning.fuse_min_bytes
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
    raws = _fusable_matmul_gradients(grads, variables[key].device,
                                     raw_gradients or {}, fuse_min_bytes)
    if raws is not None:
      summed[key] = _fused_matmul_sum(raws, variables[key].device)
      continue
    group = _pack_group(grads, variables[key].device, pack_max_bytes)
    if group is None:
      summed[key] = sum_on_device(grads, variables[key].device)
    else:
      groups.setdefault(group, []).append(key)
  for (device, _, _), group_keys in groups.items():
    towers = [grad.device for grad in grads_by_var[group_keys[0]]]
    # On CPUs, packs of a fixed size: their number does not grow with the
    # towers (one_thread_pack_bytes).
    max_bytes = packing.one_thread_pack_bytes(towers, [device],
                                              tuning.pack_size_sources)
    chunks = packing.pack_chunks(
        [packing.num_bytes(grads_by_var[key][0]) for key in group_keys],
        tuning.pack_max_group, tuning.pack_small_bytes, max_bytes)
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


def fused_matmul_sum(grads, device, raw_gradients, fuse_min_bytes=None):
  """The sum of one variable's tower gradients as one product, if fusable.

  See the module docstring and `_fusable_matmul_gradients` for when a sum is
  fused.

  Args:
    grads: the variable's gradient in each tower (two or more).
    device: the device of the variable (where the product runs).
    raw_gradients: a dict from gradient tensor names to the
      `gradient_gating.RawGradient` they gate.
    fuse_min_bytes: the smallest gradient that is fused; None means
      `Tuning.fuse_min_bytes` (itself None: no fusion).

  Returns:
    The summed gradient, or None where the sum is not fused.
  """
  if fuse_min_bytes is None:
    fuse_min_bytes = tuning_lib.get_tuning().fuse_min_bytes
  raws = _fusable_matmul_gradients(grads, device, raw_gradients,
                                   fuse_min_bytes)
  return None if raws is None else _fused_matmul_sum(raws, device)


def _fusable_matmul_gradients(grads, device, raw_gradients, fuse_min_bytes):
  """The `RawGradient`s of one variable's tower gradients, if fusable.

  Fusable: at least two towers; each gradient a dense tensor recorded in
  `raw_gradients` whose raw form is a `MatMul` output; the same transposes,
  dtype and fully known shape in every tower; at least `fuse_min_bytes`;
  every tower's `MatMul` and the variable's `device` on CPU devices of one
  task; and,
  where the contracted dimensions are known, inputs smaller in all than the
  gradients they replace.

  Returns:
    A list of `RawGradient`s, one per tower, or None.
  """
  if len(grads) < 2 or any(isinstance(g, tf.IndexedSlices) for g in grads):
    return None
  raws = [raw_gradients.get(g.name) for g in grads]
  if any(raw is None or raw.tensor.op.type != 'MatMul' for raw in raws):
    return None
  first = raws[0].tensor
  shape = first.shape
  if not shape.is_fully_defined():
    return None
  if fuse_min_bytes is None or packing.num_bytes(first) < fuse_min_bytes:
    return None
  attrs = _transposes(first.op)
  for raw in raws[1:]:
    if (raw.tensor.dtype != first.dtype or raw.tensor.shape != shape or
        _transposes(raw.tensor.op) != attrs):
      return None
  if not device_util.on_cpus_of_one_task([device] +
                                         [raw.tensor.op.device for raw in raws]):
    return None
  input_elements = 0
  for raw in raws:
    for tensor in raw.tensor.op.inputs:
      if not tensor.shape.is_fully_defined():
        return raws  # Unknown batch: the gradient size decides alone.
      input_elements += tensor.shape.num_elements()
  if input_elements >= len(raws) * shape.num_elements():
    return None
  return raws


def _transposes(matmul_op):
  return (matmul_op.get_attr('transpose_a'), matmul_op.get_attr('transpose_b'))


def _fused_matmul_sum(raws, device):
  """One `MatMul` of the towers' inputs: the sum of the towers' products.

  Tower i's gradient is `matmul(a_i, b_i)` (with the transposes of its op);
  concatenating the `a_i` and the `b_i` along the contracted dimension gives
  the sum over towers. Each tower's `b_i` first waits for the tower's gates.

  Args:
    raws: one `RawGradient` per tower (fusable, see
      `_fusable_matmul_gradients`).
    device: the variable's device.

  Returns:
    The summed gradient.
  """
  transpose_a, transpose_b = _transposes(raws[0].tensor.op)
  a_parts = []
  b_parts = []
  for raw in raws:
    a, b = raw.tensor.op.inputs
    a_parts.append(a)
    b_parts.append(gradient_gating.gate(b, raw.gates))
  with tf1.device(device):
    a = tf.concat(a_parts, axis=0 if transpose_a else 1,
                  name='fused_gradient_lhs')
    b = tf.concat(b_parts, axis=1 if transpose_b else 0,
                  name='fused_gradient_rhs')
    return tf1.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b,
                      name='fused_gradient')


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

"""Summing tower gradients: plain functions over per-tower lists.

Nothing here decides placement beyond the rule "sum on the device of the
variable the gradient belongs to", which keeps the update next to the
variable and avoids copying the sum back.
"""
import collections

from absl import logging
import tensorflow as tf

from replicate._compat import tf1


def sum_gradients_by_variable(tower_grads_and_vars):
  """Sums the gradients of each variable across towers.

  Args:
    tower_grads_and_vars: one list of `(gradient, variable)` pairs per tower,
      as returned by `Optimizer.compute_gradients`. `None` gradients are
      skipped.

  Returns:
    A list of `(summed_gradient, variable)` pairs, one per variable that has
    a gradient in some tower, in the order variables first appear. Dense
    gradients are added with `add_n`; `IndexedSlices` stay sparse: their
    values and indices are concatenated (duplicates are summed when applied).
  """
  grads_by_var = collections.OrderedDict()
  variables = {}
  for grads_and_vars in tower_grads_and_vars:
    for grad, var in grads_and_vars:
      if grad is None:
        continue
      key = _variable_key(var)
      variables[key] = var
      grads_by_var.setdefault(key, []).append(grad)
  return [(sum_on_device(grads, variables[key].device), variables[key])
          for key, grads in grads_by_var.items()]


def _variable_key(var):
  # Variables are hashable by identity in TF1 but not in TF2; their op names
  # are unique within a graph in both.
  return var.op.name


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

"""All-reducing towers' gradients for towers that each own their variables.

Under `VariablePlacement.REPLICATED` every tower keeps its own copy of each
trainable variable, so a variable's gradients are not summed on one device:
they are all-reduced, and every tower receives the sum on its own device.
The reduction is one `CrossTowerOps.batch_reduce` over all variables, so a
`CrossTowerOps` may pack or fuse them (NCCL, hierarchical copy, collective
ops across workers, or reduction to one device on CPUs).

A dense gradient has its variable's shape, but a copy of a gradient from
inside a while loop (e.g. an LSTM's) may have lost it: it gets the
variable's static shape back, so that every tower's gradient of a variable
is grouped, packed and reduced alike.
"""
import tensorflow as tf

from replicate import errors
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import values as values_lib


def all_reduce_gradients(tower_grads_and_vars, devices, cross_tower_ops):
  """Sums each variable's gradients over towers, onto every tower's device.

  Args:
    tower_grads_and_vars: one list of `(gradient, variable)` pairs per tower,
      all lists of one length, pair `k` of every tower for the same variable
      (each tower's own copy). A `None` gradient must be `None` in every
      tower.
    devices: the towers' devices, one per list, all different.
    cross_tower_ops: the `CrossTowerOps` that reduces.

  Returns:
    One list of `(summed_gradient, variable)` pairs per tower, in the order
    given; the summed gradient lives on the tower's device (`None` stays).

  Raises:
    InvalidArgumentError: if the lists differ in length, or a gradient is
      `None` in some towers only.
  """
  num_towers = len(tower_grads_and_vars)
  if len(devices) != num_towers:
    raise errors.InvalidArgumentError(
        'all_reduce_gradients got {} gradient lists for {} devices ({}); '
        'pass one list per device.'.format(num_towers, len(devices),
                                           ', '.join(devices)))
  lengths = set(len(pairs) for pairs in tower_grads_and_vars)
  if len(lengths) > 1:
    raise errors.InvalidArgumentError(
        'Every tower must have a gradient for the same variables, but the '
        'towers passed {} (gradient, variable) pairs respectively.'.format(
            [len(pairs) for pairs in tower_grads_and_vars]))
  reduced_at = []
  value_destination_pairs = []
  for index, first_pair in enumerate(tower_grads_and_vars[0]):
    grads = [pairs[index][0] for pairs in tower_grads_and_vars]
    if all(grad is None for grad in grads):
      continue
    if any(grad is None for grad in grads):
      raise errors.InvalidArgumentError(
          'Variable {} has a gradient in some towers and None in others ({}); '
          'every tower must compute the same gradients.'.format(
              first_pair[1].op.name,
              ['None' if g is None else 'tensor' for g in grads]))
    grads = [_with_shape_of(pairs[index][1], grad)
             for pairs, grad in zip(tower_grads_and_vars, grads)]
    reduced_at.append(index)
    value_destination_pairs.append(
        (values_lib.PerDevice(dict(zip(devices, grads))), list(devices)))
  reduced = {}
  if value_destination_pairs:
    for index, mirrored in zip(reduced_at, cross_tower_ops.batch_reduce(
        ReduceOp.SUM, value_destination_pairs)):
      reduced[index] = mirrored
  result = []
  for device, pairs in zip(devices, tower_grads_and_vars):
    result.append([
        (reduced[index].get(device) if index in reduced else None, var)
        for index, (_, var) in enumerate(pairs)
    ])
  return result


def _with_shape_of(variable, grad):
  """`grad` with the static shape of its `variable` when it is dense.

  A shape that contradicts the variable's is left for the optimizer to
  reject, as on one device.
  """
  if (not isinstance(grad, tf.IndexedSlices) and
      grad.shape.is_compatible_with(variable.shape)):
    grad.set_shape(variable.shape)
  return grad

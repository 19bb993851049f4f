"""All-reduce of gradients across the training tasks of a cluster.

`VariablePlacement.REPLICATED` in a `TF_CONFIG` cluster without a `ps` job
all-reduces every tower's gradients over every task with collective ops.
`WorkerAllReduce` is the `CollectiveAllReduce` it uses: small gradients
packed into one collective per dtype (Horovod's fusion buffer), large ones
one collective each, every sum scaled for the loss reduction.
"""
import collections

import tensorflow as tf

from replicate import _compat
from replicate._compat import tf1
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import cross_tower_base
from replicate.cross_tower import multi_worker_ops
from replicate.cross_tower import values as values_lib


def gradient_all_reduce(num_workers, loss_reduction):
  """The `CrossTowerOps` that all-reduces REPLICATED gradients across tasks.

  Args:
    num_workers: how many training tasks all-reduce together (> 1).
    loss_reduction: the replicated model's `tf.compat.v1.losses.Reduction`.

  Returns:
    A `WorkerAllReduce`: with a mean-type loss reduction each task's towers'
    loss is its batch's mean, so the sum over tasks is divided by
    `num_workers` (the gradient of the mean loss over the global batch, as
    `SyncReplicasOptimizer` and Horovod average); with `SUM` it is the sum.
  """
  scale = 1.0 if loss_reduction == tf1.losses.Reduction.SUM else (
      1.0 / num_workers)
  return WorkerAllReduce(num_workers, scale)


class WorkerAllReduce(multi_worker_ops.CollectiveAllReduce):
  """`CollectiveAllReduce` of packed small gradients, scaled for the mean.

  In a batch of dense values on the same devices, the values smaller than
  `pack_max_bytes` are reduced as one collective per dtype: each device's
  values are flattened and concatenated, reduced, scaled and split again
  (Horovod's fusion buffer), so many small variables cost one collective
  rather than one each. Larger values are reduced one collective each, which
  can start as soon as their gradient exists, while the rest of the backward
  pass runs, and need no copy into a buffer. Other batches go through
  `CollectiveAllReduce`. Every sum is then multiplied by `scale`.
  """

  def __init__(self, num_workers, scale=1.0, pack_max_bytes=1 << 20):
    """Builds the object.

    Args:
      num_workers: int >= 1, how many tasks take part.
      scale: what every sum is multiplied by (1.0: nothing is).
      pack_max_bytes: values of this size or larger are not packed.
    """
    super(WorkerAllReduce, self).__init__(num_workers=num_workers)
    self._scale = scale
    self._pack_max_bytes = pack_max_bytes

  def _batch_reduce(self, reduce_op, value_destination_pairs):
    devices = value_destination_pairs[0][0].devices
    if reduce_op != ReduceOp.SUM or not all(
        _packable(value, destinations, devices)
        for value, destinations in value_destination_pairs):
      return [self._scaled(m) for m in super(
          WorkerAllReduce, self)._batch_reduce(reduce_op,
                                               value_destination_pairs)]
    by_dtype = collections.OrderedDict()
    alone = []
    for position, (value, _) in enumerate(value_destination_pairs):
      tensor = value.values[0]
      if (tensor.shape.num_elements() * tensor.dtype.size >=
          self._pack_max_bytes):
        alone.append(position)
      else:
        by_dtype.setdefault(tensor.dtype.base_dtype, []).append(position)
    results = [None] * len(value_destination_pairs)
    if alone:
      reduced = super(WorkerAllReduce, self)._batch_reduce_on_devices(
          ReduceOp.SUM, [value_destination_pairs[i] for i in alone])
      for position, mirrored in zip(alone, reduced):
        results[position] = self._scaled(mirrored)
    for positions in by_dtype.values():
      values = [value_destination_pairs[i][0] for i in positions]
      sizes = [v.values[0].shape.num_elements() for v in values]
      packed = {}
      for d in devices:
        with tf1.device(d):
          packed[d] = tf.concat([tf.reshape(v.get(d), [-1]) for v in values],
                                axis=0)
      reduced = super(WorkerAllReduce, self)._batch_reduce_on_devices(
          ReduceOp.SUM, [(values_lib.PerDevice(packed), list(devices))])[0]
      pieces = {}
      for d in devices:
        with tf1.device(d):
          pieces[d] = tf.split(self._scale_tensor(reduced.get(d)), sizes)
      for k, (position, value) in enumerate(zip(positions, values)):
        results[position] = values_lib.Mirrored({
            d: tf.reshape(pieces[d][k], value.values[0].shape)
            for d in devices})
    return results

  def _scale_tensor(self, tensor):
    if self._scale == 1.0:
      return tensor
    return tensor * tf.cast(self._scale, tensor.dtype)

  def _scaled(self, mirrored):
    if self._scale == 1.0:
      return mirrored
    scaled = {}
    for d in mirrored.devices:
      with tf1.device(d):
        scaled[d] = self._scale_tensor(mirrored.get(d))
    return values_lib.Mirrored(scaled)


def _packable(value, destinations, devices):
  """Whether `value` can join a packed collective over `devices`."""
  if cross_tower_base.is_sparse(value) or list(value.devices) != list(devices):
    return False
  if sorted(destinations) != sorted(devices):
    return False
  tensor = value.values[0]
  return (isinstance(tensor, tf.Tensor) and tensor.shape.is_fully_defined()
          and tensor.dtype.base_dtype in _compat.collective_dtypes())

"""All-reduce of gradients across the training tasks of a cluster.

`VariablePlacement.REPLICATED` in a `TF_CONFIG` cluster without a `ps` job
all-reduces every tower's gradients over every task with collective ops.
`WorkerAllReduce` is the `CollectiveAllReduce` it uses: gradients in
buckets, in the order the backward pass ends them, one collective per
bucket, every sum scaled for the loss reduction.
"""
import tensorflow as tf

from replicate import _compat
from replicate._compat import tf1
from replicate.core import buckets
from replicate.core import packing
from replicate.core import tuning as tuning_lib
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower import cross_tower_base
from replicate.cross_tower import multi_worker_ops
from replicate.cross_tower import values as values_lib


def gradient_all_reduce(num_workers, loss_reduction, tuning=None):
  """The `CrossTowerOps` that all-reduces REPLICATED gradients across tasks.

  Args:
    num_workers: how many training tasks all-reduce together (> 1).
    loss_reduction: the replicated model's `tf.compat.v1.losses.Reduction`.
    tuning: the `Tuning` that sizes the buckets; None: the calling
      thread's current one.

  Returns:
    A `WorkerAllReduce`: with a mean-type loss reduction each task's towers'
    loss is its batch's mean, so the sum over tasks is divided by
    `num_workers` (the gradient of the mean loss over the global batch, as
    `SyncReplicasOptimizer` and Horovod average); with `SUM` it is the sum.
  """
  scale = 1.0 if loss_reduction == tf1.losses.Reduction.SUM else (
      1.0 / num_workers)
  return WorkerAllReduce(num_workers, scale, tuning=tuning)


class WorkerAllReduce(multi_worker_ops.CollectiveAllReduce):
  """`CollectiveAllReduce` of gradients in buckets, scaled for the mean.

  A batch of dense values on the same devices is reduced in the buckets of
  `replicate.core.buckets`, one collective per bucket: filled in the order
  the values become ready (the last layer's gradients first) up to
  `Tuning.all_reduce_bucket_bytes` (and `all_reduce_min_buckets`), so that
  a bucket's collective starts while the backward pass still runs. The
  values of a bucket are flattened and concatenated, reduced, scaled and
  split again (Horovod's fusion buffer); a bucket of one value is reduced
  as it is. Other batches go through `CollectiveAllReduce`. Every sum is
  then multiplied by `scale`; a `MEAN` is not (it already divides by the
  number of values over all tasks). Every task builds the same model, hence
  the same buckets in the same order, so its collectives (keyed in build
  order) meet the other tasks'.
  """

  def __init__(self, num_workers, scale=1.0, tuning=None):
    """Builds the object.

    Args:
      num_workers: int >= 1, how many tasks take part.
      scale: what every `SUM` is multiplied by (1.0: nothing is); a
        `MEAN` is left as it is.
      tuning: the `Tuning` that sizes the buckets; None: the calling
        thread's current one.
    """
    super(WorkerAllReduce, self).__init__(num_workers=num_workers)
    self._tuning = tuning_lib.resolve(tuning)
    self._scale = scale

  def _batch_reduce(self, reduce_op, value_destination_pairs):
    devices = value_destination_pairs[0][0].devices
    if reduce_op != ReduceOp.SUM:
      # A mean already divides by the number of values: `scale` turns sums
      # of per-task means into one mean, and would shrink a mean again.
      return super(WorkerAllReduce, self)._batch_reduce(
          reduce_op, value_destination_pairs)
    if not all(_packable(value, destinations, devices)
               for value, destinations in value_destination_pairs):
      return [self._scaled(m) for m in super(
          WorkerAllReduce, self)._batch_reduce(reduce_op,
                                               value_destination_pairs)]
    values = [value for value, _ in value_destination_pairs]
    first = [value.get(devices[0]) for value in values]
    sizes = [packing.num_bytes(tensor) for tensor in first]
    plan = buckets.plan_buckets(
        sizes, buckets.ready_depths(first),
        [tensor.dtype.base_dtype for tensor in first],
        buckets.bucket_bytes(sum(sizes), self.tuning))
    results = [None] * len(value_destination_pairs)
    for positions in plan:
      if len(positions) == 1:
        reduced = super(WorkerAllReduce, self)._batch_reduce_on_devices(
            ReduceOp.SUM, [value_destination_pairs[positions[0]]])[0]
        results[positions[0]] = self._scaled(reduced)
        continue
      packed = {}
      for d in devices:
        with tf1.device(d):
          packed[d] = packing.concat_flat([values[i].get(d)
                                           for i in positions])
      reduced = super(WorkerAllReduce, self)._batch_reduce_on_devices(
          ReduceOp.SUM, [(values_lib.PerDevice(packed), list(devices))])[0]
      pieces = {}
      for d in devices:
        with tf1.device(d):
          pieces[d] = packing.split_back(
              self._scale_tensor(reduced.get(d)),
              [first[i].shape for i in positions],
              [first[i].shape.num_elements() for i in positions])
      for k, position in enumerate(positions):
        results[position] = values_lib.Mirrored(
            {d: pieces[d][k] for d in devices})
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

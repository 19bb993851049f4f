"""All-reduce buckets: gradients grouped in the order back-propagation ends them.

One collective over every gradient waits for the last one, the first
layer's, so none of the communication overlaps back-propagation. Grouped
into buckets in the order the gradients become ready (the last layer's
first), a bucket's collective can start while the layers below are still
being differentiated: PyTorch DDP's buckets, Horovod's fusion buffer.

When a gradient is ready is read from the graph: its depth, the longest path
from a source to the op that makes it. That order does not depend on the
order of the variables, and ops added after the gradient (a cast, a scale)
keep it.

A bucket holds at most `Tuning.all_reduce_bucket_bytes`, and at most
`1 / Tuning.all_reduce_min_buckets` of all the bytes, so that the bucket
left waiting for the last gradient is small on small models too. As in DDP,
a bucket takes gradients until it holds that size or more, then the next
one starts; gradients ready at the same depth (a layer's kernel and bias)
stay in one bucket, since nothing is gained by splitting them. Every
gradient is in exactly one bucket, so every byte is all-reduced once.
"""
import collections

from replicate.core import packing


def ready_depths(tensors):
  """The depth of each tensor's op: the longest path to it from a source.

  Inputs and control inputs count alike. An edge that closes a cycle (the
  back edge of a while loop) is ignored. Only the ops the tensors depend on
  are visited.

  Args:
    tensors: tensors of one graph.

  Returns:
    A list of ints, one per tensor.
  """
  depths = {}
  predecessors = {}

  def preds(op):
    if op not in predecessors:
      predecessors[op] = [t.op for t in op.inputs] + list(op.control_inputs)
    return predecessors[op]

  for tensor in tensors:
    if tensor.op in depths:
      continue
    on_stack = {tensor.op}
    stack = [(tensor.op, iter(preds(tensor.op)))]
    while stack:
      op, pending = stack[-1]
      for pred in pending:
        if pred not in depths and pred not in on_stack:
          on_stack.add(pred)
          stack.append((pred, iter(preds(pred))))
          break
      else:
        stack.pop()
        on_stack.discard(op)
        depths[op] = max([depths[p] + 1 for p in preds(op) if p in depths] or
                         [0])
  return [depths[tensor.op] for tensor in tensors]


def bucket_bytes(total_bytes, tuning):
  """The size a bucket fills to, for `total_bytes` of gradients in all.

  `min(all_reduce_bucket_bytes, ceil(total_bytes / all_reduce_min_buckets))`
  of the `Tuning` `tuning`, at least 1.
  """
  share = -(-total_bytes // tuning.all_reduce_min_buckets)
  return max(1, min(tuning.all_reduce_bucket_bytes, share))


def plan_buckets(sizes, depths, dtypes, max_bytes):
  """Groups values into buckets in the order they become ready.

  Args:
    sizes: the bytes of each value.
    depths: when each value is ready (`ready_depths`); ties keep the order
      given.
    dtypes: each value's dtype; a bucket holds one dtype.
    max_bytes: the size a bucket fills to (`bucket_bytes`).

  Returns:
    A list of buckets, each a list of positions into `sizes`, in the order
    the buckets become ready (the bucket of the last value to be ready is
    last). Every position is in exactly one bucket.
  """
  order = sorted(range(len(sizes)), key=lambda i: (depths[i], i))
  open_buckets = collections.OrderedDict()  # dtype -> [positions, bytes]
  done = []
  for position in order:
    dtype = dtypes[position]
    current = open_buckets.get(dtype)
    if current is not None and current[1] >= max_bytes and (
        depths[current[0][-1]] < depths[position]):
      done.append(current[0])
      current = None
    if current is None:
      current = open_buckets[dtype] = [[], 0]
    current[0].append(position)
    current[1] += sizes[position]
  done.extend(positions for positions, _ in open_buckets.values())
  # Ready when their last value is: in that order, the last bucket last.
  return sorted(done, key=lambda positions: (depths[positions[-1]],
                                             positions[-1]))


class BucketPacker(packing.Packer):
  """Packs each device's values into the buckets of `plan_buckets`.

  The plan is made from the first device's values (every device holds the
  same values, in the same order); a bucket of one value is that value, a
  bucket of several is their flat concatenation. `pack` and `unpack` are
  those of `packing.Packer`.
  """

  def __init__(self, tuning, max_bytes=None):
    """Builds the packer.

    Args:
      tuning: the `Tuning` whose bucket fields size the buckets.
      max_bytes: the size a bucket fills to; None: `bucket_bytes` of the
        values' total size under `tuning`.
    """
    super(BucketPacker, self).__init__()
    self._tuning = tuning
    self._max_bytes = max_bytes

  def _plan(self, grads):
    sizes = [packing.num_bytes(grad) for grad in grads]
    max_bytes = self._max_bytes or bucket_bytes(sum(sizes), self._tuning)
    return [packing.group(grads, positions)
            for positions in plan_buckets(
                sizes, ready_depths(grads),
                [g.dtype.base_dtype for g in grads], max_bytes)]

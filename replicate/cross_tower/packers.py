"""The contrib 1.10 packer classes: `pack(device_grads)` then `unpack(summed)`.

contrib's `cross_tower_ops.ConcatAndSplitPacker` and
`AggregateSmallTensorPacker` keep what `unpack` needs on the object between
the two calls. These classes keep that interface for code written against
contrib, over the stateless pairs of `replicate.core.packing` (whose `pack`
returns the packs and a `pack_info` that `unpack` takes back), which the
library itself uses.
"""
from replicate import errors
from replicate.core import packing


class _StatefulPacker(object):
  """`pack` keeps the pack info; `unpack` uses the latest one."""

  def __init__(self, packer):
    self._packer = packer
    self._pack_info = None

  def pack(self, grouped_grads_and_vars):
    """Packs `[[(grad, var), ...] per device]`; returns the packed list.

    Raises:
      InvalidArgumentError: if devices hold different numbers of gradients,
        or a shape is not fully defined.
      InvalidTypeError: if a gradient is an `IndexedSlices`.
    """
    packed, self._pack_info = self._packer.pack(grouped_grads_and_vars)
    return packed

  def unpack(self, summed_device_grad_packs):
    """Inverts the latest `pack`: gives `[[(grad, var), ...] per device]`.

    Raises:
      ContextError: if `pack` was not called first.
    """
    if self._pack_info is None:
      raise errors.ContextError(
          '{}.unpack was called before pack; call pack(device_grads) '
          'first.'.format(type(self).__name__))
    return self._packer.unpack(summed_device_grad_packs, self._pack_info)


class ConcatAndSplitPacker(_StatefulPacker):
  """Concatenates each device's gradients and splits them into `num_packs`."""

  def __init__(self, num_packs=1):
    """Builds the packer.

    Args:
      num_packs: a positive int, how many packs (per dtype) are formed.

    Raises:
      InvalidArgumentError: if `num_packs` is not a positive int (a
        ValueError, as in contrib).
    """
    inner = packing.ConcatAndSplitPacker(num_packs)
    super(ConcatAndSplitPacker, self).__init__(inner)
    self.num_packs = num_packs


class AggregateSmallTensorPacker(_StatefulPacker):
  """Concatenates runs of small gradients (contrib's defaults: 1 MiB, 16)."""

  def __init__(self, agg_small_grads_max_bytes=1048576,
               agg_small_grads_max_group=16):
    """Builds the packer.

    Args:
      agg_small_grads_max_bytes: largest gradient (bytes) that is grouped.
      agg_small_grads_max_group: most gradients in a group.

    Raises:
      InvalidArgumentError: if either is not a positive int (a ValueError, as
        in contrib).
    """
    inner = packing.AggregateSmallTensorPacker(agg_small_grads_max_bytes,
                                               agg_small_grads_max_group)
    super(AggregateSmallTensorPacker, self).__init__(inner)
    self.agg_small_grads_max_bytes = agg_small_grads_max_bytes
    self.agg_small_grads_max_group = agg_small_grads_max_group

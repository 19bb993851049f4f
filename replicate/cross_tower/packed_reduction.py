"""Reduction to one device of many small values, packed.

Reducing each value on its own costs, for N devices and D destinations, one
sum and N - 1 + D cross-device copies per value: for the 200 small gradients
of a 100-layer model on 4 devices, 200 sums, ~600 transfers in and ~800
copies out per step. Here the small dense values of a `batch_reduce` that
share their devices, their destinations, their dtype and their shape after
dimension 0 are reduced together: every device concatenates its values of a
group (each of at most `Tuning.pack_max_bytes`; at most
`Tuning.pack_max_group` values to a pack unless it stays within
`Tuning.pack_small_bytes`),
the concatenations are summed once on the reduction device, and every
destination splits the sum back along dimension 0 (the split aliases the
buffer, nothing is copied). Element by element the sums are the same
additions in the same order, so the results are bit-identical to reducing
each value alone.

Plain functions over per-device lists: the caller decides the reduction
device; everything else runs on the devices the values and destinations
name.
"""
import collections

import tensorflow as tf

from replicate.core import packing
from replicate.cross_tower import values as values_lib


def batch_reduce_packed(value_destination_pairs, reduce_fn, reduce_to_device,
                        tuning):
  """Reduces the packable values of a `batch_reduce` in packs.

  Args:
    value_destination_pairs: `(PerDevice, destinations)` pairs as validated
      by `CrossTowerOps.batch_reduce`: each value's per-device entries are
      tensors or `IndexedSlices`, destinations a list of device strings.
    reduce_fn: `reduce_fn(tensors, device)` reduces a list of dense
      tensors on `device` (sum or mean) and returns one tensor.
    reduce_to_device: the device sums run on; None for the first
      destination of each pair.
    tuning: the `Tuning` whose pack fields size the packs.

  Returns:
    A list as long as `value_destination_pairs`: a `Mirrored` for each value
    reduced in a pack, None for each value left to the caller (sparse, too
    large, of unknown shape, on one device only, or alone in its group).
  """
  groups = collections.OrderedDict()
  for index, (value, destinations) in enumerate(value_destination_pairs):
    key = _group_key(value, destinations,
                     reduce_to_device or destinations[0],
                     tuning.pack_max_bytes)
    if key is not None:
      groups.setdefault(key, []).append(index)
  results = [None] * len(value_destination_pairs)
  for (devices, destinations, (device, _, _)), indices in groups.items():
    sizes = [packing.num_bytes(value_destination_pairs[index][0].values[0])
             for index in indices]
    for positions in packing.pack_chunks(sizes, tuning.pack_max_group,
                                         tuning.pack_small_bytes):
      chunk = [indices[position] for position in positions]
      if len(chunk) < 2:
        continue
      reduced = _reduce_pack(
          [value_destination_pairs[i][0].values for i in chunk], devices,
          destinations, device, reduce_fn)
      for index, mirrored in zip(chunk, reduced):
        results[index] = mirrored
  return results


def _group_key(value, destinations, device, max_bytes):
  """The pack group of one value, or None when it is reduced alone.

  Packable: on at least two devices, every entry a dense tensor of one
  dtype and one fully known shape of rank >= 1, at most `max_bytes`.
  """
  tensors = value.values
  if len(tensors) < 2 or any(
      isinstance(t, tf.IndexedSlices) for t in tensors):
    return None
  key = packing.concat_group_key(tensors[0], device, max_bytes)
  if key is None:
    return None
  first = tensors[0]
  shape = first.shape.as_list()
  # An entry of unknown shape (e.g. copied from a while loop) is not packed:
  # `!=` of TensorShapes of unknown rank raises in TF 1.15.
  if any(t.dtype != first.dtype or not t.shape.is_fully_defined() or
         t.shape.as_list() != shape for t in tensors[1:]):
    return None
  return tuple(value.devices), tuple(destinations), key


def _reduce_pack(per_value_tensors, devices, destinations, device, reduce_fn):
  """Reduces one pack: a concat per device, one sum, a split per destination.

  Args:
    per_value_tensors: for each value of the pack, its tensors in the order
      of `devices`.
    devices: the devices the values live on.
    destinations: where the results go.
    device: where the sum runs.
    reduce_fn: as in `batch_reduce_packed`.

  Returns:
    One `Mirrored` per value, with a tensor on each destination.
  """
  pieces = packing.reduce_concatenated(
      per_value_tensors, devices, lambda packs: reduce_fn(packs, device),
      destinations, name='packed_values')
  by_destination = list(zip(destinations, pieces))
  return [values_lib.Mirrored({d: on_d[i] for d, on_d in by_destination})
          for i in range(len(per_value_tensors))]

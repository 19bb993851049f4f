"""Variable reads delivered to towers in packs: one transfer per group.

A tower that reads a variable held on another device receives it through
a `_Send`/`_Recv` pair per variable and step. Between CPU devices of one
task (virtual CPUs, or CPU training) nothing is copied, so each pair is pure
per-op overhead, paid per variable, tower and step. Here the reads of small
variables are concatenated once on the variables' device, by dtype and
trailing shape, and each tower receives one pack per group and splits it
back (`tf.split` along dimension 0 aliases the buffer). The pack is a copy
taken at the start of the step, so a tower that reads it does not race the
variable's update.

Used for towers copied from tower 0 (tower_cloning.py), whose variable
reads can be redirected when they are copied; other devices (GPUs, other
tasks) keep one transfer per variable, where a pack would add a copy to a
real transfer.
"""
import collections

from replicate.core import device_util
from replicate.core import packing
from replicate.core import tuning


def tower_copies(reads, tower_devices, pack_max_bytes=None):
  """Packed copies of variable reads for the towers that receive them.

  Args:
    reads: `(tensor, device)` pairs: a read of a variable, and the device it
      runs on (the variable's).
    tower_devices: the devices of the towers reading them.
    pack_max_bytes: the largest read that is packed; None means
      `Tuning.read_pack_max_bytes`.

  Returns:
    One dict per tower, from a read's tensor name to the tensor the tower
    should use instead: a slice of a pack, placed on the tower's device.
    A read is absent where it stays as it is: too large, without a fully
    known static shape of rank >= 1, alone in its group, on the tower's own
    device, or not on a CPU of the tower's task.
  """
  if pack_max_bytes is None:
    pack_max_bytes = tuning.get_tuning().read_pack_max_bytes
  groups = collections.OrderedDict()
  for read, device in reads:
    if not device:
      continue  # Placed by TF at run time: no device to pack on.
    key = packing.concat_group_key(read, device, pack_max_bytes)
    if key is not None:
      groups.setdefault(key, []).append(read)
  copies = [{} for _ in tower_devices]
  for (device, _, _), members in groups.items():
    home = device_util.canonicalize(device)
    receivers = [
        tower_id for tower_id, tower_device in enumerate(tower_devices)
        if device_util.canonicalize(tower_device) != home and
        device_util.on_cpus_of_one_task([device, tower_device])
    ]
    if len(members) < 2 or not receivers:
      continue
    # One concatenation on the variables' device, nothing to reduce, a
    # split on each receiving tower.
    pieces = packing.reduce_concatenated(
        [[read] for read in members], [device], lambda packs: packs[0],
        [tower_devices[tower_id] for tower_id in receivers],
        name='packed_reads')
    for tower_id, parts in zip(receivers, pieces):
      copies[tower_id].update(
          (read.name, part) for read, part in zip(members, parts))
  return copies

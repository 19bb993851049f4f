"""The TF 1.14/1.15 `cross_device_ops` spellings, and contrib's destination checks.

`NcclAllReduce` and `HierarchicalCopyAllReduce` are `AllReduceCrossTowerOps`
with the algorithm fixed, constructed as TF 1.15's are (`num_packs`), whose
default is replicate's buckets (`num_packs=1` is TF's one pack).
`validate_destinations`, `check_destinations` are contrib 1.12's and TF
1.15's module-level helpers, over `values.get_devices_from`.
"""
from replicate import errors
from replicate.core.checks import check_int
from replicate.cross_tower import values as values_lib
from replicate.cross_tower.one_machine import AllReduceCrossTowerOps


class _OneAlgorithmAllReduce(AllReduceCrossTowerOps):
  """`AllReduceCrossTowerOps` with the algorithm fixed, built as TF 1.15's."""

  _ALGORITHM = None  # Set by each subclass.

  def __init__(self, num_packs=None):
    """Builds the object.

    Args:
      num_packs: None, buckets in the order the values become ready (see
        `AllReduceCrossTowerOps`); or an int >= 0, values are concatenated
        into this many packs per device before the all-reduce (TF's default
        1; 0: one all-reduce per value).

    Raises:
      InvalidArgumentError: if `num_packs` < 0 (a ValueError, as in TF).
      InvalidTypeError: if `num_packs` is not an int.
    """
    if num_packs is not None:
      check_int('num_packs', num_packs, 0)
    super(_OneAlgorithmAllReduce, self).__init__(
        all_reduce_alg=self._ALGORITHM, num_packs=num_packs)


class NcclAllReduce(_OneAlgorithmAllReduce):
  """`AllReduceCrossTowerOps('nccl', num_packs)` under TF 1.15's name."""

  _ALGORITHM = 'nccl'


class HierarchicalCopyAllReduce(_OneAlgorithmAllReduce):
  """`AllReduceCrossTowerOps('hierarchical_copy', num_packs)`, TF 1.15's name."""

  _ALGORITHM = 'hierarchical_copy'


def validate_destinations(destinations):
  """Raises unless `destinations` names at least one device.

  Args:
    destinations: a device string, a list of them, a `DistributedValues`, or
      a variable or tensor placed on a device.

  Raises:
    InvalidArgumentError: (a ValueError, as in TF) for None, an empty value,
      an unparsable device or a value of another type.
  """
  values_lib.get_devices_from(destinations)


def check_destinations(destinations):
  """Whether `destinations` names at least one device (never raises).

  A predicate, as in TF: `validate_destinations` is the raising check.

  Args:
    destinations: anything.

  Returns:
    True if `validate_destinations(destinations)` would pass.
  """
  try:
    values_lib.get_devices_from(destinations)
  except errors.Error:
    return False
  return True

"""Cross-tower reductions (contrib.distribute's `cross_tower_ops` names).

* `ReductionToOneDeviceCrossTowerOps`: reduce on one device, copy out.
* `AllReduceCrossTowerOps`: all-reduce among the devices of one machine, by
  NCCL or hierarchical copy, after optional repacking.
* `MultiWorkerAllReduce`, `CollectiveAllReduce`: across workers.
* `choose_the_best(devices)`: picks one for the local devices.
* `ConcatAndSplitPacker`, `AggregateSmallTensorPacker`: contrib's packers.
* `get_devices_from`, `validate_destinations`, `check_destinations`.

TF 1.14/1.15's `cross_device_ops` spellings are the same classes:
`CrossDeviceOps`, `ReductionToOneDevice`, `AllReduceCrossDeviceOps`;
`NcclAllReduce(num_packs=1)` and `HierarchicalCopyAllReduce(num_packs=1)`
are `AllReduceCrossTowerOps` with the algorithm fixed, as in TF.

A facade: the implementation is in `replicate/cross_tower/`.
"""
# pylint: disable=g-importing-member,unused-import,invalid-name
from replicate.core.packing import AggregateSmallTensorPacker
from replicate.core.packing import ConcatAndSplitPacker
from replicate.cross_tower.cross_tower_base import CrossTowerOps
from replicate.cross_tower.cross_tower_base import (
    ReductionToOneDeviceCrossTowerOps,
)
from replicate.cross_tower.multi_worker_ops import AllReduceSpecTuple
from replicate.cross_tower.multi_worker_ops import CollectiveAllReduce
from replicate.cross_tower.multi_worker_ops import CollectiveKeys
from replicate.cross_tower.multi_worker_ops import MultiWorkerAllReduce
from replicate.cross_tower.one_machine import AllReduceAlgorithm
from replicate.cross_tower.one_machine import AllReduceCrossTowerOps
from replicate.cross_tower.one_machine import choose_for
from replicate.cross_tower.one_machine import choose_the_best
from replicate.cross_tower.one_machine import has_dgx1_like_links
from replicate.cross_tower.tf_names import check_destinations
from replicate.cross_tower.tf_names import HierarchicalCopyAllReduce
from replicate.cross_tower.tf_names import NcclAllReduce
from replicate.cross_tower.tf_names import validate_destinations
from replicate.cross_tower.values import get_devices_from

# TF 1.14/1.15's names (tf.distribute.*): the same classes.
CrossDeviceOps = CrossTowerOps
ReductionToOneDevice = ReductionToOneDeviceCrossTowerOps
AllReduceCrossDeviceOps = AllReduceCrossTowerOps

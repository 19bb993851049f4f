"""Cross-tower reductions (the TF 1.x `contrib.distribute` cross_tower_ops names).

* `ReductionToOneDeviceCrossTowerOps`: reduce on one device, copy out.
* `AllReduceCrossTowerOps`: all-reduce among the devices of one machine, by
  NCCL or hierarchical copy, after optional repacking.
* `MultiWorkerAllReduce`, `CollectiveAllReduce`: across workers.
* `choose_the_best(devices)`: picks one for the local devices.

A facade: the implementation is in `replicate/cross_tower/`.
"""
# pylint: disable=g-importing-member,unused-import
from replicate.cross_tower.all_reduce_ops import AllReduceAlgorithm
from replicate.cross_tower.all_reduce_ops import AllReduceCrossTowerOps
from replicate.cross_tower.all_reduce_ops import choose_for
from replicate.cross_tower.all_reduce_ops import choose_the_best
from replicate.cross_tower.all_reduce_ops import has_dgx1_like_links
from replicate.cross_tower.cross_tower_base import CrossTowerOps
from replicate.cross_tower.cross_tower_base import ReductionToOneDeviceCrossTowerOps
from replicate.cross_tower.multi_worker_ops import CollectiveAllReduce
from replicate.cross_tower.multi_worker_ops import CollectiveKeys
from replicate.cross_tower.multi_worker_ops import MultiWorkerAllReduce

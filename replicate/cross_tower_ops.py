"""Cross-tower reductions (the `tf.contrib.distribute` cross_tower_ops names).

* `ReductionToOneDeviceCrossTowerOps`: reduce on one device, copy out.

The API (`CrossTowerOps`) and reduction to one device are defined in
`cross_tower_base`; they are re-exported here.
"""
# pylint: disable=g-importing-member,unused-import
from replicate.cross_tower_base import CrossTowerOps
from replicate.cross_tower_base import ReductionToOneDeviceCrossTowerOps

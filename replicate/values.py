"""Per-device values (the `contrib.distribute` `values` module path).

A facade: the types live in `replicate/cross_tower/values.py`, the
distributed variables of `MirroredStrategy` in `replicate/strategy/`
(`SyncOnReadVariable` also under TF 1.13's name, `ReplicaLocalVariable`).
"""
# pylint: disable=g-importing-member,unused-import
from replicate.cross_tower.values import DistributedValues
from replicate.cross_tower.values import get_devices_from
from replicate.cross_tower.values import Mirrored
from replicate.cross_tower.values import PerDevice
from replicate.cross_tower.values import PerReplica
from replicate.cross_tower.values import regroup
from replicate.cross_tower.values import select_device
from replicate.cross_tower.values import select_replica
from replicate.strategy.mirrored_values import MirroredVariable
from replicate.strategy.sync_on_read import SyncOnReadVariable

ReplicaLocalVariable = SyncOnReadVariable

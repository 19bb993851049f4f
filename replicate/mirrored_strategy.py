"""`MirroredStrategy`: synchronous data parallelism over the local devices.

A facade: the strategy is in `replicate/strategy/mirrored_strategy.py`, its
gradient route in `replicate/strategy/mirrored_gradients.py`, how its replicas
are built (`ReplicaBuild`) in `replicate/strategy/mirrored_copies.py`.
"""
# pylint: disable=g-importing-member,unused-import
from replicate.strategy.mirrored_copies import ReplicaBuild
from replicate.strategy.mirrored_gradients import (
    apply_gradients_across_replicas,
)
from replicate.strategy.mirrored_strategy import MirroredExtended
from replicate.strategy.mirrored_strategy import MirroredStrategy

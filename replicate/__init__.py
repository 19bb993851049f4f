"""replicate: multi-device data-parallel training for TF graph / Estimator code.

The public API is exactly what is imported here; everything else is private.
"""
# pylint: disable=g-bad-import-order,g-importing-member

from replicate.version import __version__

# Core: replicate an Estimator model_fn (contrib.estimator names).
from replicate.model_fn import replicate_model_fn
from replicate.towers.device_setter import VariablePlacement
from replicate.towers.tower_cloning import TowerBuild
from replicate.tower_optimizer import TowerOptimizer
from replicate.towers.tower_context import TowerContext
from replicate.towers.tower_context import get_tower_context

# Multi-worker: between-graph training with parameter servers.
from replicate.cluster.placement import GreedyLoadBalancingStrategy
from replicate.cluster.placement import byte_size_load_fn
from replicate import multi_worker

# Errors and test helpers.
from replicate import errors
from replicate import testing

# Cross-device reductions (contrib.distribute names).
from replicate import cross_tower_ops
from replicate.cross_tower import values
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower_ops import AllReduceCrossTowerOps
from replicate.cross_tower_ops import choose_the_best
from replicate.cross_tower_ops import CollectiveAllReduce
from replicate.cross_tower_ops import CollectiveKeys
from replicate.cross_tower_ops import CrossTowerOps
from replicate.cross_tower_ops import MultiWorkerAllReduce
from replicate.cross_tower_ops import ReductionToOneDeviceCrossTowerOps
from replicate.cross_tower.values import Mirrored
from replicate.cross_tower.values import PerDevice
from replicate.cross_tower.values import PerReplica

# Distribution strategies (tf.distribute names).
from replicate import distribute_lib
from replicate.distribute_lib import get_cross_replica_context
from replicate.distribute_lib import get_replica_context
from replicate.distribute_lib import get_strategy
from replicate.distribute_lib import has_strategy
from replicate.distribute_lib import in_cross_replica_context
from replicate.distribute_lib import InputContext
from replicate.distribute_lib import InputReplicationMode
from replicate.distribute_lib import ReplicaContext
from replicate.distribute_lib import Strategy
from replicate.distribute_lib import StrategyExtended
from replicate.mirrored_strategy import MirroredStrategy

"""replicate: multi-device data-parallel training for TF graph / Estimator code.

The public API is exactly what is imported here; everything else is private.
"""
# pylint: disable=g-bad-import-order,g-importing-member

from replicate.version import __version__

# Core: replicate an Estimator model_fn (tf.contrib.estimator names).
from replicate.model_fn import replicate_model_fn
from replicate.device_setter import VariablePlacement
from replicate.tower_optimizer import TowerOptimizer
from replicate.tower_context import TowerContext
from replicate.tower_context import get_tower_context

# Multi-worker: between-graph training with parameter servers.
from replicate.cluster import GreedyLoadBalancingStrategy
from replicate.cluster import byte_size_load_fn

# Errors and test helpers.
from replicate import errors
from replicate import testing

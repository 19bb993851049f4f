"""replicate: multi-device data-parallel training for TF graph / Estimator code.

Installed as the distribution `tf-replicate` (`pip install 'tf-replicate[tf]'`);
imported as `replicate`. The public API is exactly `__all__`: what is imported
here; everything else is private.
"""
# pylint: disable=g-bad-import-order,g-importing-member,g-import-not-at-top

import sys as _sys

from replicate.version import __version__

_SUPPORTED = ('TensorFlow 1.15 on Python 3.7, or TensorFlow 2.x up to 2.15 '
              'with tensorflow-estimator (tested: 1.15.5, 2.15.1)')
_INSTALL = ("pip install 'tf-replicate[tf]' (Python 3.7: TF 1.15; Python "
            "3.9-3.11: TF 2.15 with tensorflow-estimator); from a clone: "
            "pip install -e '.[tf]'")


def _check_tensorflow():
  """Raises one ImportError if no supported TensorFlow can be imported.

  Runs before anything else of the package imports TensorFlow, absl or
  TensorFlow's private modules, so that a missing or unsupported TF is what
  the user reads, not a missing dependency of TF or an AttributeError deep
  in the library.

  Raises:
    ImportError: without TensorFlow, with a TensorFlow outside 1.15 / 2.0-2.15,
      or with TF 2.x and no tensorflow-estimator.
  """
  python = '.'.join(str(v) for v in _sys.version_info[:3])
  try:
    import tensorflow
  except ImportError as e:
    if getattr(e, 'name', None) == 'tensorflow':
      found = 'no TensorFlow is installed'
    else:
      found = 'importing TensorFlow failed ({})'.format(e)
    raise ImportError(
        'replicate needs {}; {} (Python {}). Install one with: {}.'.format(
            _SUPPORTED, found, python, _INSTALL)) from None
  version = str(getattr(tensorflow, '__version__', 'unknown'))
  try:
    major_minor = tuple(int(p) for p in version.split('.')[:2])
  except ValueError:
    major_minor = None
  supported = major_minor is not None and (
      major_minor == (1, 15) or (major_minor[0] == 2 and major_minor[1] <= 15))
  if not supported:
    why = (' (TensorFlow 2.16 and later have no Estimator)'
           if major_minor and major_minor >= (2, 16) else '')
    raise ImportError(
        'replicate needs {}; TensorFlow {} is installed (Python {}){}. '
        'Install a supported one with: {}.'.format(
            _SUPPORTED, version, python, why, _INSTALL))
  if major_minor[0] == 2:
    try:
      import tensorflow_estimator  # noqa: F401  pylint: disable=unused-import
    except ImportError:
      raise ImportError(
          'replicate needs {}; TensorFlow {} is installed (Python {}) '
          'without tensorflow-estimator. Install it with: pip install '
          "'tensorflow-estimator=={}.*', or: {}.".format(
              _SUPPORTED, version, python, '.'.join(version.split('.')[:2]),
              _INSTALL)) from None


_check_tensorflow()
del _check_tensorflow

# Core: replicate an Estimator model_fn (contrib.estimator names).
from replicate.model_fn import replicate_model_fn
from replicate.towers.device_setter import VariablePlacement
from replicate.towers.tower_cloning import TowerBuild
from replicate.tower_optimizer import TowerOptimizer
from replicate.towers.tower_context import TowerContext
from replicate.towers.tower_context import get_tower_context

# Gradient compression and the performance knobs.
from replicate.core.compression import Compression
from replicate.core.tuning import Tuning
from replicate.core.tuning import get_tuning
from replicate.core.tuning import set_tuning
from replicate.core.tuning import tuning_scope

# Multi-worker: between-graph training with parameter servers.
from replicate.cluster.placement import GreedyLoadBalancingStrategy
from replicate.cluster.placement import byte_size_load_fn
from replicate import multi_worker

# Errors and test helpers.
from replicate import errors
from replicate import testing

# Cross-device reductions (contrib.distribute names).
from replicate import cross_tower_ops
from replicate import values
from replicate.core.reduce_util import ReduceOp
from replicate.cross_tower_ops import AllReduceCrossTowerOps
from replicate.cross_tower_ops import choose_the_best
from replicate.cross_tower_ops import CollectiveAllReduce
from replicate.cross_tower_ops import CollectiveKeys
from replicate.cross_tower_ops import CrossTowerOps
from replicate.cross_tower_ops import MultiWorkerAllReduce
from replicate.cross_tower_ops import ReductionToOneDeviceCrossTowerOps
from replicate.values import Mirrored
from replicate.values import PerDevice
from replicate.values import PerReplica
# The same classes under TF 1.14/1.15's tf.distribute names.
from replicate.cross_tower_ops import CrossDeviceOps
from replicate.cross_tower_ops import HierarchicalCopyAllReduce
from replicate.cross_tower_ops import NcclAllReduce
from replicate.cross_tower_ops import ReductionToOneDevice

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
from replicate.distribute_lib import get_loss_reduction
from replicate.mirrored_strategy import MirroredStrategy
from replicate.mirrored_strategy import ReplicaBuild
from replicate import mirrored_strategy
from replicate import model_fn
from replicate import tower_optimizer

__all__ = [
    # Modules (the drop-in module paths).
    'cross_tower_ops', 'distribute_lib', 'errors', 'mirrored_strategy',
    'model_fn', 'multi_worker', 'testing', 'tower_optimizer', 'values',
    # replicate_model_fn and its towers.
    'replicate_model_fn', 'TowerOptimizer', 'TowerBuild', 'TowerContext',
    'VariablePlacement', 'get_tower_context',
    # Gradient compression and the performance knobs.
    'Compression', 'Tuning', 'get_tuning', 'set_tuning', 'tuning_scope',
    # Between-graph placement.
    'GreedyLoadBalancingStrategy', 'byte_size_load_fn',
    # Cross-device reductions and values.
    'AllReduceCrossTowerOps', 'CollectiveAllReduce', 'CollectiveKeys',
    'CrossDeviceOps', 'CrossTowerOps', 'HierarchicalCopyAllReduce',
    'Mirrored', 'MultiWorkerAllReduce', 'NcclAllReduce', 'PerDevice',
    'PerReplica', 'ReduceOp', 'ReductionToOneDevice',
    'ReductionToOneDeviceCrossTowerOps', 'choose_the_best',
    # Strategies.
    'InputContext', 'InputReplicationMode', 'MirroredStrategy',
    'ReplicaBuild', 'ReplicaContext', 'Strategy', 'StrategyExtended',
    'get_cross_replica_context', 'get_loss_reduction', 'get_replica_context',
    'get_strategy', 'has_strategy', 'in_cross_replica_context',
    '__version__',
]

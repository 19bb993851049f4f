"""The strategy API (the `tf.distribute` / TF 1.14 `distribute_lib` names).

Library code asks `get_replica_context()` / `get_strategy()` what it runs in
and uses the methods here; with no strategy it gets the default one (one
replica, identity reductions) and runs unchanged.

* replica context: inside `call_for_each_replica`, one per replica.
  `ReplicaContext.merge_call` hops to the cross-replica context.
* cross-replica context: inside `Strategy.scope()` and merge functions;
  `reduce_to`, `batch_reduce_to` and `update` combine per-replica values.

TF 1.14/1.15's names are the same classes: `StrategyV1` is `Strategy`,
`StrategyExtendedV1` / `StrategyExtendedV2` are `StrategyExtended`;
`DistributionStrategy` / `DistributionStrategyExtended` (TF 1.12-1.13) too.

Pitfall: inside our replicas ask `replicate.get_replica_context()`, not
`tf.distribute.get_replica_context()`: TF's own function does not know our
strategies and returns TF's default context (one replica), so its
`all_reduce` silently reduces over one replica only.

A facade: the implementation is in `replicate/strategy/`.
"""
# pylint: disable=g-importing-member,unused-import
from replicate.core.reduce_util import ReduceOp
from replicate.strategy.context_rules import (
    require_cross_replica_or_default_context,
)
from replicate.strategy.context_rules import require_replica_context
from replicate.strategy.default_strategy import get_cross_replica_context
from replicate.strategy.default_strategy import get_replica_context
from replicate.strategy.default_strategy import get_strategy
from replicate.strategy.default_strategy import has_strategy
from replicate.strategy.default_strategy import in_cross_replica_context
from replicate.strategy.distribute_context import get_update_device
from replicate.strategy.distribute_context import UpdateContext
from replicate.strategy.input_lib import InputContext
from replicate.strategy.input_lib import InputReplicationMode
from replicate.strategy.replica_context import ReplicaContext
from replicate.strategy.strategy_base import get_loss_reduction
from replicate.strategy.strategy_base import Strategy
from replicate.strategy.strategy_extended import StrategyExtended

# The TF 1.12-1.13 names, and TF 1.14-1.15's V1/V2 spellings.
DistributionStrategy = Strategy
DistributionStrategyExtended = StrategyExtended
StrategyV1 = Strategy
StrategyExtendedV1 = StrategyExtended
StrategyExtendedV2 = StrategyExtended

"""The Strategy layer: `tf.distribute`-style strategies over our reductions.

Holds the thread-local context stack (`distribute_context`), the
`Strategy` / `StrategyExtended` / `ReplicaContext` API (`strategy_base`,
`strategy_extended`, `replica_context`) and the context rules they check
(`context_rules`), the default one-replica strategy and
the readers of the current context (`default_strategy`), input
(`input_lib`; the split of global batches among replicas, `input_split`), and the mirrored strategy: replica threads (`mirrored_run`),
the loop driving them (`replica_loop`), the opt-in replicas 1..N-1 as copies
of replica 0 (`mirrored_copies`), mirrored and sync-on-read variables
(`mirrored_values`, `sync_on_read`) and the strategy itself. `replicate/distribute_lib.py` and
`replicate/mirrored_strategy.py` are the public facades.

May import: `replicate.core`, `replicate.cross_tower`, `replicate.gradients`,
`replicate.graph_copy` (and errors, _compat). Never `towers`, `cluster` or a
facade.
"""

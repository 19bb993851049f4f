"""The towers of `replicate_model_fn`: one copy of the model per device.

Holds the tower-building loop of every mode (`tower_build`), the batch split
(`batch_split`), the thread-local replication state and `TowerContext`
(`tower_context`), copying tower 0's graph onto the other devices
(`tower_cloning` decides what and when in TRAIN, `output_copies` in EVAL and
PREDICT, `tower_copier` adapts `graph_copy` to towers), per-tower loss and
update views (`tower_collections`), what `TowerOptimizer` does in a tower
(`tower_gradients`: scaled, gated gradients; recorded, summed or
all-reduced, applied once), variable and op placement
(`device_setter`), merging the towers' EstimatorSpecs (`tower_specs`; their
EVAL metrics: `metric_merge`, and what each metric write adds:
`metric_terms`), what a tower given no rows may write (`empty_towers`),
the copies of `VariablePlacement.REPLICATED`
(`replicated_variables`) and the unreplicated graph of a SavedModel export
(`serving`). `replicate/model_fn.py`
and `replicate/tower_optimizer.py` are the public facades.

May import: `replicate.core`, `replicate.gradients`, `replicate.graph_copy`
(and errors, _compat). Never `cross_tower`, `strategy`, `cluster` or a facade.
"""

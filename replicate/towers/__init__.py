"""The towers of `replicate_model_fn`: one copy of the model per device.

Holds the batch split (`batch_split`), the thread-local replication state
and `TowerContext` (`tower_context`), copying tower 0's graph onto the other
devices (`tower_cloning` decides what and when, `tower_copier` does it),
per-tower loss and update views (`tower_collections`), variable and op
placement (`device_setter`) and merging the towers' EstimatorSpecs
(`tower_specs`). `replicate/model_fn.py` and `replicate/tower_optimizer.py`
are the public facades.

May import: `replicate.core`, `replicate.gradients` (and errors, _compat).
Never `cross_tower`, `strategy`, `cluster` or a facade.
"""

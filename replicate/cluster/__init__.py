"""Between-graph training on a TF cluster: parameter servers or all-reduce.

Holds the placement of towers and variables read from the Estimator's
`RunConfig` / `TF_CONFIG` (`placement`), the start-up check of the
cluster's tasks (`cluster_check`), and, for `VariablePlacement.REPLICATED`
without parameter servers, the collective session configs
(`session_configs`) and the TRAIN spec of tasks that all-reduce together,
whose variables start from the chief's (`chief_broadcast`; their gradients' `CrossTowerOps` is
`replicate.cross_tower.across_workers`).
`replicate/multi_worker.py` is the public facade of the helpers users call.

May import: `replicate.core`, `replicate.towers` (and errors, _compat).
Never `strategy` or a facade.
"""

"""Reductions and broadcasts of per-device values across devices.

Holds the per-device value types (`values`), the `CrossTowerOps` API with
reduction to one device (`cross_tower_base`), packed reduction
(`packed_reduction`), the all-reduce graph builders: ring, shuffle,
NCCL, hierarchical copy (`algorithms`), the dense fast path every
all-reduce shares, with reduction to one device for the rest (`fast_path`),
all-reduce within one machine and `choose_the_best` (`one_machine`) and
across workers (`multi_worker_ops`; `across_workers`: the Estimator tasks'
bucketed collectives), the all-reduce of towers that own their variables
(`replicated_gradients`),
and TF 1.14/1.15's class names (`tf_names`). The packers are
`replicate.core.packing`'s. Algorithms are plain functions over per-device lists; the
classes decide placement. `replicate/cross_tower_ops.py` is the public
facade.

May import: `replicate.core` (and errors, _compat). Never `gradients`,
`towers`, `strategy` or `cluster`.
"""

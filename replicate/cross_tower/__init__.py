"""Reductions and broadcasts of per-device values across devices.

Holds the per-device value types (`values`), the `CrossTowerOps` API with
reduction to one device (`cross_tower_base`), packed reduction
(`packed_reduction`), all-reduce algorithms (`all_reduce`), all-reduce
within one machine (`batch_all_reduce`, `all_reduce_ops`) and across workers
(`multi_worker_ops`; `worker_all_reduce` for the Estimator's tasks), the
all-reduce of towers that own their variables (`gradient_all_reduce`),
contrib's packer classes (`packers`) and TF 1.14/1.15's class names
(`tf_names`). Algorithms are plain functions over per-device lists; the
classes decide placement. `replicate/cross_tower_ops.py` is the public
facade.

May import: `replicate.core` (and errors, _compat). Never `gradients`,
`towers`, `strategy` or `cluster`.
"""

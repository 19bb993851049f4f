"""The lowest layer: what every other subpackage shares.

Holds device strings (`device_util`: the one parser and canonical form) and
the one check of tower devices against the session (`device_check`),
the kinds of ops by type (`op_kinds`: state, variable reads, TF1 control
flow),
packing of same-shaped tensors into one (`packing`), the all-reduce's
buckets in the order back-propagation ends the gradients (`buckets`), the
split of a batch's rows among devices (`row_split`), the reduce-op enum
(`reduce_util`), argument checks (`checks`), logging through
`tf.compat.v1.logging` (`logs`), gradient compression (`compression`) and
the performance knobs (`tuning`: one immutable `Tuning`, read where a
build starts and passed down).

May import: `replicate.errors`, `replicate._compat` and nothing else of
`replicate`.
"""

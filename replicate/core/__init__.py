"""The lowest layer: what every other subpackage shares.

Holds device strings (`device_util`: the one parser and canonical form),
packing of same-shaped tensors into one (`packing`), the reduce-op enum
(`reduce_util`) and argument checks (`checks`).

May import: `replicate.errors`, `replicate._compat` and nothing else of
`replicate`.
"""

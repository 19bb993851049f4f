"""Gradient machinery shared by towers and by the mirrored strategy.

Holds gradient gating (`gradient_gating`: the `gate_gradients` check, the
towers' barriers and the update's wait for them), the packed gradient
sums over devices (`gradient_aggregation`) and gradient accumulation
(`accumulation`). Functions here
take per-device lists and graphs; they know nothing of towers or strategies.
Gradients themselves are TF's own: nothing here registers a gradient or
marks an op with an override.

May import: `replicate.core` (and errors, _compat). Never `cross_tower`,
`towers`, `strategy` or `cluster`.
"""

"""Copying part of a graph onto other devices with `tf.import_graph_def`.

Holds the copying mechanics shared by `replicate_model_fn`'s towers and
`MirroredStrategy`'s replicas (`graph_copier`: the window of ops to copy, the
cone a set of targets needs, inputs mapped per copy, devices, seeds, TF1
while-loop frames, colocation, each copy's own variables), the `NodeDef`
edits a copy needs and what it reads of a `NodeDef` (`node_defs`), the
copies TF's placer binds to a shared variable's device (`bound_devices`),
each copy's own library functions where their bodies name tower 0's
device (`function_copies`), and the variable copies and an optimizer's slots of them, made in bulk by
one import each before its `apply_gradients` (`bulk_variables`), and the
rule clients follow: copy, or say why not (`copy_policy`; `python_state`:
what Python did on device 0 that a copy cannot repeat). What to
copy and when is the clients' decision (towers: `tower_cloning`,
`output_copies`; strategy: `replica_loop`).

May import: `replicate.core` (and errors, _compat).
Never `cross_tower`, `towers`, `strategy`, `cluster` or a facade.
"""

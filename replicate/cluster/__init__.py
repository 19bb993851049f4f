"""Between-graph training on a TF cluster with parameter servers.

Holds the placement of towers and variables read from the Estimator's
`RunConfig` / `TF_CONFIG` (`placement`) and the start-up check of the
cluster's tasks (`cluster_check`). `replicate/multi_worker.py` is the
public facade of the helpers users call.

May import: `replicate.core`, `replicate.towers` (and errors, _compat).
Never `strategy` or a facade.
"""

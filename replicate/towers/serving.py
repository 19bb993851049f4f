"""The graph of a SavedModel exported from a replicated Estimator.

A SavedModel is served elsewhere: by TF Serving, `saved_model_cli` or another
host, with whatever devices that has and requests of any size. So when the
Estimator builds the graph of an export (`export_saved_model`,
`export_savedmodel`, `experimental_export_all_saved_models`; detected by
`replicate._compat.building_saved_model`), `replicate_model_fn` calls
`model_fn` once on the whole batch, in no device scope: no towers, no batch
split, no device pins other than those `model_fn` sets itself. The graph is
the unreplicated model's, so its variables have the checkpoint's names and
`TowerOptimizer` passes through to the optimizer it wraps.
"""
from replicate._compat import tf1
from replicate.towers import tower_build
from replicate.towers import tower_context

# The device of the `TowerContext` an export's `model_fn` call sees: none.
EXPORT_DEVICE = ''


def build_for_export(model_fn, features, labels, mode, params, config,
                     loss_reduction):
  """Calls `model_fn` as the unreplicated model, for a SavedModel.

  Inside, `replicate.get_tower_context()` returns tower 0 of 1 with device
  `''` (unplaced).

  Args:
    model_fn: the user's `model_fn`.
    features: the serving input receiver's features.
    labels: its labels, or None.
    mode: the mode being exported.
    params: passed to `model_fn`.
    config: passed to `model_fn`.
    loss_reduction: the `replicate_model_fn` argument (kept for a
      `TowerOptimizer` call, which passes through with one tower).

  Returns:
    The `EstimatorSpec` `model_fn` returned.
  """
  replication = tower_context.Replication(tf1.get_default_graph(), 1,
                                          loss_reduction)
  tower = tower_context.TowerContext(0, 1, EXPORT_DEVICE)
  with tower_context.replication_scope(replication), (
      tower_context.tower_scope(replication, tower)):
    return tower_build.call_model_fn(model_fn, features, labels, mode, params,
                                     config)

"""EVAL and PREDICT towers 1..N-1 as copies of tower 0's outputs.

As in TRAIN (tower_cloning.py), `model_fn` is called once, for tower 0, and
the ops its outputs need are copied onto the other towers' devices
(tower_copier.py), reading each tower's shard of the batch and the one set of
variables. So Keras layer objects, `tf.compat.v1.layers` and `get_variable`
behave alike in every mode.

* PREDICT: the predictions and export outputs are copied; the merge
  concatenates them in batch order (tower_specs.py).
* EVAL: the loss and every metric's `update_op` are copied. Metric
  variables are local variables updated by their `update_op`s; each copied
  tower gets its own (`TowerCloner.own_variables`), so no two towers update
  one variable in a step (TF's `AssignAdd` is not atomic across them). The
  merge adds towers 1..N-1's metric variables into tower 0's after every
  step's updates, so tower 0's metric values cover the whole batch, as in the
  unreplicated model. Summing is exact only for metric state made of sums
  and counts; the merge refuses any other (tower_specs.py).
"""
import tensorflow as tf

from replicate._compat import ClassificationOutput
from replicate._compat import PredictOutput
from replicate._compat import RegressionOutput
from replicate._compat import tf1
from replicate.towers import tower_cloning
from replicate.towers import tower_specs

_METRIC_COLLECTIONS = (tf1.GraphKeys.LOCAL_VARIABLES,
                       tf1.GraphKeys.METRIC_VARIABLES)


def copied_eval_specs(cloner, replication, first_spec, unscaled_loss,
                      collections, first_metric_variables):
  """The EVAL specs of towers 1..N-1, copies of tower 0's.

  Args:
    cloner: the `TowerCloner` of tower 0.
    replication: the `tower_context.Replication` being built.
    first_spec: tower 0's spec, its loss scaled.
    unscaled_loss: the loss tower 0's `model_fn` returned.
    collections: the `tower_collections.TowerCollections` of the towers.
    first_metric_variables: the metric variables tower 0 created.

  Returns:
    `(specs, metric_variables)`: the `num_towers - 1` specs, and for every
    tower (tower 0 first) its metric variables in one order.
  """
  # Under REPLICATED a tower's call makes its variables on its device.
  metric_variables = cloner.own_variables(
      first_metric_variables, _METRIC_COLLECTIONS,
      follow_first_device=replication.replicated is not None)
  metrics = dict(first_spec.eval_metric_ops or {})
  cloner.clone(eval_targets(first_spec, unscaled_loss, collections))
  specs = tower_cloning.copied_specs(cloner, replication, first_spec,
                                     unscaled_loss, collections)
  for tower_id, spec in enumerate(specs, 1):
    specs[tower_id - 1] = tower_specs.replaced(
        spec, predictions=_map(lambda t, i=tower_id: cloner.get(i, t),
                               first_spec.predictions),
        eval_metric_ops={
            name: _copied_metric(cloner, tower_id, metric)
            for name, metric in metrics.items()
        })
  return specs, metric_variables


def _copied_metric(cloner, tower_id, metric):
  if isinstance(metric, (tuple, list)) and len(metric) == 2:
    # Only tower 0's value is read (after the reduction).
    return (metric[0], cloner.get(tower_id, metric[1]))
  return metric  # the merge explains what it takes


def copied_predict_specs(cloner, num_towers, first_spec):
  """The PREDICT specs of towers 1..N-1, copies of tower 0's.

  Args:
    cloner: the `TowerCloner` of tower 0.
    num_towers: the number of towers.
    first_spec: tower 0's spec.

  Returns:
    A list of `num_towers - 1` specs.
  """
  outputs = dict(first_spec.export_outputs or {})
  cloner.clone(predict_targets(first_spec))
  specs = []
  for tower_id in range(1, num_towers):
    get = lambda t, i=tower_id: cloner.get(i, t)
    fields = {'predictions': _map(get, first_spec.predictions)}
    if first_spec.export_outputs is not None:
      fields['export_outputs'] = {
          key: _copied_export_output(output, get)
          for key, output in outputs.items()
      }
    specs.append(tower_specs.replaced(first_spec, **fields))
  return specs


def eval_targets(spec, unscaled_loss, collections):
  """The tensors an EVAL spec's copies are made for, in one import: the
  metrics' updates, the loss, the LOSSES entries and the predictions
  (concatenated for what reads them, see tower_specs.py)."""
  updates = [metric[1] for metric in (spec.eval_metric_ops or {}).values()
             if isinstance(metric, (tuple, list)) and len(metric) == 2]
  return (updates + [unscaled_loss] +
          collections.added(0, tf1.GraphKeys.LOSSES) +
          _tensors(spec.predictions))


def predict_targets(spec):
  """The tensors a PREDICT spec's copies are made for: its predictions and
  export outputs."""
  return _tensors(spec.predictions) + [
      t for output in (spec.export_outputs or {}).values()
      for t in _export_tensors(output)]


def _tensors(nest):
  return [t for t in tf.nest.flatten(nest, expand_composites=True)
          if isinstance(t, (tf.Tensor, tf1.Operation))]


def _map(get, nest):
  """`nest` with each tensor (of composites too) replaced by `get(tensor)`."""
  return tf.nest.map_structure(
      lambda t: get(t) if isinstance(t, (tf.Tensor, tf1.Operation)) else t,
      nest, expand_composites=True)


def _export_tensors(output):
  if isinstance(output, PredictOutput):
    return _tensors(output.outputs)
  if isinstance(output, RegressionOutput):
    return _tensors(output.value)
  if isinstance(output, ClassificationOutput):
    return _tensors([output.scores, output.classes])
  return []


def _copied_export_output(output, get):
  """A tower's copy of tower 0's export output (other types: as they are)."""
  if isinstance(output, PredictOutput):
    return PredictOutput(_map(get, output.outputs))
  if isinstance(output, RegressionOutput):
    return RegressionOutput(get(output.value))
  if isinstance(output, ClassificationOutput):
    return ClassificationOutput(scores=get(output.scores),
                                classes=get(output.classes))
  return output  # the merge explains what it can concatenate

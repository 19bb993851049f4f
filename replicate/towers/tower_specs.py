"""Merging the towers' `EstimatorSpec`s into the spec of the replicated model."""
import numpy as np
import tensorflow as tf

from replicate import errors
from replicate._compat import ClassificationOutput
from replicate._compat import EstimatorSpec
from replicate._compat import ModeKeys
from replicate._compat import PredictOutput
from replicate._compat import RegressionOutput
from replicate._compat import tf1
from replicate.gradients import gradient_aggregation
from replicate.towers import metric_merge
from replicate.towers import metric_terms
from replicate.towers import tower_collections


def _summed_loss(tower_specs, device):
  # Not named 'loss': the Estimator's own summary of the loss is named so,
  # and would become 'loss_1' in TensorBoard next to an op of that name.
  return gradient_aggregation.sum_on_device([s.loss for s in tower_specs],
                                            device, name='summed_loss')


def replaced(spec, **fields):
  """`spec` with `fields` replaced; its other fields are not checked again.

  A tower's spec is tower 0's, which the `EstimatorSpec` constructor checked,
  with fields the library made. `EstimatorSpec._replace` would check every
  field anew, and TF's check of `eval_metric_ops` walks all the graph's
  local variables: per tower, that grows with towers x variables (the
  copies under `REPLICATED` are local variables). The merged spec, which the
  Estimator receives, is still built by the constructor.

  Raises:
    ValueError: for a field `EstimatorSpec` does not have.
  """
  unknown = sorted(set(fields) - set(spec._fields))
  if unknown:
    raise ValueError('EstimatorSpec has no fields {}'.format(unknown))
  return spec._make(fields.get(name, value)
                    for name, value in zip(spec._fields, spec))


def train_spec(tower_specs, aggregation_device, applying_tower_id):
  """The TRAIN spec: summed loss; the applying tower's `train_op` and hooks.

  The applying tower's spec is the template, but for tower 0's `train_op`:
  hooks such as `SyncReplicasOptimizer`'s check that
  `apply_gradients` was called on their optimizer, which only that tower did.

  Args:
    tower_specs: the towers' `EstimatorSpec`s, losses already scaled.
    aggregation_device: where the loss is summed.
    applying_tower_id: the tower whose `apply_gradients` applied the sums.

  Returns:
    An `EstimatorSpec`.
  """
  fields = tower_specs[applying_tower_id]._asdict()
  # What tower 0's optimizer calls returned waits for the update of the
  # step (tower_gradients.py), so its `train_op` runs the step, with what
  # `model_fn` grouped into it after `minimize` (Keras layers' updates):
  # tower 0's, whichever tower applies.
  fields['train_op'] = tower_specs[
      tower_collections.UPDATE_TOWER_ID].train_op
  fields['loss'] = _summed_loss(tower_specs, aggregation_device)
  return EstimatorSpec(**fields)


def eval_spec(tower_specs, tower_metric_variables, aggregation_device,
              tower_rows=None, first_inputs=()):
  """The EVAL spec: summed loss, metrics reduced into the first tower's.

  Every evaluation step runs all towers' metric updates, then adds each
  metric variable of towers 1..n-1 into tower 0's and resets them to zero, so
  the reduction can run every step (it is idempotent). Tower 0's metric
  values then cover the whole batch. The predictions are the towers'
  concatenated, as in PREDICT, for what wraps the model_fn and reads them
  (`tf.estimator.add_metrics`); one without a row per example (a scalar, a
  static dimension 0 other than the rows) stays tower 0's.

  A metric of a per-batch value (`tf.metrics.mean(loss)`) adds one term per
  tower instead of one per batch: that is one device's value only when the
  towers' shards are equal, so where rows are counted at run time a step
  whose towers differ in rows fails (see `metric_terms.per_batch_metrics`).
  A metric whose value reads both a sum over the rows and a term per call
  (`tf.metrics.mean(tf.reduce_sum(per_row))`) is refused there.

  Args:
    tower_specs: the towers' `EstimatorSpec`s, losses already scaled.
    tower_metric_variables: for each tower, the metric variables it created,
      in creation order.
    aggregation_device: where the loss is summed.
    tower_rows: None where every tower has `1 / N` of a static batch; else
      each tower's int64 row count.
    first_inputs: the tensors of tower 0's shard of the batch.

  Returns:
    An `EstimatorSpec`.

  Raises:
    InvalidArgumentError: if towers return different metrics, or a metric
      whose state summed over the towers would differ from one device's
      (see `metric_merge.check_summable`), or that reads a sum over the
      rows and a term per call (`metric_terms.per_batch_metrics`).
    InvalidTypeError: if a metric is not a `(value, update_op)` pair.
  """
  fields = tower_specs[0]._asdict()
  fields['loss'] = _summed_loss(tower_specs, aggregation_device)
  fields['predictions'] = _eval_predictions(
      [spec.predictions for spec in tower_specs], aggregation_device,
      tower_rows)
  metrics = [dict(spec.eval_metric_ops or {}) for spec in tower_specs]
  _check_same_keys([sorted(m) for m in metrics], 'eval_metric_ops')
  for tower_metrics in metrics:
    for name, metric in tower_metrics.items():
      if not (isinstance(metric, (tuple, list)) and len(metric) == 2):
        raise errors.InvalidTypeError(
            'replicate_model_fn reduces metrics given as (value_tensor, '
            'update_op) pairs, as tf.compat.v1.metrics returns them; metric '
            '{!r} is {!r}. Use a tf.compat.v1.metrics function.'.format(
                name, metric))
  if not metrics[0]:
    return EstimatorSpec(**fields)
  metric_merge.check_summable(metrics, tower_metric_variables)
  update_ops = [op for m in metrics for _, (_, op) in sorted(m.items())]
  if tower_rows is not None:
    update_ops += metric_terms.even_rows_checks(
        metric_terms.per_batch_metrics(metrics[0], tower_metric_variables[0],
                                       first_inputs),
        tower_rows, aggregation_device)
  with tf1.control_dependencies(update_ops):
    reduce_op = metric_merge.reduce_metric_variables(tower_metric_variables)
  fields['eval_metric_ops'] = {
      name: (value, reduce_op) for name, (value, _) in metrics[0].items()
  }
  return EstimatorSpec(**fields)


def _eval_predictions(per_tower, aggregation_device, tower_rows):
  """EVAL's predictions: each concatenated over the towers where it has
  the tower's rows in dimension 0 (checked when it runs where rows are
  counted then), else tower 0's."""
  rows = _Rows(tower_rows, ())

  def merged(tensors, what):
    if not all(isinstance(t, tf.Tensor) for t in tensors):
      return tensors[0]
    try:
      return _concat(tensors, what, rows)
    except errors.InvalidArgumentError:
      return tensors[0]

  with tf1.device(aggregation_device), tf1.name_scope('concat_predictions'):
    if isinstance(per_tower[0], dict):
      _check_same_keys([sorted(p) for p in per_tower], 'predictions')
      return {key: merged([p[key] for p in per_tower],
                          'predictions[{!r}]'.format(key))
              for key in per_tower[0]}
    if per_tower[0] is None:
      return None
    return merged(per_tower, 'predictions')


def predict_spec(tower_specs, aggregation_device, tower_rows=None,
                 split_inputs=()):
  """The PREDICT spec: predictions and export outputs concatenated by batch.

  Args:
    tower_specs: the towers' `EstimatorSpec`s.
    aggregation_device: where the concatenations run.
    tower_rows: each tower's rows (ints, or int64 scalars counted at run
      time), to check every output against; None: not checked.
    split_inputs: tower 0's tensors of the batch that the towers split (its
      shard); an output that depends on none of them is refused. Empty: not
      checked.

  Returns:
    An `EstimatorSpec`.

  Raises:
    InvalidArgumentError: if towers return different predictions or outputs,
      or a constant of unequal rows that does not depend on the tower's
      rows: a value per batch (a vocabulary) that concatenation would
      repeat once per tower, even where its size equals a tower's rows.
    InvalidTypeError: for an export output type that cannot be concatenated.
  """
  fields = tower_specs[0]._asdict()
  rows = _Rows(tower_rows, split_inputs)
  with tf1.device(aggregation_device), tf1.name_scope('concat_predictions'):
    fields['predictions'] = _concat_nests(
        [spec.predictions for spec in tower_specs], 'predictions', rows)
    outputs = [dict(spec.export_outputs or {}) for spec in tower_specs]
    _check_same_keys([sorted(o) for o in outputs], 'export_outputs')
    if tower_specs[0].export_outputs is not None:
      fields['export_outputs'] = {
          key: _concat_export_output([o[key] for o in outputs], key, rows)
          for key in outputs[0]
      }
  return EstimatorSpec(**fields)


def _concat_export_output(per_tower, key, rows):
  first = per_tower[0]
  for output in per_tower[1:]:
    if type(output) is not type(first):  # pylint: disable=unidiomatic-typecheck
      raise errors.InvalidArgumentError(
          'Every tower must return the same export_outputs, but {!r} is a {} '
          'in tower 0 and a {} in another tower.'.format(
              key, type(first).__name__, type(output).__name__))
  if isinstance(first, PredictOutput):
    return PredictOutput(_concat_nests(
        [o.outputs for o in per_tower],
        'the outputs of PredictOutput {!r}'.format(key), rows))
  if isinstance(first, RegressionOutput):
    return RegressionOutput(_concat(
        [o.value for o in per_tower],
        'the value of RegressionOutput {!r}'.format(key), rows,
        '[batch] or [batch, 1]'))
  if isinstance(first, ClassificationOutput):
    # Classes are [batch, k] like scores, so they are concatenated too.
    scores = classes = None
    if first.scores is not None:
      scores = _concat([o.scores for o in per_tower],
                       'the scores of ClassificationOutput {!r}'.format(key),
                       rows, '[batch, k]')
    if first.classes is not None and first.classes.shape.ndims == 0:
      # One string per tower, not per row: stacked per tower, as contrib
      # did. Never served (exports are unreplicated), but PREDICT must build.
      classes = tf.stack([o.classes for o in per_tower])
    elif first.classes is not None:
      classes = _concat([o.classes for o in per_tower],
                        'the classes of ClassificationOutput {!r}'.format(key),
                        rows, '[batch, k]')
    return ClassificationOutput(scores=scores, classes=classes)
  raise errors.InvalidTypeError(
      'Export output {!r} is a {}; replicate_model_fn can concatenate '
      'PredictOutput, RegressionOutput and ClassificationOutput.'.format(
          key, type(first).__name__))


class _Rows(object):
  """What the towers' outputs are checked against: each tower's rows
  (`counts`, or None) and the ops that depend on tower 0's shard."""

  def __init__(self, counts, split_inputs):
    self.counts = counts
    self._reached = None
    if split_inputs:
      self._reached = _forward_cone(t.op for t in split_inputs)

  def read_by(self, tensor):
    """Whether `tensor` depends on the tower's shard (True: unchecked)."""
    return self._reached is None or tensor.op in self._reached


def _forward_cone(ops):
  """`ops` and every op that reads what they output (data edges)."""
  pending = list(ops)
  seen = set(pending)
  while pending:
    op = pending.pop()
    for consumer in [c for t in op.outputs for c in t.consumers()]:
      if consumer not in seen:
        seen.add(consumer)
        pending.append(consumer)
  return seen


def _constant_rows_differ(tensor):
  """Whether `tensor` is a constant whose rows are not all equal.

  A constant with equal rows, built from the batch's static size
  (`tf.zeros(tf.shape(x)[:1])`, which TF folds into a constant), is one
  device's when repeated; so are values drawn per row (a dropout mask of
  `tf.ones_like(x)`, also folded), which each tower draws for its rows.
  """
  value = tf.get_static_value(tensor)
  return value is not None and not all(
      np.array_equal(row, value[0]) for row in value[1:])


def _concat(tensors, what, rows, expected_shape='[batch, ...]'):
  """Concatenates the towers' `tensors` along the batch dimension.

  Each must have its tower's rows in dimension 0: checked here where both
  are static, else by an assertion when the step runs.

  Args:
    tensors: one tensor per tower.
    what: its name, for messages.
    rows: a `_Rows`.
    expected_shape: the shape to name in messages.

  Raises:
    InvalidArgumentError: if they are scalars (no batch dimension), if tower
      0's is a constant of unequal rows that does not depend on its shard of
      the batch, or a tower's tensor has a static dimension 0 other than its
      rows, or any static dimension 0 where the rows are counted at run
      time.
  """
  what = what[:1].upper() + what[1:]
  if tensors[0].shape.ndims == 0:
    raise errors.InvalidArgumentError(
        '{} is a scalar in each tower, but replicate_model_fn concatenates '
        'the towers\' outputs along the batch dimension: give it shape {}, '
        'one row per example.'.format(what, expected_shape))
  if not rows.read_by(tensors[0]) and _constant_rows_differ(tensors[0]):
    raise errors.InvalidArgumentError(
        '{} ({}) is a constant that does not depend on the features or '
        'labels, and its rows are not all equal, so it is one value for the '
        'whole batch rather than one row per example; replicate_model_fn '
        'concatenates the towers\' '
        'outputs along dimension 0 and would repeat it once per tower, where '
        'one device returns it once. Compute it per example from the '
        'features (shape {}), or serve it apart from the predictions.'.format(
            what, tensors[0].name, expected_shape))
  if rows.counts is not None:
    tensors = [_with_rows(tensor, count, tower_id, what, expected_shape)
               for tower_id, (tensor, count) in enumerate(
                   zip(tensors, rows.counts))]
  return tf.concat(tensors, axis=0)


def _with_rows(tensor, rows, tower_id, what, expected_shape):
  """`tensor`, checked to have `rows` rows in dimension 0."""
  message = (
      '{} in tower {} has {{}} in dimension 0, but the tower was given {{}} '
      'of the batch: replicate_model_fn concatenates the towers\' outputs '
      'along dimension 0, so each must have shape {}, one row per example (a '
      'value per batch, or a batch dimension elsewhere, would be repeated or '
      'mixed across towers).'.format(what, tower_id, expected_shape))
  static = (tf.compat.dimension_value(tensor.shape[0])
            if tensor.shape.ndims is not None else None)
  if isinstance(rows, int) and static is not None:
    if static != rows:
      raise errors.InvalidArgumentError(message.format(static, rows))
    return tensor
  if static is not None:
    # Rows counted at run time leave a tower's batch dimension unknown when
    # the graph is built: a size fixed then (a time-major output's time, a
    # constant) is not the rows, even where it happens to equal them.
    raise errors.InvalidArgumentError(message.format(
        '{}, fixed when the graph is built,'.format(static),
        'a number of rows counted when the step runs'))
  size = tf.shape(tensor, out_type=tf.int64)[0]
  check = tf1.assert_equal(
      size, tf.cast(rows, tf.int64),
      message=message.format('the size below', 'the rows after it'),
      data=[size, rows])
  with tf1.control_dependencies([check]):
    return tf.identity(tensor)


def _concat_nests(per_tower, what, rows):
  if isinstance(per_tower[0], dict):
    _check_same_keys([sorted(p) for p in per_tower], what)
    return {
        key: _concat([p[key] for p in per_tower],
                     '{}[{!r}]'.format(what, key), rows)
        for key in per_tower[0]
    }
  return _concat(per_tower, what, rows)


def _check_same_keys(per_tower_keys, what):
  for tower_id, keys in enumerate(per_tower_keys[1:], 1):
    if keys != per_tower_keys[0]:
      raise errors.InvalidArgumentError(
          'Every tower must return the same {}, but tower 0 returned keys {} '
          'and tower {} returned {}. Make model_fn return the same structure '
          'on every call.'.format(what, per_tower_keys[0], tower_id, keys))


def merge(mode, tower_specs, tower_metric_variables, aggregation_device,
          applying_tower_id, tower_rows=None, first_inputs=(),
          split_inputs=()):
  """Dispatches to the merge of `mode`."""
  if mode == ModeKeys.TRAIN:
    return train_spec(tower_specs, aggregation_device, applying_tower_id)
  if mode == ModeKeys.EVAL:
    return eval_spec(tower_specs, tower_metric_variables, aggregation_device,
                     tower_rows, first_inputs)
  return predict_spec(tower_specs, aggregation_device, tower_rows,
                      split_inputs)

"""Merging the towers' `EstimatorSpec`s into the spec of the replicated model."""
import tensorflow as tf

from replicate import errors
from replicate._compat import ClassificationOutput
from replicate._compat import EstimatorSpec
from replicate._compat import ModeKeys
from replicate._compat import PredictOutput
from replicate._compat import RegressionOutput
from replicate._compat import tf1
from replicate.gradients import gradient_aggregation


def _summed_loss(tower_specs, device):
  # Not named 'loss': the Estimator's own summary of the loss is named so,
  # and would become 'loss_1' in TensorBoard next to an op of that name.
  return gradient_aggregation.sum_on_device([s.loss for s in tower_specs],
                                            device, name='summed_loss')


def train_spec(tower_specs, aggregation_device, applying_tower_id):
  """The TRAIN spec: summed loss; the applying tower's `train_op` and hooks.

  The applying tower's spec is the template: its `train_op` applies the
  gathered gradients, and hooks such as `SyncReplicasOptimizer`'s check that
  `apply_gradients` was called on their optimizer, which only that tower did.

  Args:
    tower_specs: the towers' `EstimatorSpec`s, losses already scaled.
    aggregation_device: where the loss is summed.
    applying_tower_id: the tower whose `apply_gradients` applied the sums.

  Returns:
    An `EstimatorSpec`.
  """
  fields = tower_specs[applying_tower_id]._asdict()
  fields['loss'] = _summed_loss(tower_specs, aggregation_device)
  return EstimatorSpec(**fields)


def eval_spec(tower_specs, tower_metric_variables, aggregation_device):
  """The EVAL spec: summed loss, metrics reduced into the first tower's.

  Every evaluation step runs all towers' metric updates, then adds each
  metric variable of towers 1..n-1 into tower 0's and resets them to zero, so
  the reduction can run every step (it is idempotent). Tower 0's metric
  values then cover the whole batch.

  Args:
    tower_specs: the towers' `EstimatorSpec`s, losses already scaled.
    tower_metric_variables: for each tower, the metric variables it created,
      in creation order.
    aggregation_device: where the loss is summed.

  Returns:
    An `EstimatorSpec`.

  Raises:
    InvalidArgumentError: if towers return different metrics, or a metric
      whose state summed over the towers would differ from one device's
      (see `_check_summable`).
    InvalidTypeError: if a metric is not a `(value, update_op)` pair.
  """
  fields = tower_specs[0]._asdict()
  fields['loss'] = _summed_loss(tower_specs, aggregation_device)
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
  _check_summable(metrics, tower_metric_variables)
  update_ops = [op for m in metrics for _, (_, op) in sorted(m.items())]
  with tf1.control_dependencies(update_ops):
    reduce_op = _reduce_metric_variables(tower_metric_variables)
  fields['eval_metric_ops'] = {
      name: (value, reduce_op) for name, (value, _) in metrics[0].items()
  }
  return EstimatorSpec(**fields)


def _reduce_metric_variables(tower_metric_variables):
  """Adds towers 1.. metric variables into tower 0's, then zeroes them."""
  counts = [len(v) for v in tower_metric_variables]
  if len(set(counts)) > 1:
    raise errors.InvalidArgumentError(
        'Different `EstimatorSpec.eval_metric_ops` across `model_fn()` calls: '
        'every tower must create the same metrics. Expected {} local '
        'variables (tower 0\'s {} in each of {} towers), but got {} instead '
        '({} respectively). Make model_fn return the same eval_metric_ops on '
        'every call.'.format(counts[0] * len(counts), counts[0], len(counts),
                             sum(counts), counts))
  resets = []
  with tf1.name_scope('metric_reduction'):
    for position, primary in enumerate(tower_metric_variables[0]):
      replicas = [tower[position] for tower in tower_metric_variables[1:]]
      for replica in replicas:
        if (replica.dtype.base_dtype != primary.dtype.base_dtype or
            not replica.shape.is_compatible_with(primary.shape)):
          raise errors.InvalidArgumentError(
              'Every tower must create the same metrics, but metric variable '
              '{} ({}, {}) does not match {} ({}, {}) of tower 0. Make '
              'model_fn return the same eval_metric_ops on every call.'.format(
                  replica.op.name, replica.dtype.base_dtype.name,
                  replica.shape, primary.op.name,
                  primary.dtype.base_dtype.name, primary.shape))
      add = tf1.assign_add(primary, tf.math.add_n(
          [tf1.convert_to_tensor(r) for r in replicas]))
      with tf1.control_dependencies([add]):
        resets.extend(
            tf1.assign(replica, tf.zeros_like(replica)) for replica in replicas)
    return tf.group(*resets, name='reduce_metric_variables')


# Writes that add to (or subtract from) a variable: from zero, the towers'
# states summed are what one device's updates would have made.
_ADDITIVE_WRITES = frozenset([
    'AssignAdd', 'AssignSub', 'ScatterAdd', 'ScatterSub', 'ScatterNdAdd',
    'ScatterNdSub', 'AssignAddVariableOp', 'AssignSubVariableOp',
    'ResourceScatterAdd', 'ResourceScatterSub', 'ResourceScatterNdAdd',
    'ResourceScatterNdSub'])
# Ops taking a variable (its ref or its resource handle) only to read it.
_READS = frozenset(['ReadVariableOp', 'ResourceGather', 'ResourceGatherNd',
                    'VariableShape', 'VarIsInitializedOp',
                    'IsVariableInitialized'])
# Ops passing a variable's ref or handle on (identities, control flow).
_FORWARDS = frozenset([
    'Identity', 'RefIdentity', 'IdentityN', 'Switch', 'RefSwitch', 'Enter',
    'RefEnter', 'Merge', 'RefMerge', 'Exit', 'RefExit', 'NextIteration',
    'RefNextIteration'])


def _check_summable(metrics, tower_metric_variables):
  """Raises unless summing the towers' metric variables is exact.

  The merge adds the towers' metric variables into tower 0's. That gives one
  device's state only where every write of a metric variable by the metrics'
  update ops adds an amount that reads no metric state, to a variable that
  starts at zero.

  Args:
    metrics: for each tower, its `{key: (value, update_op)}`.
    tower_metric_variables: for each tower, its metric variables.

  Raises:
    InvalidArgumentError: naming the metric, the variable, the write and the
      fix.
  """
  updates = [_op(update) for tower in metrics for _, update in tower.values()]
  cone = _cone(updates)
  owned = {v.op: v for tower in tower_metric_variables for v in tower}
  stateful = _reads_of(owned, cone)
  # Tower 0's first, so that the message names the variable model_fn made.
  for variable in [v for tower in tower_metric_variables for v in tower]:
    for write in _writes(variable.op, cone):
      reason = None
      if write.type not in _ADDITIVE_WRITES:
        reason = (
            'its update op writes metric variable {} with {} (op {}), which '
            'does not add to it, so its towers\' states cannot be combined by '
            'summing them'.format(variable.op.name, write.type, write.name))
      elif any(t.op in stateful for t in _amount_inputs(write)):
        reason = (
            'its update op adds to metric variable {} with {} (op {}) an '
            'amount computed from the metric\'s own state, so its towers\' '
            'states cannot be combined by summing them'.format(
                variable.op.name, write.type, write.name))
      elif not _starts_at_zero(variable):
        reason = (
            'metric variable {} does not start at a constant zero, and the '
            'copy of every tower starts where it does, so summing the towers\' '
            'states would count the start more than once'.format(
                variable.op.name))
      if reason:
        raise errors.InvalidArgumentError(
            'Metric {!r} cannot be reduced across towers: {}. '
            'replicate_model_fn merges the towers of a metric by adding their '
            'metric variables, which is exact only for state made of sums '
            'and counts (AssignAdd, ScatterAdd and the like) from zero. '
            'Build the metric from sums and counts, as the '
            'tf.compat.v1.metrics functions are, or evaluate on one '
            'device.'.format(
                _metric_key(metrics, write), reason))


def _op(tensor_or_op):
  return getattr(tensor_or_op, 'op', tensor_or_op)


def _cone(ops):
  """`ops` and every op they depend on (data and control inputs)."""
  seen = set(ops)
  pending = list(ops)
  while pending:
    op = pending.pop()
    for dependency in [t.op for t in op.inputs] + list(op.control_inputs):
      if dependency not in seen:
        seen.add(dependency)
        pending.append(dependency)
  return seen


def _reads_of(variable_ops, cone):
  """The ops of `cone` whose outputs depend on those variables' values."""
  seen = set()
  pending = list(variable_ops)
  while pending:
    op = pending.pop()
    for consumer in (c for t in op.outputs for c in t.consumers()):
      if consumer in cone and consumer not in seen:
        seen.add(consumer)
        pending.append(consumer)
  return seen


def _is_variable(tensor):
  return (tensor.dtype == tf.resource or
          tensor.dtype != tensor.dtype.base_dtype)  # a ref


def _writes(variable_op, cone):
  """The ops of `cone` that write the variable of `variable_op`."""
  writes = []
  pending = [variable_op.outputs[0]]
  seen = set()
  while pending:
    tensor = pending.pop()
    for op in tensor.consumers():
      if op not in cone or op in seen:
        continue
      seen.add(op)
      if op.type in _READS:
        continue
      if tensor.dtype != tf.resource and not any(
          arg.is_ref for arg in op.op_def.input_arg):
        continue  # takes the ref's value: a read
      if op.type in _FORWARDS:
        pending.extend(t for t in op.outputs if _is_variable(t))
      else:
        writes.append(op)
  return writes


def _amount_inputs(write):
  """What a write adds besides the variable: its inputs after the first,
  and those of the ops forwarding the variable to it (a cond's predicate)."""
  inputs = list(write.inputs[1:])
  op = write.inputs[0].op
  while op.type in _FORWARDS:
    inputs.extend(op.inputs[1:])
    op = op.inputs[0].op
  return inputs


def _starts_at_zero(variable):
  value = tf.get_static_value(variable.initial_value)
  return value is not None and not value.any()


def _metric_key(metrics, write):
  for tower in metrics:
    for key, (_, update) in sorted(tower.items()):
      if write in _cone([_op(update)]):
        return key
  return None  # pragma: no cover (every write checked is in some cone)


def predict_spec(tower_specs, aggregation_device):
  """The PREDICT spec: predictions and export outputs concatenated by batch.

  Args:
    tower_specs: the towers' `EstimatorSpec`s.
    aggregation_device: where the concatenations run.

  Returns:
    An `EstimatorSpec`.

  Raises:
    InvalidArgumentError: if towers return different predictions or outputs.
    InvalidTypeError: for an export output type that cannot be concatenated.
  """
  fields = tower_specs[0]._asdict()
  with tf1.device(aggregation_device), tf1.name_scope('concat_predictions'):
    fields['predictions'] = _concat_nests(
        [spec.predictions for spec in tower_specs], 'predictions')
    outputs = [dict(spec.export_outputs or {}) for spec in tower_specs]
    _check_same_keys([sorted(o) for o in outputs], 'export_outputs')
    if tower_specs[0].export_outputs is not None:
      fields['export_outputs'] = {
          key: _concat_export_output([o[key] for o in outputs], key)
          for key in outputs[0]
      }
  return EstimatorSpec(**fields)


def _concat_export_output(per_tower, key):
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
        'the outputs of PredictOutput {!r}'.format(key)))
  if isinstance(first, RegressionOutput):
    return RegressionOutput(_concat(
        [o.value for o in per_tower],
        'the value of RegressionOutput {!r}'.format(key),
        '[batch] or [batch, 1]'))
  if isinstance(first, ClassificationOutput):
    # Classes are [batch, k] like scores, so they are concatenated too.
    scores = classes = None
    if first.scores is not None:
      scores = _concat([o.scores for o in per_tower],
                       'the scores of ClassificationOutput {!r}'.format(key),
                       '[batch, k]')
    if first.classes is not None:
      classes = _concat([o.classes for o in per_tower],
                        'the classes of ClassificationOutput {!r}'.format(key),
                        '[batch, k]')
    return ClassificationOutput(scores=scores, classes=classes)
  raise errors.InvalidTypeError(
      'Export output {!r} is a {}; replicate_model_fn can concatenate '
      'PredictOutput, RegressionOutput and ClassificationOutput.'.format(
          key, type(first).__name__))


def _concat(tensors, what, expected_shape='[batch, ...]'):
  """Concatenates the towers' `tensors` along the batch dimension.

  Raises:
    InvalidArgumentError: if they are scalars (no batch dimension).
  """
  if tensors[0].shape.ndims == 0:
    raise errors.InvalidArgumentError(
        '{} is a scalar in each tower, but replicate_model_fn concatenates '
        'the towers\' outputs along the batch dimension: give it shape {}, '
        'one row per example.'.format(what[:1].upper() + what[1:],
                                      expected_shape))
  return tf.concat(tensors, axis=0)


def _concat_nests(per_tower, what):
  if isinstance(per_tower[0], dict):
    _check_same_keys([sorted(p) for p in per_tower], what)
    return {
        key: _concat([p[key] for p in per_tower],
                     '{}[{!r}]'.format(what, key))
        for key in per_tower[0]
    }
  return _concat(per_tower, what)


def _check_same_keys(per_tower_keys, what):
  for tower_id, keys in enumerate(per_tower_keys[1:], 1):
    if keys != per_tower_keys[0]:
      raise errors.InvalidArgumentError(
          'Every tower must return the same {}, but tower 0 returned keys {} '
          'and tower {} returned {}. Make model_fn return the same structure '
          'on every call.'.format(what, per_tower_keys[0], tower_id, keys))


def merge(mode, tower_specs, tower_metric_variables, aggregation_device,
          applying_tower_id):
  """Dispatches to the merge of `mode`."""
  if mode == ModeKeys.TRAIN:
    return train_spec(tower_specs, aggregation_device, applying_tower_id)
  if mode == ModeKeys.EVAL:
    return eval_spec(tower_specs, tower_metric_variables, aggregation_device)
  return predict_spec(tower_specs, aggregation_device)

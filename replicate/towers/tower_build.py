"""Building the towers of one `replicate_model_fn` call and merging them.

In every mode `model_fn` is called once, for tower 0, and towers 1..N-1 are
copies of what it built (tower_cloning.py for TRAIN, output_copies.py for
EVAL and PREDICT), unless `TowerBuild.CALL_PER_TOWER` asks for one call per
tower or copying cannot be shown to be right (then one warning says why).
"""
import contextlib
import copy

import tensorflow as tf

from replicate import errors
from replicate._compat import EstimatorSpec
from replicate._compat import ModeKeys
from replicate._compat import tf1
from replicate.core import checks
from replicate.core import op_kinds
from replicate.towers import batch_split
from replicate.towers import device_setter
from replicate.towers import empty_towers
from replicate.towers import output_copies
from replicate.towers import step_checks
from replicate.towers import tower_cloning
from replicate.towers import tower_collections
from replicate.towers import tower_context
from replicate.towers import tower_copier
from replicate.towers import tower_specs
from replicate.towers.tower_cloning import TowerBuild

_PER_TOWER_REQUESTED = 'tower_build is TowerBuild.CALL_PER_TOWER'
_REGULARIZATION = tf1.GraphKeys.REGULARIZATION_LOSSES


def build(model_fn, features, labels, mode, params, config, placement,
          loss_reduction, tower_build, replicated=None, unsplit_features=(),
          tuning=None):
  """Builds the towers of `model_fn` and returns the merged `EstimatorSpec`.

  Args:
    model_fn: the user's `model_fn`.
    features: the global batch of features.
    labels: the global batch of labels, or None.
    mode: a `tf.estimator.ModeKeys`.
    params: passed to `model_fn` (a deep copy per call).
    config: passed to `model_fn` (a deep copy per call).
    placement: where towers, variables and aggregations go (an object with
      `tower_devices`, `choose_parameter_device` and `aggregation_device`).
    loss_reduction: a `tf.compat.v1.losses.Reduction`.
    tower_build: a `TowerBuild`.
    replicated: under `VariablePlacement.REPLICATED`, a
      `replicated_variables.ReplicatedVariables` for these towers, else None.
    unsplit_features: keys of `features` every tower gets whole.
    tuning: the `Tuning` of this build (None: the current one).

  Returns:
    An `EstimatorSpec`.

  Raises:
    InvalidArgumentError, InvalidTypeError, ContextError: as
      `replicate_model_fn` documents.
  """
  if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
    raise errors.InvalidArgumentError(
        'Unknown mode {!r}; expected one of tf.estimator.ModeKeys.TRAIN, EVAL '
        'or PREDICT.'.format(mode))
  graph = tf1.get_default_graph()
  devices = placement.tower_devices
  num_towers = len(devices)
  replication = tower_context.Replication(graph, num_towers, loss_reduction,
                                          replicated, tuning)
  choose_parameter_device = placement.choose_parameter_device
  aggregation_device = placement.aggregation_device

  # Checked with one tower too, so that a model runs alike on any count.
  batch_split.check_unsplit_names(features, unsplit_features)
  with tower_context.replication_scope(replication):
    if num_towers == 1:
      # One device: no splitting, scaling or aggregation; only placement.
      tower = tower_context.TowerContext(0, 1, devices[0])
      with tower_context.tower_scope(replication, tower), tf1.device(
          device_setter.tower_device_setter(devices[0],
                                            choose_parameter_device)):
        return call_model_fn(model_fn, features, labels, mode, params, config)

    if replicated is not None:
      replicated.note_existing(tf1.trainable_variables())
    split = batch_split.split_batch(features, labels, num_towers,
                                    aggregation_device, unsplit_features)
    feature_shards, label_shards = split.feature_shards, split.label_shards
    replication.tower_rows = split.rows
    replication.batch_size = split.batch_size
    collections = tower_collections.TowerCollections(
        graph, num_towers,
        share_regularization=loss_reduction != tf1.losses.Reduction.SUM)
    cloner = None
    if tower_build == TowerBuild.CLONE:
      # A copy reads its tower's shard and row count in place of tower 0's.
      cloner = tower_copier.TowerCloner(
          graph, devices, len(graph.get_operations()), [
              tf.nest.flatten((shard, label_shard), expand_composites=True) +
              ([split.rows[i]] if split.rows else [])
              for i, (shard, label_shard) in enumerate(
                  zip(feature_shards, label_shards))
          ])
      if mode == ModeKeys.TRAIN:
        # Copied at tower 0's first TowerOptimizer.apply_gradients.
        replication.cloner = cloner
    per_tower_reason = None if cloner else _PER_TOWER_REQUESTED
    specs = []
    metric_variables = []
    new_locals = []  # each tower's new local variables, not metric ones
    copied = False
    try:
      for tower_id, device in enumerate(devices):
        tower = tower_context.TowerContext(tower_id, num_towers, device)
        trainable_before = _ids(tf1.trainable_variables())
        metrics_before = _ids(graph.get_collection(
            tf1.GraphKeys.METRIC_VARIABLES))
        locals_before = _ids(graph.get_collection(
            tf1.GraphKeys.LOCAL_VARIABLES))
        requested_devices = (
            cloner.requested_devices if cloner and tower_id == 0 else None)
        replication.tower_inputs = tf.nest.flatten(
            (feature_shards[tower_id], label_shards[tower_id]),
            expand_composites=True)
        with _tower_scopes(tower_id) as name_scope, tower_context.tower_scope(
            replication, tower), collections.tower(tower_id), tf1.device(
                device_setter.tower_device_setter(
                    device, choose_parameter_device, requested_devices)):
          replication.name_scopes[tower_id] = name_scope
          try:
            spec = call_model_fn(model_fn, feature_shards[tower_id],
                                 label_shards[tower_id], mode, params, config)
          except ValueError as e:
            _raise_if_unshared(e, tower, per_tower_reason)
            raise
          check_tower(spec, tower, replication, trainable_before,
                      per_tower_reason)
          unscaled_loss = spec.loss
          spec = tower_specs.replaced(
              spec, loss=replication.scale_loss(spec.loss))
        replication.cloner = None
        if tower_id:
          # (Tower 0's terms are checked where its towers are copies: a
          # call may add a term in tower 0 only.)
          _check_terms(replication, tower_id, unscaled_loss, collections)
          step_checks.check_regularization_counted_once(
              replication, tower_id, unscaled_loss,
              collections.added(0, _REGULARIZATION),
              collections.added(tower_id, _REGULARIZATION))
        specs.append(spec)
        metric_variables.append(_in_creation_order(graph, [
            v for v in graph.get_collection(tf1.GraphKeys.METRIC_VARIABLES)
            if id(v) not in metrics_before
        ]))
        metrics_now = _ids(graph.get_collection(
            tf1.GraphKeys.METRIC_VARIABLES))
        new_locals.append([
            v for v in graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES)
            if id(v) not in locals_before and id(v) not in metrics_now])
        if tower_id or cloner is None:
          _check_copied(replicated, per_tower_reason)
          continue
        if mode == ModeKeys.TRAIN:
          if replication.towers_cloned:
            _check_terms(replication, 0, unscaled_loss, collections)
            specs.extend(tower_cloning.copied_specs(
                cloner, replication, specs[0], unscaled_loss, collections))
            metric_variables.extend([] for _ in range(1, num_towers))
            copied = True
            break
          per_tower_reason = (
              replication.not_cloned_reason or
              'tower 0 made no TowerOptimizer.apply_gradients call')
          _check_copied(replicated, per_tower_reason)
          continue
        per_tower_reason = cloner.reason_not_to_clone(
            replication.tower_context_requested,
            loss_reduction == tf1.losses.Reduction.SUM)
        own_locals = []
        if mode == ModeKeys.EVAL:
          # A hand-made metric's state outside `METRIC_VARIABLES` is the
          # copies' own too, as a call's `tf.Variable` would be, and is
          # checked to sum (a shared one would take racing writes).
          own_locals = _in_creation_order(graph, metric_variables[0] + (
              _written_by_metrics(specs[0], new_locals[0])))
        if per_tower_reason is None:
          per_tower_reason = cloner.reason_variables_made_anew(
              output_copies.predict_targets(specs[0])
              if mode == ModeKeys.PREDICT else output_copies.eval_targets(
                  specs[0], unscaled_loss, collections), own_locals)
        if per_tower_reason is not None:
          _check_copied(replicated, per_tower_reason)
          tower_cloning.warn_not_cloned(per_tower_reason)
          continue
        _check_terms(replication, 0, unscaled_loss, collections)
        if replicated is not None:
          replicated.make_copies(cloner)
        if mode == ModeKeys.EVAL:
          more_specs, metric_variables = output_copies.copied_eval_specs(
              cloner, replication, specs[0], unscaled_loss, collections,
              own_locals)
        else:
          more_specs = output_copies.copied_predict_specs(
              cloner, num_towers, specs[0])
        specs.extend(more_specs)
        copied = True
        break
      if not copied or mode == ModeKeys.TRAIN:
        replication.check_same_optimizer_calls()
      if not copied and mode == ModeKeys.EVAL and num_towers > 1:
        _add_metric_locals(graph, specs, metric_variables, new_locals)
    finally:
      replication.cloner = None
      collections.finish()
    rows = split.rows
    if mode == ModeKeys.PREDICT and rows is None:
      rows = _static_rows(split)
    flat_inputs = [tf.nest.flatten((features, labels), expand_composites=True)
                   for features, labels in zip(feature_shards, label_shards)]
    spec = tower_specs.merge(
        mode, specs, metric_variables, aggregation_device,
        replication.applying_tower_id, rows,
        [t for t in flat_inputs[0] if t is not None],
        # What the towers split (not `unsplit_features`): an output that
        # reads none of it is one value per batch.
        [t for t, other in zip(flat_inputs[0], flat_inputs[-1])
         if t is not None and t is not other])
    if mode == ModeKeys.TRAIN:
      step_checks.check_only_tower_optimizers_update(replication,
                                                     spec.train_op)
      empty_towers.write_checks(
          spec.train_op, [[t for t in inputs if t is not None]
                          for inputs in flat_inputs], split.rows)
      tower_collections.order_update_writes(
          collections.added(tower_collections.UPDATE_TOWER_ID,
                            tf1.GraphKeys.UPDATE_OPS), spec.train_op)
    return _with_sync_hook(spec, mode, replicated)


def _check_terms(replication, tower_id, loss, collections):
  """`step_checks.check_terms_read_rows` of a tower's loss."""
  step_checks.check_terms_read_rows(
      replication, tower_id, loss,
      replication.graph.get_collection(_REGULARIZATION) +
      collections.added(tower_id, _REGULARIZATION))


def _add_metric_locals(graph, specs, metric_variables, new_locals):
  """Adds to each tower's metric variables the local variables its call
  made anew that its metrics' updates write (a hand-made metric's state made
  outside `METRIC_VARIABLES`), so that the merge adds them up as a copy's
  writes of tower 0's add up; those every tower shares need no merge."""
  cones = [_metric_cone(spec) for spec in specs]
  for tower_id, (variables, made) in enumerate(
      zip(metric_variables, new_locals)):
    # Tower 0 makes those `get_variable` shares with the other towers.
    variables.extend(_in_creation_order(graph, [
        v for v in made if op_kinds.variable_writes(v.op, cones[tower_id])
        and not (tower_id == 0 and
                 op_kinds.variable_writes(v.op, cones[1]))]))


def _metric_cone(spec):
  """The ops `spec`'s metric update ops depend on."""
  return op_kinds.backward_cone(
      getattr(update, 'op', update)
      for _, update in (spec.eval_metric_ops or {}).values())


def _written_by_metrics(spec, variables):
  """Those of `variables` that `spec`'s metric update ops write."""
  cone = _metric_cone(spec)
  return [v for v in variables if op_kinds.variable_writes(v.op, cone)]


def _static_rows(split):
  """Each tower's rows of a static batch split evenly (a list of ints), or
  None where no value is split."""
  flat = [tf.nest.flatten(shards, expand_composites=True) for shards in zip(
      split.feature_shards, split.label_shards)]
  for first, second in zip(flat[0], flat[1]):
    if first is not second and isinstance(first, tf.Tensor):
      rows = tf.compat.dimension_value(first.shape[0])
      if rows is not None:
        return [rows] * len(flat)
  return None


def _check_copied(replicated, per_tower_reason):
  """Raises where REPLICATED towers would be built by their own calls.

  Raises:
    InvalidArgumentError: naming why the towers are not copies.
  """
  if replicated is None or per_tower_reason is None:
    return
  raise errors.InvalidArgumentError(
      'variable_placement=REPLICATED gives every tower its own variables by '
      "copying tower 0's graph, but here the towers would be built by calling "
      'model_fn once per tower, because {}. Remove that reason, or use '
      'VariablePlacement.CONSOLIDATION_DEVICE.'.format(per_tower_reason))


def _with_sync_hook(spec, mode, replicated):
  """`spec` with the hook that sets the towers' copies at session start,
  and a `local_init_op` of `model_fn`'s that initializes them.

  Raises:
    InvalidArgumentError: if `model_fn` writes a replicated variable (see
      `ReplicatedVariables.check_writes`).
  """
  if replicated is None:
    return spec
  replicated.check_writes(tf.nest.flatten(
      [spec.train_op, spec.loss, spec.eval_metric_ops, spec.predictions]))
  spec = spec._replace(
      scaffold=replicated.scaffold_initializing_copies(spec.scaffold))
  hook = replicated.sync_hook()
  if hook is None:
    return spec
  field = {ModeKeys.TRAIN: 'training_hooks', ModeKeys.EVAL: 'evaluation_hooks',
           ModeKeys.PREDICT: 'prediction_hooks'}[mode]
  return spec._replace(**{field: tuple(getattr(spec, field)) + (hook,)})


def _ids(items):
  return set(id(item) for item in items)


def _raise_if_unshared(error, tower, per_tower_reason):
  """Says why a tower after the first asked for a variable tower 0 did not
  make (TF's "Variable ... does not exist" under the towers' reuse)."""
  message = str(error)
  if tower.tower_id and 'does not exist' in message and 'reuse' in message:
    raise errors.InvalidArgumentError(
        'Tower {} of {} asked for a variable tower 0 did not create ({}). '
        'Towers are built here by calling model_fn once per tower, because '
        '{}; tower {}\'s call reuses tower 0\'s variables by name, and a '
        'Keras layer object created inside model_fn (e.g. '
        'tf.keras.experimental.SequenceFeatures) names its variables anew on '
        'every call. Remove the reason so that towers are copied from tower '
        '0, or create the variables with tf.compat.v1.get_variable.'.format(
            tower.tower_id, tower.num_towers, message.split('\n')[0],
            per_tower_reason, tower.tower_id)) from error


@contextlib.contextmanager
def _tower_scopes(tower_id):
  """Variable and name scopes of one tower (tower 0: the caller's own).

  Towers after the first reuse tower 0's variables and build under
  `tower_<i>`; the gradients are applied under the scopes of tower 0's
  optimizer call (`Replication.first_tower_call_scopes`). Yields the
  tower's name scope ('' or ending in '/').
  """
  with tf1.variable_scope(tf1.get_variable_scope(),
                          reuse=True if tower_id else None,
                          auxiliary_name_scope=False):
    if tower_id:
      with tf1.name_scope('tower_{}'.format(tower_id)) as scope:
        yield scope
    else:
      scope = tf1.get_default_graph().get_name_scope()
      yield scope + '/' if scope else ''


def _in_creation_order(graph, variables):
  """`variables` in the order they were made.

  The towers' metric variables are paired by position. `EstimatorSpec`
  adds Keras metrics' variables (TF 2 heads) to `METRIC_VARIABLES` in the
  order of a Python set, which differs between towers; the order the calls
  made them in does not.
  """
  if len(variables) < 2:
    return variables
  position = {op: i for i, op in enumerate(graph.get_operations())}
  return sorted(variables, key=lambda v: position[v.op])


def call_model_fn(model_fn, features, labels, mode, params, config):
  """Calls `model_fn` with the arguments its signature asks for.

  Raises:
    InvalidArgumentError: if `model_fn` takes no `features`, no `labels`
      where there are labels, or no `params` where the Estimator was given
      some (the wrapper takes `params`, so the Estimator's own check of the
      user's signature cannot see it).
    InvalidTypeError: if it returns no `EstimatorSpec`.
  """
  accepted = checks.fn_args(model_fn)
  if 'features' not in accepted:
    raise errors.InvalidArgumentError(
        'model_fn must take a `features` argument; its arguments are {}.'
        .format(list(accepted)))
  if params and 'params' not in accepted:
    # The Estimator's words (it passes `{}` where it was given none).
    raise errors.InvalidArgumentError(
        'model_fn ({}) does not include params argument, but params ({}) is '
        'passed to Estimator.'.format(model_fn, params))
  kwargs = {'features': features}
  if 'labels' in accepted:
    kwargs['labels'] = labels
  elif labels is not None:
    raise errors.InvalidArgumentError(
        'The input_fn provides labels but model_fn takes no `labels` '
        'argument; add one to model_fn or return no labels.')
  if 'mode' in accepted:
    kwargs['mode'] = mode
  if 'params' in accepted:
    kwargs['params'] = copy.deepcopy(params)
  if 'config' in accepted:
    kwargs['config'] = copy.deepcopy(config)
  spec = model_fn(**kwargs)
  if not isinstance(spec, EstimatorSpec):
    raise errors.InvalidTypeError(
        'model_fn must return a tf.estimator.EstimatorSpec, got {!r} of type '
        '{}.'.format(spec, type(spec).__name__))
  return spec


def check_tower(spec, tower, replication, trainable_before, per_tower_reason):
  """Raises on what would make the replicated model differ from the original.

  Args:
    spec: the spec `model_fn` returned for `tower`.
    tower: the `TowerContext` built.
    replication: the `tower_context.Replication`.
    trainable_before: ids of the trainable variables before the call.
    per_tower_reason: why this tower is built by its own `model_fn` call
      (None for tower 0).

  Raises:
    InvalidArgumentError: for a `train_op` made without `TowerOptimizer`, or
      a tower after the first that created trainable variables.
  """
  if (spec.train_op is not None and
      replication.num_optimizer_calls(tower.tower_id) == 0):
    raise errors.InvalidArgumentError(
        'model_fn returned a train_op but made no TowerOptimizer call in tower '
        '{} of {}. Please wrap optimizers with replicate.TowerOptimizer in '
        'order to use replicate_model_fn with multiple `devices`. (A call '
        'inside a TF 2 tf.cond or tf.function, e.g. by an optimizer that '
        'wraps TowerOptimizer, does not count: wrap the other way, '
        'TowerOptimizer(other_optimizer).)'.format(
            tower.tower_id, tower.num_towers))
  if not tower.tower_id:
    return
  unshared = [v.op.name for v in tf1.trainable_variables()
              if id(v) not in trainable_before]
  if unshared:
    raise errors.InvalidArgumentError(
        'Tower {} created trainable variables {} instead of reusing tower '
        "0's, so the towers would train different weights. Towers are built "
        'here by calling model_fn once per tower, because {}; such calls '
        'share only variables made with tf.compat.v1.get_variable or '
        'tf.compat.v1.layers (a Keras layer object or tf.Variable created '
        'inside model_fn makes new ones on every call). Remove the reason '
        'so that towers are copied from tower 0, or create the variables '
        'with tf.compat.v1.get_variable.'.format(
            tower.tower_id, unshared, per_tower_reason))

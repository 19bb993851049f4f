"""Gradient accumulation: apply once every `steps` micro-steps.

Each run of the training op adds the step's (already reduced) gradients to
an accumulator per variable, colocated with the variable. Every `steps`-th
run applies `scale` times the accumulated sums with the wrapped optimizer,
advances the global step once, and zeroes the accumulators. With `scale =
1 / steps` and a loss that is a mean over the batch, `steps` micro-steps on
batches of `b` rows update the variables as one step on `steps * b` rows.

The accumulators and the micro-step counter are local variables
(`LOCAL_VARIABLES`): they are initialized with the other local variables and
never written to checkpoints, so checkpoints keep the names of the
unaccumulated model, and a restore starts a fresh accumulation.
"""
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1


def apply_accumulated(apply_fn, grads_and_vars, steps, scale, global_step,
                      name=None):
  """Accumulates `grads_and_vars`; every `steps`-th run applies the sums.

  Args:
    apply_fn: `apply_fn(grads_and_vars, global_step, name)` builds the update
      (e.g. a wrapped optimizer's `apply_gradients`).
    grads_and_vars: `(gradient, variable)` pairs for one run; gradients may be
      `IndexedSlices` or None (skipped).
    steps: the number of runs whose gradients make one update, >= 2.
    scale: the factor applied to the accumulated sums (`1 / steps` averages).
    global_step: optional variable, advanced once per update.
    name: optional name of the returned op.

  Returns:
    An op that accumulates this run's gradients and, every `steps` runs,
    applies and resets.

  Raises:
    InvalidArgumentError: if no gradient is given, or for reference
      variables under TF 2 control flow (whose `cond` takes resource
      variables only).
  """
  pairs = [(g, v) for g, v in grads_and_vars if g is not None]
  if not pairs:
    raise errors.InvalidArgumentError(
        'No gradients were given for any of the variables {}; check that the '
        'loss depends on them.'.format([v.name for _, v in grads_and_vars]))
  _check_condition_takes(pairs)
  with tf1.name_scope('gradient_accumulation'):
    # Outside the control dependencies the update is built under (a model's
    # `control_dependencies(update_ops)`, the towers' gradients): else the
    # local variables' initializer would run the model's step, input and
    # all, before the input is initialized.
    with tf1.control_dependencies(None):
      accumulators = [_accumulator(v, g) for g, v in pairs]
      with tf1.colocate_with(pairs[0][1]):
        counter = tf1.Variable(
            0, dtype=tf.int64, trainable=False, name='micro_step',
            collections=[tf1.GraphKeys.LOCAL_VARIABLES], use_resource=True)
    adds = [op for accumulator, (g, _) in zip(accumulators, pairs)
            for op in accumulator.add(g)]
    with tf.control_dependencies(adds):
      count = counter.assign_add(1)

  graph = tf1.get_default_graph()
  outer_scope = graph.get_name_scope()

  def update():
    sums = [(accumulator.sum(scale), v)
            for accumulator, (_, v) in zip(accumulators, pairs)]
    # The optimizer's own variables (e.g. Adam's `beta1_power`) are named in
    # the caller's scope, as without accumulation, so that checkpoints keep
    # their names.
    with graph.name_scope(outer_scope + '/' if outer_scope else ''):
      apply_op = apply_fn(sums, global_step, None)
    with tf.control_dependencies([apply_op]):
      resets = [op for accumulator in accumulators
                for op in accumulator.reset()]
      resets.append(counter.assign(0, read_value=False))
    return tf.group(*resets)

  with tf1.name_scope('gradient_accumulation'):
    return tf.group(
        tf1.cond(count >= steps, update, tf.no_op), name=name)


def _check_condition_takes(pairs):
  """Raises for reference variables where `tf.cond` is TF 2's (an `If`
  function, which cannot take them: TF's own error names a type mismatch
  of the optimizer's update op)."""
  if not tf1.control_flow_v2_enabled():
    return
  refs = [v.op.name for _, v in pairs if v.dtype.base_dtype != v.dtype]
  if refs:
    raise errors.InvalidArgumentError(
        'accumulation_steps > 1 applies the accumulated gradients inside a '
        'tf.cond, and TF 2 control flow cannot update reference variables '
        'there: {} {} made with use_resource=False. Make them resource '
        'variables (tf.compat.v1.variable_scope(..., use_resource=True), the '
        'TF 2 default), or call tf.compat.v1.disable_control_flow_v2() '
        'before building the graph.'.format(
            refs, 'is' if len(refs) == 1 else 'are'))


def _accumulator(variable, gradient):
  """The accumulator of `variable`'s gradients, of the gradient's kind."""
  shape = variable.shape
  if not shape.is_fully_defined():
    raise errors.InvalidArgumentError(
        'Gradient accumulation needs variables of a fully known shape; {} '
        'has shape {}.'.format(variable.name, shape))
  name = variable.op.name.replace('/', '_')
  with tf1.colocate_with(variable):
    total = _local_zeros(shape, variable.dtype.base_dtype,
                         name + '_accumulator')
    if not isinstance(gradient, tf.IndexedSlices):
      return _DenseSum(total)
    # The rows the runs' gradients named: only those are applied, as by
    # one run on all the runs' rows (a sparse update leaves the others, and
    # their slots, untouched; FTRL or RMSProp given zero gradients would
    # change them).
    named = _local_zeros(shape[:1], variable.dtype.base_dtype,
                         name + '_accumulated_rows')
  return _SparseSum(total, named, gradient.indices.dtype,
                    gradient.dense_shape)


def _local_zeros(shape, dtype, name):
  """A zero-initialized local resource variable."""
  return tf1.Variable(
      tf.zeros(shape, dtype), trainable=False, name=name,
      collections=[tf1.GraphKeys.LOCAL_VARIABLES], use_resource=True)


def _scaled(value, scale):
  if scale == 1:
    return value
  return value * tf.cast(scale, value.dtype)


class _DenseSum(object):
  """The sum of dense gradients."""

  def __init__(self, total):
    self._total = total

  def add(self, gradient):
    return [self._total.assign_add(gradient, read_value=False)]

  def sum(self, scale):
    return _scaled(self._total.read_value(), scale)

  def reset(self):
    return [self._total.assign(tf.zeros_like(self._total), read_value=False)]


class _SparseSum(object):
  """The sum of `IndexedSlices` gradients and the rows they named."""

  def __init__(self, total, named, indices_dtype, dense_shape):
    self._total = total
    self._named = named  # 1 for a row some run's gradient named, else 0
    self._indices_dtype = indices_dtype
    self._dense_shape = dense_shape

  def add(self, gradient):
    # Rows repeated in `indices` are added, as applying them would.
    return [self._total.scatter_add(gradient),
            self._named.scatter_update(tf.IndexedSlices(
                tf.ones_like(gradient.indices, self._named.dtype),
                gradient.indices))]

  def sum(self, scale):
    rows = tf.reshape(tf.where(self._named.read_value() > 0), [-1])
    values = tf.gather(self._total.read_value(), rows)
    return tf.IndexedSlices(_scaled(values, scale),
                            tf.cast(rows, self._indices_dtype),
                            self._dense_shape)

  def reset(self):
    return [variable.assign(tf.zeros_like(variable), read_value=False)
            for variable in (self._total, self._named)]

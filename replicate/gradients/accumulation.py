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
      `IndexedSlices` (accumulated densely) or None (skipped).
    steps: the number of runs whose gradients make one update, >= 2.
    scale: the factor applied to the accumulated sums (`1 / steps` averages).
    global_step: optional variable, advanced once per update.
    name: optional name of the returned op.

  Returns:
    An op that accumulates this run's gradients and, every `steps` runs,
    applies and resets.

  Raises:
    InvalidArgumentError: if no gradient is given.
  """
  pairs = [(g, v) for g, v in grads_and_vars if g is not None]
  if not pairs:
    raise errors.InvalidArgumentError(
        'No gradients were given for any of the variables {}; check that the '
        'loss depends on them.'.format([v.name for _, v in grads_and_vars]))
  with tf1.name_scope('gradient_accumulation'):
    accumulators = [_accumulator(v) for _, v in pairs]
    with tf1.colocate_with(pairs[0][1]):
      counter = tf1.Variable(
          0, dtype=tf.int64, trainable=False, name='micro_step',
          collections=[tf1.GraphKeys.LOCAL_VARIABLES], use_resource=True)
    adds = [_add(accumulator, g) for accumulator, (g, _) in
            zip(accumulators, pairs)]
    with tf.control_dependencies(adds):
      count = counter.assign_add(1)

  graph = tf1.get_default_graph()
  outer_scope = graph.get_name_scope()

  def update():
    sums = [(_scaled(accumulator, scale), v)
            for accumulator, (_, v) in zip(accumulators, pairs)]
    # The optimizer's own variables (e.g. Adam's `beta1_power`) are named in
    # the caller's scope, as without accumulation, so that checkpoints keep
    # their names.
    with graph.name_scope(outer_scope + '/' if outer_scope else ''):
      apply_op = apply_fn(sums, global_step, None)
    with tf.control_dependencies([apply_op]):
      resets = [accumulator.assign(tf.zeros_like(accumulator),
                                   read_value=False)
                for accumulator in accumulators]
      resets.append(counter.assign(0, read_value=False))
    return tf.group(*resets)

  with tf1.name_scope('gradient_accumulation'):
    return tf.group(
        tf1.cond(count >= steps, update, tf.no_op), name=name)


def _accumulator(variable):
  """A zero-initialized local variable of `variable`'s shape, next to it."""
  shape = variable.shape
  if not shape.is_fully_defined():
    raise errors.InvalidArgumentError(
        'Gradient accumulation needs variables of a fully known shape; {} '
        'has shape {}.'.format(variable.name, shape))
  with tf1.colocate_with(variable):
    return tf1.Variable(
        tf.zeros(shape, variable.dtype.base_dtype), trainable=False,
        name=variable.op.name.replace('/', '_') + '_accumulator',
        collections=[tf1.GraphKeys.LOCAL_VARIABLES], use_resource=True)


def _add(accumulator, gradient):
  if isinstance(gradient, tf.IndexedSlices):
    # Rows repeated in `indices` are added, as applying them would.
    return accumulator.scatter_add(gradient)
  return accumulator.assign_add(gradient, read_value=False)


def _scaled(accumulator, scale):
  value = accumulator.read_value()
  if scale == 1:
    return value
  return value * tf.cast(scale, value.dtype)

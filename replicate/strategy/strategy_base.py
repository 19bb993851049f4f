"""`Strategy`: the user-facing half of a distribution strategy.

Device-level methods are on `strategy.extended` (`strategy_extended.py`);
`Strategy` checks its arguments and delegates.
"""
import copy

import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import reduce_util
from replicate.core.checks import check_int
from replicate.core.reduce_util import ReduceOp
from replicate.strategy import input_lib
from replicate.strategy.context_rules import (
  require_cross_replica_or_default_context,
)
from replicate.strategy.input_lib import InputReplicationMode


class Strategy(object):
  """A way to run a computation on several devices (or one).

  The user-facing half; device-level methods are on `strategy.extended`.
  """

  def __init__(self, extended):
    """Wraps `extended`, the `StrategyExtended` doing the work."""
    self._extended = extended

  @property
  def extended(self):
    """The `StrategyExtended` with the device-level methods."""
    return self._extended

  def scope(self):
    """A context manager making this the current strategy (cross-replica).

    Variables created in the scope are created the strategy's way (mirrored,
    for `MirroredStrategy`). Re-entering the scope of the same strategy is
    allowed.

    Returns:
      A context manager; entering it gives this strategy.

    Raises:
      ContextError: (on entering) inside a scope or replica of another
        strategy, or inside a replica of this strategy.
    """
    return self._extended._scope(self)  # pylint: disable=protected-access

  @property
  def num_replicas_in_sync(self):
    """How many replicas run in sync."""
    return self._extended._num_replicas_in_sync  # pylint: disable=protected-access

  def make_dataset_iterator(self, dataset):
    """An iterator giving each replica its slice of each global batch.

    Args:
      dataset: a `tf.data.Dataset` of global batches. A batch of `b` rows
        gives replica i the i-th slice: the first `b % N` replicas get
        `b // N + 1` rows, the others `b // N` (none when `b < N`).

    Returns:
      An iterator with `initialize()` (a list of ops to run first) and
      `get_next()` (per-replica values).

    Raises:
      InvalidTypeError: if `dataset` is not a dataset.
    """
    return self._extended._make_dataset_iterator(dataset)  # pylint: disable=protected-access

  def experimental_distribute_dataset(self, dataset):
    """`dataset` for the replicas: each global batch split across them.

    As TF 1.15's in graph mode: iterate the result through
    `make_initializable_iterator()` (run its `initialize()` or `initializer`
    first) or `make_one_shot_iterator()`; `get_next()` gives per-replica
    values, e.g. for `experimental_run_v2(fn, args=(batch,))`. The batches
    are split as `make_dataset_iterator` splits them.

    Args:
      dataset: a `tf.data.Dataset` of global batches (a batch of `b` rows
        gives the first `b % num_replicas_in_sync` replicas one row more).

    Returns:
      A `DistributedDataset`.

    Raises:
      InvalidTypeError: if `dataset` is not a dataset.
    """
    return input_lib.DistributedDataset(
        dataset, self._extended._make_dataset_iterator)  # pylint: disable=protected-access

  def experimental_distribute_datasets_from_function(self, dataset_fn):
    """The dataset `dataset_fn(InputContext)` returns, for the replicas.

    As TF 1.15's: `dataset_fn` is called once now (one input pipeline) and
    returns a dataset of per-replica batches (use
    `InputContext.get_per_replica_batch_size`); each step the replicas take
    successive elements. Iterate it as `experimental_distribute_dataset`'s.

    Args:
      dataset_fn: a callable taking an `InputContext`, returning a dataset.

    Returns:
      A `DistributedDatasetsFromFunction`.

    Raises:
      InvalidTypeError: if `dataset_fn` is not callable or does not return a
        dataset.
    """
    if not callable(dataset_fn):
      raise errors.InvalidTypeError(
          'dataset_fn must be a callable taking an InputContext, got {!r}.'
          .format(dataset_fn))
    dataset = dataset_fn(input_lib.InputContext(
        num_input_pipelines=1, input_pipeline_id=0,
        num_replicas_in_sync=self.num_replicas_in_sync))
    input_lib.check_dataset(dataset, 'The value returned by dataset_fn')

    def make_iterator(dataset, one_shot):
      return self._extended._make_input_fn_iterator(  # pylint: disable=protected-access
          lambda _: dataset, one_shot=one_shot)
    return input_lib.DistributedDatasetsFromFunction(dataset, make_iterator)

  def make_input_fn_iterator(self, input_fn,
                             replication_mode=InputReplicationMode.PER_WORKER):
    """An iterator over datasets made by `input_fn(InputContext)`.

    `input_fn` returns a dataset of per-replica batches (use
    `InputContext.get_per_replica_batch_size`); replicas take successive
    elements.

    Args:
      input_fn: a callable taking an `InputContext`, returning a dataset.
      replication_mode: `InputReplicationMode.PER_WORKER`.

    Returns:
      An iterator as in `make_dataset_iterator`.

    Raises:
      InvalidArgumentError: for another replication mode.
      InvalidTypeError: if `input_fn` is not callable or does not return a
        dataset.
    """
    if replication_mode is not InputReplicationMode.PER_WORKER:
      raise errors.InvalidArgumentError(
          'replication_mode must be InputReplicationMode.PER_WORKER (the only '
          'mode supported), got {!r}.'.format(replication_mode))
    if not callable(input_fn):
      raise errors.InvalidTypeError(
          'input_fn must be a callable taking an InputContext, got {!r}.'
          .format(input_fn))
    return self._extended._make_input_fn_iterator(input_fn)  # pylint: disable=protected-access

  def experimental_make_numpy_iterator(self, numpy_input, batch_size,
                                       num_epochs=1, shuffle=1024,
                                       session=None):
    """An iterator over global batches of in-memory NumPy data.

    Args:
      numpy_input: a nest of NumPy arrays with one first dimension.
      batch_size: the global batch size. As in TF 1.15's MirroredStrategy
        the last batch may be partial; its rows are split among the
        replicas like any batch's (some may get fewer, or none).
      num_epochs: how many passes over the data (None: forever).
      shuffle: shuffle buffer size; None or 0 for no shuffling.
      session: optional `tf.Session`. When given, the arrays are loaded into
        the graph through variables initialized in that session (instead of
        being embedded as constants).

    Returns:
      An iterator as in `make_dataset_iterator`.

    Raises:
      InvalidArgumentError: if `batch_size` is below 1, or the arrays have
        different lengths.
      InvalidTypeError: if `batch_size` is not an integer.
    """
    check_int('batch_size', batch_size, 1)
    dataset = input_lib.numpy_dataset(numpy_input, session)
    if shuffle:
      dataset = dataset.shuffle(shuffle)
    dataset = dataset.repeat(num_epochs)
    dataset = dataset.batch(batch_size)
    return self.make_dataset_iterator(dataset)

  def experimental_run(self, fn, input_iterator=None):
    """Runs `fn(inputs)` on each replica with its share of the next batch.

    Args:
      fn: the function to replicate.
      input_iterator: an iterator from `make_dataset_iterator` or
        `make_input_fn_iterator`; None calls `fn()` without inputs.

    Returns:
      What `fn` returned, with per-replica leaves (`PerReplica`).

    Raises:
      ContextError: as `call_for_each_replica`.
    """
    with self.scope():
      args = (input_iterator.get_next(),) if input_iterator is not None else ()
      return self._extended.call_for_each_replica(fn, args=args)

  def experimental_run_v2(self, fn, args=(), kwargs=None):
    """Runs `fn(*args, **kwargs)` on each replica.

    Args:
      fn: the function to replicate.
      args: positional arguments; `PerReplica` leaves are split by replica.
      kwargs: keyword arguments, likewise.

    Returns:
      What `fn` returned, with per-replica leaves.

    Raises:
      ContextError: as `call_for_each_replica`.
    """
    with self.scope():
      return self._extended.call_for_each_replica(fn, args=args, kwargs=kwargs)

  def run(self, fn, args=(), kwargs=None):
    """Runs `fn(*args, **kwargs)` on each replica (TF 2.x's name).

    The same as `experimental_run_v2`.

    Returns:
      What `fn` returned, with per-replica leaves.

    Raises:
      ContextError: as `call_for_each_replica`.
    """
    return self.experimental_run_v2(fn, args=args, kwargs=kwargs)

  def colocate_vars_with(self, colocate_with_variable):
    """A scope placing new variables like `colocate_with_variable`.

    Args:
      colocate_with_variable: a variable created in this strategy's scope.

    Returns:
      A context manager.

    Raises:
      ContextError: inside a replica.
    """
    return self._extended.colocate_vars_with(colocate_with_variable)

  def experimental_make_numpy_dataset(self, numpy_input, session=None):
    """A `tf.data.Dataset` of the rows of in-memory NumPy arrays.

    Batch it and hand it to `make_dataset_iterator` (or use
    `experimental_make_numpy_iterator`, which does both).

    Args:
      numpy_input: a nest of NumPy arrays with one first dimension.
      session: optional `tf.compat.v1.Session`: the arrays are then loaded
        through variables initialized in it, not embedded as constants.

    Returns:
      An unbatched `tf.data.Dataset`.

    Raises:
      InvalidArgumentError: if the arrays have different lengths.
    """
    return self._extended.experimental_make_numpy_dataset(numpy_input,
                                                          session=session)

  def reduce(self, reduce_op, value, axis=None):
    """Reduces a per-replica `value` to one tensor (on the host).

    Args:
      reduce_op: `ReduceOp.SUM` / `MEAN`, TF's `tf.distribute.ReduceOp`, a
        `tf.VariableAggregation` SUM / MEAN, or (as in TF) the string 'sum' /
        'mean' in any case.
      value: a per-replica value (e.g. from `experimental_run`), or a single
        tensor (MEAN gives it back; SUM needs one replica).
      axis: None to reduce across replicas only; an int to reduce each
        replica's value along that dimension too, as TF does: SUM adds
        everything, MEAN divides that sum by the total length of the
        dimension over all replicas (replicas may have different lengths).

    Returns:
      A tensor.

    Raises:
      ContextError: inside a replica.
      InvalidArgumentError: for another reduce op or string, or SUM of a
        plain value over several replicas.
      InvalidTypeError: if `axis` is neither None nor an int.
    """
    require_cross_replica_or_default_context(self._extended, 'reduce')
    reduce_op = reduce_util.as_strategy_reduce_op(reduce_op)
    extended = self._extended
    if axis is None:
      return extended._reduce(reduce_op, value)  # pylint: disable=protected-access
    if not isinstance(axis, int) or isinstance(axis, bool):
      raise errors.InvalidTypeError(
          'reduce takes an int axis (or None for no reduction within '
          'replicas), got {!r} of type {}.'.format(axis, type(axis).__name__))
    if reduce_op == ReduceOp.SUM:
      sums = self.experimental_run_v2(
          lambda v: tf.reduce_sum(v, axis=axis), args=(value,))
      return extended._reduce(ReduceOp.SUM, sums)  # pylint: disable=protected-access

    def sum_and_length(v):
      v = tf.convert_to_tensor(v)
      return (tf.reduce_sum(v, axis=axis),
              tf.cast(tf.shape(v)[axis], v.dtype))
    sums, lengths = self.experimental_run_v2(sum_and_length, args=(value,))
    return (extended._reduce(ReduceOp.SUM, sums) /  # pylint: disable=protected-access
            extended._reduce(ReduceOp.SUM, lengths))  # pylint: disable=protected-access

  def unwrap(self, value):
    """The per-replica components of `value`, as a tuple.

    Args:
      value: a `PerReplica` / `Mirrored` value (or mirrored variable), or a
        plain value.

    Returns:
      The components in replica order; `(value,)` for a plain value.
    """
    return self._extended._local_results(value)  # pylint: disable=protected-access

  def experimental_local_results(self, value):
    """Same as `unwrap`."""
    return self.unwrap(value)

  def group(self, value, name=None):
    """One op running every component of every leaf of `value`.

    Args:
      value: a nest of per-replica values, tensors or ops.
      name: the name of the grouping op.

    Returns:
      A `tf.Operation`.
    """
    components = []
    for leaf in tf.nest.flatten(value):
      components.extend(c for c in self.unwrap(leaf) if c is not None)
    return tf.group(*components, name=name)

  def configure(self, session_config=None, cluster_spec=None, task_type=None,
                task_id=None):
    """Configures the strategy for a session config and cluster.

    Args:
      session_config: a `ConfigProto` the sessions will use.
      cluster_spec: the cluster (multi-worker strategies only).
      task_type: this task's job name (multi-worker strategies only).
      task_id: this task's index (multi-worker strategies only).

    Raises:
      InvalidArgumentError: for cluster arguments given to a local strategy.
    """
    self._extended._configure(session_config, cluster_spec, task_type,  # pylint: disable=protected-access
                              task_id)

  def update_config_proto(self, config_proto):
    """A copy of `config_proto` with what this strategy needs set.

    Args:
      config_proto: a `tf.compat.v1.ConfigProto`.

    Returns:
      A new `ConfigProto`; the argument is not modified.

    Raises:
      InvalidTypeError: if `config_proto` is not a `ConfigProto`.
    """
    if not isinstance(config_proto, tf1.ConfigProto):
      raise errors.InvalidTypeError(
          'update_config_proto needs a tf.compat.v1.ConfigProto, got {!r}.'
          .format(config_proto))
    return self._extended._update_config_proto(config_proto)  # pylint: disable=protected-access

  def __copy__(self):
    raise errors.ContextError(
        'A {} cannot be shallow-copied: the copy would share its extended '
        'state with the original. Use copy.deepcopy(strategy).'.format(
            type(self).__name__))

  def __deepcopy__(self, memo):
    result = type(self).__new__(type(self))
    memo[id(self)] = result
    for key, value in self.__dict__.items():
      setattr(result, key, copy.deepcopy(value, memo))
    return result





def get_loss_reduction():
  """The `ReduceOp` that combines replicas' gradients: always `SUM` here.

  TF returns `SUM` except under an Estimator with a `tf.distribute`
  strategy, where it reads the last `tf.compat.v1.losses` reduction to decide
  whether optimizers scale the loss. replicate's strategies never scale the
  loss in the optimizer: each replica scales its loss to the global batch and
  gradients are summed (see `MirroredStrategy`), so the answer is `SUM`.

  Returns:
    `ReduceOp.SUM`.
  """
  return ReduceOp.SUM

"""Input iterators for strategies, and the multi-step loop.

`DatasetIterator` splits each global batch of a dataset along dimension 0,
one slice per replica device, in device order, as evenly as it can (a final
partial batch too: some replicas get fewer rows, or none; `input_split`).
`InputFunctionIterator` calls `input_fn(InputContext)` once (one worker) and
gives replicas successive elements of the dataset it returns, in replica
order. `DistributedDataset` (`Strategy.experimental_distribute_dataset`)
makes `DatasetIterator`s, initializable or one-shot.
"""
import enum

import numpy as np
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core.checks import check_int
from replicate.cross_tower import values as values_lib
from replicate.strategy import distribute_context
from replicate.strategy import input_split


class InputReplicationMode(enum.Enum):
  """How `make_input_fn_iterator` replicates the input pipeline.

  * `PER_WORKER`: `input_fn` is called once per worker; each of that worker's
    replicas takes successive elements of the dataset it returns.
  """
  PER_WORKER = 'PER_WORKER'


class InputContext(object):
  """What an `input_fn` needs to know to build its share of the input.

  Passed to the `input_fn` of `Strategy.make_input_fn_iterator`.
  """

  def __init__(self, num_input_pipelines=1, input_pipeline_id=0,
               num_replicas_in_sync=1):
    """Describes one input pipeline among several.

    Args:
      num_input_pipelines: how many pipelines there are (one per worker).
      input_pipeline_id: which one this is, in `[0, num_input_pipelines)`.
      num_replicas_in_sync: how many replicas train in sync (over all
        pipelines).

    Raises:
      InvalidTypeError: if an argument is not an integer.
      InvalidArgumentError: if a count is below 1 or the id is out of range.
    """
    check_int('num_input_pipelines', num_input_pipelines, 1)
    check_int('input_pipeline_id', input_pipeline_id, 0)
    check_int('num_replicas_in_sync', num_replicas_in_sync, 1)
    if input_pipeline_id >= num_input_pipelines:
      raise errors.InvalidArgumentError(
          'input_pipeline_id {} is out of range for {} input pipelines; it '
          'must be in [0, {}).'.format(input_pipeline_id, num_input_pipelines,
                                       num_input_pipelines))
    self._num_input_pipelines = num_input_pipelines
    self._input_pipeline_id = input_pipeline_id
    self._num_replicas_in_sync = num_replicas_in_sync

  @property
  def num_input_pipelines(self):
    """How many input pipelines there are."""
    return self._num_input_pipelines

  @property
  def input_pipeline_id(self):
    """This pipeline's id, in `[0, num_input_pipelines)`."""
    return self._input_pipeline_id

  @property
  def num_replicas_in_sync(self):
    """How many replicas train in sync."""
    return self._num_replicas_in_sync

  def get_per_replica_batch_size(self, global_batch_size):
    """The batch size of each replica for a global batch of that size.

    Args:
      global_batch_size: the batch size summed over all replicas.

    Returns:
      `global_batch_size // num_replicas_in_sync`.

    Raises:
      InvalidArgumentError (a ValueError): if the global batch size is not
        divisible by the number of replicas.
    """
    if global_batch_size % self._num_replicas_in_sync:
      raise errors.InvalidArgumentError(
          'The global batch size ({}) is not divisible by the number of '
          'replicas in sync ({}); use a global batch size that is a multiple '
          'of {}.'.format(global_batch_size, self._num_replicas_in_sync,
                          self._num_replicas_in_sync))
    return global_batch_size // self._num_replicas_in_sync

  def __repr__(self):
    return ('InputContext(num_input_pipelines={}, input_pipeline_id={}, '
            'num_replicas_in_sync={})'.format(
                self._num_input_pipelines, self._input_pipeline_id,
                self._num_replicas_in_sync))


def check_dataset(dataset, what):
  if not isinstance(dataset, tf.data.Dataset):
    raise errors.InvalidTypeError(
        '{} must be a tf.data.Dataset, got {!r} of type {}.'.format(
            what, dataset, type(dataset).__name__))


class _IteratorBase(object):
  """An iterator over a dataset, placed on the host.

  Initializable unless `one_shot` (a one-shot iterator needs no
  initialization and cannot be restarted).
  """

  def __init__(self, dataset, devices, one_shot=False):
    self._devices = tuple(devices) if devices is not None else None
    self._one_shot = one_shot
    if one_shot:
      self._iterator = tf1.data.make_one_shot_iterator(dataset)
    else:
      self._iterator = tf1.data.make_initializable_iterator(dataset)

  def initialize(self):
    """The ops to run (once, and again to restart) before `get_next`.

    Returns:
      A list of ops (empty for a one-shot iterator).
    """
    if self._one_shot:
      return []
    return [self._iterator.initializer]

  @property
  def initializer(self):
    """`initialize()` as one op."""
    return tf.group(*self.initialize())

  @property
  def output_types(self):
    """The dtypes of one element of the underlying dataset."""
    return tf1.data.get_output_types(self._iterator)

  @property
  def output_shapes(self):
    """The shapes of one element of the underlying dataset."""
    return tf1.data.get_output_shapes(self._iterator)


class DatasetIterator(_IteratorBase):
  """Splits each global batch of a dataset into one slice per replica."""

  def __init__(self, dataset, devices, one_shot=False):
    """Builds the iterator.

    Args:
      dataset: a `tf.data.Dataset` of global batches.
      devices: the replica devices, or None for one replica (no splitting,
        plain values).
      one_shot: True for a one-shot iterator (no initialization).

    Raises:
      InvalidTypeError: if `dataset` is not a dataset.
      InvalidArgumentError: (TF's ValueError) if a component of its elements
        has rank 0, so that there is no batch to split.
    """
    check_dataset(dataset, 'dataset')
    if devices is not None and len(devices) > 1:
      for shape in tf.nest.flatten(tf1.data.get_output_shapes(dataset)):
        if shape.rank == 0:
          raise errors.InvalidArgumentError(
              'Input shape should have at least one dimension. Perhaps your '
              'input dataset is not batched? '  # TF's phrase
              'The dataset gives scalars, which cannot be split across {} '
              'replicas: batch it (dataset.batch(global_batch_size)).'.format(
                  len(devices)))
    super(DatasetIterator, self).__init__(dataset, devices, one_shot)

  def get_next(self, name=None):
    """The next global batch, split along dimension 0 in replica order.

    A batch of `b` rows on `N` replicas: the first `b % N` replicas get
    `b // N + 1` rows, the others `b // N` (none when `b < N`); every row
    goes to one replica. So a dataset's final partial batch is split too.

    Args:
      name: an optional name for the `get_next` op.

    Returns:
      The element's structure with `PerReplica` leaves (replica i gets the
      i-th slice of the global batch); plain tensors with one replica.

    Raises:
      InvalidArgumentError: if an input is a scalar, or two inputs' static
        batch sizes differ (sizes known only at run time are checked by an
        assertion that fails the step with the same explanation).
    """
    element = self._iterator.get_next(name=name)
    if self._devices is None:
      return element
    flat = tf.nest.flatten(element)
    leaves = []
    for pieces in input_split.split_batch(flat, len(self._devices)):
      index = {}
      for device, piece in zip(self._devices, pieces):
        with tf.device(device):
          index[device] = input_split.identity(piece)
      # One device: the placed tensor itself, as from an input_fn's
      # iterator and TF's (regroup keeps a lone value as it is).
      leaves.append(values_lib.regroup(index, values_lib.PerReplica))
    return tf.nest.pack_sequence_as(element, leaves)


class DistributedDataset(object):
  """A dataset whose global batches are split across the replicas.

  What `Strategy.experimental_distribute_dataset` returns. In graph mode (the
  only mode here, as in TF 1.15) it is iterated through an iterator made by
  `make_initializable_iterator()` or `make_one_shot_iterator()`, whose
  `get_next()` gives per-replica values.
  """

  def __init__(self, dataset, make_iterator):
    """Wraps `dataset`.

    Args:
      dataset: a `tf.data.Dataset` of global batches.
      make_iterator: `(dataset, one_shot) -> DatasetIterator` of the
        strategy.

    Raises:
      InvalidTypeError: if `dataset` is not a dataset.
    """
    check_dataset(dataset, 'dataset')
    self._dataset = dataset
    self._make_iterator = make_iterator

  def make_initializable_iterator(self):
    """An iterator to initialize (`initialize()` or `initializer`) first."""
    return self._make_iterator(self._dataset, one_shot=False)

  def make_one_shot_iterator(self):
    """An iterator that needs no initialization and cannot be restarted."""
    return self._make_iterator(self._dataset, one_shot=True)

  # What tf.compat.v1.data.make_initializable_iterator / make_one_shot_iterator
  # call, as on TF's distributed datasets.
  def _make_initializable_iterator(self, shared_name=None):
    del shared_name  # The iterator is the strategy's.
    return self.make_initializable_iterator()

  def _make_one_shot_iterator(self):
    return self.make_one_shot_iterator()

  def __iter__(self):
    raise errors.ContextError(
        'A distributed dataset is iterated in graph mode through an iterator: '
        'use make_initializable_iterator() (run its initializer first) or '
        'make_one_shot_iterator(), then get_next().')


class DistributedDatasetsFromFunction(DistributedDataset):
  """What `Strategy.experimental_distribute_datasets_from_function` returns:
  a dataset of per-replica batches, of which the replicas take successive
  elements (`InputFunctionIterator`), iterated as a `DistributedDataset`."""


class InputFunctionIterator(_IteratorBase):
  """Replicas take successive elements of the dataset `input_fn` returns."""

  def __init__(self, input_fn, devices, one_shot=False):
    """Calls `input_fn(InputContext)` and builds the iterator.

    Args:
      input_fn: a callable taking an `InputContext`, returning a dataset of
        per-replica batches.
      devices: the replica devices, or None for one replica.
      one_shot: True for a one-shot iterator (no initialization).

    Raises:
      InvalidTypeError: if `input_fn` does not return a dataset.
    """
    num = len(devices) if devices is not None else 1
    context = InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=num)
    dataset = input_fn(context)
    check_dataset(dataset, 'The value returned by input_fn')
    super(InputFunctionIterator, self).__init__(dataset, devices, one_shot)

  def get_next(self, name=None):
    """The next element for each replica.

    Replica i gets the i-th of `num_replicas` successive elements; the reads
    are chained so that this order holds in every run.

    Args:
      name: an optional name prefix.

    Returns:
      The element's structure with `PerReplica` leaves; plain tensors with
      one replica.
    """
    if self._devices is None:
      return self._iterator.get_next(name=name)
    per_device = {}
    previous = []
    for i, device in enumerate(self._devices):
      with tf.control_dependencies(previous):
        element = self._iterator.get_next(
            name=None if name is None else '{}_{}'.format(name, i))
      with tf.device(device):
        element = tf.nest.map_structure(tf.identity, element)
      per_device[device] = element
      previous = tf.nest.flatten(element)
    return values_lib.regroup(per_device, values_lib.PerReplica)


def numpy_dataset(numpy_input, session=None):
  """A dataset of the rows of a nest of NumPy arrays.

  Args:
    numpy_input: a nest of NumPy arrays (or lists) with one first dimension.
    session: None to embed the arrays as constants; a `tf.Session` to load
      them into (non-trainable, collection-free) variables initialized in that
      session right away, keeping the graph small.

  Returns:
    A `tf.data.Dataset` of rows.

  Raises:
    InvalidArgumentError: if the arrays have different lengths or are scalars.
  """
  arrays = [np.asarray(a) for a in tf.nest.flatten(numpy_input)]
  lengths = set(a.shape[0] if a.ndim else None for a in arrays)
  if None in lengths or len(lengths) != 1:
    raise errors.InvalidArgumentError(
        'The NumPy inputs must all have the same first dimension (the '
        'examples), got shapes {}.'.format([a.shape for a in arrays]))
  if session is not None:
    tensors = []
    with distribute_context.unmirrored_variables():
      for array in arrays:
        placeholder = tf1.placeholder(array.dtype, array.shape)
        variable = tf1.Variable(placeholder, trainable=False, collections=[],
                                name='numpy_input')
        session.run(variable.initializer, feed_dict={placeholder: array})
        tensors.append(variable.value())
    arrays = tensors
  return tf.data.Dataset.from_tensor_slices(
      tf.nest.pack_sequence_as(numpy_input, arrays))


class MultiStepContext(object):
  """Collects the outputs of `experimental_run_steps_on_iterator`'s steps."""

  def __init__(self, strategy):
    self._strategy = strategy
    self._last_step_outputs = {}
    self._reduce_ops = {}
    self._non_tensor_outputs = {}
    self.run_op = None

  def set_last_step_output(self, name, output, reduce_op=None):
    """Records `output` under `name`; after the loop it holds the last step's.

    Args:
      name: the output's key (also a key of `initial_loop_values`).
      output: a tensor, or a per-replica value when `reduce_op` is given.
      reduce_op: None to keep `output` as is (it must then be one tensor);
        `ReduceOp.SUM` / `MEAN` to reduce a per-replica value first.

    Raises:
      InvalidTypeError: if `output` is per-replica and `reduce_op` is None.
    """
    if reduce_op is not None:
      output = self._strategy.reduce(reduce_op, output)
    elif isinstance(output, values_lib.DistributedValues):
      raise errors.InvalidTypeError(
          'set_last_step_output({!r}) got a per-replica value without a '
          'reduce_op; loop outputs must be single tensors. Pass reduce_op='
          'ReduceOp.SUM or MEAN.'.format(name))
    self._last_step_outputs[name] = output
    self._reduce_ops[name] = reduce_op

  def set_non_tensor_output(self, name, output):
    """Records a Python value produced while building the step."""
    self._non_tensor_outputs[name] = output

  @property
  def last_step_outputs(self):
    """A dict name -> the tensor of the last step."""
    return self._last_step_outputs

  @property
  def non_tensor_outputs(self):
    """A dict name -> the Python values recorded while building."""
    return self._non_tensor_outputs


def run_steps_on_iterator(strategy, fn, iterator, iterations,
                          initial_loop_values):
  """See `StrategyExtended.experimental_run_steps_on_iterator`.

  Raises:
    InvalidArgumentError: if `fn` records an output that has no initial value.
  """
  initial = dict(initial_loop_values or {})
  names = sorted(initial)
  context = MultiStepContext(strategy)

  def body(step, *loop_values):
    context._last_step_outputs = dict(zip(names, loop_values))  # pylint: disable=protected-access
    with distribute_context.in_loop_body():
      result = fn(context, iterator.get_next())
    outputs = context.last_step_outputs
    if sorted(outputs) != names:
      raise errors.InvalidArgumentError(
          'The step function recorded outputs {} but initial_loop_values has '
          '{}; give an initial value for every output the step records.'
          .format(sorted(outputs), names))
    dependencies = [op for op in tf.nest.flatten(result) if op is not None]
    with tf.control_dependencies(dependencies):
      new_values = [tf.identity(outputs[n]) for n in names]
      return [step + 1] + new_values

  with tf1.name_scope('run_steps'):
    loop = tf1.while_loop(
        lambda step, *unused: step < iterations, body,
        [tf.constant(0)] + [tf.convert_to_tensor(initial[n]) for n in names],
        parallel_iterations=1)
  loop = loop if isinstance(loop, (list, tuple)) else [loop]
  context._last_step_outputs = dict(zip(names, loop[1:]))  # pylint: disable=protected-access
  context.run_op = tf.group(*loop)
  return context

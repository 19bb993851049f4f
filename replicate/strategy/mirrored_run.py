"""The replica threads and replica context of mirrored strategies.

Each replica built by a call of the replica function runs it in a thread of
its own (`ReplicaThread`), so that it can pause in `merge_call`. The calling
(main) thread drives them one at a time (replica_loop.py): it lets
replica 0 run until it finishes or reaches `merge_call`, then replica 1, and
so on. When every replica has paused in `merge_call`, the main thread runs the
merge function once, in cross-replica context, hands each replica its share of
the result, and starts the next round. Running one thread at a time keeps
graph construction deterministic (same op names and order on every run) and
keeps TensorFlow's graph-wide state (variable scopes, gradient override maps)
consistent.

Nothing can deadlock on the library's side: a replica that raises, or
replicas that call `merge_call` a different number of times, stop the run;
every other replica is released with an abort signal and joined, and the
error is raised in the calling thread.
"""
import contextlib
import functools
import numbers
import sys
import threading

import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.cross_tower import values as values_lib
from replicate.strategy import default_strategy
from replicate.strategy import mirrored_copies
from replicate.strategy import mirrored_gradients
from replicate.strategy import replica_context


class _Aborted(Exception):
  """Raised inside a paused replica thread when the run is stopped."""


class Run(object):
  """State shared by the main thread and the replica threads of one call."""

  def __init__(self):
    self.aborted = False
    # Variables created by replica 0, by requested name, in creation order;
    # replicas > 0 get these instead of creating their own.
    self.created = {}
    # (replica id, name) -> how many of replica 0's variables of that name
    # the replica has taken so far.
    self.taken = {}
    self.all_reduce_gradients = AllReduceGradients()


@contextlib.contextmanager
def _creators(graph, stack, creator):
  """`stack`, then `creator` on top, as this thread's variable creators of
  `graph`. Entered after `graph.as_default()`: a TF 2 `FuncGraph` takes the
  outer graph's stack there."""
  _compat.set_variable_creator_stack(graph, stack)
  with tf1.variable_creator_scope(creator):
    yield


class ReplicaThread(threading.Thread):
  """Runs `fn` for one replica; pauses at each `merge_call`."""

  def __init__(self, run, strategy, replica_id, device, fn, args, kwargs,
               creator):
    super(ReplicaThread, self).__init__(
        name='replicate_replica_{}'.format(replica_id))
    self.daemon = True
    self.run_state = run
    self.strategy = strategy
    self.replica_id = replica_id
    self.device = device
    self.fn, self.args, self.kwargs = fn, args, kwargs
    self.creator = creator
    self.graph = tf1.get_default_graph()
    # The caller's variable creators (the strategy's scope among them) apply
    # in the replica too, below the replica's own, as in TF.
    self.creator_stack = _compat.variable_creator_stack(self.graph)
    # So are the TF 2-style summary writer, step and recording condition;
    # replica 0 alone records, as in TF.
    self.summary_state = _compat.summary_state()
    # The graph `tf.init_scope` lifts variable creation to: the caller's
    # outermost graph, e.g. the graph around a TF 2 `while_loop` body.
    with tf1.init_scope():
      self.init_graph = tf1.get_default_graph()
    name_scope = self.graph.get_name_scope()
    if replica_id > 0:
      name_scope = (name_scope + '/' if name_scope else '') + (
          'replica_{}'.format(replica_id))
    self.name_scope = name_scope + '/' if name_scope else ''
    self.var_scope = tf1.get_variable_scope()
    self.should_run = threading.Event()
    self.has_paused = threading.Event()
    self.done = False
    self.result = None
    self.exc_info = None
    self.merge_fn = None
    self.merge_args = None
    self.merge_kwargs = None
    self.merge_result = None
    self.merge_calls = 0
    self.captured_name_scope = ''
    self.captured_var_scope = None
    self.captured_control_deps = set()
    self.context = None
    # Whether the other replicas are copies of this one (mirrored_copies):
    # then the function must not ask which replica it builds, and what it
    # looks up by its device scope is recorded in `scope_lookups` as
    # (distributed value, device) pairs, for the copies to read their own.
    self.copying = False
    self.scope_lookups = []

  def run(self):
    self.should_run.wait()
    self.should_run.clear()
    try:
      if self.run_state.aborted:
        return
      context = MirroredReplicaContext(self.strategy, self.replica_id, self)
      self.context = context
      _compat.set_summary_state(self.summary_state, self.replica_id == 0)
      with self.init_graph.as_default(), \
          self.graph.as_default(), \
          self.graph.colocate_with(None, ignore_existing=True), \
          context, \
          tf.device(self.device), \
          self.graph.name_scope(self.name_scope), \
          tf1.variable_scope(self.var_scope,
                             reuse=True if self.replica_id > 0 else None,
                             auxiliary_name_scope=False), \
          _creators(self.graph, self.creator_stack, self.creator), \
          values_lib.observing_scope_lookups(
              self._record_lookup if self.copying else None):
        self.result = self.fn(*self.args, **self.kwargs)
        self.done = True
    except _Aborted:
      pass
    except BaseException:  # pylint: disable=broad-except
      self.exc_info = sys.exc_info()
    finally:
      self.has_paused.set()

  def _record_lookup(self, value, device):
    self.scope_lookups.append((value, device))

  def pause_for_merge(self, merge_fn, args, kwargs):
    """Called by this thread's replica context: waits for the merge result."""
    self.merge_fn, self.merge_args, self.merge_kwargs = merge_fn, args, kwargs
    self.captured_name_scope = self.graph.get_name_scope()
    if self.captured_name_scope:
      self.captured_name_scope += '/'
    self.captured_var_scope = tf1.get_variable_scope()
    self.captured_control_deps = _compat.current_control_dependencies(
        self.graph)
    self.merge_calls += 1
    self.has_paused.set()
    self.should_run.wait()
    self.should_run.clear()
    if self.run_state.aborted:
      raise _Aborted()
    result, self.merge_result = self.merge_result, None
    return result


class MirroredReplicaContext(replica_context.ReplicaContext):
  """The replica context of one thread of a mirrored `call_for_each_replica`."""

  def __init__(self, strategy, replica_id_in_sync_group, thread):
    super(MirroredReplicaContext, self).__init__(strategy,
                                                 replica_id_in_sync_group)
    self._thread = thread

  @property
  def replica_id_in_sync_group(self):
    """This replica's index (a Python int); see `ReplicaContext`.

    Raises:
      InvalidArgumentError: where the other replicas are copies of this one
        (`ReplicaBuild.CLONE`): they would build what replica 0 built.
    """
    self._check_not_copied('replica_id_in_sync_group')
    return self._replica_id_in_sync_group

  def _devices(self):
    self._check_not_copied('devices')
    return super(MirroredReplicaContext, self)._devices()

  def _check_not_copied(self, what):
    if self._thread.copying:
      raise mirrored_copies.POLICY.error(
          'the replica function asked which replica it builds ({}), so '
          'its replicas may differ'.format(what))

  def _routes_gradients(self):
    return True

  def _apply_gradients(self, optimizer, grads_and_vars, global_step, name,
                       compression=None):
    return mirrored_gradients.apply_gradients_across_replicas(
        optimizer, grads_and_vars, global_step=global_step, name=name,
        compression=compression)

  def _merge_call(self, merge_fn, args, kwargs):
    if threading.current_thread() is not self._thread:
      raise errors.ContextError(
          'merge_call of replica {} was called from thread {!r}, not from '
          'the thread running that replica. Call merge_call from the '
          'function given to call_for_each_replica itself.'.format(
              self._replica_id_in_sync_group,
              threading.current_thread().name))
    return self._thread.pause_for_merge(merge_fn, args, kwargs)

  def _all_reduce(self, reduce_op, value):
    # A fresh tensor per replica, even for a tensor built outside the
    # replicas: merge_call must see one value per replica to reduce.
    with tf.device(self._thread.device):
      flat = [tf.identity(v) for v in tf.nest.flatten(value)]
    if not flat:
      return value
    reduced = self._all_reduce_values(reduce_op, flat)
    # The reduced tensors depend on every replica's inputs; differentiating
    # through that graph would give replica i only its own input's share.
    # Each reduced tensor is instead handed out by an IdentityN that also
    # takes this replica's inputs, and whose gradient (registered below)
    # sends nothing into the reduction and the all-reduced output gradients
    # to the inputs. (`tf.custom_gradient` cannot serve here: it looks for
    # the variables its outputs depend on, walks into the other replicas and
    # fails on their copies of a mirrored variable.) Replicas build one at a
    # time (see the module docstring), so the graph's override map is this
    # replica's while the op is made. The gradient is registered for this
    # run only: `call_for_each_replica` takes it off the ops and out of TF's
    # registry when it returns (`AllReduceGradients.release`).
    graph = tf1.get_default_graph()
    gradient = self._thread.run_state.all_reduce_gradients.name(reduce_op)
    with graph.gradient_override_map({'IdentityN': gradient}), tf.device(
        self._thread.device):
      outputs = tf.identity_n(list(reduced) + flat, name='all_reduce')
    results = list(outputs[:len(flat)])
    # A `GradientTape` records ops of this thread only, so it cannot see
    # the reduction (built by the merge) and does not read the override map:
    # it gets the same gradient recorded (as `tf.custom_gradient` does).
    _compat.record_on_tape(
        'ReplicateAllReduce', results, flat,
        lambda *grads: _input_gradients(reduce_op, 'all_reduce', flat, grads))
    return tf.nest.pack_sequence_as(value, results)

  def _all_reduce_values(self, reduce_op, tensors):
    def merge_fn(strategy, per_replica):
      return strategy.extended.batch_reduce_to(
          reduce_op, [(v, v) for v in per_replica])
    return list(self.merge_call(merge_fn, args=(tensors,)))


class AllReduceGradients(object):
  """The all-reduce's gradient, registered with TF for one run only.

  The gradient of an all-sum is the all-sum of the output gradients; that of
  an all-mean, their all-mean (each output is 1/n of every input).
  `MirroredReplicaContext._all_reduce` names it in a gradient override map
  while the replicas are built. `release` takes the name off the run's ops
  and out of TF's gradient registry: nothing the library registers outlives
  `call_for_each_replica`, and no graph names it (a checkpoint's meta graph
  differentiates where `replicate` is not imported). Names are unique per
  run, so runs in other threads or nested in a merge keep theirs.
  """

  def __init__(self):
    self._names = {}  # ReduceOp -> the name registered for this run

  def name(self, reduce_op):
    """The registered gradient name of `reduce_op`'s all-reduce."""
    if reduce_op not in self._names:
      name = 'ReplicateAllReduce{}_{:x}'.format(reduce_op.name.title(),
                                                id(self))
      tf1.RegisterGradient(name)(functools.partial(_registered_gradient,
                                                   reduce_op))
      self._names[reduce_op] = name
    return self._names[reduce_op]

  def release(self, ops):
    """Takes this run's gradient off `ops` (the run's new ops) and out of
    TF's registry. What is left of each all-reduce is a plain `IdentityN` of
    the reduced tensors, whose TF gradient is the reduction's own: the
    gradient of the whole graph's loss (for a sum over the replicas' losses,
    the all-reduce of their gradients)."""
    names = set(self._names.values())
    try:
      for op in ops:
        if op.type != 'IdentityN':
          continue
        attr = op.node_def.attr.get(_GRADIENT_OP_TYPE)
        if attr is not None and attr.s.decode() in names:
          _compat.clear_attr(op, _GRADIENT_OP_TYPE)
    finally:
      for name in names:
        _compat.unregister_gradient(name)
      self._names.clear()


def _registered_gradient(reduce_op, op, *grads):
  return _all_reduce_gradient(reduce_op, op, grads)


def _all_reduce_gradient(reduce_op, op, grads):
  """Gradients of `MirroredReplicaContext._all_reduce`'s IdentityN.

  Its inputs are the n reduced tensors, then this replica's n inputs; its
  first n outputs are the results. The reduced tensors get no gradient; the
  inputs get `_input_gradients`.
  """
  count = len(op.inputs) // 2
  return [None] * count + _input_gradients(
      reduce_op, op.name, op.inputs[count:], grads[:count])


def _input_gradients(reduce_op, name, inputs, grads):
  """Each floating-point input's gradient: the all-reduce of its result's
  (zeros where the result has none), which every replica computes in the
  same order, so their `merge_call`s pair up.

  Raises:
    ContextError: outside a replica while the replicas are built (e.g.
      `tf.gradients` of a replica's result taken in a merge function): the
      other replicas' gradients are not there to add. (Once
      `call_for_each_replica` returns, the op no longer names this gradient:
      `AllReduceGradients.release`.)
  """
  context = default_strategy.get_replica_context()
  if not isinstance(context, MirroredReplicaContext):
    raise errors.ContextError(
        'The gradient of all_reduce {} must be built inside the function '
        'given to call_for_each_replica / experimental_run_v2: its inputs '
        "get the all-reduce of every replica's output gradients, which only "
        'the replicas can compute together.'.format(name))
  positions = []
  upstream = []
  for position, (grad, tensor) in enumerate(zip(grads, inputs)):
    if not (tensor.dtype.is_floating or tensor.dtype.is_complex):
      continue
    positions.append(position)
    upstream.append(tf.zeros_like(tensor) if grad is None else
                    tf1.convert_to_tensor(grad))
  input_grads = [None] * len(inputs)
  if upstream:
    for position, grad in zip(positions,
                              context.all_reduce(reduce_op, upstream)):
      input_grads[position] = grad
  return input_grads


# The attribute `gradient_override_map` sets (TF's name).
_GRADIENT_OP_TYPE = '_gradient_op_type'


def _is_plain_python(value):
  return value is None or isinstance(
      value, (str, numbers.Integral, float, bool))


def regroup(devices, structures, container_of=None):
  """Merges one nest per replica into one nest of per-replica leaves.

  As TF 1.15's `values.regroup` (lists, tuples, namedtuples rebuilt with
  `_make`, dicts; see `values.merge_structures`). A leaf that is the same
  object on every replica (a mirrored variable, an optimizer, a tensor
  built outside the replicas) or an equal Python value stays as it is;
  each replica's own copy of one mirrored variable (`v.get()`, a
  variable a tape watched) is that variable again; any other leaf that
  differs between replicas becomes `PerReplica`.

  Args:
    devices: the replica devices, in replica order.
    structures: one nest per replica, all of the same structure.
    container_of: `value -> the distributed variable holding it` (else
      the value itself), or None.

  Returns:
    The merged nest.

  Raises:
    StructureMismatchError: if the structures differ (an `AssertionError`
      too, as TF's).
  """
  def merge(leaves):
    first = leaves[0]
    same = all(leaf is first for leaf in leaves)
    if not same and _is_plain_python(first):
      same = all(_is_plain_python(leaf) and leaf == first for leaf in leaves)
    if same:
      return first
    container = container_of(first) if container_of is not None else first
    if container is not first and isinstance(
        container, values_lib.DistributedValues) and len(
            container.values) == len(leaves) and all(
                copy is leaf for copy, leaf in zip(container.values, leaves)):
      return container  # each replica gave its own copy, in device order
    return values_lib.PerReplica(dict(zip(devices, leaves)))
  return values_lib.merge_structures(list(structures), merge)


def select_replica(device, structure, keep=()):
  """A replica's share of a merge result: distributed leaves on `device`.

  Args:
    device: the replica's device.
    structure: a nest.
    keep: types of `DistributedValues` handed over whole (mirrored
      variables, which pick their copy themselves).

  Returns:
    The nest with each other `DistributedValues` replaced by its value there.
    A `Mirrored` with no copy there (reduced or broadcast to one device)
    gives its primary copy, read across devices: its copies are equal, and
    contrib handed such a value over as one tensor.

  Raises:
    InvalidArgumentError: if a `PerReplica` leaf has no value on `device`.
  """
  def select(leaf):
    if isinstance(leaf, keep):
      return leaf
    if isinstance(leaf, values_lib.Mirrored) and not leaf.on_device(device):
      return leaf.get(leaf.primary_device)
    if isinstance(leaf, values_lib.DistributedValues):
      return leaf.get(device)
    return leaf
  return tf.nest.map_structure(select, structure)


def regroup_updates(results, devices, group):
  """Per leaf of the update results, as TF's MirroredStrategy returns them.

  Args:
    results: what the update function returned, per device.
    devices: the devices, in the order of `results`.
    group: False for the tuple of results per leaf. True for one op running
      every device's update where the results are ops, and where they are
      tensors (e.g. what `assign(..., read_value=True)` returns) a
      `Mirrored` of their values, each read once every device's update ran.

  Returns:
    The nest of `results[0]`, with a leaf as described for `group`.
  """
  flats = [tf.nest.flatten(r) for r in results]
  leaves = []
  for column in zip(*flats):
    present = [(d, c) for d, c in zip(devices, column) if c is not None]
    if not present:
      leaves.append(None)
    elif not group:
      leaves.append(tuple(column))
    elif all(tf.is_tensor(c) for _, c in present):
      every_update = tf.group(*[c for _, c in present])
      values = {}
      for device, value in present:
        with tf.device(device), tf.control_dependencies([every_update]):
          values[device] = tf.identity(value)
      leaves.append(values_lib.Mirrored(values))
    else:
      leaves.append(tf.group(*[c for _, c in present]))
  return tf.nest.pack_sequence_as(results[0], leaves)

"""`call_for_each_replica` of mirrored strategies: the loop that drives it.

By default replicas are built by calls of the replica function
(mirrored_run.py: one thread each, driven one at a time, the merge function
run between). With `ReplicaBuild.CLONE` they are copies of replica 0
(mirrored_copies.py): only replica 0's thread runs, and at each of its sync
points (a `merge_call`, its end) what it built is copied onto the other
replicas before the merge function runs with every replica's values. A
reason copies cannot be shown right stops the run with
`mirrored_copies.POLICY`'s error: before anything is built where it is known
then, else at the sync point where it shows up (the ask of the replica id
raises where it is made).
"""
import collections

import tensorflow as tf

from replicate import errors
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import logs as logging
from replicate.core import op_kinds
from replicate.cross_tower import values as values_lib
from replicate.strategy import distribute_context
from replicate.strategy import mirrored_copies
from replicate.strategy import mirrored_run
from replicate.strategy import sync_on_read

# How long the main thread waits for an aborted replica thread to exit before
# giving up on it (it is a daemon thread, so it cannot keep the process alive).
_JOIN_TIMEOUT_S = 30.0

ReplicaBuild = mirrored_copies.ReplicaBuild


def call_for_each_replica(strategy, devices, fn, args, kwargs, make_creator,
                          keep=(),
                          replica_build=ReplicaBuild.CALL_PER_REPLICA,
                          mirrored_variables=None):
  """Builds `fn` for every device; see the module docstring.

  Args:
    strategy: the `Strategy`.
    devices: the replica devices (canonical strings), in replica order.
    fn: the function to replicate.
    args: a tuple of arguments; distributed leaves are split by replica.
    kwargs: a dict of keyword arguments, likewise.
    make_creator: `make_creator(run)` returns the variable creator each
      replica thread enters (it shares variables through `run.created`).
    keep: see `mirrored_run.select_replica`.
    replica_build: a `ReplicaBuild`.
    mirrored_variables: a callable returning the strategy's mirrored
      variables (whose reads copies map to their replica's copy).

  Returns:
    `fn`'s results regrouped (see `mirrored_run.regroup`).

  Raises:
    ContextError: in eager mode, or if replicas call `merge_call` a
      different number of times.
    InvalidArgumentError: with `ReplicaBuild.CLONE`, where copies cannot be
      shown right (mirrored_copies.py lists the reasons).
    Any exception `fn` or a merge function raises.
  """
  if tf.executing_eagerly():
    raise errors.ContextError(
        'call_for_each_replica of a mirrored strategy builds graphs; it was '
        'called eagerly. Call it inside `with tf.Graph().as_default():`.')
  graph = tf1.get_default_graph()
  copying = replica_build == ReplicaBuild.CLONE and len(devices) > 1
  replica_args = [(mirrored_run.select_replica(d, args, keep),
                   mirrored_run.select_replica(d, kwargs, keep))
                  for d in devices]
  if copying:
    inputs = [mirrored_copies.flat_inputs(a) for a in replica_args]
    mirrored_copies.POLICY.check(
        mirrored_copies.reason_not_to_clone(graph, inputs))
  # Replica threads need their own device, colocation and control-dependency
  # stacks (TF 2.x graphs have them already).
  graph.switch_to_thread_local()
  first_op = len(graph.get_operations())
  run = mirrored_run.Run()
  creator = make_creator(run)
  # Every thread is made now, in the caller's scopes; a copied run starts
  # only replica 0's.
  threads = [
      mirrored_run.ReplicaThread(run, strategy, i, device, fn, a, k, creator)
      for i, (device, (a, k)) in enumerate(zip(devices, replica_args))]
  copies = None
  if copying:
    copies = _Copies(graph, devices, threads, inputs, keep,
                     mirrored_variables)
  loop = _Loop(strategy, devices, threads, keep)
  try:
    # Entering the caller's variable scope here restores it on exit, after
    # replica threads have set the graph-wide scope to theirs.
    with tf1.variable_scope(tf1.get_variable_scope(),
                            auxiliary_name_scope=False):
      if copies is None:
        loop.start(threads)
        results = loop.drive()
      else:
        loop.start(threads[:1])
        results = copies.drive(loop)
    if mirrored_variables is not None:
      loop.check_writes(mirrored_variables())
    loop.finished = True
    return results
  finally:
    loop.stop(run)
    run.all_reduce_gradients.release(graph.get_operations()[first_op:])


class _Loop(object):
  """Drives the started replica threads, one at a time, between merges."""

  def __init__(self, strategy, devices, threads, keep):
    self.strategy = strategy
    self.devices = devices
    self.threads = threads
    self.keep = keep
    # A replica's copy of a mirrored variable regroups into the variable.
    self.container_of = strategy.extended._value_container  # pylint: disable=protected-access
    self.started = []
    self.finished = False
    # graph -> the ops the replica threads built in it, merges excluded.
    self.replica_ops = collections.defaultdict(list)

  def start(self, threads):
    for t in threads:
      t.start()
      self.started.append(t)

  def step(self, threads=None):
    """Lets each started thread run to its next pause; raises its error.

    Keeps what each built (one thread runs at a time): `check_writes`
    looks there for updates of a single copy.
    """
    for t in threads or self.started:
      before = len(t.graph.get_operations())
      t.should_run.set()
      t.has_paused.wait()
      t.has_paused.clear()
      if t.exc_info is not None:
        raise t.exc_info[1].with_traceback(t.exc_info[2])
      self.replica_ops[t.graph].extend(t.graph.get_operations()[before:])

  def check_writes(self, variables):
    """Raises if a replica wrote its copy of an ON_WRITE mirrored variable.

    A `tf.compat.v1` optimizer given a callable loss updates what its tape
    watched, the replica's own copies (with a tensor loss it asks the
    variable for its `constraint`, which refuses): each copy would get its
    own replica's gradient, and TF's strategies sum them.

    Raises:
      ContextError: naming the variable and the write.
    """
    for graph, ops in self.replica_ops.items():
      built = set(ops)
      for variable in variables:
        if isinstance(variable, sync_on_read.SyncOnReadVariable):
          continue
        for copy in variable.values:
          if copy.graph is not graph:
            continue
          init = copy.initializer
          writes = [op for op in op_kinds.variable_writes(copy.op, built)
                    if op is not init]
          if writes:
            raise errors.ContextError(
                '{} ({}) writes the copy of mirrored variable {} on {} '
                'inside a replica: it would change only that copy, and the '
                'copies would differ. A tf.compat.v1 optimizer given a '
                'callable loss updates the copies its tape watched: wrap it '
                'in replicate.TowerOptimizer, or call '
                'replicate.mirrored_strategy.apply_gradients_across_replicas'
                '; assign the mirrored variable itself, not its copy.'.format(
                    writes[0].name, writes[0].type, variable.primary.op.name,
                    copy.device))

  def drive(self):
    """The per-replica loop, every thread started; returns the results."""
    threads = self.threads
    while True:
      self.step()
      if all(t.done for t in threads):
        break
      if any(t.done for t in threads):
        raise errors.ContextError(
            'Replicas called merge_call a different number of times ({}); '
            'every replica must reach the same merge_calls in the same '
            'order. Avoid merge_call under replica-dependent Python '
            'conditions.'.format(', '.join(
                'replica {}: {}'.format(t.replica_id, t.merge_calls)
                for t in threads)))
      result = self.merge(threads[0], [t.merge_args for t in threads],
                          [t.merge_kwargs for t in threads],
                          [t.captured_control_deps for t in threads])
      for device, t in zip(self.devices, threads):
        t.merge_result = mirrored_run.select_replica(device, result,
                                                     self.keep)
    return mirrored_run.regroup(self.devices, [t.result for t in threads],
                                self.container_of)

  def merge(self, first, merge_args, merge_kwargs, control_deps):
    """Runs `first`'s merge function once on every replica's arguments."""
    merge_args = mirrored_run.regroup(self.devices, merge_args,
                                      self.container_of)
    merge_kwargs = mirrored_run.regroup(self.devices, merge_kwargs,
                                        self.container_of)
    graph = first.graph
    # What the merge function builds runs after every replica's open control
    # dependencies (e.g. an update inside `tf.control_dependencies([op])` in
    # a replica waits for each replica's `op`), as in TF.
    deps = set()
    for replica_deps in control_deps:
      deps.update(replica_deps)
    with graph.name_scope(first.captured_name_scope), \
        tf1.variable_scope(first.captured_var_scope,
                           auxiliary_name_scope=False), \
        graph.control_dependencies(sorted(deps, key=_op_name)), \
        distribute_context.push_cross_replica(self.strategy):
      return first.merge_fn(self.strategy, *merge_args, **merge_kwargs)

  def stop(self, run):
    if not self.finished:
      run.aborted = True
    for t in self.started:
      t.should_run.set()
    for t in self.started:
      t.join(_JOIN_TIMEOUT_S)
      if t.is_alive():
        logging.warning(
            'Replica thread %s did not stop within %.0f s after the run was '
            'aborted; it is left running as a daemon thread.', t.name,
            _JOIN_TIMEOUT_S)


def _op_name(op):
  return op.name


# The collections every call of a replica function adds its own entries to,
# which `CLONE` adds the copies' entries to: batch normalization's updates
# and tf.compat.v1.losses' losses. (A regularizer's loss is added where its
# variable is made, by replica 0 alone in either build.)
_PER_CALL_COLLECTIONS = (tf1.GraphKeys.UPDATE_OPS, tf1.GraphKeys.LOSSES)


class _Copies(object):
  """Replicas 1..N-1 as copies of replica 0 (mirrored_copies.py)."""

  def __init__(self, graph, devices, threads, inputs, keep,
               mirrored_variables):
    self.graph = graph
    self.devices = devices
    self.threads = threads
    self.keep = keep
    self.mirrored_variables = mirrored_variables or (lambda: ())
    # Replica 0's tensors and the others' in their place (same leaves where
    # shared).
    pairs = [[(a, b) for a, b in zip(inputs[0], replica)
              if a is not b and isinstance(a, (tf.Tensor, tf.Operation))]
             for replica in inputs[1:]]
    replica_inputs = [[a for a, _ in pairs[0]] if pairs else []]
    replica_inputs += [[b for _, b in replica] for replica in pairs]
    self.copier = mirrored_copies.ReplicaCopier(
        graph, devices, len(graph.get_operations()), replica_inputs)
    self.merge_ops = set()
    # How far each per-call collection held entries at the last sync point.
    self.collected = {key: len(graph.get_collection(key))
                      for key in _PER_CALL_COLLECTIONS}
    # Replica 0 raises where it asks its replica id (mirrored_run.py).
    threads[0].copying = True

  def drive(self, loop):
    """Runs replica 0 and copies it; returns every replica's results."""
    first = self.threads[0]
    while True:
      loop.step()
      ops = loop.replica_ops[self.graph]
      mirrored_copies.POLICY.check(
          mirrored_copies.reason_summaries_written(ops) or
          self.copier.reason_python_state(ops))
      self.copier.map_mirrored(self.mirrored_variables())
      self._map_scope_lookups(first)
      entries = self._new_entries()
      if first.done:
        return self._results(loop.container_of, entries)
      self._merge(loop, first, entries)

  def _map_scope_lookups(self, first):
    """Copy i reads replica i's value where replica 0 read its own by its
    device scope (`PerDevice.get()`), as replica i's call would."""
    lookups, first.scope_lookups = first.scope_lookups, []
    own = device_util.canonicalize(self.devices[0])
    for value, device in lookups:
      if device_util.canonicalize(device) != own:
        # Pinned elsewhere inside the function: the same in every call.
        continue
      original = value.get(own)
      if isinstance(original, tf.Variable):
        continue  # A distributed variable's copies: `map_mirrored`.
      for i in range(1, len(self.devices)):
        mirrored_copies.POLICY.check(mirrored_copies.map_shares(
            self.copier, i, original, value.get(self.devices[i]),
            source='the replica function read, by its device scope, '
                   'per-device'))

  def _merge(self, loop, first, entries):
    copier = self.copier
    # One import per sync point: what the merge reads and the collections'.
    copier.clone(mirrored_copies.tensors_of(
        (first.merge_args, first.merge_kwargs, entries)) +
                 sorted(first.captured_control_deps, key=_op_name))
    self._add_copies(entries)
    count = len(self.devices)
    merge_args = [first.merge_args] + [
        mirrored_copies.copy_of(copier, i, first.merge_args)
        for i in range(1, count)]
    merge_kwargs = [first.merge_kwargs] + [
        mirrored_copies.copy_of(copier, i, first.merge_kwargs)
        for i in range(1, count)]
    deps = [first.captured_control_deps] + [
        set(copier.get(i, op) for op in first.captured_control_deps)
        for i in range(1, count)]
    before = len(self.graph.get_operations())
    result = loop.merge(first, merge_args, merge_kwargs, deps)
    made = self.graph.get_operations()[before:]
    copier.share(made)
    self.merge_ops.update(made)
    shares = [mirrored_run.select_replica(d, result, self.keep)
              for d in self.devices]
    for i in range(1, count):
      mirrored_copies.POLICY.check(
          mirrored_copies.map_shares(copier, i, shares[0], shares[i]))
    first.merge_result = shares[0]

  def _new_entries(self):
    """What replica 0 added to each per-call collection since the last sync
    point, by key; entries the merge function added are left out (added
    once, as in calls)."""
    return {key: [e for e in self.graph.get_collection(key)[
        self.collected[key]:] if _op_of(e) not in self.merge_ops]
            for key in _PER_CALL_COLLECTIONS}

  def _add_copies(self, entries):
    """Adds each copy's `entries` (cloned) where replica 0 added its own:
    each call adds its own (batch normalization's moving-statistics
    updates, a `tf.compat.v1.losses` loss), replica after replica before
    the merge runs."""
    for key, added in sorted(entries.items()):
      for i in range(1, len(self.devices)):
        for entry in added:
          # A value shared by every replica (made before the run) is its own
          # copy: each call adds it again, and so does each copy.
          self.graph.add_to_collection(
              key, mirrored_copies.copy_of(self.copier, i, entry))
      self.collected[key] = len(self.graph.get_collection(key))

  def _results(self, container_of, entries):
    """Every replica's results: replica 0's, and their copies."""
    first = self.threads[0]
    copier = self.copier
    copier.clone(mirrored_copies.tensors_of((first.result, entries)))
    self._add_copies(entries)
    results = [first.result]
    for i in range(1, len(self.devices)):
      results.append(_own_copies(
          mirrored_copies.copy_of(copier, i, first.result), i, container_of))
    return mirrored_run.regroup(self.devices, results, container_of)


def _own_copies(structure, replica_id, container_of):
  """`structure` with replica 0's copy of a mirrored variable (`v.get()`
  in replica 0) replaced by replica `replica_id`'s, as its call returns."""
  def own(leaves):
    value = leaves[0]
    container = container_of(value)
    if container is not value and isinstance(
        container, values_lib.DistributedValues) and (
            container.values[0] is value):
      return container.values[replica_id]
    return value
  return values_lib.merge_structures([structure], own)


def _op_of(item):
  return item if isinstance(item, tf.Operation) else getattr(item, 'op', None)

"""Copies, in rounds, part of a graph onto other devices.

`GraphCopier` copies the ops built since a point (the window) that some
tensors depend on onto every other device of a list, with one
`tf.import_graph_def` per round: each copy keeps its original's op type and
attributes, is named `<prefix>_<i>/<original name>`, and is placed where the
original's requested device maps for copy i. Clients decide what to copy and
when (e.g. towers/tower_cloning.py); subclasses say
how devices map and which ops every copy shares.
"""
import tensorflow as tf

from replicate import _compat
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import op_kinds
from replicate.graph_copy import bound_devices
from replicate.graph_copy import bulk_variables
from replicate.graph_copy import function_copies
from replicate.graph_copy import node_defs


class GraphCopier(object):
  """Copies what was built on device 0 onto devices 1..N-1, in rounds.

  Each `clone` call copies the ops (built since the window opened) that the
  requested tensors depend on and that no earlier round copied; later
  rounds read what earlier rounds copied. `get` maps an original tensor or op
  to copy i's. A "tower" here is one of the devices: tower 0 holds the
  originals, towers 1..N-1 the copies.
  """

  def __init__(self, graph, devices, first_op_index, tower_inputs,
               stateful_op_types=op_kinds.STATEFUL_OP_TYPES,
               scope_name='tower'):
    """Prepares to copy what tower 0 builds in `graph`.

    Args:
      graph: the graph the towers are built in.
      devices: the tower devices, tower 0's first.
      first_op_index: how many ops `graph` had when tower 0 started.
      tower_inputs: for each tower, the flat list of tensors it reads in
        place of tower 0's (e.g. its shard of the batch), in the same order
        for every tower.
      stateful_op_types: op types never copied (variables, tables).
      scope_name: copy i is named under `<scope_name>_<i>/`.
    """
    self._stateful_op_types = stateful_op_types
    self._scope_name = scope_name
    self._graph = graph
    self._devices = list(devices)
    self._first_op_index = first_op_index
    # What tower 0's ops asked for inside the tower's device scope; filled
    # by the tower's device function (for towers: device_setter's).
    self.requested_devices = {}
    self._copies = [None] + [{} for _ in self._devices[1:]]
    for tower_id in range(1, len(self._devices)):
      for original, copy in zip(tower_inputs[0], tower_inputs[tower_id]):
        if original is not None:
          self._copies[tower_id][original.name] = copy
    self._prefixes = None
    self._device_cache = {}
    self._control_proxies = {}
    # Tower-0 ops never copied, and those copied in earlier rounds
    # (`Operation`s: their names are a call into TF's C API each time).
    self._shared = set()
    self._copied = set()
    # Tower-0 variables of which every copied tower has its own (metric
    # variables in EVAL, see `own_variables`).
    self._own_variable_ops = set()
    self._tower_ops = set()
    self._functions = function_copies.FunctionCopies(graph, devices[0])

  def share(self, ops):
    """Marks tower-0 ops as shared by every tower: they are never copied.

    Args:
      ops: `Operation`s built in tower 0.
    """
    self._shared.update(ops)

  def clone(self, targets):
    """Copies onto towers 1..N-1 what `targets` need from tower 0.

    Args:
      targets: tower-0 `Tensor`s and `Operation`s.
    """
    window, todo = self._cone(targets)
    ops = [op for op in window if op in todo]  # creation order
    if not ops:
      return
    self._make_prefixes()
    with self._graph.as_default(), tf1.device(None), tf1.name_scope(None), (
        tf1.control_dependencies(None)), tf1.colocate_with(
            None, ignore_existing=True):
      self._import(ops, todo)

  def _make_prefixes(self):
    if self._prefixes is None:
      # At the top of the graph, whatever scope the copying starts in (a
      # canned head's `dnn/head`): `tower_<i>/<tower 0's name>`.
      with self._graph.name_scope(None):
        self._prefixes = [None] + [
            self._graph.unique_name('{}_{}'.format(
                self._scope_name, tower_id)) + '/'
            for tower_id in range(1, len(self._devices))
        ]

  def own_variables(self, variables, collections, on_tower_devices=False,
                    follow_first_device=False):
    """Gives every copied tower its own copy of some tower-0 variables.

    Each tower gets a new variable per given one (same dtype, shape,
    initial value and constraint, named under the tower's scope); copies of tower 0's ops
    that read or write a given variable read and write the tower's own
    instead. Used for metric variables (each tower counts its own shard, and
    no two towers update one variable) and for `VariablePlacement.REPLICATED`
    (each tower trains its own copy).

    Args:
      variables: variables created in tower 0.
      collections: the graph collections the new variables join.
      on_tower_devices: put each tower's copies on the tower's device (else
        on the device of the variable copied).
      follow_first_device: put the copies of a variable on tower 0's device
        on their tower's device (where the tower's own call, whose
        variables go to its device, would make it).

    Returns:
      A list with, for each tower, its variables in the order given (tower
      0's are `variables`).
    """
    self._make_prefixes()
    specs = [
        bulk_variables.VariableSpec(
            name=self._prefixes[tower_id] + variable.op.name,
            device=(self._devices[tower_id] if on_tower_devices or (
                follow_first_device and variable.device and
                device_util.canonicalize(variable.device) ==
                device_util.canonicalize(self._devices[0])) else
                    variable.device),
            initial_value=variable.initial_value,
            resource=variable.op.type == 'VarHandleOp', trainable=False,
            collections=list(collections), colocate_with=None,
            wrap_initial_value=False, constraint=variable.constraint)
        for tower_id in range(1, len(self._devices))
        for variable in variables]
    if all(bulk_variables.can_copy(variable) for variable in variables):
      made = bulk_variables.create_variables(self._graph, specs)
    else:
      made = self._own_variables_one_by_one(specs)
    count = len(variables)
    per_tower = [list(variables)] + [
        made[i * count:(i + 1) * count]
        for i in range(len(self._devices) - 1)]
    self.map_variables(variables, per_tower)
    return per_tower

  def _own_variables_one_by_one(self, specs):
    """`own_variables`' copies made by `tf.Variable`, one at a time."""
    made = []
    with self._graph.as_default(), tf1.name_scope(None), (
        tf1.control_dependencies(None)), tf1.colocate_with(
            None, ignore_existing=True):
      for spec in specs:
        with tf1.device(spec.device):
          made.append(tf1.Variable(
              spec.initial_value, trainable=False,
              collections=spec.collections, name=spec.name,
              dtype=spec.initial_value.dtype.base_dtype,
              use_resource=spec.resource, constraint=spec.constraint))
    return made

  def map_variables(self, variables, per_tower):
    """Copies of ops that read or write a variable use each tower's own.

    Args:
      variables: tower-0 variables.
      per_tower: for each tower, its own variables, in the order of
        `variables` (tower 0's entry is not read).
    """
    for tower_id in range(1, len(self._devices)):
      copies = self._copies[tower_id]
      for variable, own in zip(variables, per_tower[tower_id]):
        copies[variable.op.name] = own.op
        copies[variable.op.outputs[0].name] = own.op.outputs[0]
    self._own_variable_ops.update(v.op for v in variables)
    # What read the variable's own read tensor (`variable.value()`) reads
    # each copy's, as in a tower that made the variable itself, rather than
    # a second read of the copy.
    for index, variable in enumerate(variables):
      snapshot = op_kinds.variable_snapshot(variable)
      owns = [op_kinds.variable_snapshot(per_tower[tower_id][index])
              for tower_id in range(1, len(self._devices))]
      if snapshot is None or any(own is None for own in owns):
        continue
      for tower_id, own in enumerate(owns, 1):
        self._copies[tower_id][snapshot.op.name] = own.op
        self._copies[tower_id][snapshot.name] = own
      self._copied.add(snapshot.op)

  def set_copy(self, tower_id, original, copy):
    """Tower `tower_id`'s copies read `copy` where originals read `original`.

    Args:
      tower_id: a tower other than 0.
      original: a tower-0 `Tensor` or `Operation` not copied (e.g. built
        between rounds by a client, for every tower).
      copy: what tower `tower_id` reads instead, of the same kind.
    """
    self._copies[tower_id][original.name] = copy
    if isinstance(original, tf.Tensor) and (
        original.op.name not in self._copies[tower_id]):
      # A control input on the op means a control input on the copy's op.
      self._copies[tower_id][original.op.name] = copy.op

  def _cone(self, targets):
    """`(window, ops to copy)` for copying `targets`.

    The ops to copy are the ops of tower 0 (the window) that `targets`
    depend on through data or control inputs, stopping at shared ops and at
    ops copied before. Both are of `Operation`s.
    """
    window = self._window()
    in_window = set(window)
    shared = self._shared_ops(window)
    # Tower ops of this window: every tower has its own, copied now, in a
    # later round, or built by a client per tower (a tower's scaled loss).
    self._tower_ops = in_window - shared
    todo = set()
    stack = [t if isinstance(t, tf1.Operation) else t.op for t in targets]
    while stack:
      op = stack.pop()
      if (op in todo or op in shared or op not in in_window or
          op in self._copied):
        continue
      todo.add(op)
      stack.extend(t.op for t in op.inputs)
      stack.extend(op.control_inputs)
    return window, todo

  def _import(self, ops, todo):
    """Copies `ops` (the set `todo`) onto every other tower: one import.

    Every tower's copies go into one `GraphDef`, named `tower_<i>/<name>`.
    An input from outside `ops` is renamed the same way and mapped, per
    tower, to what that tower reads: its copy from an earlier round, its
    shard of the batch, or the tensor itself (shared).
    """
    graph_def = tf1.GraphDef()
    graph_def.versions.CopyFrom(self._graph.graph_def_versions)
    reseed = node_defs.reseeds(self._graph)
    external = {}  # input name in a NodeDef -> Tensor or Operation
    for op in ops:
      for tensor in op.inputs:
        if tensor.op not in todo:
          external[node_defs.input_name(tensor)] = tensor
      for control in op.control_inputs:
        if control not in todo:
          external['^' + control.name] = control
    originals = [op.node_def for op in ops]
    todo_names = set(node_def.name for node_def in originals)
    anchors = bound_devices.anchors(
        ops, lambda op: op in todo or op in self._copied or (
            op in self._tower_ops))
    devices = {}
    input_map = {}
    returned = []
    for tower_id in range(1, len(self._devices)):
      prefix = self._prefixes[tower_id]
      copies = self._copies[tower_id]
      tower_name = node_defs.tower_names(prefix, copies, todo_names)
      for op, node_def in zip(ops, originals):
        node = graph_def.node.add()
        node.CopyFrom(node_def)
        node.name = prefix + node.name
        for index, name in enumerate(node.input):
          node.input[index] = (
              '^' + prefix + name[1:] if name.startswith('^') else
              prefix + name)
        # The device is set by the device function below: a device in the
        # NodeDef would make the import enter a device scope for every op.
        node.ClearField('device')
        anchor = anchors.get(op)  # bound to a shared variable: goes with it
        devices[node.name] = (
            self._copies[tower_id].get(anchor.name, anchor).device
            if anchor is not None else
            self._copy_device(op, node_def, tower_id, devices))
        # Seeds derived from the graph's: another call would derive others.
        # (A function's random ops keep theirs: every call builds its body
        # in a graph of its own, which derives the same seeds again.)
        if reseed and node_defs.is_seeded(node) and _compat.has_derived_seed(
            op, node.attr['seed'].i, node.attr['seed2'].i):
          node_defs.offset_seed(node, tower_id)
        if 'frame_name' in node.attr:
          # A TF1 tf.while_loop runs in the frame its Enter ops name: each
          # copy of the loop needs its own, or TF takes the copies for one
          # loop. (Nothing else of TF1 control flow needs care: its Python
          # contexts only matter to differentiate the ops, and the copies
          # are never differentiated.)
          node.attr['frame_name'].s = prefix.encode() + node.attr[
              'frame_name'].s
        node_defs.rename_colocation(node, prefix, todo_names)
        node_defs.rename_in_messages(node, op, tower_name)
        if node_defs.calls_functions(node):
          # The device as the tower's ops ask for it (a canonical one would
          # name the job `localhost`, which a cluster's session lacks).
          self._functions.retarget(node, self._devices[tower_id],
                                   '_' + prefix.rstrip('/'), graph_def.library,
                                   tower_name)
        returned.append(node.name)
      for name, value in external.items():
        if name.startswith('^'):
          input_map['^' + prefix + name[1:]] = self._control_tensor(
              copies.get(value.name, value))
        else:
          input_map[prefix + name] = copies.get(value.name, value)
    with tf1.device(lambda op: devices.get(op.name, op.device)):
      imported = tf1.import_graph_def(
          graph_def, input_map=input_map, return_elements=returned, name='')
    self._copied.update(ops)
    position = 0
    for tower_id in range(1, len(self._devices)):
      copies = self._copies[tower_id]
      for op in ops:
        new_op = imported[position]
        position += 1
        copies[op.name] = new_op
        for old, new in zip(op.outputs, new_op.outputs):
          copies[old.name] = new

  def name_scope(self, tower_id):
    """The name scope (ending in '/') of tower `tower_id`'s copies."""
    return self._prefixes[tower_id]

  def device(self, tower_id):
    """Tower `tower_id`'s device."""
    return self._devices[tower_id]

  def _control_tensor(self, op):
    """A tensor whose op stands for `op` as a control input of a copy.

    `import_graph_def` remaps control inputs to the op of a tensor; an op
    without outputs (e.g. a resource variable's update) gets a constant that
    depends on it, made once and shared by the towers.
    """
    if op.outputs:
      return op.outputs[0]
    proxy = self._control_proxies.get(op.name)
    if proxy is None:
      with tf1.device(op.device), tf1.control_dependencies([op]):
        proxy = tf.constant(0, name='control_proxy')
      self._control_proxies[op.name] = proxy
    return proxy

  def get(self, tower_id, value):
    """Tower `tower_id`'s copy of a tower-0 value (itself where shared).

    Args:
      tower_id: a tower other than 0.
      value: a `Tensor`, `Operation`, `IndexedSlices` or None.

    Returns:
      The copy, of the same kind.
    """
    if value is None:
      return None
    if isinstance(value, tf.IndexedSlices):
      return tf.IndexedSlices(
          self.get(tower_id, value.values), self.get(tower_id, value.indices),
          self.get(tower_id, value.dense_shape))
    return self._copies[tower_id].get(value.name, value)

  def _window(self):
    return self._graph.get_operations()[self._first_op_index:]

  def _window_items(self, key, window_ops):
    window = set(window_ops)
    return [item for item in self._graph.get_collection(key)
            if op_kinds.op_of(item) in window]

  def _shared_ops(self, window):
    """Ops of tower 0 that every tower uses as they are.

    The state (variables and tables, `stateful_op_types`), the plain reads
    of shared variables, and what fills a shared table (its initializer:
    the one `tables_initializer` runs). A write of a shared variable or
    table that a copy needs is copied, so every tower makes it, as its own
    `model_fn` call would; the reads and writes of a variable each tower
    has its own (`own_variables`) are copied and read or write that one.
    """
    shared = set(self._shared)
    shared.update(self._always_shared(window))
    own = self._own_variable_ops
    stateful = self._stateful_op_types
    for op in window:
      op_type = op.type
      if op_type in stateful:
        shared.add(op)
      elif op_type in op_kinds.TABLE_INITIALIZER_OP_TYPES:
        if op.inputs and op.inputs[0].op.type in stateful:
          shared.add(op)
      elif op_kinds.is_plain_read(op) and op.inputs[0].op not in own:
        shared.add(op)
    return shared

  # What subclasses decide.

  def _always_shared(self, window):
    """Ops of the window every tower shares besides the stateful ones."""
    del window  # None by default.
    return ()

  def _requested_device(self, op):
    """The device tower-0 op `op` asked for; None: copies go where it went."""
    return self.requested_devices.get(op.name)

  def _tower_device(self, requested, device):
    """Where an op that requested `requested` goes on tower `device`."""
    raise NotImplementedError('Subclasses place the copies.')

  def _copy_device(self, op, node_def, tower_id, devices):
    """Where tower `tower_id` gets its copy of `op`.

    Args:
      op: a tower-0 op.
      node_def: its `NodeDef`.
      tower_id: the tower.
      devices: the devices of the copies placed so far in this round, by
        name.

    Returns:
      A device string.
    """
    colocated = node_defs.colocation_targets(node_def)
    for target in colocated:
      name = self._prefixes[tower_id] + target
      if name in devices:
        return devices[name]
      if target in self._copies[tower_id]:
        return self._copies[tower_id][target].device
      if target != op.name:
        # With a tower op not copied in this round (the loss that
        # `colocate_gradients_with_ops` puts the gradient seed with): where
        # that op's copy goes, as a call would colocate with its own.
        target_op = self._graph.get_operation_by_name(target)
        if target_op in self._tower_ops:
          return self._copy_device(target_op, target_op.node_def, tower_id,
                                   devices)
    requested = self._requested_device(op)
    if requested is None and not colocated:
      grouped = self._group_device(op, tower_id, devices)
      if grouped is not None:
        return grouped
    if requested is None or colocated:
      # Not placed by the tower's device function, or colocated with a
      # shared op: the same device in every tower.
      return op.device
    return self._placed(requested, tower_id)

  def _group_device(self, op, tower_id, devices):
    """Where a copy of a `tf.group` NoOp goes: with its copied inputs.

    TF's `group` (e.g. GATE_OP's `tuple` in a gradient) puts its NoOp on
    the device of the ops it waits for; None for any other op.
    """
    if op.type != 'NoOp' or not op.control_inputs or any(
        dep.device != op.device for dep in op.control_inputs):
      return None
    placed = set(devices.get(self._prefixes[tower_id] + dep.name)
                 for dep in op.control_inputs)
    return placed.pop() if len(placed) == 1 and None not in placed else None

  def _placed(self, requested, tower_id):
    """Tower `tower_id`'s device for an op that requested `requested`.

    A request of exactly tower 0's device is read as "this tower's device":
    that is what `tf.device(x.device)` of a tower-0 tensor `x` asks for, and
    what the same line gives in a tower built by its own `model_fn` call. (An
    op pinned to that device on purpose thus moves with its tower; on
    virtual CPUs of one machine that changes no result.)
    """
    key = (requested, tower_id)
    device = self._device_cache.get(key)
    if device is None:
      if requested and (device_util.canonicalize(requested) ==
                        device_util.canonicalize(self._devices[0])):
        device = self._devices[tower_id]
      else:
        device = self._tower_device(requested, self._devices[tower_id])
      self._device_cache[key] = device
    return device


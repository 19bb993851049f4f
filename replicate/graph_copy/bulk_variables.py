"""Many variables made with one `tf.import_graph_def`: copies and their slots.

`tf.Variable` builds a variable's ops (handle, initializer, read) one at a
time through Python. `VariablePlacement.REPLICATED` needs N-1 copies of
every trainable variable and of every optimizer slot; made one at a time
they are a large part of its build (measured in docs/performance.md,
"Private build paths"). `create_variables` writes the ops of a batch of
variables into one `GraphDef` (the op types, names, attributes and
devices `tf.Variable` gives them), imports it once and wraps each variable
from a `VariableDef`. `create_slot_copies` lets an optimizer make the
primaries' slots itself, then makes the copies' slots in bulk from them
and enters them where the optimizer looks slots up, so that its
`apply_gradients` makes none.
"""
import collections

from replicate import _compat
from replicate._compat import tf1


class VariableSpec(collections.namedtuple('VariableSpec', [
    'name', 'device', 'initial_value', 'resource', 'trainable',
    'collections', 'colocate_with', 'wrap_initial_value', 'synchronization',
    'aggregation', 'constraint'], defaults=(None, None, None))):
  """What `create_variables` makes one variable from.

  Attributes:
    name: the variable's op name (made unique in the graph, as TF does).
    device: its device (ignored with `colocate_with`).
    initial_value: a tensor of the graph, of a fully known shape: the
      variable's dtype, shape and initial value.
    resource: a resource variable (`VarHandleOp`), else a `VariableV2`.
    trainable: the variable's `trainable`.
    collections: the graph collections it joins.
    colocate_with: None, or a variable whose device every op of this one
      shares (a slot and its variable).
    wrap_initial_value: read `initial_value` through an identity named
      `<name>/Initializer/Identity` (what a callable initial value gives);
      else the initializer reads it directly.
    synchronization, aggregation: `tf.VariableSynchronization` and
      `tf.VariableAggregation` members, or None for the defaults.
    constraint: the variable's constraint function, or None.
  """


def can_create(initial_value):
  """Whether `create_variables` can make a variable from `initial_value`."""
  return initial_value is not None and (
      initial_value.shape.is_fully_defined())


def can_copy(variable):
  """Whether copies of `variable` can be made from its initial value.

  Not when TF guarded its initializer (the initial value reads other
  variables, read once they are initialized): the copies would read them
  unguarded.
  """
  initial_value = getattr(variable, 'initial_value', None)
  # An Operation, or (TF 1.15, after `init_from_checkpoint` replaced it) the
  # output of a reference variable's `Assign`.
  initializer = getattr(variable.initializer, 'op', variable.initializer)
  return can_create(initial_value) and (
      initializer.inputs[1] is initial_value)


def create_variables(graph, specs):
  """Makes one variable per spec, with one import for all of them.

  Args:
    graph: the graph to build in.
    specs: `VariableSpec`s.

  Returns:
    The variables, in the order of `specs`.
  """
  if not specs:
    return []
  with graph.as_default(), tf1.name_scope(None), (
      tf1.control_dependencies(None)), tf1.colocate_with(
          None, ignore_existing=True), tf1.device(None):
    names = [graph.unique_name(spec.name) for spec in specs]
    graph_def = tf1.GraphDef()
    graph_def.versions.CopyFrom(graph.graph_def_versions)
    input_map = {}
    devices = {}
    protos = []
    for spec, name in zip(specs, names):
      protos.append(_add_variable(graph_def, spec, name, input_map, devices))
    with tf1.device(lambda op: devices.get(op.name, op.device)):
      tf1.import_graph_def(graph_def, input_map=input_map, name='')
    variables = []
    for spec, proto in zip(specs, protos):
      variable = _compat.variable_from_def(proto)
      if spec.constraint is not None:
        _compat.set_variable_constraint(variable, spec.constraint)
      tf1.add_to_collections(list(spec.collections), variable)
      variables.append(variable)
  return variables


def _add_variable(graph_def, spec, name, input_map, devices):
  """Adds one variable's nodes; returns its `VariableDef`."""
  dtype = spec.initial_value.dtype.base_dtype
  device = spec.device
  if spec.colocate_with is not None:
    # An import cannot name an op outside it in `_class`: the device says
    # where the colocated ops go.
    device = spec.colocate_with.device
  external = name + '/_bulk_initial_value'
  input_map[external] = spec.initial_value
  initial = external
  initial_name = spec.initial_value.name
  if spec.wrap_initial_value:
    initial = name + '/Initializer/Identity'
    _node(graph_def, initial, 'Identity', [external], T=dtype,
          _class=[b'loc:@' + name.encode()])
    initial_name = initial + ':0'
  shape = spec.initial_value.shape.as_proto()
  proto = _compat.variable_def_proto(
      variable_name=name + ':0', initial_value_name=initial_name,
      initializer_name=name + '/Assign', trainable=spec.trainable,
      is_resource=spec.resource)
  if spec.synchronization is not None:
    proto.synchronization = spec.synchronization.value
  if spec.aggregation is not None:
    proto.aggregation = spec.aggregation.value
  if spec.resource:
    # Not the `IsInitialized/VarIsInitializedOp` tf.Variable adds: a
    # variable made from a `VariableDef` never reads it (its
    # `is_initialized()` makes a new one), and every copy would carry it.
    _node(graph_def, name, 'VarHandleOp', [], dtype=dtype, shape=shape,
          shared_name=name.encode(), container=b'')
    _node(graph_def, name + '/Assign', 'AssignVariableOp', [name, initial],
          dtype=dtype)
    read = name + '/Read/ReadVariableOp'
    _node(graph_def, read, 'ReadVariableOp', [name], dtype=dtype)
    for op_name in (name, name + '/Assign', read):
      devices[op_name] = device
  else:
    own = [b'loc:@' + name.encode()]
    _node(graph_def, name, 'VariableV2', [], dtype=dtype, shape=shape,
          shared_name=b'', container=b'')
    _node(graph_def, name + '/Assign', 'Assign', [name, initial], T=dtype,
          use_locking=True, validate_shape=True, _class=own)
    read = name + '/read'
    _node(graph_def, read, 'Identity', [name], T=dtype, _class=own)
    devices[name] = device
  proto.snapshot_name = read + ':0'
  return proto


def _node(graph_def, name, op_type, inputs, **attrs):
  """Adds a `NodeDef`; attrs: DType, TensorShapeProto, bool, bytes, list."""
  node = graph_def.node.add()
  node.name = name
  node.op = op_type
  node.input.extend(inputs)
  for key, value in attrs.items():
    if value is None:
      continue
    attr = node.attr[key]
    if isinstance(value, bool):
      attr.b = value
    elif isinstance(value, bytes):
      attr.s = value
    elif isinstance(value, list):
      attr.list.s.extend(value)
    elif hasattr(value, 'as_datatype_enum'):
      attr.type = value.as_datatype_enum
    else:
      attr.shape.CopyFrom(value)
  return node


def create_slot_copies(optimizer, primaries, copies, collections):
  """Makes `optimizer`'s slots: the primaries' its own way, copies' in bulk.

  The optimizer makes the slots of `primaries` as `apply_gradients` would;
  then each copy of a primary gets, for each slot of the primary, a slot of
  the same dtype, shape and initial value (read from the primary slot's
  initial value), named as the optimizer would name it, colocated with the
  copy, entered where `optimizer.get_slot` finds it: `apply_gradients`
  over primaries and copies then makes no slot. Slots it cannot copy are
  left to the optimizer.

  Args:
    optimizer: a `tf.compat.v1.train.Optimizer`.
    primaries: the variables whose slots the optimizer makes itself.
    copies: per primary, the list of its copies.
    collections: the collections the copies' slots join.

  Returns:
    How many slots were made in bulk; 0 where the optimizer has not the
    structure this needs (`_compat.optimizer_slots`): it then makes every
    slot itself, as without this call.
  """
  structure = _compat.optimizer_slots(optimizer)
  if structure is None or not primaries:
    return 0
  create_slots, slot_dict, var_key = structure
  create_slots(list(primaries))
  specs, entries = [], []
  for slot_name in optimizer.get_slot_names():
    slots = slot_dict(slot_name)
    for primary, primary_copies in zip(primaries, copies):
      slot = slots.get(var_key(primary))
      if slot is None or not _copyable(primary, slot):
        continue
      prefix = primary.op.name + '/'
      at = slot.op.name.find(prefix)
      for copy in primary_copies:
        if var_key(copy) in slots:
          continue
        name = (slot.op.name[:at] + copy.op.name + '/' +
                slot.op.name[at + len(prefix):])
        specs.append(VariableSpec(
            name=name, device=copy.device, initial_value=slot.initial_value,
            resource=slot.op.type == 'VarHandleOp', trainable=False,
            collections=collections, colocate_with=copy,
            wrap_initial_value=True))
        entries.append((slots, var_key(copy)))
  made = create_variables(tf1.get_default_graph(), specs)
  for (slots, key), slot in zip(entries, made):
    slots[key] = slot
  return len(made)


def _copyable(primary, slot):
  return (slot.op.name.find(primary.op.name + '/') >= 0 and
          can_create(slot.initial_value) and
          _compat.save_slice_info(primary) is None)

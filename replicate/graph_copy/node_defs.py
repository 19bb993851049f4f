"""Edits of an op's `NodeDef` as it becomes a copy on another device."""
import re

_SEED2_STRIDE = 1000003  # a prime: seed2 + i * stride differs per copy


def colocation_targets(node_def):
  """Names of the ops a `NodeDef` is colocated with (its `_class` attr)."""
  if '_class' not in node_def.attr:
    return []
  prefix = b'loc:@'
  return [g[len(prefix):].decode() for g in node_def.attr['_class'].list.s
          if g.startswith(prefix)]


def rename_colocation(node, prefix, copied):
  """Colocates a copy with the copies of the ops its original was with.

  Colocation with an op that is not copied (e.g. a variable) is dropped: the
  copy's device is set explicitly to that op's.
  """
  if '_class' not in node.attr:
    return
  groups = node.attr['_class'].list.s
  tag = b'loc:@'
  kept = [tag + prefix.encode() + g[len(tag):] for g in groups
          if g.startswith(tag) and g[len(tag):].decode() in copied]
  if kept:
    del groups[:]
    groups.extend(kept)
  else:
    del node.attr['_class']


# A tensor's name in an assertion's message: `'x (dense/BiasAdd:0) = '`.
_NAMED_TENSOR = re.compile(rb'\(([^()\s]+:\d+)\)')
_DT_STRING = 7  # types_pb2.DT_STRING


def tower_names(prefix, copies, copied):
  """`name -> name` of a copy's tensor for tower 0's tensor `name`.

  Args:
    prefix: the copy's name scope (`'tower_1/'`).
    copies: tower 0's tensor names -> the copy's tensors made so far.
    copied: names of tower 0's ops copied with this prefix now.
  """
  def tower_name(name):
    if name.rsplit(':', 1)[0] in copied:
      return prefix + name
    copy = copies.get(name)
    return name if copy is None else copy.name
  return tower_name


def rename_in_messages(node, op, tower_name):
  """Names the copy's own tensors in the message of an assertion.

  `tf.debugging.assert_*` writes the name of each tensor it shows into a
  string constant that only `Assert` ops read; a call of `model_fn` per
  device names that device's tensor. `tower_name` maps a name of tower 0's
  to the copy's.
  """
  if _is_message(node) and all(
      reader.type == 'Assert' for reader in op.outputs[0].consumers()):
    _rename_values(node, tower_name)


def rename_in_function_messages(definition, tower_name):
  """`rename_in_messages` for the body of a copy's own function (a TF 2
  `cond` branch holds its assertion's message), in place; `tower_name`
  from `outside_names`."""
  readers = {}
  for node in definition.node_def:
    for name in node.input:
      readers.setdefault(name.lstrip('^').split(':')[0], set()).add(node.op)
  for node in definition.node_def:
    if _is_message(node) and readers.get(node.name) == {'Assert'}:
      _rename_values(node, tower_name)


def outside_names(definition, tower_name):
  """`tower_name` for the messages in a function body and the functions it
  calls: a name of the body's own nodes is the same in every call's body
  (a `tf.function`'s assertion on its own tensor), and is kept."""
  own = set(node.name for node in definition.node_def)
  return lambda name: (
      name if name.rsplit(':', 1)[0] in own else tower_name(name))


def _is_message(node):
  return node.op == 'Const' and node.attr['dtype'].type == _DT_STRING


def _rename_values(node, tower_name):
  values = node.attr['value'].tensor.string_val
  for index, text in enumerate(values):
    values[index] = _NAMED_TENSOR.sub(
        lambda m: b'(' + tower_name(m.group(1).decode()).encode() + b')',
        text)


def reseeds(graph):
  """Whether copies of `graph`'s seeded random ops may get seeds of their own.

  Without a graph seed, a seeded random op has an op-level seed
  (`tf.random.uniform(..., seed=5)`): a call per device gives every device
  that seed and the same numbers, so the copies keep it too. With one, TF
  derives the op seed of an op without one from the graph (the op's
  position, or a count), which another call changes
  (`_compat.has_derived_seed` tells them apart).
  """
  return graph.seed is not None


def is_seeded(node):
  """Whether a `NodeDef` is a random op with a seed.

  An unseeded one (seed and seed2 both 0) draws its own numbers in every
  copy already.
  """
  return ('seed' in node.attr and 'seed2' in node.attr and
          bool(node.attr['seed'].i or node.attr['seed2'].i))


def offset_seed(node, tower_id):
  """Gives a seeded random op of copy `tower_id` its own `seed2`.

  Only for a top-level op whose seed TF derived from the graph's (see
  `reseeds`): another call of the function per device derives another seed
  and draws other numbers on every device.
  """
  if not is_seeded(node):
    return
  node.attr['seed2'].i = (node.attr['seed2'].i +
                          tower_id * _SEED2_STRIDE) % (1 << 31)


def calls_functions(node):
  """Whether a `NodeDef` names functions (a call, a branch, a loop body)."""
  return bool(function_refs(node))


def function_refs(node):
  """The `NameAttrList`s of the functions a `NodeDef`'s attributes name
  (editable in place)."""
  refs = []
  stack = list(node.attr.values())
  while stack:
    value = stack.pop()
    if value.HasField('func'):
      refs.append(value.func)
      stack.extend(value.func.attr.values())
    elif value.HasField('list'):
      for func in value.list.func:
        refs.append(func)
        stack.extend(func.attr.values())
  return refs


def input_name(tensor):
  """How a NodeDef names `tensor` as an input (`op` for output 0)."""
  return tensor.op.name if tensor.value_index == 0 else tensor.name

"""Each copy's own library functions, where their bodies name a device.

A TF 2 `If`, `While` or `PartitionedCall` built on tower 0 names functions
whose body nodes ask for tower 0's device: they were traced under its device
scope. A copy of the op that called the same functions would run the loop
or branch of every tower on tower 0's device. A call of `model_fn` on tower
`i` would have traced them under tower `i`'s device scope, so each copy gets
its own copy of such a function (and of the functions it calls), in which a
node that asked for exactly tower 0's device asks for the copy's device,
and an assertion's message names the copy's tensors (a `cond` branch holds
the message of a `tf.debugging.assert_*`). Other devices named in a body
(a user's `tf.device('/cpu:0')`) are kept, and a function that names tower
0's device nowhere is shared.

May import: `replicate.core`, `replicate._compat`, `graph_copy.node_defs`.
"""
from replicate import _compat
from replicate.core import device_util
from replicate.graph_copy import node_defs


class FunctionCopies(object):
  """The functions copies call, made per copy device on first use."""

  def __init__(self, graph, first_device):
    """Prepares to copy `graph`'s functions traced on `first_device`."""
    self._graph = graph
    self._first = device_util.canonicalize(first_device)
    self._names_first = {}  # function name -> names tower 0's device
    self._made = {}  # (function name, device) -> the copy's name

  def retarget(self, node, device, suffix, library, tower_name=None):
    """Points the function attributes of a copied `NodeDef` at `device`'s.

    Args:
      node: the copy's `NodeDef`, edited in place.
      device: the copy's device.
      suffix: appended to the names of the functions copied for it.
      library: the `FunctionDefLibrary` (of the `GraphDef` being imported)
        that new functions are added to.
      tower_name: maps tower 0's tensor names to the copy's, for the
        assertion messages of the functions copied
        (`node_defs.rename_in_function_messages`); None keeps them.
    """
    for ref in node_defs.function_refs(node):
      ref.name = self._function_for(ref.name, device, suffix, library,
                                    tower_name)

  def _function_for(self, name, device, suffix, library, tower_name):
    if not self._names_first_device(name, set()):
      return name
    key = (name, device)
    made = self._made.get(key)
    if made is not None:
      return made
    made = name + suffix
    while _compat.is_graph_function(self._graph, made) or any(
        f.signature.name == made for f in library.function):
      made += '_'
    self._made[key] = made  # before the body: a function may call itself
    definition = type(_compat.graph_function_def(self._graph, name))()
    definition.CopyFrom(_compat.graph_function_def(self._graph, name))
    definition.signature.name = made
    if tower_name is not None:
      tower_name = node_defs.outside_names(definition, tower_name)
    for body_node in definition.node_def:
      if body_node.device and device_util.canonicalize(
          body_node.device) == self._first:
        body_node.device = device
      self.retarget(body_node, device, suffix, library, tower_name)
    if tower_name is not None:
      node_defs.rename_in_function_messages(definition, tower_name)
    library.function.add().CopyFrom(definition)
    return made

  def _names_first_device(self, name, visiting):
    """Whether function `name`, or one it calls, asks for tower 0's device."""
    known = self._names_first.get(name)
    if known is not None:
      return known
    definition = _compat.graph_function_def(self._graph, name)
    if definition is None or name in visiting:
      return False
    visiting.add(name)
    names = False
    for body_node in definition.node_def:
      if body_node.device and device_util.canonicalize(
          body_node.device) == self._first:
        names = True
        break
      if any(self._names_first_device(ref.name, visiting)
             for ref in node_defs.function_refs(body_node)):
        names = True
        break
    self._names_first[name] = names
    return names

"""Per-copy functions: a copy's own branches and bodies where they draw.

A TF 2 `tf.cond`, `tf.while_loop` or function call is one op (`If`,
`While`, `PartitionedCall`, ...) whose attributes name functions of the
graph's library. A copy of the op names the same functions, so random ops
inside them would draw tower 0's numbers in every copy. Another `model_fn`
call would have built new functions with their own random ops; here a copy
gets renamed copies of the functions (and of the functions they call) that
hold seeded random ops, with seeds offset as for the copies of top-level
ops (`node_defs.offset_seed`). Functions without seeded random ops, and
the gradient functions of the originals, are shared.
"""
import re

from replicate import _compat
from replicate.graph_copy import node_defs


class FunctionCopies(object):
  """Renamed, reseeded copies of functions for one import (one round).

  The copy of function `f` for copy `tower_id` of prefix `p` is named
  `f_<p>`; one made by an earlier round is in the graph and is reused.
  """

  def __init__(self, graph, library):
    """Prepares copies of `graph`'s functions, to be added to `library`.

    Args:
      graph: the graph whose function library the originals are in.
      library: the `FunctionDefLibrary` of the `GraphDef` to import.
    """
    self._graph = graph
    self._library = library
    self._draws = {}  # function name -> whether it (or a callee) draws
    self._made = set()  # names of the copies in `library`

  def rename(self, node, prefix, tower_id):
    """Points `node` (a copy's `NodeDef`) at the copy's own functions.

    Args:
      node: the `NodeDef` of copy `tower_id`, edited in place.
      prefix: the copy's name scope, e.g. 'tower_1/'.
      tower_id: the copy's index (its seed offset).
    """
    for name_attr in _function_refs(node):
      if self._draws_numbers(name_attr.name):
        name_attr.name = self._copy(name_attr.name, prefix, tower_id)
    if self._draws_numbers(node.op):  # a direct call of a library function
      node.op = self._copy(node.op, prefix, tower_id)

  def _copy(self, name, prefix, tower_id):
    new_name = '{}_{}'.format(name, re.sub(r'[^A-Za-z0-9_]', '_',
                                           prefix.rstrip('/')))
    if new_name in self._made or _compat.is_graph_function(
        self._graph, new_name):
      return new_name
    self._made.add(new_name)
    function_def = self._library.function.add()
    function_def.CopyFrom(_compat.graph_function_def(self._graph, name))
    function_def.signature.name = new_name
    for node in function_def.node_def:
      node_defs.offset_seed(node, tower_id)
      self.rename(node, prefix, tower_id)
    return new_name

  def _draws_numbers(self, name):
    """Whether library function `name` holds a seeded random op."""
    draws = self._draws.get(name)
    if draws is None:
      function_def = _compat.graph_function_def(self._graph, name)
      self._draws[name] = False  # a recursive call draws nothing new
      draws = function_def is not None and any(
          node_defs.is_seeded(node) or self._draws_numbers(node.op) or any(
              self._draws_numbers(ref.name) for ref in _function_refs(node))
          for node in function_def.node_def)
      self._draws[name] = draws
    return draws


def calls_functions(node):
  """Whether a `NodeDef` names functions (a call, a branch, a loop body)."""
  return bool(_function_refs(node))


def _function_refs(node):
  """The `NameAttrList`s of the functions a `NodeDef`'s attributes name."""
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

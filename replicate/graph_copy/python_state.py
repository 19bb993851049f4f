"""Python state a copy of device 0's ops cannot reproduce.

A copy repeats device 0's ops; another call of the user's function would
run its Python again. Two kinds of ops carry what that Python did:

* random ops seeded by a number drawn from Python's random generators
  (Keras's `backend.dropout`, `random_normal` and `GaussianNoise` draw an
  op seed with `numpy.random` when given none): another call draws another
  seed, a copy keeps device 0's and draws the same numbers;
* a stateful `tf.py_func` / `tf.numpy_function` / `tf.py_function` whose
  Python function keeps state of its own (a closure, a default argument or
  class made by the call, a bound method, a callable object): another call
  makes another function, with its own state, where every copy would call
  device 0's.

`PythonState` notes the generators' state when device 0 starts, and names
such ops among those about to be copied. May import `_compat` and `core`.
"""
import functools
import inspect
import random
import types

import numpy as np
import tensorflow as tf

from replicate import _compat
from replicate._compat import tf1
from replicate.core import op_kinds
from replicate.graph_copy import node_defs

_PY_FUNC_OP_TYPES = frozenset(['PyFunc', 'EagerPyFunc'])  # not PyFuncStateless


class PythonState(object):
  """What device 0's Python did that its copies cannot repeat."""

  def __init__(self):
    """Notes the state of `numpy.random` and `random` (call it before the
    user's function runs on device 0)."""
    self._numpy = np.random.get_state()
    self._random = random.getstate()

  def _drawn(self):
    """Whether `numpy.random` or `random` has drawn numbers since."""
    numpy_now = np.random.get_state()
    return (random.getstate() != self._random or
            numpy_now[2] != self._numpy[2] or
            not np.array_equal(numpy_now[1], self._numpy[1]))

  def reason_not_to_copy(self, ops):
    """Why copies of `ops` would not do what another call builds, or None.

    Args:
      ops: device-0 `Operation`s about to be copied (variable initializers
        left out: variables are shared, never copied).

    Returns:
      A clause naming the first op concerned, or None.
    """
    for op in ops:
      if op.type in _PY_FUNC_OP_TYPES:
        function = _compat.py_func_function(op)
        if function is not None and _keeps_state(function):
          return ('built the {} op {} calling {!r}, which keeps Python '
                  'state of its own (a closure, a default argument or '
                  'class made by the call, a bound method or a callable '
                  'object): every copy would call that one object, where '
                  'each call makes its own'.format(op.type, op.name,
                                                   function))
    if not self._drawn():
      return None
    for op in ops:
      if _python_seeded(op):
        return ('drew numbers from Python\'s random generators '
                '(numpy.random or random) and built the random op {} with an '
                'explicit seed, which may be one of them (Keras\'s '
                'backend.dropout, random_normal and GaussianNoise draw one '
                'from numpy.random when given none): another call would draw '
                'another seed, a copy keeps device 0\'s'.format(op.name))
    return None


def copied_ops(window):
  """The ops of `window` (device 0's, in creation order) less those that
  only compute its variables' initial values, which are never copied."""
  if not window:
    return []
  window_set = set(window)
  graph = window[0].graph
  # (`init_from_checkpoint` leaves some an initializer that is a tensor.)
  initializers = [
      op_kinds.op_of(v.initializer) for key in (tf1.GraphKeys.GLOBAL_VARIABLES,
                                               tf1.GraphKeys.LOCAL_VARIABLES)
      for v in graph.get_collection(key) if v.op in window_set]
  initial = op_kinds.backward_cone(
      op for op in initializers if op is not None) & window_set
  return [op for op in window if op not in initial]


def _python_seeded(op):
  """Whether `op` is a random op seeded by a number fixed at build time."""
  node = op.node_def
  if node_defs.is_seeded(node):
    return not (node_defs.reseeds(op.graph) and _compat.has_derived_seed(
        op, node.attr['seed'].i, node.attr['seed2'].i))
  if not op.type.startswith('Stateless'):
    return False
  names = [arg.name for arg in op.op_def.input_arg]
  return 'seed' in names and tf.get_static_value(
      op.inputs[names.index('seed')]) is not None


def _keeps_state(function):
  """Whether a py_func's Python function may hold state that another call
  of the user's function would make anew: a closure's cells, a default
  argument or a class made by the call, a bound method's instance, a
  partial's arguments, a callable object's attributes. A module-level
  function (or class, builtin, ufunc) is the same object in every call, and
  so is what it holds."""
  if isinstance(function, functools.partial):
    return True
  if isinstance(function, types.FunctionType):
    # (A decorator's wrapper holds the function it wraps in a cell.)
    defaults = (list(function.__defaults__ or ()) +
                list((function.__kwdefaults__ or {}).values()))
    return bool(function.__closure__) or (
        _made_by_a_call(function) and
        not all(_holds_no_state(value) for value in defaults))
  if inspect.ismethod(function) or inspect.isbuiltin(function):
    owner = function.__self__
    if owner is None or isinstance(owner, types.ModuleType):
      return False  # a builtin function
    return _made_by_a_call(owner) if isinstance(owner, type) else True
  wrapped = getattr(function, '__wrapped__', None)
  if wrapped is not None:  # a wrapper object (numpy's dispatchers)
    return _keeps_state(wrapped)
  return hasattr(function, '__dict__') and not isinstance(function, type)


def _made_by_a_call(item):
  """Whether a function or class was defined inside a function, so that
  each call of that function makes another."""
  return '<locals>' in getattr(item, '__qualname__', '')


_IMMUTABLE_TYPES = (type(None), bool, int, float, complex, str, bytes,
                    frozenset, type(Ellipsis), np.generic, np.dtype,
                    tf.DType)


def _holds_no_state(value):
  """Whether a default argument is the same, unchanged, in every call: an
  immutable value, or a module-level class or stateless function."""
  if isinstance(value, tuple):
    return all(_holds_no_state(item) for item in value)
  if isinstance(value, _IMMUTABLE_TYPES):
    return True
  if isinstance(value, type):
    return not _made_by_a_call(value)
  return callable(value) and not _keeps_state(value)

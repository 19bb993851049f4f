"""`gate_gradients` of towers and replicas, and the ops a call creates.

Towers and replicas compute their gradients with the wrapped optimizer's own
`compute_gradients` and the `gate_gradients` given (`GATE_OP` by default):
TF's `tuple` per gradient op is what keeps a variable's update from running
while a backward op (e.g. `dY . W^T`) still reads the variable, whichever
ops lie between the variable and that reader (a `read` snapshot, a
`Transpose` or `Reshape` that aliases its buffer, control flow).
"""
from replicate import errors
from replicate._compat import tf1

_GATES = (tf1.train.Optimizer.GATE_NONE, tf1.train.Optimizer.GATE_OP,
          tf1.train.Optimizer.GATE_GRAPH)


def check_gate_gradients(kwargs):
  """Checks the `gate_gradients` of `compute_gradients`' keyword arguments.

  Raises:
    InvalidArgumentError: if it is not `GATE_NONE`, `GATE_OP` or
      `GATE_GRAPH`.
  """
  gate_gradients = kwargs.get('gate_gradients', tf1.train.Optimizer.GATE_OP)
  if gate_gradients not in _GATES:
    raise errors.InvalidArgumentError(
        'gate_gradients must be TowerOptimizer.GATE_NONE, GATE_OP or '
        'GATE_GRAPH, got {!r}.'.format(gate_gradients))


def ops_created_by(graph, fn):
  """Calls `fn()` and returns its result and the ops it added to `graph`.

  Args:
    graph: the graph `fn` builds in.
    fn: a function with no arguments.

  Returns:
    `(result, ops)`: `fn`'s return value and the list of new operations, in
    creation order.
  """
  first = len(graph.get_operations())
  result = fn()
  return result, graph.get_operations()[first:]

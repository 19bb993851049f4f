"""Tower 0's ops copied onto the other towers (graph_copy does the copying).

`TowerCloner` is `graph_copy.GraphCopier` with the towers' rules: copies are
named `tower_<i>/`, placed by the towers' device function
(device_setter.py), and share tower 0's `UPDATE_OPS` (the moving statistics
come from tower 0, see tower_collections.py). What to copy and when is
decided in tower_cloning.py.
"""
from replicate._compat import tf1
from replicate.core import op_kinds
from replicate.graph_copy import graph_copier
from replicate.graph_copy import node_defs
from replicate.graph_copy import python_state
from replicate.towers import device_setter


class TowerCloner(graph_copier.GraphCopier):
  """Copies what tower 0 built onto towers 1..N-1, one round per request."""

  def __init__(self, graph, devices, first_op_index, tower_inputs):
    """Prepares to copy tower 0 of `graph`.

    Args:
      graph: the graph the towers are built in.
      devices: the tower devices, tower 0's first.
      first_op_index: how many ops `graph` had when tower 0 started.
      tower_inputs: for each tower, the flat list of tensors its `model_fn`
        call gets (features and labels, composite tensors expanded), in the
        same order for every tower.
    """
    super(TowerCloner, self).__init__(
        graph, devices, first_op_index, tower_inputs,
        stateful_op_types=op_kinds.STATEFUL_OP_TYPES, scope_name='tower')
    self._python_state = python_state.PythonState()
    self._first_inputs = frozenset(t.name for t in tower_inputs[0]
                                   if t is not None)

  def reason_not_to_clone(self, tower_context_requested, sum_reduction):
    """Why tower 0 must not be copied, or None when it may be.

    Args:
      tower_context_requested: whether `model_fn` called
        `replicate.get_tower_context()` while building tower 0.
      sum_reduction: whether the loss reduction is `SUM`.

    Returns:
      A sentence for the warning, or None.
    """
    if tower_context_requested:
      return ('model_fn calls replicate.get_tower_context(), so its towers '
              'may differ (to build a summary once, drop the call: a copied '
              'model runs model_fn once)')
    window = self._window()
    if sum_reduction and self._window_items(
        tf1.GraphKeys.REGULARIZATION_LOSSES, window):
      return ('loss_reduction is SUM and model_fn creates regularization '
              'losses, which only tower 0 may count')
    for op in window:
      requested = self.requested_devices.get(op.name)
      if (requested is not None and op.device != self._placed(requested, 0)
          and op.type not in op_kinds.STATEFUL_OP_TYPES and
          not node_defs.colocation_targets(op.node_def)):
        return ('a device scope around the replicated model_fn moved {} to '
                '{!r}'.format(op.name, op.device))
    reason = self._python_state.reason_not_to_copy(
        python_state.copied_ops(window))
    return None if reason is None else 'model_fn ' + reason

  def reason_call_values(self, named_tensors):
    """Why tensors of tower 0's call would differ in another call, or None.

    A tensor tower 0's `model_fn` call computed from the tower's rows, or
    with a random op, has another value in another tower's call (e.g. the
    last tower's, whose optimizer applies when towers are built by calls).

    Args:
      named_tensors: `(description, tensor)` pairs, e.g. an optimizer's
        learning rate.
    """
    window = set(self._window())
    for what, tensor in named_tensors:
      pending = [tensor.op] if tensor.op in window else []
      seen = set(pending)
      while pending:
        op = pending.pop()
        if 'seed2' in op.node_def.attr:
          return '{} is drawn by a random op of its call ({})'.format(
              what, op.name)
        if any(t.name in self._first_inputs for t in op.inputs):
          return '{} is computed from the tower\'s rows ({})'.format(
              what, op.name)
        for source in [t.op for t in op.inputs] + list(op.control_inputs):
          if source in window and source not in seen:
            seen.add(source)
            pending.append(source)
    return None

  def reason_variables_made_anew(self, targets, own=()):
    """Why copies of what `targets` need would not write what calls write.

    Each `model_fn` call makes its own `tf.Variable`s (only `get_variable`
    shares tower 0's); a copy writes tower 0's. A non-trainable variable
    tower 0 made so (a running statistic in the forward pass) and the ops
    `targets` need write would count every tower's rows where a call's
    counts its own. (Trainable ones made anew, a Keras layer's, are shared:
    calls refuse them, tower_build.check_tower.) Metric variables, and
    `own`, are the copies' own (output_copies.py).

    Args:
      targets: tower-0 tensors and ops the copies are made for.
      own: variables each copy gets its own of (an EVAL copy's metric
        state).

    Returns:
      A sentence for the warning, or None.
    """
    window = set(self._window())
    graph = self._graph
    trainable = [v for v in tf1.trainable_variables() if v.op in window]
    skipped = set(id(v) for v in trainable + list(own) + graph.get_collection(
        tf1.GraphKeys.METRIC_VARIABLES))
    made = [v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES) +
            graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES)
            if v.op in window and id(v) not in skipped and _made_anew(v)]
    if not made or any(_made_anew(v) for v in trainable):
      return None
    cone = op_kinds.backward_cone(
        op_kinds.op_of(t) for t in targets) & window
    for variable in made:
      if op_kinds.variable_writes(variable.op, cone):
        return ('model_fn makes variable {} anew (not with get_variable) '
                'and writes it, where each call makes its own'.format(
                    variable.op.name))
    return None

  def _always_shared(self, window):
    return [op_kinds.op_of(item) for item in self._window_items(
        tf1.GraphKeys.UPDATE_OPS, window)]

  def _tower_device(self, requested, device):
    return device_setter.tower_device(requested, device)


def _made_anew(variable):
  """Whether `variable` was made outside the variable store (a `tf.Variable`,
  a Keras weight): another `model_fn` call would make another one."""
  with tf1.variable_scope(tf1.VariableScope(reuse=True),
                          auxiliary_name_scope=False):
    try:
      found = tf1.get_variable(variable.op.name)
    except ValueError:
      return True
  return found is not variable

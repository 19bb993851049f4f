"""Kinds of ops by type: variables and their reads, tables, TF1 control flow.

The one place that names op types: what owns state (never copied, placed on
a parameter device), what reads or writes a variable, what a TF1 loop or
branch is made of. Imports nothing of the package but `_compat`.
"""
import tensorflow as tf

from replicate import _compat
from replicate._compat import tf1

# Ops that read a variable without copying it: a reference variable's
# snapshot (`Identity`) and a resource variable's `ReadVariableOp`.
READ_OP_TYPES = frozenset(['Identity', 'ReadVariableOp'])
# Ops that are a variable.
VARIABLE_OP_TYPES = frozenset(['VariableV2', 'Variable', 'VarHandleOp'])
# Ops that make a lookup table (the v1 reference and v2 resource kinds, and
# TF 2's anonymous ones). A static table holds what its initializer put in;
# a mutable one is also written by inserts and saved in checkpoints.
STATIC_TABLE_OP_TYPES = frozenset([
    'HashTable', 'HashTableV2', 'AnonymousHashTable',
])
MUTABLE_TABLE_OP_TYPES = frozenset([
    'MutableHashTable', 'MutableHashTableV2', 'MutableHashTableOfTensors',
    'MutableHashTableOfTensorsV2', 'MutableDenseHashTable',
    'MutableDenseHashTableV2', 'AnonymousMutableHashTable',
    'AnonymousMutableHashTableOfTensors', 'AnonymousMutableDenseHashTable',
])

# Ops that fill a whole table (input 0) from their other inputs: the
# initializers `TABLE_INITIALIZERS` holds, and imports.
TABLE_INITIALIZER_OP_TYPES = frozenset([
    'InitializeTable', 'InitializeTableV2', 'InitializeTableFromTextFile',
    'InitializeTableFromTextFileV2', 'InitializeTableFromDataset',
    'LookupTableImport', 'LookupTableImportV2',
])

# Variables, and the state a device function puts next to them on a
# parameter device (as `tf.compat.v1.train.replica_device_setter` does): the
# mutable tables. A static table is rebuilt by its initializer in every
# session, from files that may exist only where the model runs, so it stays
# with the ops around it.
PARAMETER_OP_TYPES = frozenset([
    'Variable',
    'VariableV2',
    'VarHandleOp',
    'AutoReloadVariable',
]) | MUTABLE_TABLE_OP_TYPES

# Ops that own state (variables, tables): never copied, every copy uses them
# as they are, as calls of one model function share variables through
# variable scopes. A table's initializer is the original's alone (run once,
# by `tables_initializer`). A write of the state in what a copy needs is
# copied like any other op: every copy makes it, as another call would.
STATEFUL_OP_TYPES = PARAMETER_OP_TYPES | STATIC_TABLE_OP_TYPES


# Ops taking a variable (its ref or its resource handle) only to read it.
VARIABLE_READER_OP_TYPES = frozenset([
    'ReadVariableOp', 'ResourceGather', 'ResourceGatherNd', 'VariableShape',
    'VarIsInitializedOp', 'IsVariableInitialized'])
# Ops passing a variable's ref or handle on (identities, control flow).
VARIABLE_FORWARD_OP_TYPES = frozenset([
    'Identity', 'RefIdentity', 'IdentityN', 'Switch', 'RefSwitch', 'Enter',
    'RefEnter', 'Merge', 'RefMerge', 'Exit', 'RefExit', 'NextIteration',
    'RefNextIteration'])


# TF 2 functional control flow and function calls: ops whose functions get
# a resource handle as an argument, to read it or write it.
FUNCTION_CALL_OP_TYPES = frozenset([
    'While', 'StatelessWhile', 'If', 'StatelessIf', 'Case', 'StatelessCase',
    'PartitionedCall', 'StatefulPartitionedCall'])


# The kernels of optimizers' updates (`ApplyAdam`, `ResourceSparseApplyFtrl`,
# Keras' `ResourceApplyKerasMomentum`...): only optimizers make them.
OPTIMIZER_UPDATE_PREFIXES = ('Apply', 'ResourceApply', 'SparseApply',
                             'ResourceSparseApply')

# TF 2-style summary writes (`tf.compat.v2.summary`, `summary_ops_v2`).
SUMMARY_WRITE_OP_TYPES = frozenset([
    'WriteSummary', 'WriteScalarSummary', 'WriteHistogramSummary',
    'WriteImageSummary', 'WriteAudioSummary', 'WriteRawProtoSummary',
    'WriteGraphSummary', 'ImportEvent'])

# TF 1 summary ops (`tf.compat.v1.summary.*`): they make a `Summary` proto
# whose tag is the name scope they were made in.
SUMMARY_V1_OP_TYPES = frozenset([
    'ScalarSummary', 'HistogramSummary', 'ImageSummary', 'AudioSummary',
    'AudioSummaryV2', 'TensorSummary', 'TensorSummaryV2', 'MergeSummary'])

# Ops that read a checkpoint (a `Saver`'s restore).
RESTORE_OP_TYPES = frozenset(['RestoreV2', 'Restore', 'RestoreSlice'])


def restores(write):
  """Whether the write `write` assigns a value read from a checkpoint.

  A `Saver`'s restore op assigns a `RestoreV2` output, directly or through
  an `Identity` (resource variables).
  """
  if len(write.inputs) < 2:
    return False
  source = write.inputs[1].op
  while source.type == 'Identity' and source.inputs:
    source = source.inputs[0].op
  return source.type in RESTORE_OP_TYPES


def is_variable(tensor):
  """Whether `tensor` is a variable itself: a ref or a resource handle."""
  return (tensor.dtype == tf.resource or
          tensor.dtype != tensor.dtype.base_dtype)  # a ref


def variable_writes(variable_op, within=None):
  """The ops that write the variable of `variable_op` (its ref or handle
  followed through identities and control flow). A call of functions (a
  TF 2 `cond` or `while_loop`, a `tf.function`) that only read the handle
  or pass it on is no write; one whose functions cannot be read is.

  Args:
    variable_op: a `VariableV2` or `VarHandleOp`.
    within: a set of ops to look in; None for the whole graph.
  """
  writes = []
  pending = [variable_op.outputs[0]]
  seen = set()
  bodies = {}
  while pending:
    tensor = pending.pop()
    for op in tensor.consumers():
      if (within is not None and op not in within) or op in seen:
        continue
      seen.add(op)
      if op.type in VARIABLE_READER_OP_TYPES:
        continue
      if tensor.dtype != tf.resource and not any(
          arg.is_ref for arg in op.op_def.input_arg):
        continue  # takes the ref's value: a read
      if op.type in VARIABLE_FORWARD_OP_TYPES:
        pending.extend(t for t in op.outputs if is_variable(t))
        continue
      returned = _call_passes_on(op, tensor, bodies)
      if returned is None:
        writes.append(op)
      else:
        pending.extend(op.outputs[i] for i in returned)
  return writes


def _called(graph, node_def, index):
  """The names of the functions that get input `index` of the call
  `node_def` (a `NodeDef`), and the argument it is there; ([], None) where
  it is no function's argument (a branch index), None if not a call."""
  op_type = node_def.op
  attr = node_def.attr
  if op_type in ('If', 'StatelessIf', 'Case', 'StatelessCase'):
    if index == 0:
      return [], None
    if op_type.endswith('If'):
      names = [attr['then_branch'].func.name, attr['else_branch'].func.name]
    else:
      names = [func.name for func in attr['branches'].list.func]
    return names, index - 1
  if op_type in ('While', 'StatelessWhile'):
    return [attr['cond'].func.name, attr['body'].func.name], index
  if op_type in ('PartitionedCall', 'StatefulPartitionedCall'):
    return [attr['f'].func.name], index
  if _compat.is_graph_function(graph, op_type):
    return [op_type], index
  return None


def _call_passes_on(op, tensor, bodies):
  """Where the function call `op` only reads the variable `tensor` (a
  resource handle): the indices of its outputs that are the handle again
  (a loop's variable, a branch returning it). None where a function may
  write it, or cannot be read: a write, to be safe. `bodies` memoizes
  (function name, argument) across calls."""
  if tensor.dtype != tf.resource:
    return None
  returned = set()
  for index, source in enumerate(op.inputs):
    if source is not tensor:
      continue
    called = _called(op.graph, op.node_def, index)
    if called is None:
      return None
    for name in called[0]:
      results = _passed_on(op.graph, name, called[1], bodies)
      if results is None:
        return None
      returned.update(results)
  if not returned <= set(range(len(op.outputs))):
    return None
  return sorted(returned)


def _passed_on(graph, name, index, bodies):
  """`_argument_passed_on`, memoized in `bodies` by (function, argument); a
  recursive call is None, a write, to be safe."""
  key = (name, index)
  if key not in bodies:
    bodies[key] = None
    bodies[key] = _argument_passed_on(graph, name, index, bodies)
  return bodies[key]


def _argument_passed_on(graph, name, index, bodies):
  """What function `name`'s argument `index` (a resource handle) becomes:
  the indices of the function's results that are the handle, where the
  body only reads it, passes it on or calls functions that do; else
  None."""
  definition = _compat.graph_function_def(graph, name)
  if definition is None or index >= len(definition.signature.input_arg):
    return None
  consumers = {}
  for node in definition.node_def:
    for position, source in enumerate(node.input):
      consumers.setdefault(source, []).append((node, position))
  names = set()
  pending = [definition.signature.input_arg[index].name]
  while pending:
    source = pending.pop()
    if source in names:
      continue
    names.add(source)
    for node, position in consumers.get(source, ()):
      if node.op in VARIABLE_READER_OP_TYPES:
        continue
      if node.op in ('Identity', 'IdentityN'):
        pending.append(_output_name(
            graph, node, position if node.op == 'IdentityN' else 0))
        continue
      called = _called(graph, node, position)
      if called is None:
        return None
      for nested in called[0]:
        results = _passed_on(graph, nested, called[1], bodies)
        if results is None:
          return None
        pending.extend(_output_name(graph, node, i) for i in results)
  return [i for i, arg in enumerate(definition.signature.output_arg)
          if definition.ret[arg.name] in names]


def backward_cone(ops):
  """`ops` (an iterable) and every op they depend on (data and control
  inputs)."""
  pending = list(ops)
  seen = set(pending)
  while pending:
    op = pending.pop()
    for dependency in [t.op for t in op.inputs] + list(op.control_inputs):
      if dependency not in seen:
        seen.add(dependency)
        pending.append(dependency)
  return seen


def op_of(item):
  """The `Operation` of a collection item (an op, tensor or variable)."""
  if isinstance(item, tf1.Operation):
    return item
  return getattr(item, 'op', None)


def is_plain_read(op):
  """A read of a variable without control inputs: the same in every copy."""
  op_type = op.type
  if (op_type not in READ_OP_TYPES or op.control_inputs or
      len(op.inputs) != 1):
    return False
  source = op.inputs[0]
  if op_type == 'Identity':
    return (source.op.type in VARIABLE_OP_TYPES and
            source.dtype._is_ref_dtype)  # pylint: disable=protected-access
  return source.op.type == 'VarHandleOp'


def variable_snapshot(variable):
  """The read a variable made with itself, if a plain read; else None.

  A `RefVariable`'s `<name>/read`, a `ResourceVariable`'s
  `<name>/Read/ReadVariableOp`: layers read these (`variable.value()`).
  """
  name = variable.to_proto().snapshot_name
  if not name:
    return None
  tensor = variable.graph.get_tensor_by_name(name)
  op = tensor.op
  if not is_plain_read(op) or op.inputs[0].op is not variable.op:
    return None
  return tensor


def _output_name(graph, node_def, index):
  """How a function body names output `index` of its node `node_def`: by
  the op's output argument, which is `output` for identities, control flow
  and calls, and the function's own result names for a call by name."""
  if _compat.is_graph_function(graph, node_def.op):
    results = _compat.graph_function_def(graph, node_def.op).signature
    return '{}:{}:0'.format(node_def.name, results.output_arg[index].name)
  return '{}:output:{}'.format(node_def.name, index)

"""Kinds of ops by type: variables and their reads, tables, TF1 control flow.

The one place that names op types: what owns state (never copied, placed on
a parameter device), what reads or writes a variable, what a TF1 loop or
branch is made of. Imports nothing of the package but `_compat`.
"""
import tensorflow as tf

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
  followed through identities and control flow).

  Args:
    variable_op: a `VariableV2` or `VarHandleOp`.
    within: a set of ops to look in; None for the whole graph.
  """
  writes = []
  pending = [variable_op.outputs[0]]
  seen = set()
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
      else:
        writes.append(op)
  return writes


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

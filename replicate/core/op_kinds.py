"""Kinds of ops by type: variables and their reads, tables, TF1 control flow.

The one place that names op types: what owns state (never copied, placed on
a parameter device), what reads a variable, what a TF1 loop or branch is
made of. Imports nothing of the package but `_compat`.
"""
from replicate._compat import tf1

# Ops that read a variable without copying it: a reference variable's
# snapshot (`Identity`) and a resource variable's `ReadVariableOp`.
READ_OP_TYPES = frozenset(['Identity', 'ReadVariableOp'])
# Ops that are a variable.
VARIABLE_OP_TYPES = frozenset(['VariableV2', 'Variable', 'VarHandleOp'])
# TF1 control flow: ops that run in a loop's frame or a branch.
CONTROL_FLOW_OP_TYPES = frozenset([
    'Enter', 'RefEnter', 'Switch', 'RefSwitch', 'Merge', 'RefMerge', 'Exit',
    'RefExit', 'NextIteration', 'RefNextIteration', 'LoopCond'])
# Those of them through which a loop or a branch receives a tensor.
CONTROL_FLOW_ENTRY_TYPES = frozenset(['Enter', 'RefEnter', 'Switch',
                                      'RefSwitch'])

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

"""Which ops of an original graph its copies share, and how they read."""
from replicate._compat import tf1
from replicate.gradients import gradient_gating

# Ops that own state (variables, tables): never copied, every copy uses
# them as they are.
STATEFUL_OP_TYPES = frozenset([
    'Variable',
    'VariableV2',
    'VarHandleOp',
    'AutoReloadVariable',
    'MutableHashTable',
    'MutableHashTableV2',
    'MutableHashTableOfTensors',
    'MutableHashTableOfTensorsV2',
    'MutableDenseHashTable',
    'MutableDenseHashTableV2',
])

# Ops that write the variable (reference or resource handle) of input 0. A
# write of a variable the copies share is the original's alone, never copied:
# one writer per step (for towers, as for the update ops of `UPDATE_OPS`,
# e.g. the moving statistics of a Keras BatchNormalization layer object,
# which are not in that collection).
WRITE_OP_TYPES = frozenset([
    'Assign', 'AssignAdd', 'AssignSub', 'AssignVariableOp',
    'AssignAddVariableOp', 'AssignSubVariableOp', 'ScatterAdd', 'ScatterSub',
    'ScatterMul', 'ScatterDiv', 'ScatterMin', 'ScatterMax', 'ScatterUpdate',
    'ResourceScatterAdd', 'ResourceScatterSub', 'ResourceScatterMul',
    'ResourceScatterDiv', 'ResourceScatterMin', 'ResourceScatterMax',
    'ResourceScatterUpdate',
])


def op_of(item):
  """The `Operation` of a collection item (an op, tensor or variable)."""
  if isinstance(item, tf1.Operation):
    return item
  return getattr(item, 'op', None)


def is_plain_read(op):
  """A read of a variable without control inputs: the same in every copy."""
  op_type = op.type
  if (op_type not in gradient_gating.READ_OP_TYPES or op.control_inputs or
      len(op.inputs) != 1):
    return False
  source = op.inputs[0]
  if op_type == 'Identity':
    return (source.op.type in gradient_gating.VARIABLE_OP_TYPES and
            source.dtype._is_ref_dtype)  # pylint: disable=protected-access
  return source.op.type == 'VarHandleOp'


def read_device(read_op):
  """Where a plain read runs: its device, else its variable's.

  A resource variable's read is built without a device (`value()` leaves
  every device scope) and placed next to the variable by TF's placer.
  """
  return read_op.device or read_op.inputs[0].op.device

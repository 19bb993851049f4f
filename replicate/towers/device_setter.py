"""Placement of tower ops and shared variables on local devices.

Placement is kept apart from the algorithms: this module decides *where*
ops go; the aggregation code only ever receives per-device lists.
"""
import enum

from replicate._compat import tf1
from replicate.core import device_check
from replicate.core import device_util
from replicate.core import op_kinds


class VariablePlacement(enum.Enum):
  """Where `replicate_model_fn` puts the variables shared by the towers.

  Attributes:
    CONSOLIDATION_DEVICE: every variable on one device: the GPU with a single
      GPU, else `/device:CPU:0`. This is `tf.contrib`'s default.
    ROUND_ROBIN: variables spread over the tower devices in creation order
      (for experiments; gradients are then summed on each variable's device).
    PARAMETER_SERVERS: in between-graph training (a `RunConfig` whose cluster,
      from `TF_CONFIG`, has a `ps` job), every variable on a parameter-server
      task, `/job:ps/task:<j>/device:CPU:0`, round robin or by `ps_strategy`;
      see `replicate/cluster/placement.py`. `CONSOLIDATION_DEVICE` does the same in
      such a cluster; this member makes it a requirement (an error without a
      `ps` job). Graphs the Estimator builds for a local session (EVAL,
      PREDICT) use the consolidation device.
    REPLICATED: every tower keeps its own copy of each trainable variable on
      its own device. Tower 0's copies carry the unreplicated names (they are
      what checkpoints hold); the other towers' are local variables, set from
      tower 0's when a session starts. The towers' gradients are all-reduced
      and each tower applies the sums to its copies (see
      replicate/towers/replicated_variables.py). Non-trainable variables (the
      global step, moving statistics) stay single, on tower 0's device.
  """
  CONSOLIDATION_DEVICE = 'consolidation_device'
  ROUND_ROBIN = 'round_robin'
  PARAMETER_SERVERS = 'parameter_servers'
  REPLICATED = 'replicated'


def canonical_device(device):
  """Returns a tower device in TF's spelling (`device_util.normalize`).

  Kept for its callers; the parsing is `replicate.core.device_util`'s, the
  library's one device parser. Compare devices with
  `device_util.canonicalize`.

  Args:
    device: a device string such as `/gpu:0`, `GPU:0` or `/device:CPU:1`.

  Returns:
    The normalized string, e.g. `/device:GPU:0`.

  Raises:
    InvalidTypeError: if `device` is not a string.
    InvalidArgumentError: if `device` cannot be parsed or names no device type.
  """
  return device_check.check_device_list([device])[0]


def consolidation_device(devices):
  """The device that holds shared variables and aggregates tower results.

  Args:
    devices: canonical tower devices.

  Returns:
    The single GPU when there is exactly one device and it is a GPU (so the
    whole model stays on it), else `/device:CPU:0`.
  """
  if len(devices) == 1 and device_util.parse(
      devices[0]).device_type == 'GPU':
    return devices[0]
  return '/device:CPU:0'


class _RoundRobin(object):
  """Hands out parameter devices in turn, one per stateful op."""

  def __init__(self, ps_devices):
    self._ps_devices = ps_devices
    self._next = 0

  def __call__(self, unused_op):
    device = self._ps_devices[self._next]
    self._next = (self._next + 1) % len(self._ps_devices)
    return device


def parameter_device_chooser(placement, devices):
  """A function `op -> device` for stateful ops, shared by all towers.

  Args:
    placement: a `VariablePlacement`.
    devices: canonical tower devices.

  Returns:
    A callable taking the op being placed and returning a device string.
  """
  if placement == VariablePlacement.ROUND_ROBIN:
    return _RoundRobin(list(devices))
  if placement == VariablePlacement.REPLICATED:
    # Tower 0's copies live with tower 0; the others are made per tower.
    return lambda unused_op: devices[0]
  device = consolidation_device(devices)
  return lambda unused_op: device


def tower_device_setter(worker_device, choose_parameter_device,
                        requested_devices=None):
  """A device function: parameters to a parameter device, others here.

  Parameters are variables and mutable tables (`op_kinds.PARAMETER_OP_TYPES`;
  a static table stays with tower 0, like the initializer that fills it).
  A device the user set explicitly inside `model_fn` (e.g. `tf.device('/cpu:0')`
  around an embedding lookup) is kept; only unset fields are filled in.

  Args:
    worker_device: the tower's device.
    choose_parameter_device: from `parameter_device_chooser`.
    requested_devices: optional dict; when given, the device each placed op
      requested from the scopes inside this one (`''` for none) is stored
      under the op's name, so that a copy of the op can be placed on another
      tower by the same rule (see `tower_device`).

  Returns:
    A function usable with `tf.device`.
  """
  worker_spec = device_util.parse(worker_device)
  # Most ops request the same few devices (usually none): parsing and merging
  # device strings for every op would cost more than building some ops.
  placed = {}

  def place(op):
    requested = op.device or ''
    # Device functions see Operations, NodeDefs when a graph is imported,
    # and op-like stand-ins asking where a new op would go
    # (`_compat.current_device`, with no name).
    op_type = op.op if isinstance(op, tf1.NodeDef) else op.type
    if requested_devices is not None and op.name:
      requested_devices[op.name] = requested
    if op_type in op_kinds.PARAMETER_OP_TYPES:
      spec = device_util.parse(choose_parameter_device(op))
      spec.merge_from(device_util.parse(requested))
      return spec.to_string()
    device = placed.get(requested)
    if device is None:
      device = placed[requested] = _tower_placement(requested, worker_spec)
    return device

  return place


def tower_device(requested, worker_device):
  """Where `tower_device_setter(worker_device, ...)` puts a stateless op.

  Args:
    requested: the device the op requested (as recorded by
      `tower_device_setter`'s `requested_devices`).
    worker_device: the tower's device.

  Returns:
    The device string.
  """
  return _tower_placement(requested, device_util.parse(worker_device))


def _tower_placement(requested, worker_spec):
  current = device_util.parse(requested)
  if _on_another_task(current, worker_spec):
    # Placed explicitly on another task, e.g. SyncReplicasOptimizer's token
    # queue next to the global step on a ps: this tower's device type and
    # index mean nothing there.
    return current.to_string()
  spec = device_util.parse(worker_spec.to_string())
  spec.merge_from(current)
  return spec.to_string()


def _on_another_task(current, worker_spec):
  """Whether `current` names a job or task other than the tower's."""
  return ((current.job is not None and current.job != worker_spec.job) or
          (current.task is not None and current.task != worker_spec.task))

"""Device strings: the library's one parser and one canonical form.

TensorFlow accepts many spellings of one device: `/cpu:0`, `CPU:0`,
`/device:CPU:0`, `/job:localhost/replica:0/task:0/device:CPU:0`. Every device
string `replicate` reads goes through `parse`; everything that compares or
keys devices uses `canonicalize`, so two spellings of the same device always
compare equal. The canonical form is TF's graph-mode one: this process's
devices name no job (`/replica:0/task:0/device:CPU:0`), so a session on a
`tf.train.Server` places them on its own task, as it placed contrib's.
`normalize` keeps only the parts a user gave, in TF's spelling, for device
scopes whose job and task a cluster fills in later; it is never used to
compare devices.
"""
import tensorflow as tf

from replicate import errors
from replicate._compat import tf1

# What an unspecified part of a device string means: the first replica and
# task, the first CPU; no job (this process), as TF's graph-mode
# `device_util.canonicalize`. `/job:localhost` is this process too, so it is
# dropped: its spellings compare equal to the job-less ones.
_LOCAL_DEFAULTS = (('replica', 0), ('task', 0), ('device_type', 'CPU'),
                   ('device_index', 0))
_LOCAL_JOB = 'localhost'


def parse(device, what='device'):
  """The one parser: `tf.compat.v1.DeviceSpec` of any spelling of a device.

  Args:
    device: a device string (`/cpu:1`, `CPU:1`, `/device:CPU:1`,
      `/job:localhost/replica:0/task:0/device:CPU:1`, ...) or a `DeviceSpec`.
    what: what `device` is, for the messages.

  Returns:
    A `tf.compat.v1.DeviceSpec` (device type upper-cased).

  Raises:
    InvalidTypeError: if `device` is not a string or DeviceSpec.
    InvalidArgumentError: if `device` cannot be parsed.
  """
  if isinstance(device, tf1.DeviceSpec):
    return device
  if isinstance(device, tf.DeviceSpec):  # TF 2's DeviceSpecV2.
    device = device.to_string()
  if not isinstance(device, str):
    raise errors.InvalidTypeError(
        '{} must be a device string such as "/device:GPU:0", got {!r} of '
        'type {}.'.format(what, device, type(device).__name__))
  try:
    return tf1.DeviceSpec.from_string(device)
  except (ValueError, TypeError) as e:
    raise errors.InvalidArgumentError(
        'Cannot parse {} {!r}: it is not a valid device string ({}); use a '
        'form such as "/device:GPU:0", "/cpu:1" or '
        '"/job:worker/task:1/device:CPU:0".'.format(what, device, e))


def normalize(device):
  """The parts of `device` that were given, in TF's spelling.

  `/cpu:1` and `CPU:1` give `/device:CPU:1`; `/job:worker/task:1/gpu:0`
  gives `/job:worker/task:1/device:GPU:0`. Unlike `canonicalize`, nothing is
  filled in, so a cluster can still put the device on its own task. Compare
  devices with `canonicalize`, never with this.

  Args:
    device: a device string in any spelling, or a `DeviceSpec`.

  Returns:
    A device string.

  Raises:
    InvalidTypeError, InvalidArgumentError: as `parse`.
  """
  return parse(device).to_string()


def canonicalize(device, default=None):
  """Returns the fully specified, canonical spelling of `device`.

  Parts missing from `device` are taken from `default`, then from the local
  defaults (`/replica:0/task:0/device:CPU:0`). Device types are upper-cased,
  and `/job:localhost` (this process) is dropped, so `/cpu:0`, `CPU:0`,
  `/device:CPU:0` and `/job:localhost/replica:0/task:0/device:CPU:0` all give
  `/replica:0/task:0/device:CPU:0`, TF's graph-mode canonical string.

  Args:
    device: a device string (any spelling TensorFlow accepts) or a
      `tf.compat.v1.DeviceSpec`.
    default: optional device string whose parts fill in what `device` leaves
      out, e.g. `/job:worker/task:1` to resolve `/gpu:0` on that worker.

  Returns:
    A string such as `/replica:0/task:0/device:GPU:1` or
    `/job:worker/replica:0/task:1/device:GPU:1`.

  Raises:
    InvalidTypeError: if `device` or `default` is not a string or DeviceSpec.
    InvalidArgumentError: if a string cannot be parsed as a device.
  """
  spec = tf1.DeviceSpec(**dict(_LOCAL_DEFAULTS))
  if default is not None:
    spec = spec.make_merged_spec(parse(default, 'default device'))
  spec = spec.make_merged_spec(parse(device, 'device'))
  if spec.job == _LOCAL_JOB:
    spec = tf1.DeviceSpec(replica=spec.replica, task=spec.task,
                          device_type=spec.device_type,
                          device_index=spec.device_index)
  return spec.to_string()


def canonicalize_all(devices, default=None):
  """`canonicalize` applied to each of `devices`; returns a tuple."""
  return tuple(canonicalize(d, default) for d in devices)


def worker_of(device):
  """The worker part (`/job:.../replica:.../task:...`) of a device.

  Args:
    device: a device string in any spelling.

  Returns:
    A string such as `/job:worker/replica:0/task:1`, or `/replica:0/task:0`
    for this process's devices.

  Raises:
    InvalidTypeError, InvalidArgumentError: as `canonicalize`.
  """
  spec = tf1.DeviceSpec.from_string(canonicalize(device))
  return tf1.DeviceSpec(job=spec.job, replica=spec.replica,
                        task=spec.task).to_string()


def device_type_of(device):
  """The upper-case device type (`'CPU'`, `'GPU'`, ...) of a device."""
  return tf1.DeviceSpec.from_string(canonicalize(device)).device_type


def resolve(device):
  """The device a tensor, variable or op was placed on, canonicalized.

  Args:
    device: the `.device` attribute of a graph object (may be `''`).

  Returns:
    The canonical device string, or `None` when `device` is empty (the
    object was built outside any device scope).
  """
  if not device:
    return None
  return canonicalize(device)


def is_local(device):
  """Whether `device` names this process's devices (no job, or `localhost`).

  Args:
    device: a device string in any spelling.

  Returns:
    A bool: True for `/device:CPU:1`, `/replica:0/task:0/device:CPU:1` or
    `/job:localhost/replica:0/task:0/device:CPU:1`, False for
    `/job:worker/task:1/device:CPU:1`.
  """
  job = parse(device).job
  return job is None or job == 'localhost'

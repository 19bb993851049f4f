"""The one validation of the devices a user asks for.

Used by `replicate_model_fn` and `MirroredStrategy` alike: a device list is
checked once (`check_device_list`: a list of parseable device strings, each
device once, whatever its spelling), and local devices are checked against
the devices a session will really have (`check_devices_exist`): a tower on
a device the session lacks is an error, or, where the session allows soft
placement, runs elsewhere after one warning that says where, never
silently.
"""
from replicate import _compat
from replicate import errors
from replicate._compat import tf1
from replicate.core import device_util
from replicate.core import logs as logging


def default_devices():
  """Every GPU visible to this process, else the CPU.

  Returns:
    A list such as `['/device:GPU:0', '/device:GPU:1']` or
    `['/device:CPU:0']`.
  """
  return _compat.local_gpu_devices() or ['/device:CPU:0']


def devices_or_gpus(devices, num_gpus, num_gpus_per_worker):
  """`devices`, or contrib `MirroredStrategy`'s `num_gpus` GPUs.

  Args:
    devices: a device list, or None for `default_devices()`.
    num_gpus: None, or GPUs 0 to `num_gpus` - 1 (the CPU for 0), as TF's
      `all_local_devices(num_gpus)`.
    num_gpus_per_worker: contrib's other name for `num_gpus`.

  Returns:
    The devices, unchecked (`check_device_list` checks them).

  Raises:
    InvalidArgumentError: if both counts, or a count and `devices`, are
      given, or a count is negative (TF's phrases first).
    InvalidTypeError: if a count is not an int.
  """
  if num_gpus is not None and num_gpus_per_worker is not None:
    raise errors.InvalidArgumentError(
        'You cannot specify both `num_gpus` and `num_gpus_per_worker`.')
  num_gpus = num_gpus if num_gpus is not None else num_gpus_per_worker
  if num_gpus is None:
    return default_devices() if devices is None else devices
  if devices is not None:
    raise errors.InvalidArgumentError(
        'Must only specify one of `devices` and `num_gpus_per_worker`. '  # TF's
        'Got devices={!r} and {} GPUs; pass one of the two.'.format(
            devices, num_gpus))
  if isinstance(num_gpus, bool) or not isinstance(num_gpus, int):
    raise errors.InvalidTypeError(
        'num_gpus must be an int, got {!r}.'.format(num_gpus))
  if num_gpus < 0:
    raise errors.InvalidArgumentError(
        'num_gpus must be 0 or more, got {}.'.format(num_gpus))
  return ['/device:GPU:{}'.format(i) for i in range(num_gpus)] or [
      '/device:CPU:0']


def check_device_list(devices):
  """Validates a list of devices; one tower or replica per device.

  Args:
    devices: a list or tuple of device strings, any spelling TF accepts.

  Returns:
    A list of the devices in TF's spelling (`device_util.normalize`), in
    the order given.

  Raises:
    InvalidTypeError: if `devices` is not a list or tuple of strings.
    InvalidArgumentError: if `devices` is empty, or a device cannot be
      parsed or names no device type.
    AssertedArgumentError: (an `InvalidArgumentError` and, as TF's, an
      `AssertionError`) if two entries (in any spellings) name the same
      device.
  """
  if isinstance(devices, str) or not isinstance(
      devices, (list, tuple)):
    raise errors.InvalidTypeError(
        'devices must be a list of device strings such as ["/device:GPU:0", '
        '"/device:GPU:1"], got {!r}.'.format(devices))
  if not devices:
    raise errors.InvalidArgumentError(
        'devices is empty; pass at least one device, or devices=None to use '
        'every local GPU (or the CPU if there is none).')
  for device in devices:
    if not isinstance(device, str):
      raise errors.InvalidTypeError(
          'Devices must be strings such as "/device:GPU:0", got {!r} of type '
          '{} in devices {!r}.'.format(device, type(device).__name__,
                                       list(devices)))
  normalized = []
  seen = {}
  for device in devices:
    spec = device_util.parse(device)
    if spec.device_type is None:
      raise errors.InvalidArgumentError(
          'Device {!r} names no device type; use a device string such as '
          '"/device:GPU:0" or "/cpu:0".'.format(device))
    canonical = device_util.canonicalize(spec)
    if canonical in seen:
      raise errors.AssertedArgumentError(
          'No duplicates allowed in `devices` argument: {}. '  # TF's phrase
          'Device {!r} is listed twice: {!r} and {!r} both are {}, so the '
          'devices name the same device more than once (two towers on one '
          'device). List each device once.'.format(
              list(devices), device, seen[canonical], device, canonical))
    seen[canonical] = device
    normalized.append(spec.to_string())
  return normalized


def session_devices(session_config=None):
  """The canonical names of the local devices a session would have.

  CPUs and the other non-GPU devices are listed by TF for `session_config`
  (its `device_count`); GPUs are the GPUs visible to this process, limited by
  the config's `device_count` and `gpu_options.visible_device_list`, counted
  without creating them (creating them would fix the process's GPU memory
  options before the user's session does).

  Args:
    session_config: a `tf.compat.v1.ConfigProto`, or None for the default.

  Returns:
    A list of canonical device strings.
  """
  without_gpus = tf1.ConfigProto()
  if session_config is not None:
    without_gpus.CopyFrom(session_config)
  without_gpus.device_count['GPU'] = 0
  names = [name for name, _, _ in
           _compat.local_device_attributes(without_gpus)]
  names.extend('/device:GPU:{}'.format(i)
               for i in range(_session_gpu_count(session_config)))
  return [device_util.canonicalize(n) for n in names]


def _session_gpu_count(session_config):
  num = len(_compat.local_gpu_devices())
  if session_config is None:
    return num
  visible = session_config.gpu_options.visible_device_list
  if visible:
    num = len([i for i in visible.split(',') if i.strip().isdigit() and
               int(i) < num])
  if 'GPU' in session_config.device_count:
    num = min(num, session_config.device_count['GPU'])
  return num


def check_devices_exist(devices, session_config=None, warned=None):
  """Checks every local device against the session's devices.

  A device the session lacks is an error unless the session allows soft
  placement (`allow_soft_placement`, as the Estimator's default session
  config does): TensorFlow then runs the ops of that device's tower on
  another device, and the model trains as it would on the devices that
  exist. That is logged once, as a WARNING naming the missing devices and
  where their towers will run, so that it is never silent. Devices of
  another job (`/job:worker/task:1/...`) are left to the cluster checks
  (`replicate.cluster.cluster_check`).

  Args:
    devices: device strings in any spelling.
    session_config: the `ConfigProto` of the session that will run them
      (None: TF's default session, without soft placement).
    warned: a set the caller keeps to warn once: the missing devices already
      warned about are added to it, and not warned about again. None: warn
      on every call.

  Raises:
    InvalidArgumentError: naming the first missing device, the session's
      devices and the fix, where soft placement is off.
  """
  local = [d for d in devices if device_util.is_local(d)]
  if not local:
    return
  available = session_devices(session_config)
  missing = [d for d in local
             if device_util.canonicalize(d) not in available]
  if not missing:
    return
  if session_config is not None and session_config.allow_soft_placement:
    key = tuple(device_util.canonicalize(d) for d in missing)
    if warned is None or key not in warned:
      if warned is not None:
        warned.add(key)
      logging.warning('%s', _soft_placement_message(missing, available))
    return
  message = _missing_device_message(device_util.normalize(missing[0]),
                                    available)
  if len(missing) > 1:
    message += ' (Missing too: {}.)'.format(
        ', '.join(device_util.normalize(d) for d in missing[1:]))
  raise errors.InvalidArgumentError(message)


def _fallback_device(available):
  """Where soft placement puts the ops of a missing device.

  TF's placer drops the missing device's type and index and takes the
  session's device of highest priority that has a kernel for the op: the
  first GPU if there is one, else the CPU.
  """
  gpus = [d for d in available if device_util.device_type_of(d) == 'GPU']
  return _short(gpus[0]) if gpus else 'CPU:0'


def _soft_placement_message(missing, available):
  names = ', '.join(device_util.normalize(d) for d in missing)
  return (
      'Device(s) {} do not exist in this session ({}; its devices are {}). '
      'session_config allows soft placement (the Estimator\'s default does), '
      'so TensorFlow will run the towers of {} on {} (ops without a kernel '
      'there on CPU:0): the results are the same, only the speed of '
      'separate devices is lost. Pass devices that exist '
      '(devices=None uses every visible GPU, else the CPU), or set '
      'allow_soft_placement=False in session_config to make this an '
      'error.'.format(names, _why_missing(missing[0], available),
                      ', '.join(_short(d) for d in available), names,
                      _fallback_device(available)))


def _short(canonical):
  return canonical.split('/device:')[-1]


def _why_missing(device, available):
  """Why the session lacks `device`: a clause such as 'no GPU is visible'."""
  device_type = device_util.device_type_of(device)
  index = device_util.parse(device).device_index or 0
  same_type = [d for d in available
               if device_util.device_type_of(d) == device_type]
  if device_type == 'CPU':
    return 'the session has {} CPU device(s)'.format(len(same_type))
  if device_type == 'GPU':
    visible = len(_compat.local_gpu_devices())
    if not visible:
      return ('no GPU is visible to this process '
              '(tf.config.list_physical_devices("GPU") is empty: no GPU, a '
              'TensorFlow build without CUDA, or CUDA_VISIBLE_DEVICES hides '
              'them)')
    if len(same_type) < visible:
      return ('this process sees {} GPU(s) but session_config '
              '(device_count / gpu_options.visible_device_list) gives the '
              'session {}'.format(visible, len(same_type)))
    return 'this process sees only {} GPU(s)'.format(visible)
  return 'the session has no {} device {}'.format(device_type, index)


def _missing_device_message(device, available):
  device_type = device_util.device_type_of(device)
  index = device_util.parse(device).device_index or 0
  head = (
      'Device {} does not exist: {}, and session_config does not allow soft '
      'placement, so TensorFlow could not place its tower. The session\'s '
      'devices are {}.'.format(device, _why_missing(device, available),
                               ', '.join(_short(d) for d in available)))
  soft = (' (or allow_soft_placement=True in session_config, to run its '
          'tower on another device with a warning)')
  if device_type == 'CPU':
    return (
        '{} For virtual CPUs pass RunConfig(session_config='
        'tf.compat.v1.ConfigProto(device_count={{"CPU": {}}})), or list '
        'fewer devices{}.'.format(head, index + 1, soft))
  if device_type == 'GPU':
    return ('{} Pass GPUs that exist (devices=None uses every visible GPU, '
            'else the CPU) or CPU devices{}.'.format(head, soft))
  return ('{} List only devices this process has (devices=None uses every '
          'visible GPU, else the CPU){}.'.format(head, soft))

"""The one validation of the devices a user asks for.

Used by `replicate_model_fn` and `MirroredStrategy` alike: a device list is
checked once (`check_device_list`: a list of parseable device strings, each
device once, whatever its spelling), and local devices are checked against
the devices a session will really have (`check_devices_exist`), because
soft placement would otherwise run a tower on a device the session lacks
silently somewhere else.
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


def check_device_list(devices):
  """Validates a list of devices; one tower or replica per device.

  Args:
    devices: a list or tuple of device strings, any spelling TF accepts.

  Returns:
    A list of the devices in TF's spelling (`device_util.normalize`), in
    the order given.

  Raises:
    InvalidTypeError: if `devices` is not a list or tuple of strings.
    InvalidArgumentError: if `devices` is empty, a device cannot be parsed or
      names no device type, or two entries (in any spellings) name the same
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
      raise errors.InvalidArgumentError(
          'Device {!r} is listed twice in devices {}: {!r} and {!r} both are '
          '{}, so the devices name the same device more than once (two '
          'towers on one device). List each device once.'.format(
              device, list(devices), seen[canonical], device, canonical))
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


def soft_placement_requested(run_config):
  """Whether the user's own `RunConfig` asks for soft placement.

  The Estimator puts its default session config (`allow_soft_placement:
  true`) in place of a missing one before `model_fn` runs, and `RunConfig`
  does the same in a cluster; neither is the user's wish. Only a
  `session_config` the user passed, with `allow_soft_placement=True`, is.
  (A user's config equal to the Estimator's default cannot be told apart
  from it and counts as the default.)

  Args:
    run_config: the `RunConfig` passed to `model_fn`, or None.

  Returns:
    A bool.
  """
  session_config = getattr(run_config, 'session_config', None)
  if session_config is None or not session_config.allow_soft_placement:
    return False
  return session_config not in _compat.estimator_default_session_configs(
      run_config)


def check_devices_exist(devices, session_config=None,
                        soft_placement_requested=False):
  """Raises unless every local device is one of the session's devices.

  Devices of another job (`/job:worker/task:1/...`) are left to the cluster
  checks (`replicate.cluster.cluster_check`).

  Args:
    devices: device strings in any spelling.
    session_config: the `ConfigProto` of the session that will run them
      (None: TF's default session).
    soft_placement_requested: the user asked for soft placement explicitly
      (see `soft_placement_requested`): a missing device is then logged as
      a WARNING each time a model is built, and TF places its ops elsewhere.

  Raises:
    InvalidArgumentError: naming the first missing device, the session's
      devices and the fix.
  """
  local = [d for d in devices if device_util.is_local(d)]
  if not local:
    return
  available = session_devices(session_config)
  missing = [d for d in local
             if device_util.canonicalize(d) not in available]
  if not missing:
    return
  message = _missing_device_message(device_util.normalize(missing[0]),
                                    available, session_config)
  if len(missing) > 1:
    message += ' (Missing too: {}.)'.format(
        ', '.join(device_util.normalize(d) for d in missing[1:]))
  if soft_placement_requested:
    logging.warning(
        '%s Soft placement was asked for in session_config, so TensorFlow '
        'will place it elsewhere.', message)
    return
  raise errors.InvalidArgumentError(message)


def _short(canonical):
  return canonical.split('/device:')[-1]


def _missing_device_message(device, available, session_config):
  device_type = device_util.device_type_of(device)
  index = device_util.parse(device).device_index or 0
  same_type = [d for d in available
               if device_util.device_type_of(d) == device_type]
  has = 'The session\'s devices are {}.'.format(
      ', '.join(_short(d) for d in available))
  if device_type == 'CPU':
    return (
        'Device {} does not exist: the session has {} CPU device(s), so it '
        'would silently run on another device. {} For virtual CPUs pass '
        'RunConfig(session_config=tf.compat.v1.ConfigProto('
        'device_count={{"CPU": {}}})), or list fewer devices.'.format(
            device, len(same_type), has, index + 1))
  if device_type == 'GPU':
    visible = len(_compat.local_gpu_devices())
    if not visible:
      why = ('no GPU is visible to this process '
             '(tf.config.list_physical_devices("GPU") is empty: no GPU, a '
             'TensorFlow build without CUDA, or CUDA_VISIBLE_DEVICES hides '
             'them)')
    elif len(same_type) < visible:
      why = ('this process sees {} GPU(s) but session_config '
             '(device_count / gpu_options.visible_device_list) gives the '
             'session {}'.format(visible, len(same_type)))
    else:
      why = 'this process sees only {} GPU(s)'.format(visible)
    return (
        'Device {} does not exist: {}, so its tower would silently run on '
        'another device. {} Pass GPUs that exist (devices=None uses every '
        'visible GPU, else the CPU) or CPU devices.'.format(device, why, has))
  return (
      'Device {} does not exist: the session has no {} device {}, so it '
      'would silently run on another device. {} List only devices this '
      'process has (devices=None uses every visible GPU, else the '
      'CPU).'.format(device, device_type, index, has))

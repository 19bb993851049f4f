"""Helpers for unit-testing replicated code on CPU with virtual devices."""
from replicate._compat import tf1


def virtual_cpu_config(num_cpus, **kwargs):
  """A `ConfigProto` that gives a session `num_cpus` virtual CPU devices.

  Args:
    num_cpus: how many CPU devices (`/device:CPU:0` ... `/device:CPU:<n-1>`).
    **kwargs: further `ConfigProto` fields.

  Returns:
    A `tf.compat.v1.ConfigProto`.

  Raises:
    InvalidArgumentError: if `num_cpus` is not a positive integer.
  """
  from replicate import errors  # pylint: disable=g-import-not-at-top
  if not isinstance(num_cpus, int) or isinstance(num_cpus, bool) or num_cpus < 1:
    raise errors.InvalidArgumentError(
        'num_cpus must be a positive integer, got {!r}.'.format(num_cpus))
  return tf1.ConfigProto(device_count={'CPU': num_cpus}, **kwargs)


def virtual_cpu_devices(num_cpus):
  """The device strings of `num_cpus` virtual CPUs: `['/device:CPU:0', ...]`."""
  return ['/device:CPU:{}'.format(i) for i in range(num_cpus)]


def pick_unused_port():
  """A TCP port on 127.0.0.1 that is free now, for local test clusters.

  The port is found by binding port 0 and released at once, so another
  process may take it before the caller binds it; fine for tests.

  Returns:
    An int.
  """
  import socket  # pylint: disable=g-import-not-at-top
  sock = socket.socket()
  try:
    sock.bind(('127.0.0.1', 0))
    return sock.getsockname()[1]
  finally:
    sock.close()

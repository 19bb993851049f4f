"""Values that live on several devices: `PerDevice` and `Mirrored`.

A `DistributedValues` maps each of its devices to the value there. Device
keys are canonicalized once, when the object is built, so any spelling of a
device (`/gpu:0`, `/device:GPU:0`, fully qualified) finds the same value.

A value looked up by the current `tf.device` scope (`get()` with no device,
a `Mirrored` converted to a tensor) is reported to the function given to
`observing_scope_lookups` on this thread, if any: a replica whose copies
stand for other replicas' calls must make each copy read its own device's
value (strategy/replica_loop.py).
"""
import contextlib
import threading

import tensorflow as tf

from replicate import _compat
from replicate import errors
from replicate.core import device_util


class DistributedValues(object):
  """A value per device, built from a `{device: value}` dict.

  Devices keep the order of the dict they were built from; the first one is
  the primary device.
  """

  def __init__(self, index):
    """Builds the object from `index`, a `{device: value}` dict.

    Args:
      index: a non-empty dict from device strings (any spelling) to values.

    Raises:
      InvalidTypeError: if `index` is not a dict, or a key is not a device
        string.
      InvalidArgumentError: if `index` is empty, a key cannot be parsed, or
        two keys name the same device.
    """
    if not isinstance(index, dict):
      raise errors.InvalidTypeError(
          '{} is built from a {{device: value}} dict, got {!r} of type {}.'
          .format(type(self).__name__, index, type(index).__name__))
    if not index:
      raise errors.InvalidArgumentError(
          '{} needs at least one device; got an empty dict. Pass '
          '{{device: value}} for every device.'.format(type(self).__name__))
    canonical = {}
    for device, value in index.items():
      key = device_util.canonicalize(device)
      if key in canonical:
        raise errors.InvalidArgumentError(
            'Two keys of the {} dict name the same device {} (one is {!r}); '
            'give each device once.'.format(type(self).__name__, key, device))
      canonical[key] = value
    self._index = canonical
    self._devices = tuple(canonical)

  @property
  def devices(self):
    """The canonical device strings, in construction order."""
    return self._devices

  @property
  def primary_device(self):
    """The first device."""
    return self._devices[0]

  @property
  def values(self):
    """The values, in the order of `devices`."""
    return tuple(self._index[d] for d in self._devices)

  @property
  def is_tensor_like(self):
    """Whether every value is a tensor (TF 1.15's property)."""
    return all(tf.is_tensor(v) for v in self.values)

  def on_device(self, device):
    """Whether `device` (any spelling) is one of `devices`."""
    return device_util.canonicalize(device) in self._index

  def _lookup(self, device):
    key = device_util.canonicalize(device)
    if key not in self._index:
      raise errors.InvalidArgumentError(
          'Device {} is not one of the devices of this {} ({}); ask for one '
          'of those.'.format(key, type(self).__name__,
                            ', '.join(self._devices)))
    return self._index[key]

  def _get_without_device(self):
    raise NotImplementedError

  def get(self, device=None):
    """The value on `device`.

    Args:
      device: a device string in any spelling. When None, the device of the
        current `tf.device` scope is used; outside any device scope, see the
        subclass (`Mirrored` gives the primary value, `PerDevice` raises).

    Returns:
      The value on that device.

    Raises:
      InvalidArgumentError: if the device is not one of `devices`, or (for
        `PerDevice`) `device` is None outside a device scope.
    """
    if device is None:
      device = _compat.current_device()
      if not device:
        return self._get_without_device()
      _note_scope_lookup(self, device)
    return self._lookup(device)

  def __repr__(self):
    return '{}({{{}}})'.format(
        type(self).__name__,
        ', '.join('{}: {!r}'.format(d, self._index[d]) for d in self._devices))


_observers = threading.local()


@contextlib.contextmanager
def observing_scope_lookups(observe):
  """Calls `observe(values, device)` for each lookup by the current device
  scope made on this thread inside the `with` block (the previous observer,
  if any, is restored on exit)."""
  previous = getattr(_observers, 'observe', None)
  _observers.observe = observe
  try:
    yield
  finally:
    _observers.observe = previous


def _note_scope_lookup(values, device):
  observe = getattr(_observers, 'observe', None)
  if observe is not None:
    observe(values, device)


class PerDevice(DistributedValues):
  """A different value on each device (e.g. each tower's gradient)."""

  def _get_without_device(self):
    raise errors.InvalidArgumentError(
        'PerDevice.get() with no device was called outside any tf.device '
        'scope, and a PerDevice has a different value on each of {}; pass '
        'the device or call it inside tf.device(...).'.format(
            ', '.join(self._devices)))


PerReplica = PerDevice


class Mirrored(DistributedValues):
  """The same value, copied onto each device.

  Like TF's, it stands for its value where a tensor is expected: converted
  to a tensor (e.g. `tf.identity(mirrored)`, `tf.group(mirrored)`) it is the
  copy on the current `tf.device` (the primary copy outside any device
  scope, or in one that holds no copy), Python operators (`mirrored * 2`) act on it, `session.run(mirrored)`
  fetches it, and `device`, `dtype`, `shape` and `op` are its.
  """

  def _get_without_device(self):
    return self._index[self.primary_device]

  def _copy_as_tensor(self):
    """The copy on the current `tf.device` if there is one, else the primary.

    Where a tensor is expected any copy is right (they are equal), so a
    device scope that holds no copy is no error here.
    """
    device = _compat.current_device()
    if device and self.on_device(device):
      _note_scope_lookup(self, device)
      return self._lookup(device)
    return self._index[self.primary_device]

  def _as_graph_element(self):
    value = self._copy_as_tensor()
    as_graph_element = getattr(value, '_as_graph_element', None)
    return as_graph_element() if callable(as_graph_element) else value

  # The copy's, as TF's Mirrored delegates them: e.g. `tf.group` of update
  # results asks for `device`, and `control_dependencies` then depends on
  # the copy (see `_as_graph_element`).
  @property
  def device(self):
    return self._copy_as_tensor().device

  @property
  def dtype(self):
    return self._copy_as_tensor().dtype

  @property
  def shape(self):
    return self._copy_as_tensor().shape

  @property
  def op(self):
    return self._copy_as_tensor().op


def _mirrored_to_tensor(value, dtype=None, name=None, as_ref=False):
  del as_ref  # Only variables have references; MirroredVariable's own wins.
  # pylint: disable=protected-access
  return tf.convert_to_tensor(value._copy_as_tensor(), dtype=dtype, name=name)


# After the default priority (100), so that subclasses with conversions of
# their own (MirroredVariable) keep them.
tf.register_tensor_conversion_function(Mirrored, _mirrored_to_tensor,
                                       priority=101)

# Python operators (`mirrored * 2`) act on the copy's tensor, as TF's do.
OPERATORS = ('__add__', '__radd__', '__sub__', '__rsub__', '__mul__',
             '__rmul__', '__truediv__', '__rtruediv__', '__floordiv__',
             '__rfloordiv__', '__mod__', '__rmod__', '__pow__', '__rpow__',
             '__matmul__', '__rmatmul__', '__neg__', '__abs__',
             '__getitem__', '__lt__', '__le__', '__gt__', '__ge__',
             '__and__', '__rand__', '__or__', '__ror__', '__xor__',
             '__rxor__', '__invert__')


def _tensor_operator(name):
  def apply(self, *args):
    return getattr(tf.convert_to_tensor(self), name)(*args)
  apply.__name__ = name
  return apply


for _name in OPERATORS:
  setattr(Mirrored, _name, _tensor_operator(_name))
del _name


def _device_of_graph_object(obj, what, prefix=''):
  device = device_util.resolve(obj.device)
  if device is None:
    raise errors.InvalidArgumentError(
        '{}The {} {} has no device, so it cannot name where results go; '
        'create it inside tf.device(...) or pass device strings.'.format(
            prefix, what, obj.name))
  return device


def _resolve(device):
  """`device` canonicalized; what it leaves out comes from the enclosing
  `tf.device` scope, as contrib's `device_util.resolve` did (`'/cpu:0'`
  inside `tf.device('/job:worker/task:1')` is that worker's CPU)."""
  return device_util.canonicalize(device, _compat.current_device() or None)


def get_devices_from(destinations):
  """The canonical devices named by `destinations`.

  A device string takes what it leaves out from the enclosing `tf.device`
  scope (outside any scope, from the local defaults).

  Args:
    destinations: a device string; a list or tuple of device strings; a
      `DistributedValues` (its devices); a variable or tensor placed on a
      device (that device).

  Returns:
    A non-empty tuple of canonical device strings, without repetition.

  Raises:
    InvalidArgumentError: if `destinations` is None or empty, or a variable
      or tensor has no device, or a string is not a device.
    InvalidTypeError: for any other type.
  """
  if destinations is None:
    raise errors.InvalidArgumentError(
        'destinations can not be empty: destinations is None; pass a device '
        'string, a list of them, a '
        'PerDevice/Mirrored value or a variable.')
  if isinstance(destinations, DistributedValues):
    return destinations.devices
  if isinstance(destinations, str):
    if not destinations:
      raise errors.InvalidArgumentError(
          'destinations can not be empty: destinations is an empty string; '
          'pass a device such as '
          '"/device:CPU:0".')
    return (_resolve(destinations),)
  if isinstance(destinations, (list, tuple)):
    if not destinations:
      raise errors.InvalidArgumentError(
          'destinations can not be empty: destinations is an empty {}; name '
          'at least one device.'.format(
              type(destinations).__name__))
    result = []
    for d in destinations:
      if not isinstance(d, str):
        raise errors.InvalidArgumentTypeError(
            'A list of destinations must hold device strings, got {!r} of '
            'type {}.'.format(d, type(d).__name__))
      d = _resolve(d)
      if d not in result:
        result.append(d)
    return tuple(result)
  empty = 'destinations can not be empty: '  # TF's phrase
  if isinstance(destinations, tf.Variable):
    return (_device_of_graph_object(destinations, 'variable', empty),)
  if isinstance(destinations, (tf.Tensor, tf.IndexedSlices)):
    return (_device_of_graph_object(destinations, 'tensor', empty),)
  raise errors.InvalidArgumentTypeError(
      'destinations must be one of a `DistributedValues` object, a '
      'tf.Variable object, or a device string (or a list of device strings, '
      'or a placed tensor); got {!r} of type {}.'.format(
          destinations, type(destinations).__name__))


def as_per_device(value):
  """`value` as a `DistributedValues`.

  Args:
    value: a `DistributedValues` (returned as is), or a single tensor,
      `IndexedSlices` or variable with its device set, which stands for a
      one-device `PerDevice`.

  Returns:
    A `DistributedValues`.

  Raises:
    InvalidArgumentError: if a single tensor has no device.
    InvalidTypeError: for any other type.
  """
  if isinstance(value, DistributedValues):
    return value
  if isinstance(value, (tf.Tensor, tf.IndexedSlices, tf.Variable)):
    device = _device_of_graph_object(value, 'value')
    return PerDevice({device: value})
  raise errors.InvalidArgumentTypeError(
      'Expected a PerDevice/Mirrored value, or a tensor placed on a device, '
      'got {!r} of type {}.'.format(value, type(value).__name__))


def select_device(device, structured):
  """Replaces each `DistributedValues` in a nest by its value on `device`.

  Args:
    device: a device string in any spelling.
    structured: a nest (lists, tuples, dicts) that may hold
      `DistributedValues`.

  Returns:
    The same nest with each `DistributedValues` replaced by `.get(device)`.

  Raises:
    InvalidArgumentError: if a `DistributedValues` has no value on `device`.
  """
  return tf.nest.map_structure(
      lambda v: v.get(device) if isinstance(v, DistributedValues) else v,
      structured)


def select_replica(replica_id, structured):
  """Replica `replica_id`'s share of a nest (TF 1.14/1.15's function).

  Args:
    replica_id: an int, the replica's index among the values' devices.
    structured: a nest that may hold `DistributedValues`.

  Returns:
    The nest with each `DistributedValues` replaced by its value number
    `replica_id` (in the order of its `devices`).
  """
  return tf.nest.map_structure(
      lambda v: v.values[replica_id] if isinstance(v, DistributedValues)
      else v, structured)


def regroup(device_to_structure, wrap_class=PerDevice):
  """Turns `{device: nest}` into one nest of `wrap_class` values.

  As contrib's `values.regroup`: lists, tuples, namedtuples (rebuilt with
  `_make`, so that a spec's own checks never see the wrapped leaves) and
  dicts are walked; a leaf that is the same object on every device (one
  device included) is returned as it is, any other becomes
  `wrap_class({device: leaf})`.

  Args:
    device_to_structure: a non-empty dict from devices to nests of the same
      structure (e.g. what each replica's function returned).
    wrap_class: `PerDevice` or `Mirrored`.

  Returns:
    The merged nest.

  Raises:
    InvalidArgumentError: if the dict is empty.
    StructureMismatchError: (an `AssertionError` too, as contrib's) if the
      structures differ.
  """
  if not device_to_structure:
    raise errors.InvalidArgumentError(
        'regroup needs at least one device; got an empty dict.')
  devices = list(device_to_structure)

  def merge(leaves):
    if all(leaf is leaves[0] for leaf in leaves):
      return leaves[0]
    return wrap_class(dict(zip(devices, leaves)))
  return merge_structures([device_to_structure[d] for d in devices], merge)


def merge_structures(structures, merge_leaves):
  """One nest of the structure `structures` share, leaves merged.

  Lists, tuples, namedtuples (rebuilt with `_make`) and dicts are walked,
  as TF's `regroup` walks them; anything else is a leaf.

  Args:
    structures: a non-empty list of nests.
    merge_leaves: called with the list of the nests' leaves at one place;
      returns the merged leaf.

  Returns:
    The merged nest.

  Raises:
    StructureMismatchError: if the structures differ.
  """
  first = structures[0]
  if not isinstance(first, (list, tuple, dict)):
    return merge_leaves(list(structures))
  for other in structures[1:]:
    if isinstance(first, dict):
      same = isinstance(other, dict) and set(other) == set(first)
    else:
      same = (isinstance(other, type(first)) or
              isinstance(first, type(other))) and len(other) == len(first)
    if not same:
      raise errors.StructureMismatchError(
          'Replicas produced values of different structures ({!r} and {!r}); '
          'every replica must return (or pass to merge_call) the same '
          'structure.'.format(first, other))
  if isinstance(first, dict):
    merged = [(key, merge_structures([s[key] for s in structures],
                                     merge_leaves)) for key in first]
    return dict(merged) if type(first) is dict else type(first)(merged)
  merged = [merge_structures([s[i] for s in structures], merge_leaves)
            for i in range(len(first))]
  if isinstance(first, list):
    return merged
  return type(first)._make(merged) if hasattr(first, '_fields') else (
      tuple(merged))

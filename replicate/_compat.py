"""Every TensorFlow-version difference and every private TF import lives here.

The rest of the library is written against the public `tensorflow.compat.v1`
API. When something is only reachable through a private module, or differs
between TF 1.15 and TF 2.15, it is wrapped here, once, so that the other
modules never probe versions themselves.
"""
import inspect

import tensorflow as tf

tf1 = tf.compat.v1

TF_VERSION = tuple(int(p) for p in tf.__version__.split('.')[:2])
IS_TF2 = TF_VERSION[0] >= 2

# Estimator types: public in both versions through tf.compat.v1.estimator
# (TF 2.15 gets them from the tensorflow-estimator package).
EstimatorSpec = tf1.estimator.EstimatorSpec
ModeKeys = tf1.estimator.ModeKeys
PredictOutput = tf1.estimator.export.PredictOutput
RegressionOutput = tf1.estimator.export.RegressionOutput
ClassificationOutput = tf1.estimator.export.ClassificationOutput


def local_gpu_devices():
  """Returns the canonical names of the GPUs visible to this process.

  Returns:
    A list such as `['/device:GPU:0', '/device:GPU:1']`; empty without GPUs.
  """
  gpus = tf.config.experimental.list_physical_devices('GPU')
  return ['/device:GPU:{}'.format(i) for i in range(len(gpus))]


# --- cross_tower_ops ---
# The device scope of the default graph, NCCL and collective ops, and the
# local device list (with GPU link topology). The private modules are imported
# inside the functions: importing them is only needed when they are used.


class _FakeOperation(object):
  """Just enough of an Operation for a graph to apply its device scopes to."""

  def __init__(self):
    self.device = ''
    self.type = ''
    self.name = ''
    self.node_def = tf1.NodeDef()  # Empty, for device functions to read.

  def _set_device(self, device):  # pylint: disable=invalid-name
    self.device = device if isinstance(device, str) else device.to_string()

  def _set_device_from_string(self, device_str):  # pylint: disable=invalid-name
    self.device = device_str


def current_device():
  """The device an op created now in the default graph would be placed on.

  Returns:
    The device string of the innermost `tf.device` scopes, merged as the
    graph would merge them (`''` outside any device scope). In eager mode,
    the eager context's device name.
  """
  if tf.executing_eagerly():
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
    return context.context().device_name or ''
  op = _FakeOperation()
  tf1.get_default_graph()._apply_device_functions(op)  # pylint: disable=protected-access
  return op.device


def nccl_all_sum(tensors):
  """NCCL all-sum of `tensors` (a list of one shape and dtype, each on its
  GPU): the list of sums, one on each input's device."""
  from tensorflow.python.ops import nccl_ops  # pylint: disable=g-import-not-at-top
  return nccl_ops.all_sum(tensors)


def collective_all_reduce(tensor, group_size, group_key, instance_key,
                          merge_op, final_op):
  """A collective all-reduce op (`CollectiveReduce`), same call on both TFs:
  `tensor` reduced over `group_size` devices (all workers) of the group
  `group_key`, in the reduction `instance_key` (equal on every member), by
  `merge_op` (`'Add'`...) then `final_op` (`'Id'`, or `'Div'` by the size).
  The result is on the device of the calling scope."""
  from tensorflow.python.ops import collective_ops  # pylint: disable=g-import-not-at-top
  return collective_ops.all_reduce(tensor, group_size, group_key, instance_key,
                                   merge_op, final_op)


def collective_dtypes():
  """The dtypes TF's collective all-reduce accepts in this TF version.

  TF 1.15's collective implementation rejects float16 at run time; TF 2.15
  reduces it.
  """
  dtypes = [tf.float32, tf.float64, tf.int32, tf.int64]
  if IS_TF2:
    dtypes.append(tf.float16)
  return tuple(dtypes)


def local_device_attributes(session_config=None):
  """The local devices as a session with `session_config` (an optional
  `ConfigProto`) sees them: a list of `(name, device_type, links)`, `links`
  the indices (interconnect bus ids) of the GPUs a GPU is linked to (empty
  for other devices)."""
  from tensorflow.python.client import device_lib  # pylint: disable=g-import-not-at-top
  result = []
  for d in device_lib.list_local_devices(session_config):
    links = []
    if d.device_type == 'GPU' and d.HasField('locality'):
      links = [link.device_id for link in d.locality.links.link]
    result.append((d.name, d.device_type, links))
  return result


# --- distribute_lib / mirrored_strategy ---


def variable_to_tensor(variable, dtype=None, name=None, as_ref=False):
  """`variable` (a resource variable) as a tensor of `dtype` (or None),
  honouring `as_ref` (the handle-backed variable is asked for), which the
  public `tf.convert_to_tensor` lacks: `MirroredVariable`'s conversion
  function forwards to its local copy through this."""
  return variable._dense_var_to_tensor(  # pylint: disable=protected-access
      dtype=dtype, name=name, as_ref=as_ref)


def _trackable_base():
  if IS_TF2:
    from tensorflow.python.trackable import base  # pylint: disable=g-import-not-at-top
  else:
    from tensorflow.python.training.tracking import base  # pylint: disable=g-import-not-at-top
  return base


# `tf.compat.v1.train.Saver` saves objects of these classes through their
# `_gather_saveables_for_checkpoint()` (SaveableObject factories).
TrackableBase = _trackable_base().Trackable
VARIABLE_VALUE_KEY = _trackable_base().VARIABLE_VALUE_KEY


def make_copies_saveable(copies, name):
  """A SaveableObject for `tf.compat.v1.train.Saver` saving `copies[0]` (the
  primary of a mirrored variable's resource-variable copies) under `name`
  (its op name, as for a plain variable), restoring every copy."""
  primary = copies[0]

  def restore(value):
    assigns = []
    for copy in copies:
      with tf.device(copy.device):
        assigns.append(copy.assign(value, read_value=False))
    return tf.group(*assigns)
  return make_saveable(name, primary, primary.dtype, primary.device,
                       read_fn=primary.read_value, restore_fn=restore)


def make_saveable(name, variable, dtype, device, read_fn, restore_fn):
  """A SaveableObject of one tensor for `tf.compat.v1.train.Saver`, under the
  key `name`, standing for `variable` (its primary copy): `read_fn()` builds
  the tensor to save (of `dtype`, read on `device`); `restore_fn(tensor)`
  returns the op restoring it."""
  from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-import-not-at-top

  class _Saveable(saveable_object.SaveableObject):
    """Saves what `read_fn` reads; a restore runs `restore_fn`."""

    def __init__(self):
      def tensor():
        with tf.device(device):
          return read_fn()
      spec = saveable_object.SaveSpec(tensor, '', name, dtype=dtype,
                                      device=device)
      super(_Saveable, self).__init__(variable, [spec], name)

    def restore(self, restored_tensors, restored_shapes):
      value = restored_tensors[0]
      if restored_shapes is not None:
        value = tf.reshape(value, restored_shapes[0])
      return restore_fn(value)

  return _Saveable()


def current_control_dependencies(graph):
  """The set of `Operation`s that the open `control_dependencies` blocks of
  `graph` (this thread's) give a new op: TF keeps no public accessor."""
  return set(graph._current_control_dependencies())  # pylint: disable=protected-access


def cond_predicates(graph):
  """The predicates of the TF1 `tf.cond`s a new op of `graph` is built in,
  innermost first (TF keeps no public accessor of its control flow)."""
  predicates = []
  context = graph._get_control_flow_context()  # pylint: disable=protected-access
  while context is not None:
    if getattr(context, 'pred', None) is not None:
      predicates.append(context.pred)
    context = context.outer_context
  return predicates


def variable_creator_stack(graph):
  """This thread's variable creators of `graph`, outermost first (TF copies
  them into its replica threads; there is no public accessor)."""
  return list(graph._variable_creator_stack)  # pylint: disable=protected-access


def set_variable_creator_stack(graph, stack):
  """Makes the list `stack` this thread's variable creators of `graph`."""
  graph._variable_creator_stack = list(stack)  # pylint: disable=protected-access


def clear_attr(op, name):
  """Removes the attribute `name` of the existing `op` (no public API)."""
  op._clear_attr(name)  # pylint: disable=protected-access


def unregister_gradient(name):
  """Takes `name` out of TF's gradient registry: `tf.RegisterGradient` has no
  inverse (no public API). A name that is not there is ignored."""
  from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
  ops._gradient_registry._registry.pop(name, None)  # pylint: disable=protected-access


def record_on_tape(name, outputs, inputs, backward):
  """Records on the active `GradientTape`s that `outputs` came from `inputs`,
  with `backward(*output_grads) -> input_grads` (what `tf.custom_gradient`
  does in graph mode; there is no public API)."""
  if IS_TF2:
    from tensorflow.python.eager import record as tape  # pylint: disable=g-import-not-at-top
  else:
    from tensorflow.python.eager import tape  # pylint: disable=g-import-not-at-top
  tape.record_operation(name, list(outputs), list(inputs), backward)


def _summary_state_fields():
  """This thread's TF 2-style summary state (writer, step, recording): where
  TF keeps it and its fields, the replica-0 flag last (no public API)."""
  if IS_TF2:
    from tensorflow.python.ops import summary_ops_v2  # pylint: disable=g-import-not-at-top
    return summary_ops_v2._summary_state, (  # pylint: disable=protected-access
        'writer', 'step', 'is_recording', 'is_recording_distribution_strategy')
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  return context.context(), ('summary_writer', 'summary_step',
                             'summary_recording',
                             'summary_recording_distribution_strategy')


def summary_state():
  """This thread's TF 2-style summary writer, step and recording condition."""
  holder, fields = _summary_state_fields()
  return [getattr(holder, field) for field in fields[:3]]


def set_summary_state(state, first_replica):
  """Makes `state` this thread's, recording only if `first_replica` (as TF's
  replica threads and contexts do)."""
  holder, fields = _summary_state_fields()
  for field, value in zip(fields, list(state) + [first_replica]):
    setattr(holder, field, value)


def in_control_flow(op):
  """Whether `op` is in a TF1 cond or loop (no outside control input)."""
  return op._get_control_flow_context() is not None  # pylint: disable=protected-access


def add_control_inputs(op, controls):
  """Makes the existing `op` wait for the `Operation`s `controls` too (no
  public API; TF's own control flow adds edges to earlier ops this way)."""
  op._add_control_inputs(list(controls))  # pylint: disable=protected-access


# --- replicate_model_fn: SavedModel export ---

# The `tf.estimator.Estimator` method (tensorflow_estimator 1.15 and 2.15)
# that builds one mode of a SavedModel: every export reaches `model_fn` through
# it, and nothing else does (`predict()` calls `_call_model_fn` itself).
_EXPORT_METHOD = '_add_meta_graph_for_mode'
_ESTIMATOR_MODULES = ('tensorflow_estimator.', 'tensorflow.python.estimator.')


def building_saved_model():
  """Whether an Estimator is building the default graph for a SavedModel.

  TF has no public signal for this: the Estimator calls `model_fn` in
  PREDICT mode both for `predict()` and for an export. This walks the Python
  call stack (CPython frames, `inspect.currentframe`) for a frame of
  `Estimator._add_meta_graph_for_mode` defined in a tensorflow_estimator
  module, the private method every export (`export_saved_model`,
  `export_savedmodel`, `experimental_export_all_saved_models`, the
  `Exporter`s of `train_and_evaluate`) calls `model_fn` from, in TF 1.15 and
  TF 2.15 alike. Where that frame has the local `g` (the graph the method
  opened), it must be the default graph. If a future tensorflow_estimator
  renamed the method, exports would hold the towers, but `predict()` can
  never be taken for an export.

  Returns:
    A bool.
  """
  graph = tf1.get_default_graph()
  frame = inspect.currentframe()
  try:
    while frame is not None:
      if (frame.f_code.co_name == _EXPORT_METHOD and
          frame.f_globals.get('__name__', '').startswith(_ESTIMATOR_MODULES)):
        return frame.f_locals.get('g', graph) is graph
      frame = frame.f_back
    return False
  finally:
    del frame


# --- cluster checks (cluster/cluster_check.py) ---

# The Estimator methods (tensorflow_estimator 1.15 and 2.15) whose local
# `hooks` hold the `StopAtStepHook` that `train(steps=, max_steps=)` adds.
_TRAIN_METHODS = ('_train_model_default', '_train_model_distributed', 'train')


def estimator_stop_hooks():
  """The `StopAtStepHook`s of the `Estimator.train` call building the graph.

  TF has no public way for a `model_fn` (or its hooks) to learn the step
  training should reach. `Estimator.train` adds a
  `tf.compat.v1.train.StopAtStepHook(steps, max_steps)` to its local list
  `hooks`, which it passes to `_train_model_default` /
  `_train_model_distributed`, which call `model_fn`; this walks the Python
  call stack (`inspect.currentframe`) for such a frame of a
  tensorflow_estimator module and returns those hooks.

  Returns:
    A list of `StopAtStepHook`s; empty outside `Estimator.train` (or if a
    future tensorflow_estimator renamed its methods).
  """
  frame = inspect.currentframe()
  try:
    while frame is not None:
      if (frame.f_code.co_name in _TRAIN_METHODS and
          frame.f_globals.get('__name__', '').startswith(_ESTIMATOR_MODULES)):
        hooks = frame.f_locals.get('hooks')
        if isinstance(hooks, (list, tuple)):
          return [h for h in hooks
                  if isinstance(h, tf1.train.StopAtStepHook)]
      frame = frame.f_back
    return []
  finally:
    del frame


def stop_hook_last_step(hook):
  """The global step a `StopAtStepHook` stops at (None before its session).

  `steps=` is turned into a last step when the hook's session is created.
  """
  return getattr(hook, '_last_step', None)


def session_closed(session):
  """Whether a `tf.compat.v1.Session` has been closed (private `_closed`)."""
  return bool(getattr(session, '_closed', False))


# --- bulk variables (graph_copy/bulk_variables.py) ---


def variable_def_proto(**fields):
  """A `VariableDef` proto (not in `tf.compat.v1` of TF 1.15)."""
  from tensorflow.core.framework import variable_pb2  # pylint: disable=g-import-not-at-top
  return variable_pb2.VariableDef(**fields)


def variable_from_def(variable_def):
  """A variable object wrapping graph ops that a `VariableDef` names.

  Made with the variable class itself, not `tf.Variable`: no variable
  creator scope (e.g. a strategy's) sees it.
  """
  from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top
  if variable_def.is_resource:
    return resource_variable_ops.ResourceVariable(variable_def=variable_def)
  if IS_TF2:
    from tensorflow.python.ops import ref_variable  # pylint: disable=g-import-not-at-top
    return ref_variable.RefVariable(variable_def=variable_def)
  from tensorflow.python.ops import variables  # pylint: disable=g-import-not-at-top
  return variables.RefVariable(variable_def=variable_def)


def set_variable_constraint(variable, constraint):
  """Gives a variable made by `variable_from_def` its constraint."""
  variable._constraint = constraint  # pylint: disable=protected-access


def optimizer_slots(optimizer):
  """`(create_slots, slot_dict, var_key)` of a `tf.compat.v1` optimizer.

  `create_slots(var_list)` makes the slots `apply_gradients` would (under
  `init_scope`, as it does); `slot_dict(name)` is the dict
  `get_slot(var, name)` looks `var_key(var)` up in: a slot entered there
  is used and not made again. None when `optimizer` is not a plain
  `tf.compat.v1.train.Optimizer` with that structure (its own
  `apply_gradients`, no `_slots`): it then makes every slot itself.
  """
  from tensorflow.python.training import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top
  base = tf1.train.Optimizer
  if not isinstance(optimizer, base) or (
      type(optimizer).apply_gradients is not base.apply_gradients):
    return None
  create = getattr(optimizer, '_create_slots', None)
  slot_dict = getattr(optimizer, '_slot_dict', None)
  var_key = getattr(optimizer_lib, '_var_key', None)
  if not (callable(create) and callable(slot_dict) and callable(var_key) and
          isinstance(getattr(optimizer, '_slots', None), dict)):
    return None

  def create_slots(var_list):
    with tf1.init_scope():
      create(var_list)
  return create_slots, slot_dict, var_key


def save_slice_info(variable):
  """A partitioned variable's slice information, or None."""
  return getattr(variable, '_save_slice_info', None)


# At most how many ops TF 1.15 makes after deriving a random op's seed from the
# graph and before the op: 1 for each of its random ops (`random_uniform`,
# `dropout`, `truncated_normal`, `random_shuffle`, the candidate samplers...).
_DERIVED_SEED_GAP = 4


# What TF gives a random op in place of seeds (0, 0), which its kernels
# take for "unseeded" (`random_seed.get_seed`).
_MAXINT32 = 2**31 - 1


def has_derived_seed(op, seed, seed2):
  """Whether random op `op`'s `seed2` is one TF derived from its graph.

  Under a graph seed, a random op made without an op seed gets a `seed2`
  from the graph (`tf.compat.v1.get_seed`): on TF 1.15 the id of the op
  made just before it, on TF 2.15 a count of the seeds derived so far in
  the graph. Another `model_fn` call derives others; an explicit op seed is
  the same in every call. An explicit seed that equals a derivable one
  (TF 1.15: an id just below the op's; TF 2.15: below the count) is taken
  for derived.

  Args:
    op: a top-level random op (not inside a function).
    seed, seed2: its `seed` and `seed2` attributes.
  """
  if seed == 0 and seed2 == _MAXINT32:
    seed2 = 0  # graph seed 0 and op seed 0 (TF 2.15's first derived one)
  if IS_TF2:
    from tensorflow.python.framework import random_seed  # pylint: disable=g-import-not-at-top
    derived = random_seed._graph_to_seed_dict.get(op.graph, 0)  # pylint: disable=protected-access
    return seed2 < derived
  op_id = op._id  # pylint: disable=protected-access
  return op_id - _DERIVED_SEED_GAP <= seed2 < op_id


def py_func_function(op):
  """The Python function a `PyFunc` / `EagerPyFunc` op calls (as given to
  `tf.py_func`, `tf.numpy_function` or `tf.py_function`), or None where TF's
  registry no longer holds it."""
  from tensorflow.python.ops import script_ops  # pylint: disable=g-import-not-at-top
  token = op.get_attr('token')
  function = script_ops._py_funcs._funcs.get(  # pylint: disable=protected-access
      token.decode() if isinstance(token, bytes) else token)
  # tf.py_function registers an `EagerFunc` around the user's function; TF
  # 2 wraps it in AutoGraph's `do_not_convert` (its cell `func`), where
  # `functools.update_wrapper` may not name it.
  function = getattr(function, '_func', function)
  code = getattr(function, '__code__', None)
  if hasattr(function, 'autograph_info__') and 'func' in getattr(
      code, 'co_freevars', ()):
    function = function.__closure__[code.co_freevars.index('func')]
    function = function.cell_contents
  return function


def is_graph_function(graph, name):
  """Whether `graph`'s function library holds a function named `name`."""
  return graph._is_function(name)  # pylint: disable=protected-access


def graph_function_def(graph, name):
  """The `FunctionDef` of `graph`'s library function `name`, or None."""
  function = graph._get_function(name)  # pylint: disable=protected-access
  if function is None:
    return None
  # TF 2.15's functions cache their definition; TF 1.15's have `definition`.
  definition = getattr(function, 'cached_definition', None)
  return definition if definition is not None else function.definition

"""`tf.import_graph_def` into the default graph, without TF 1.15's graph scan.

Private TensorFlow API, like `_compat.py`: the one other module that may
touch TF's internals.

After the C import, TF 1.15 finds the ops it created by walking every op of
the graph and looking each one up by name (`c_api_util.new_tf_operations`).
One import is cheap; one import per variable, as `MirroredStrategy` makes
its copies (graph_copy/bulk_variables.py), walks the graph once per variable
(what that costs: docs/performance.md). Here the new ops are the import's
return operations (every node of the `GraphDef` is asked for), so only they
are wrapped. TF 2.x tracks new ops itself: there `tf.import_graph_def` is
called.

Imports nothing of the package.
"""
import tensorflow as tf

tf1 = tf.compat.v1


def import_graph_def(graph_def, input_map=None, return_elements=None):
  """`tf.compat.v1.import_graph_def(..., name='')` into the default graph.

  Same effect as TF's: device functions, colocation and control dependencies
  of the current scopes apply to the new ops as in `tf.import_graph_def`.

  Args:
    graph_def: a `GraphDef` without a function library.
    input_map: `{input name in graph_def: Tensor}` (values must be tensors).
    return_elements: names of ops (`name`) or tensors (`name:i`) to return.

  Returns:
    The `return_elements`' ops and tensors, or None if not asked for.

  Raises:
    ValueError: as `tf.import_graph_def`: a malformed `graph_def`, or an
      input map entry the `graph_def` does not read; an input map value
      that is not a tensor.
  """
  input_map = dict(input_map or {})
  for value in input_map.values():
    if not isinstance(value, tf.Tensor):
      raise ValueError('import_graph_def needs tensors as input_map values, '
                       'got {!r}; convert them first.'.format(value))
  internals = _tf1_internals()
  if internals is None or graph_def.library.function:
    return tf1.import_graph_def(graph_def, input_map=input_map,
                                return_elements=return_elements, name='')
  return _import_tf1(internals, graph_def, input_map, return_elements)


def _tf1_internals():
  """TF 1.15's importer modules, or None where the graph tracks new ops."""
  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import c_api_util
  if not hasattr(c_api_util, 'new_tf_operations') or hasattr(
      tf1.get_default_graph(), 'new_operations'):
    return None
  from tensorflow.python import pywrap_tensorflow as c_api
  from tensorflow.python.framework import importer
  from tensorflow.python.framework import op_def_registry
  # pylint: enable=g-import-not-at-top
  return c_api, c_api_util, importer, op_def_registry


def _import_tf1(internals, graph_def, input_map, return_elements):
  # pylint: disable=protected-access
  c_api, c_api_util, importer, op_def_registry = internals
  graph = tf1.get_default_graph()
  graph_def = importer._ProcessGraphDefParam(
      graph_def, op_def_registry.get_registered_ops())
  names = [node.name for node in graph_def.node]
  requested = list(return_elements or [])
  scoped_options = c_api_util.ScopedTFImportGraphDefOptions()
  importer._PopulateTFImportGraphDefOptions(
      scoped_options.options, '', input_map, names + requested, True)
  with graph._mutation_lock():
    with c_api_util.tf_buffer(graph_def.SerializeToString()) as serialized:
      try:
        results = c_api_util.ScopedTFImportGraphDefResults(
            c_api.TF_GraphImportGraphDefWithResults(
                graph._c_graph, serialized, scoped_options.options))
      except tf.errors.InvalidArgumentError as e:
        raise ValueError(str(e))
    c_ops = c_api.TF_ImportGraphDefResultsReturnOperations(results.results)
    new_ops = [graph._create_op_from_tf_operation(c_op, compute_device=False)
               for c_op in c_ops[:len(names)]]
    for op in new_ops:
      op._add_control_inputs(graph._control_dependencies_for_inputs(op.inputs))
      op._control_flow_post_processing()
    # Only ops with a colocation attribute (from their NodeDef, or from a
    # colocation scope) need TF's check, which raises an error on the others.
    may_colocate = [bool(graph._colocation_stack) or '_class' in node.attr
                    for node in graph_def.node]
    _place(graph, importer, new_ops, may_colocate)
  missing = c_api.TF_ImportGraphDefResultsMissingUnusedInputMappings_wrapper(
      results.results)
  if missing:
    raise ValueError(
        'Attempted to map inputs that were not found in graph_def: [{}]'
        .format(', '.join(tf.compat.as_str(name) for name in missing)))
  if return_elements is None:
    return None
  outputs = iter(c_api.TF_ImportGraphDefResultsReturnOutputs(results.results))
  operations = iter(c_ops[len(names):])
  return [graph._get_tensor_by_tf_output(next(outputs)) if ':' in name else
          graph._get_operation_by_tf_operation(next(operations))
          for name in requested]
  # pylint: enable=protected-access


def _place(graph, importer, new_ops, may_colocate):
  """Devices of the new ops, as TF's `importer._ProcessNewOps` sets them.

  `may_colocate`: for each new op, whether it may carry a colocation.
  """
  # pylint: disable=protected-access
  colocated = []
  for op, check in zip(new_ops, may_colocate):
    original_device = op.device
    op._set_device('')
    names = importer._GetColocationNames(op) if check else None
    if names:
      colocated.append((op, names))
    else:
      with importer._MaybeDevice(original_device):
        graph._apply_device_functions(op)
  for op, names in colocated:
    for name in names:
      try:
        target = graph._get_operation_by_name_unsafe(name)
      except KeyError:
        if importer.tf2.enabled() or (
            importer.control_flow_util.EnableControlFlowV2(graph)):
          continue  # TF 2 behaviour: colocation is a hint.
        raise ValueError('Specified colocation to an op that does not exist '
                         'during import: {} in {}'.format(name, op.name))
      if target.device:
        op._set_device(target.device)
        break
  # pylint: enable=protected-access

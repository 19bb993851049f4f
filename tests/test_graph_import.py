"""_graph_import.py: `tf.import_graph_def` without TF 1.15's graph scan.

The import must give what `tf.compat.v1.import_graph_def(..., name='')`
gives in the same scopes: the same ops, inputs, devices (device functions,
colocation), control dependencies of an enclosing scope, and the same
return elements and errors. On TF 1.15 it must not walk the graph's
existing ops (`c_api_util.new_tf_operations`); on TF 2.x it is TF's import.
"""
from unittest import mock

import tensorflow as tf

from replicate import _graph_import
from replicate import testing
from replicate._compat import tf1


def _source_graph_def():
  """`x -> y = x * 2 -> z = y + c`, `c` colocated with `y`."""
  graph = tf.Graph()
  with graph.as_default():
    x = tf1.placeholder(tf.float32, [2], name='x')
    y = tf.multiply(x, 2.0, name='y')
    with graph.colocate_with(y.op):
      c = tf.constant([1.0, 2.0], name='c')
    tf.add(y, c, name='z')
  return graph.as_graph_def()


def _prefixed(graph_def, prefix):
  """`graph_def` with every node (and input) named under `prefix`."""
  out = tf1.GraphDef()
  out.CopyFrom(graph_def)
  for node in out.node:
    node.name = prefix + node.name
    for i, name in enumerate(node.input):
      node.input[i] = prefix + name
    if '_class' in node.attr:
      values = [v.replace(b'loc:@', b'loc:@' + prefix.encode())
                for v in node.attr['_class'].list.s]
      del node.attr['_class'].list.s[:]
      node.attr['_class'].list.s.extend(values)
  return out


def _import(import_fn, graph, graph_def, feed, gate, return_elements):
  """Imports `graph_def` with `x` mapped to `feed`, under a device function
  that puts `y` on CPU:1 and inside `control_dependencies([gate])`."""
  devices = {'copy/y': '/device:CPU:1'}
  with graph.as_default(), tf1.device(
      lambda op: devices.get(op.name, op.device)), tf1.control_dependencies(
          [gate]):
    if import_fn is tf1.import_graph_def:
      return import_fn(graph_def, input_map={'copy/x:0': feed},
                       return_elements=return_elements, name='')
    return import_fn(graph_def, input_map={'copy/x:0': feed},
                     return_elements=return_elements)


def _describe(graph):
  """Each op: (name, type, inputs, control inputs, device, colocation)."""
  return sorted(
      (op.name, op.type, [t.name for t in op.inputs],
       sorted(c.name for c in op.control_inputs), op.device,
       sorted(op.colocation_groups()))
      for op in graph.get_operations())


class GraphImportTest(tf.test.TestCase):

  def _build(self, import_fn, colocate_with_feed=False):
    graph = tf.Graph()
    with graph.as_default():
      feed = tf.constant([3.0, 4.0], name='feed')
      gate = tf.no_op(name='gate')
      for i in range(20):  # ops the TF 1.15 scan would walk
        tf.constant(float(i), name='existing')
      with graph.colocate_with(feed.op if colocate_with_feed else None,
                               ignore_existing=not colocate_with_feed):
        returned = _import(import_fn, graph,
                           _prefixed(_source_graph_def(), 'copy/'), feed,
                           gate, ['copy/z:0', 'copy/y'])
    return graph, returned

  def test_same_graph_and_results_as_tf_import(self):
    ours, (z, y) = self._build(_graph_import.import_graph_def)
    theirs, (tf_z, tf_y) = self._build(tf1.import_graph_def)
    self.assertEqual(_describe(theirs), _describe(ours))
    self.assertEqual((tf_z.name, tf_y.name), (z.name, y.name))
    self.assertIsInstance(y, tf1.Operation)
    self.assertIsInstance(z, tf.Tensor)
    # The device function placed y; c is colocated with y, so it gets y's
    # device; ops of the import wait for the enclosing control dependency.
    self.assertEqual('/device:CPU:1', y.device)
    self.assertEqual('/device:CPU:1', ours.get_operation_by_name(
        'copy/c').device)
    self.assertIn('gate', [op.name for op in y.control_inputs])
    config = testing.virtual_cpu_config(2)
    with tf1.Session(graph=ours, config=config) as session:
      # z = feed * 2 + c = [3, 4] * 2 + [1, 2].
      self.assertAllEqual([7.0, 10.0], session.run(z))

  def test_colocation_scope_as_tf_import(self):
    ours, (_, y) = self._build(_graph_import.import_graph_def,
                               colocate_with_feed=True)
    theirs, _ = self._build(tf1.import_graph_def, colocate_with_feed=True)
    self.assertEqual(_describe(theirs), _describe(ours))
    self.assertIn(b'loc:@feed', y.colocation_groups())

  def test_new_ops_follow_the_existing_ones(self):
    graph, (z, _) = self._build(_graph_import.import_graph_def)
    names = [op.name for op in graph.get_operations()]
    self.assertEqual(['feed', 'gate'], names[:2])
    # The mapped placeholder is imported too (nothing reads it).
    self.assertEqual(['copy/c', 'copy/x', 'copy/y', 'copy/y/y', 'copy/z'],
                     sorted(names[22:]))
    self.assertIs(z.op, graph.get_operation_by_name('copy/z'))

  def test_unused_input_map_entry_is_an_error(self):
    graph = tf.Graph()
    with graph.as_default():
      feed = tf.constant([3.0, 4.0])
      with self.assertRaisesRegex(ValueError, 'not found in graph_def'):
        _graph_import.import_graph_def(
            _source_graph_def(), input_map={'x:0': feed, 'nope:0': feed})

  def test_input_map_values_must_be_tensors(self):
    graph = tf.Graph()
    with graph.as_default():
      with self.assertRaisesRegex(ValueError, 'needs tensors'):
        _graph_import.import_graph_def(_source_graph_def(),
                                       input_map={'x:0': [1.0, 2.0]})

  def test_tf1_import_does_not_walk_the_graph(self):
    # pylint: disable=g-import-not-at-top
    from tensorflow.python.framework import c_api_util
    if hasattr(c_api_util, 'new_tf_operations') and not hasattr(
        tf.Graph(), 'new_operations'):
      # TF 1.15: our import wraps only the new ops.
      with mock.patch.object(c_api_util, 'new_tf_operations',
                             wraps=c_api_util.new_tf_operations) as scan:
        self._build(_graph_import.import_graph_def)
      self.assertEqual(0, scan.call_count)
    else:
      # TF 2.x tracks new ops itself: the import is TF's.
      with mock.patch.object(tf1, 'import_graph_def',
                             wraps=tf1.import_graph_def) as spy:
        self._build(_graph_import.import_graph_def)
      self.assertEqual(1, spy.call_count)


if __name__ == '__main__':
  tf.test.main()

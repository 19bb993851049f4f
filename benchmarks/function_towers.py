"""Would towers as one function per device meet issue 34's build and RSS goals?

A bound, not a design: the copies that replicate makes of tower 0's ops
(ResNet-50, 8 '/gpu:i' towers, default placement) are recorded, each tower's
NodeDefs are turned into one FunctionDef (inputs: what the copies read from
outside them; outputs: what is read from outside; control outputs: stateful
ops nobody reads), and a fresh process builds the one-GPU graph and then adds
the 7 functions, one StatefulPartitionedCall per tower and the gradient sums.
What it leaves out (building the FunctionDefs, the copies' control inputs from
outside) only makes the bound lower. Nothing is run: no GPU here.

  python benchmarks/function_towers.py [--rounds 3] [--python PY]

Prints, per round, process CPU time and `ru_maxrss` growth of the build,
against the one-GPU build of the same process (gpu_graph_bench.py's method).
Reads replicate's private GraphCopier to record the copies: a measurement
script, not library code.
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import collections
import gc
import os
import pickle
import resource
import sys
import tempfile
import time

import bench_util

TOWERS = 8


def _maxrss_mb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _output_args(op):
  """Output index -> 'arg:k', a FunctionDef's name for the op's output."""
  names = []
  for arg in op.op_def.output_arg:
    if arg.number_attr:
      count = op.node_def.attr[arg.number_attr].i
    elif arg.type_list_attr:
      count = len(op.node_def.attr[arg.type_list_attr].list.type)
    else:
      count = 1
    names.extend('{}:{}'.format(arg.name, k) for k in range(count))
  return names


def _function_def(name, ops, prefix, function_pb2):
  """One tower's copied ops as a FunctionDef, and what its call needs."""
  members = set(ops)
  local = lambda op_name: op_name[len(prefix):]
  fdef = function_pb2.FunctionDef()
  fdef.signature.name = name
  inputs, outputs, grads = collections.OrderedDict(), [], []
  for op in ops:
    node = fdef.node_def.add()
    node.CopyFrom(op.node_def)
    node.name = local(op.name)
    del node.input[:]
    for tensor in op.inputs:
      if tensor.op in members:
        node.input.append('{}:{}'.format(
            local(tensor.op.name), _output_args(tensor.op)[tensor.value_index]))
      else:
        if tensor.name not in inputs:
          arg = fdef.signature.input_arg.add()
          arg.name = 'in{}'.format(len(inputs))
          arg.type = tensor.dtype.base_dtype.as_datatype_enum
          inputs[tensor.name] = arg.name
        node.input.append(inputs[tensor.name])
    node.input.extend('^' + local(c.name) for c in op.control_inputs
                      if c in members)
    node.attr.pop('_class', None)
    read_outside = False
    for tensor in op.outputs:
      readers = [c for c in tensor.consumers() if c not in members]
      if readers:
        read_outside = True
        arg = fdef.signature.output_arg.add()
        arg.name = 'out{}'.format(len(outputs))
        arg.type = tensor.dtype.base_dtype.as_datatype_enum
        fdef.ret[arg.name] = '{}:{}'.format(
            local(op.name), _output_args(op)[tensor.value_index])
        outputs.append(local(tensor.name))
        grads.append(any(r.name.startswith('gradient_aggregation')
                         for r in readers))
    if op.op_def.is_stateful and not read_outside:
      fdef.signature.control_output.append(local(op.name))
      fdef.control_ret[local(op.name)] = local(op.name)
  fdef.signature.is_stateful = True
  return dict(fdef=fdef.SerializeToString(), inputs=list(inputs),
              outputs=outputs, grads=grads,
              nodedef_bytes=sum(op.node_def.ByteSize() for op in ops))


def extract(path):
  """Builds replicate's graph, records the copies, pickles the functions."""
  import gpu_graph_bench  # pylint: disable=g-import-not-at-top
  import graph_models  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.core.framework import function_pb2  # pylint: disable=g-import-not-at-top

  import replicate  # pylint: disable=g-import-not-at-top
  from replicate.graph_copy import graph_copier  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  copies = collections.defaultdict(list)
  original = graph_copier.GraphCopier._import  # pylint: disable=protected-access

  def recording_import(self, ops, todo):
    original(self, ops, todo)
    for tower in range(1, len(self._devices)):  # pylint: disable=protected-access
      copies[tower].extend(self._copies[tower][op.name] for op in ops)  # pylint: disable=protected-access

  graph_copier.GraphCopier._import = recording_import  # pylint: disable=protected-access
  model_fn, make_input, batch = graph_models.MODELS['resnet50']
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    with tf.device('/cpu:0'):
      features, labels = make_input(batch)
    gpu_graph_bench._builders(tf, replicate)['replicate'](  # pylint: disable=protected-access
        model_fn, features, labels,
        ['/gpu:{}'.format(i) for i in range(TOWERS)])
  towers = [_function_def('tower_{}_body'.format(t), copies[t],
                          'tower_{}/'.format(t), function_pb2)
            for t in range(1, TOWERS)]
  with open(path, 'wb') as f:
    pickle.dump(towers, f)


def measure(path):
  """One GPU's graph, then the 7 calls; ratios against the one GPU."""
  import graph_models  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  with open(path, 'rb') as f:
    towers = pickle.load(f)
  model_fn, make_input, batch = graph_models.MODELS['resnet50']
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    with tf.device('/cpu:0'):
      features, labels = make_input(batch)
    with tf.device('/cpu:0'), tf1.name_scope('split_inputs'):  # replicate's
      tf.split(features, TOWERS)
      tf.split(labels, TOWERS)
    gc.collect()
    rss0, cpu0 = _maxrss_mb(), time.process_time()
    with tf.device('/gpu:0'):
      model_fn(features, labels, tf1.estimator.ModeKeys.TRAIN,
               {'wrap_optimizer': lambda o: o})
    rss1, cpu1 = _maxrss_mb(), time.process_time()
    graph_def = tf1.GraphDef()
    graph_def.versions.CopyFrom(graph.graph_def_versions)
    input_map, calls = {}, []
    for tower, body in enumerate(towers, 1):
      fdef = graph_def.library.function.add()
      fdef.ParseFromString(body['fdef'])
      node = graph_def.node.add()
      node.name, node.op = 'tower_{}/call'.format(tower), 'StatefulPartitionedCall'
      node.device = '/gpu:{}'.format(tower)
      node.attr['Tin'].list.type.extend(
          a.type for a in fdef.signature.input_arg)
      node.attr['Tout'].list.type.extend(
          a.type for a in fdef.signature.output_arg)
      node.attr['f'].func.name = fdef.signature.name
      for k, name in enumerate(body['inputs']):
        key = 'input_{}_{}'.format(tower, k)
        node.input.append(key)
        input_map[key] = graph.get_tensor_by_name(name)
      calls.append(node.name)
    calls = tf1.import_graph_def(graph_def, input_map=input_map,
                                 return_elements=calls, name='')
    # The sums of the calls' gradients (tower 0's own, one GPU's, is named
    # otherwise here: one input fewer per sum).
    with tf.device('/cpu:0'), tf1.name_scope('gradient_aggregation'):
      for k, is_gradient in enumerate(towers[0]['grads']):
        if is_gradient:
          tf.math.add_n([call.outputs[k] for call in calls])
    rss2, cpu2 = _maxrss_mb(), time.process_time()
  bench_util.emit(dict(
      tf=tf.__version__, single_cpu_s=cpu1 - cpu0, single_rss_mb=rss1 - rss0,
      build_ratio=(cpu2 - cpu0) / (cpu1 - cpu0),
      rss_ratio=(rss2 - rss0) / (rss1 - rss0), ops=len(graph.get_operations()),
      fdef_bytes=sum(len(t['fdef']) for t in towers),
      nodedef_bytes=sum(t['nodedef_bytes'] for t in towers)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=3,
                      help='fresh measuring processes, one figure each')
  parser.add_argument('--python', default=None,
                      help='the Python (and so the TF) of the children')
  parser.add_argument('--extract', help='child: record the copies to FILE')
  parser.add_argument('--measure', help='child: build from FILE, measure')
  args = parser.parse_args()
  sys.path[:0] = [bench_util.HERE, os.path.join(bench_util.ROOT, 'tests')]
  if args.extract:
    return extract(args.extract)
  if args.measure:
    return measure(args.measure)
  path = os.path.join(tempfile.mkdtemp(), 'towers.pickle')
  script = os.path.abspath(__file__)
  bench_util.run_child(script, ['--extract', path], 1800, python=args.python)
  if not os.path.exists(path):
    sys.exit('extracting the copies failed')
  print('round  build vs one GPU  RSS vs one GPU  ops  FunctionDef MB '
        '(copied NodeDefs MB)')
  for r in range(args.rounds):
    res = bench_util.run_child(script, ['--measure', path], 1800,
                               python=args.python)
    if 'build_ratio' not in res:
      sys.exit('round {} failed: {}'.format(r, res))
    print('{:5d}  {:15.2f}x  {:13.2f}x  {:4d}  {:.2f} ({:.2f})  TF {}'.format(
        r, res['build_ratio'], res['rss_ratio'], res['ops'],
        res['fdef_bytes'] / 1e6, res['nodedef_bytes'] / 1e6, res['tf']))


if __name__ == '__main__':
  main()

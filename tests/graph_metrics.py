"""What a built training graph does with its all-reduce, without running it.

Used by the tests of the gradient all-reduce's buckets and, run as a script,
to print the figures of docs/performance.md ("Overlap of the all-reduce with
back-propagation"): `python tests/graph_metrics.py`. The GPU graph benchmark
(benchmarks/gpu_graph_bench.py) imports it too, for the overlap and for the
bytes crossing devices per step (`bytes_per_link`, tested by
tests/test_graph_metrics.py).

The method (/work/shared/MEASUREMENTS.md, "Overlap"): depth is the longest
path from a source, with creation order as a topological order (an input
created later, the back edge of a while loop, is ignored). A collective is
ready when the deepest op it waits for is done: its depth is the largest
depth among its members' inputs, control inputs included. The overlappable
share is the share of all-reduced bytes whose collective is ready before the
last one, so it can run while back-propagation goes on.
"""
import collections

import tensorflow as tf

_COLLECTIVE_TYPES = ('NcclAllReduce', 'CollectiveReduce', 'CollectiveReduceV2')

Collective = collections.namedtuple('Collective',
                                    ['key', 'ready_depth', 'bytes'])


def op_depths(graph):
  """`{op: depth}`: longest path from a source (a source has depth 0)."""
  depths = {}
  for op in graph.get_operations():
    depth = 0
    for pred in [t.op for t in op.inputs] + list(op.control_inputs):
      if pred in depths:  # Created earlier: not a while loop's back edge.
        depth = max(depth, depths[pred] + 1)
    depths[op] = depth
  return depths


def _key(op):
  """What identifies the collective `op` is a member of."""
  if op.type == 'NcclAllReduce':
    return op.get_attr('shared_name')
  if op.type == 'CollectiveReduce':
    return op.get_attr('instance_key')
  return op.inputs[3].op.name  # CollectiveReduceV2: its instance key input.


def collectives(graph):
  """The graph's all-reduces, in creation order, one entry per collective.

  Returns:
    `Collective(key, ready_depth, bytes)` per collective: `bytes` is the size
    of one member's input (what each device contributes).
  """
  depths = op_depths(graph)
  members = collections.OrderedDict()
  for op in graph.get_operations():
    if op.type in _COLLECTIVE_TYPES:
      members.setdefault(_key(op), []).append(op)
  result = []
  for key, ops in members.items():
    ready = max(depths[pred] for op in ops
                for pred in [t.op for t in op.inputs] + list(op.control_inputs))
    data = ops[0].inputs[0]
    result.append(Collective(key, ready,
                             data.shape.num_elements() * data.dtype.size))
  return result


def overlap_report(graph, gradient_bytes):
  """The all-reduce of one training graph, in numbers.

  Args:
    graph: a built training graph.
    gradient_bytes: the bytes of one tower's gradients (the ring floor
      all-reduces each exactly once).

  Returns:
    A dict: `collectives` (count), `bytes_vs_floor` (all-reduced bytes per
    device over `gradient_bytes`), `overlappable` (the share of all-reduced
    bytes whose collective is ready before the last one; None without a
    collective).
  """
  found = collectives(graph)
  if not found:
    return {'collectives': 0, 'bytes_vs_floor': 0.0, 'overlappable': None}
  total = sum(c.bytes for c in found)
  last = max(c.ready_depth for c in found)
  early = sum(c.bytes for c in found if c.ready_depth < last)
  return {'collectives': len(found),
          'bytes_vs_floor': float(total) / gradient_bytes,
          'overlappable': float(early) / total}


# ----------------------------------------------------------------------------
# Bytes crossing devices per step (MEASUREMENTS.md, "Bytes per step").
# ----------------------------------------------------------------------------

HOST_GPU, GPU_GPU, HOST_HOST, RING = ('host<->GPU', 'GPU<->GPU',
                                      'host<->host', 'NCCL ring')
LINKS = (HOST_GPU, GPU_GPU, HOST_HOST, RING)


def canonical_device(device):
  """`'/device:TYPE:i'` of a device string, job/replica/task dropped.

  An empty string stays empty (unplaced); a device without an index gets 0.
  """
  if not device:
    return ''
  spec = tf.DeviceSpec.from_string(device)
  return '/device:{}:{}'.format(spec.device_type.upper(),
                                spec.device_index or 0)


def train_cone(fetches):
  """The ops `fetches` (ops or tensors) depend on, inputs and control inputs."""
  stack = [getattr(f, 'op', f) for f in fetches]
  seen = set()
  while stack:
    op = stack.pop()
    if op in seen:
      continue
    seen.add(op)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return seen


def _is_handle(tensor):
  """Whether `tensor` is a resource handle or a reference (not data)."""
  return tensor.dtype == tf.resource or tensor.dtype._is_ref_dtype  # pylint: disable=protected-access


def op_devices(graph, default_device='/device:GPU:0'):
  """`{op: canonical device}` as TF's placer would resolve it, for every op.

  An op reading a resource handle or a reference takes the device of the op
  that made it (a variable's reads, updates and `Identity` stay with it); an
  op without a device takes its colocation group's; an op with neither
  takes `default_device`, the placer's first device of the highest-priority
  type (GPU:0 on a GPU machine).
  """
  return _resolve_devices(graph, default_device)[0]


def _resolve_devices(graph, default_device):
  """`(op_devices(graph, default_device), {ops that took the default})`."""
  devices = {}
  defaulted = set()
  by_name = {op.name: op for op in graph.get_operations()}

  def resolve(op, visiting):
    if op in devices:
      return devices[op]
    if op in visiting:  # A loop's back edge: decide by the op alone.
      return canonical_device(op.device) or canonical_device(default_device)
    visiting.add(op)
    device = ''
    handles = [t for t in op.inputs if _is_handle(t)]
    if handles:
      device = resolve(handles[0].op, visiting)
    if not device:
      device = canonical_device(op.device)
    if not device:
      for group in op.colocation_groups():
        other = by_name.get(group.decode()[len('loc:@'):])
        if other is not None and other is not op:
          device = resolve(other, visiting)
          break
    if not device:
      device = canonical_device(default_device)
      defaulted.add(op)
    devices[op] = device
    return device

  for op in graph.get_operations():
    resolve(op, set())
  return devices, defaulted


def _link(source, destination):
  """The link kind between two canonical devices."""
  gpus = ('GPU' in source) + ('GPU' in destination)
  return {2: GPU_GPU, 1: HOST_GPU, 0: HOST_HOST}[gpus]


def _tensor_bytes(tensor):
  """Bytes of `tensor` from its static shape, or None if not fully known."""
  elements = tensor.shape.num_elements()
  if elements is None or tensor.dtype == tf.string:
    return None
  return elements * tensor.dtype.size


def bytes_per_link(fetches, default_device='/device:GPU:0'):
  """Bytes crossing devices in one run of `fetches`, by link kind.

  For every op in the cone of `fetches`, each input produced on another
  device counts once per (tensor, destination device): the Send/Recv pairs
  TF's partitioner inserts. Devices as `op_devices` resolves them. Handles
  and references move no data. A collective all-reduce (`NcclAllReduce`,
  `CollectiveReduce[V2]`) of N members moves its data inside the
  collective, counted as a ring: 2(N-1)/N x the bytes of one member's input
  per member, i.e. 2(N-1) x those bytes per collective.

  Returns:
    A dict: bytes per link kind (`LINKS`), `total`, `unknown_tensors` (the
    crossing tensors whose size is not static, strings included: counted as
    0 bytes) and `unplaced_ops` (ops of the cone that took
    `default_device`).
  """
  fetches = list(fetches)
  graph = fetches[0].graph
  devices, defaulted = _resolve_devices(graph, default_device)
  cone = train_cone(fetches)
  result = dict.fromkeys(LINKS, 0)
  unknown = 0
  crossed = set()
  members = collections.defaultdict(list)
  for op in cone:
    if op.type in _COLLECTIVE_TYPES:
      members[_key(op)].append(op)
    destination = devices[op]
    for tensor in op.inputs:
      source = devices[tensor.op]
      if (source == destination or _is_handle(tensor) or
          (tensor, destination) in crossed):
        continue
      crossed.add((tensor, destination))
      size = _tensor_bytes(tensor)
      if size is None:
        unknown += 1
      else:
        result[_link(source, destination)] += size
  for ops in members.values():
    size = _tensor_bytes(ops[0].inputs[0])
    if size is None:
      unknown += 1
    else:
      result[RING] += 2 * (len(ops) - 1) * size
  result['total'] = sum(result[link] for link in LINKS)
  result['unknown_tensors'] = unknown
  result['unplaced_ops'] = len(cone & defaulted)
  return result


def ring_floor(num_devices, gradient_bytes):
  """Bytes of the ring all-reduce of every gradient: 2(N-1) x P, or None.

  None for one device, where there is nothing to all-reduce.
  """
  return 2 * (num_devices - 1) * gradient_bytes if num_devices > 1 else None


def mlp_model_fn(widths):
  """A `model_fn` of dense layers of `widths`, SGD through TowerOptimizer."""
  import replicate  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1

  def model_fn(features, labels, mode, params):
    del params
    net = features
    for index, width in enumerate(widths):
      net = tf1.layers.dense(
          net, width, activation=tf.nn.relu if index < len(widths) - 1
          else None, name='dense_{}'.format(index))
    loss = tf1.losses.mean_squared_error(labels, net)
    train_op = replicate.TowerOptimizer(
        tf1.train.GradientDescentOptimizer(0.1)).minimize(
            loss, tf1.train.get_or_create_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


def cnn_model_fn(features, labels, mode, params):
  """A small CNN (3 conv layers, 2 dense) on 32x32x3 images."""
  import replicate  # pylint: disable=g-import-not-at-top
  del params
  tf1 = tf.compat.v1
  net = features
  for index, filters in enumerate([32, 64, 64]):
    net = tf1.layers.conv2d(net, filters, 3, padding='same',
                            activation=tf.nn.relu,
                            name='conv_{}'.format(index))
    net = tf1.layers.max_pooling2d(net, 2, 2)
  net = tf1.layers.flatten(net)
  net = tf1.layers.dense(net, 128, activation=tf.nn.relu, name='fc')
  logits = tf1.layers.dense(net, 10, name='logits')
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = replicate.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(0.1)).minimize(
          loss, tf1.train.get_or_create_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def build_replicated(model_fn, features, labels, devices, cross_tower_ops):
  """Builds `model_fn`'s REPLICATED training graph; returns `(graph, bytes)`.

  `bytes` is the size of one tower's trainable variables (its gradients).
  """
  import replicate  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  with tf.Graph().as_default() as graph:
    replicate.replicate_model_fn(
        model_fn, devices=devices,
        variable_placement=replicate.VariablePlacement.REPLICATED,
        cross_tower_ops=cross_tower_ops)(
            features(), labels(), tf1.estimator.ModeKeys.TRAIN, {}, None)
    first_tower = [v for v in tf1.trainable_variables()
                   if not v.op.name.startswith('tower_')]
    size = sum(v.shape.num_elements() * v.dtype.size for v in first_tower)
  return graph, size


# The models of docs/performance.md, global batch 256: the benchmarks' wide
# MLP (784-2048-2048-10, P = 23.3 MB), eight dense layers of different
# widths (P = 0.6 MB, tests/towers/test_all_reduce_overlap.py), the small
# CNN above (P = 0.8 MB) and the benchmarks' deep model.
WIDE = (mlp_model_fn([2048, 2048, 10]),
        lambda: tf.zeros([256, 784]), lambda: tf.zeros([256, 10]))
DENSE8 = (mlp_model_fn([48, 96, 160, 256, 192, 128, 64, 10]),
          lambda: tf.zeros([256, 16]), lambda: tf.zeros([256, 10]))
CNN = (cnn_model_fn, lambda: tf.zeros([256, 32, 32, 3]),
       lambda: tf.zeros([256], tf.int32))
# The benchmarks' deep model: 100 dense layers of 64 (P = 1.7 MB).
DEEP = (mlp_model_fn([64] * 100), lambda: tf.zeros([256, 64]),
        lambda: tf.zeros([256, 64]))


def main():
  import replicate  # pylint: disable=g-import-not-at-top
  devices = ['/gpu:{}'.format(i) for i in range(8)]
  variants = [
      ('num_packs=1 (one pack, before)', dict(num_packs=1)),
      ('num_packs=0 (one per variable)', dict(num_packs=0)),
      ('defaults (backward-order buckets)', {}),
  ]
  for name, (model_fn, features, labels) in [
      ('wide', WIDE), ('dense8', DENSE8), ('cnn', CNN), ('deep', DEEP)]:
    for label, kwargs in variants:
      graph, size = build_replicated(
          model_fn, features, labels, devices,
          replicate.AllReduceCrossTowerOps('nccl', **kwargs))
      report = overlap_report(graph, size)
      print('{:6} P={:.1f} MB  {:36} collectives {:3d}  bytes/floor {:.3f}  '
            'overlappable {:.2f}'.format(
                name, size / 1e6, label, report['collectives'],
                report['bytes_vs_floor'], report['overlappable']))


if __name__ == '__main__':
  main()

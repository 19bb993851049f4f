"""graph_metrics.bytes_per_link on tiny graphs whose answers are known.

The GPU graph benchmark reports bytes crossing devices per step from this
analysis (MEASUREMENTS.md's method): each input produced on another device
counts once per (tensor, destination device), devices resolved as TF's
placer would (a resource or reference goes with its handle, an unplaced op
with its colocation group), and an all-reduce as a ring. Graphs are built
for '/gpu:i' and never run.
"""
import graph_metrics
import tensorflow as tf

tf1 = tf.compat.v1
_HOST_GPU, _GPU_GPU, _RING = (graph_metrics.HOST_GPU, graph_metrics.GPU_GPU,
                              graph_metrics.RING)


class BytesPerLinkTest(tf.test.TestCase):

  def test_a_tensor_counts_once_per_destination_device(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        x = tf.zeros([1000])  # 1000 float32: 4000 bytes.
      with tf.device('/gpu:1'):
        a = x * 2.0
        b = x + 1.0  # Same tensor, same device: no second transfer.
      with tf.device('/job:localhost/replica:0/task:0/device:GPU:2'):
        c = tf.reduce_sum(x)  # Another device: 4000 bytes more.
      with tf.device('/gpu:2'):
        d = a + b  # a and b, 4000 bytes each, from GPU:1 to GPU:2.
        e = c * 3.0  # c is on GPU:2 already (job/replica/task dropped).
      result = graph_metrics.bytes_per_link([d, e])
    # host<->GPU: x to GPU:1 and to GPU:2 = 2 x 4000.
    self.assertEqual(8000, result[_HOST_GPU])
    self.assertEqual(8000, result[_GPU_GPU])
    self.assertEqual(0, result[_RING])
    self.assertEqual(16000, result['total'])
    self.assertEqual(0, result['unknown_tensors'])
    self.assertEqual(0, result['unplaced_ops'])

  def test_ops_outside_the_cone_move_nothing(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        x = tf.zeros([1000])
      with tf.device('/gpu:0'):
        fetched = x * 2.0  # 4000 bytes.
      with tf.device('/gpu:1'):
        _ = x + 1.0  # Not fetched: no transfer.
      result = graph_metrics.bytes_per_link([fetched])
    self.assertEqual(4000, result['total'])

  def test_a_resource_read_goes_by_its_handles_device(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        var = tf1.get_variable('v', [10, 10], use_resource=True)
      with tf.device('/gpu:0'):
        # The ReadVariableOp asks for GPU:0, but runs beside its handle on
        # CPU:0: its 10 x 10 float32 output (400 bytes) crosses to the
        # matmul on GPU:0.
        read = tf.raw_ops.ReadVariableOp(resource=var.handle,
                                         dtype=tf.float32)
        product = tf.matmul(read, read)
      result = graph_metrics.bytes_per_link([product])
      devices = graph_metrics.op_devices(read.graph)
    self.assertIn('GPU:0', read.op.device)
    self.assertEqual('/device:CPU:0', devices[read.op])
    self.assertEqual(400, result[_HOST_GPU])
    self.assertEqual(400, result['total'])

  def test_a_reference_update_goes_by_its_variables_device(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        var = tf1.Variable(tf.zeros([5]), use_resource=False)
      with tf.device('/gpu:0'):
        grad = tf.ones([5]) * 3.0
      update = tf1.assign_add(var, grad)
      # TF colocates it with its variable; as an imported op asking for
      # GPU:1 it still runs on CPU:0 with the variable it updates: the 5
      # float32 of `grad` (20 bytes) cross from GPU:0.
      update.op._set_device('/gpu:1')  # pylint: disable=protected-access
      result = graph_metrics.bytes_per_link([update])
    self.assertEqual(20, result[_HOST_GPU])
    self.assertEqual(0, result[_GPU_GPU])

  def test_an_unplaced_op_takes_its_colocation_groups_device(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        x = tf.zeros([10])  # 40 bytes.
      with tf.device('/gpu:1'):
        anchor = tf.zeros([3])
      with tf1.colocate_with(anchor.op, ignore_existing=True):
        near = x * 2.0  # On GPU:1 with `anchor`: x crosses, 40 bytes.
      # As an imported op without a device: only its colocation places it.
      near.op._set_device('')  # pylint: disable=protected-access
      with tf.device(None):
        loose = tf.reduce_sum(x)  # The default device, GPU:0: 40 more.
      result = graph_metrics.bytes_per_link([near, loose, anchor])
    self.assertEqual('', near.op.device)
    self.assertEqual(80, result[_HOST_GPU])
    # `loose` and tf.reduce_sum's axis constant took the default device.
    self.assertEqual(2, result['unplaced_ops'])

  def test_unknown_sizes_are_counted_apart(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        x = tf1.placeholder(tf.float32, [None, 3])
        y = tf.zeros([4])  # 16 bytes.
      with tf.device('/gpu:0'):
        out = tf.reduce_sum(x) + tf.reduce_sum(y)
      result = graph_metrics.bytes_per_link([out])
    self.assertEqual(16, result['total'])
    self.assertEqual(1, result['unknown_tensors'])

  def test_an_nccl_all_reduce_is_a_ring(self):
    with tf.Graph().as_default():
      outputs = []
      for i in range(4):
        with tf.device('/gpu:{}'.format(i)):
          # 250 float32 per member: 1000 bytes, made on its own GPU.
          grad = tf.fill([250], float(i + 1))
          outputs.append(tf.raw_ops.NcclAllReduce(
              input=grad, reduction='sum', num_devices=4, shared_name='c0'))
      result = graph_metrics.bytes_per_link(outputs)
    # Each of 4 members sends 2(4-1)/4 x 1000 bytes: 6000 in all.
    self.assertEqual(6000, result[_RING])
    self.assertEqual(6000, result['total'])
    self.assertEqual(0, result[_HOST_GPU] + result[_GPU_GPU])

  def test_ring_floor(self):
    # 2(N-1) x P: 8 towers, 1000 bytes of gradients.
    self.assertEqual(14000, graph_metrics.ring_floor(8, 1000))
    self.assertIsNone(graph_metrics.ring_floor(1, 1000))

  def test_canonical_device(self):
    self.assertEqual('/device:GPU:3', graph_metrics.canonical_device(
        '/job:worker/replica:0/task:1/device:gpu:3'))
    self.assertEqual('/device:CPU:0', graph_metrics.canonical_device('/cpu'))
    self.assertEqual('', graph_metrics.canonical_device(''))


if __name__ == '__main__':
  tf.test.main()

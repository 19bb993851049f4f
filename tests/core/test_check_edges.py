"""Edges of the core checks: fp16 compression of IndexedSlices keeps their
dense shape (core/compression.py); a boolean GPU count and a visible device
list past the GPUs (core/device_check.py)."""
import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1
from replicate.core import compression
from replicate.core import device_check
from replicate.core import device_util


def _num_gpus():
  return len(tf.config.experimental.list_physical_devices('GPU'))


class CompressionShapeTest(tf.test.TestCase):

  def test_fp16_indexed_slices_keep_their_dense_shape(self):
    # Sent and restored slices keep dense_shape [4, 2] (a sparse gradient
    # of a 4x2 variable); without it they cannot be densified.
    with tf.Graph().as_default():
      slices = tf.IndexedSlices(tf.constant([[1.5, 2.0], [3.0, 4.0]]),
                                tf.constant([2, 0]), tf.constant([4, 2]))
      sent, context = compression.Compression.fp16.compress(slices)
      restored = compression.Compression.fp16.decompress(sent, context)
      self.assertIsNotNone(sent.dense_shape)
      self.assertIsNotNone(restored.dense_shape)
      with tf1.Session() as sess:
        self.assertAllEqual([4, 2], sess.run(restored.dense_shape))
        # Rows 2 and 0 of a 4x2 zero matrix.
        self.assertAllEqual([[3.0, 4.0], [0.0, 0.0], [1.5, 2.0], [0.0, 0.0]],
                            sess.run(tf.convert_to_tensor(restored)))


class DeviceCountTest(tf.test.TestCase):

  def test_boolean_num_gpus_is_refused(self):
    # True is an int to Python, but not a GPU count.
    with self.assertRaisesRegex(TypeError, 'num_gpus must be an int, got True'):
      replicate.MirroredStrategy(num_gpus=True)
    with self.assertRaisesRegex(TypeError, 'num_gpus must be an int, got False'):
      device_check.devices_or_gpus(None, None, False)

  def test_visible_device_list_beyond_the_gpus_gives_none(self):
    # visible_device_list names GPU index N where only N GPUs (0..N-1) are
    # visible: the session has no GPU at all, so /gpu:0 is missing.
    config = tf1.ConfigProto()
    config.gpu_options.visible_device_list = str(_num_gpus())
    devices = device_check.session_devices(config)
    self.assertEqual([], [d for d in devices
                          if device_util.device_type_of(d) == 'GPU'])
    with self.assertRaisesRegex(
        errors.InvalidArgumentError,
        r'Device /device:GPU:0 does not exist'):
      device_check.check_devices_exist(['/gpu:0'], config)


if __name__ == '__main__':
  tf.test.main()

"""Tests for `replicate.core.compression` (stateless compress/decompress)."""
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from replicate import testing
from replicate._compat import tf1
from replicate.core import compression


class CompressionTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.named_parameters(('float32', np.float32),
                                  ('float64', np.float64))
  def test_fp16_halves_floats_and_restores_the_dtype(self, dtype):
    # 1/3 is not a float16: it comes back rounded to float16's 11 bits.
    value = np.array([[1.0 / 3, -2.5], [1024.0, 0.0]], dtype)
    with tf.Graph().as_default():
      with tf.device('/cpu:1'):
        tensor = tf.constant(value)
      sent, context = compression.Compression.fp16.compress(tensor)
      self.assertEqual(tf.float16, sent.dtype)
      # The cast runs where the value is, so half the bytes cross devices.
      self.assertEqual(tensor.device, sent.device)
      restored = compression.Compression.fp16.decompress(sent, context)
      self.assertEqual(tf.as_dtype(dtype), restored.dtype)
      with tf1.Session(config=testing.virtual_cpu_config(2)) as sess:
        got = sess.run(restored)
    self.assertAllEqual(value.astype(np.float16).astype(dtype), got)
    self.assertNotEqual(value[0, 0], got[0, 0])

  @parameterized.named_parameters(('int32', tf.int32), ('float16', tf.float16),
                                  ('bfloat16', tf.bfloat16))
  def test_fp16_leaves_narrow_and_integer_values(self, dtype):
    with tf.Graph().as_default():
      tensor = tf.zeros([3], dtype)
      sent, context = compression.Compression.fp16.compress(tensor)
      self.assertIs(tensor, sent)
      self.assertIs(tensor, compression.Compression.fp16.decompress(
          sent, context))

  def test_fp16_indexed_slices_keep_their_indices(self):
    with tf.Graph().as_default():
      slices = tf.IndexedSlices(tf.constant([[1.5, 2.0], [3.0, 4.0]]),
                                tf.constant([2, 0]), tf.constant([4, 2]))
      sent, context = compression.Compression.fp16.compress(slices)
      self.assertIsInstance(sent, tf.IndexedSlices)
      self.assertEqual(tf.float16, sent.values.dtype)
      self.assertIs(slices.indices, sent.indices)
      restored = compression.Compression.fp16.decompress(sent, context)
      self.assertEqual(tf.float32, restored.values.dtype)
      with tf1.Session() as sess:
        self.assertAllEqual([[1.5, 2.0], [3.0, 4.0]],
                            sess.run(restored.values))

  def test_none_is_the_identity(self):
    with tf.Graph().as_default():
      tensor = tf.ones([2])
      sent, context = compression.Compression.none.compress(tensor)
      self.assertIs(tensor, sent)
      self.assertIs(tensor, compression.Compression.none.decompress(
          sent, context))

  def test_is_compressor(self):
    self.assertTrue(compression.is_compressor(compression.Compression.fp16))
    self.assertTrue(compression.is_compressor(compression.FP16Compressor()))
    self.assertFalse(compression.is_compressor('fp16'))
    self.assertFalse(compression.is_compressor(None))


if __name__ == '__main__':
  tf.test.main()

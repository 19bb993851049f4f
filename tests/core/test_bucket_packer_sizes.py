"""BucketPacker's `max_bytes`: the size its buckets fill to, over the default."""
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1
from replicate.core import buckets


def _mlp_gradients(num_layers=4):
  """The gradients of dense layers 0..n-1 (kernel, bias), in forward order.

  Each layer's gradients are ready at their own depth: layer 3 first.
  """
  net = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
  for index in range(num_layers):
    net = tf1.layers.dense(net, 4 + index, activation=tf.nn.tanh,
                           name='layer_{}'.format(index))
  return tf.gradients(tf.reduce_sum(net), tf1.trainable_variables())


class BucketPackerSizeTest(tf.test.TestCase):

  def _bucket_elements(self, **kwargs):
    with tf.Graph().as_default():
      grads = _mlp_gradients()
      packer = buckets.BucketPacker(replicate.Tuning(), **kwargs)
      packed = packer.pack([[(g, None) for g in grads]])
      return [t.shape.num_elements() for t, _ in packed[0]]

  def test_max_bytes_overrides_the_tuning(self):
    # Elements per layer (kernel + bias): 4*4+4 = 20, 4*5+5 = 25,
    # 5*6+6 = 36, 6*7+7 = 49; 130 in all (520 bytes).
    # A bucket of 10**6 bytes holds them all: one bucket, 130 elements.
    # (The Tuning's default would fill to ceil(520 / 8) = 65 bytes, closing
    # a bucket after every layer: 4 buckets.)
    self.assertEqual([130], self._bucket_elements(max_bytes=10 ** 6))
    # One byte: one bucket per layer, the last layer's first.
    self.assertEqual([49, 36, 25, 20], self._bucket_elements(max_bytes=1))

  def test_default_fills_to_a_share_of_the_total(self):
    # No max_bytes: min(25 MiB, ceil(520 / 8) = 65) bytes; every layer's
    # gradients (80 bytes or more) fill a bucket: one per layer.
    self.assertEqual([49, 36, 25, 20], self._bucket_elements())


if __name__ == '__main__':
  tf.test.main()

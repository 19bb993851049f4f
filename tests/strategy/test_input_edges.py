"""Edges of input: a one-replica MirroredStrategy, NumPy inputs without an
example dimension, and InputContext's bounds.

With one device nothing is split, but an unbatched (scalar) dataset is
still refused with an explanation (TF 1.15's MirroredStrategy refuses it on
one device too, with 'Input shape should have at least one dimension'),
never with an IndexError from deep inside the split.
"""
import numpy as np
import tensorflow as tf

import replicate
from replicate import errors
from replicate import testing
from replicate._compat import tf1

DEVICES = testing.virtual_cpu_devices(2)


class OneReplicaInputTest(tf.test.TestCase):

  def test_scalar_dataset_on_one_device_is_refused_clearly(self):
    strategy = replicate.MirroredStrategy([DEVICES[0]])
    with tf.Graph().as_default():
      for make in (strategy.make_dataset_iterator,
                   lambda d: strategy.experimental_distribute_dataset(
                       d).make_initializable_iterator()):
        # Where the iterator is made (as TF) or where get_next is built:
        # either way a ValueError that says to batch the dataset.
        with self.assertRaisesRegex(ValueError, r'(?i)batch'):
          make(tf.data.Dataset.range(3)).get_next()

  def test_batched_dataset_on_one_device_is_not_split(self):
    strategy = replicate.MirroredStrategy([DEVICES[0]])
    with tf.Graph().as_default():
      iterator = strategy.make_dataset_iterator(
          tf.data.Dataset.range(5).batch(3))
      pieces = strategy.experimental_local_results(iterator.get_next())
      self.assertLen(pieces, 1)
      with tf1.Session(config=testing.virtual_cpu_config(2)) as sess:
        sess.run(iterator.initialize())
        # Whole batches, the partial last one too.
        self.assertAllEqual(sess.run(pieces[0]), [0, 1, 2])
        self.assertAllEqual(sess.run(pieces[0]), [3, 4])


  def test_one_device_gives_plain_tensors_from_every_input_api(self):
    # As TF's MirroredStrategy on one device: the batch itself, placed on
    # the device, from a dataset's iterator as from an input_fn's (the
    # dataset's was a one-device PerReplica before 2026-11-28).
    strategy = replicate.MirroredStrategy([DEVICES[1]])
    with tf.Graph().as_default():
      dataset = tf.data.Dataset.range(6).batch(3)
      for element in (
          strategy.make_dataset_iterator(dataset).get_next(),
          strategy.make_input_fn_iterator(lambda _: dataset).get_next(),
          strategy.experimental_distribute_dataset(
              dataset).make_initializable_iterator().get_next()):
        self.assertIsInstance(element, tf.Tensor)
        self.assertIn('CPU:1', element.device)


class NumpyScalarInputTest(tf.test.TestCase):

  def test_numpy_scalars_are_refused_with_the_librarys_message(self):
    # Scalars have no first dimension of examples: refused by the length
    # check, all of them scalars too (not left to from_tensor_slices).
    strategy = replicate.MirroredStrategy(DEVICES)
    with tf.Graph().as_default():
      for numpy_input in (np.float32(3.), (np.float32(1.), np.int64(2))):
        with self.assertRaisesRegex(errors.InvalidArgumentError,
                                    'must all have the same first dimension'):
          strategy.experimental_make_numpy_iterator(numpy_input,
                                                    batch_size=2)



class InputContextBoundsTest(tf.test.TestCase):

  def test_negative_pipeline_id_is_refused(self):
    # -1 is below the range [0, 2), as 2 is above it.
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'input_pipeline_id must be an integer >= 0, '
                                'got -1'):
      replicate.InputContext(num_input_pipelines=2, input_pipeline_id=-1)

  def test_last_pipeline_id_is_accepted(self):
    context = replicate.InputContext(num_input_pipelines=3,
                                     input_pipeline_id=2,
                                     num_replicas_in_sync=6)
    self.assertEqual(2, context.input_pipeline_id)
    self.assertEqual(4, context.get_per_replica_batch_size(24))



if __name__ == '__main__':
  tf.test.main()

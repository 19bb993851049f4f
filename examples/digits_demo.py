"""Train a handwritten-digit classifier on 4 virtual CPU devices with replicate.

The data is scikit-learn's bundled copy of the UCI handwritten digits (1,797
8x8 images, no download). The model_fn is ordinary TF1 Estimator code; the only
replicate-specific lines are the `replicate.TowerOptimizer` wrapper and the
`replicate.replicate_model_fn(...)` call.

    python examples/digits_demo.py [--devices 4] [--steps 1500] [--model_dir DIR]

Logs loss and examples/s while training, evaluates on held-out digits (exits
non-zero if accuracy is not above 0.9), predicts a few examples, leaves
TensorBoard summaries in the model directory, and exports a SavedModel that
it reloads on one CPU to predict a digit (the export is the single-device
model: it serves anywhere, whatever devices trained it).
"""
import argparse
import os
import sys
import tempfile
import time

# TensorFlow's C++ INFO lines (e.g. TF 2.15's "Local rendezvous" notes at the
# end of each input pipeline) would bury the demo's output; a level the user
# set is kept. It only takes effect before TensorFlow is imported.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')

import numpy as np  # pylint: disable=g-import-not-at-top
from sklearn import datasets  # pylint: disable=g-import-not-at-top
from sklearn import model_selection  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import replicate  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


def model_fn(features, labels, mode, params):
  """A plain two-hidden-layer MLP model_fn, as users already write them."""
  training = mode == tf1.estimator.ModeKeys.TRAIN
  net = features['pixels']
  for units in params['hidden_units']:
    net = tf1.layers.dense(net, units, activation=tf.nn.relu)
    net = tf1.layers.dropout(net, rate=0.1, training=training)
  logits = tf1.layers.dense(net, 10, name='logits')
  classes = tf.argmax(logits, axis=1)
  if mode == tf1.estimator.ModeKeys.PREDICT:
    return tf1.estimator.EstimatorSpec(
        mode, predictions={'class': classes,
                           'probabilities': tf.nn.softmax(logits)})

  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  accuracy = tf1.metrics.accuracy(labels, classes)
  # In training, replicate_model_fn calls this function once and copies the
  # towers' training ops from it, so the summary exists once (tower 0's).
  tf1.summary.scalar('batch_accuracy',
                     tf.reduce_mean(tf.cast(tf.equal(labels, classes),
                                            tf.float32)))
  optimizer = replicate.TowerOptimizer(
      tf1.train.AdamOptimizer(params['learning_rate']))
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  return tf1.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metric_ops={'accuracy': accuracy})


class ThroughputHook(tf1.train.SessionRunHook):
  """Logs loss and examples/s every `every_n_steps` steps and at the last."""

  def __init__(self, loss, batch_size, every_n_steps):
    self._loss = loss
    self._batch_size = batch_size
    self._every_n_steps = every_n_steps

  def after_create_session(self, session, coord):
    # Steps are counted here rather than read from the global step in each
    # run: that read may see the step's increment or not (TF 2.15's resource
    # variable does not), which skipped the last line.
    self._step = session.run(tf1.train.get_global_step())
    self._reported_step = self._step
    self._start = None

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    self._step += 1
    self._last_loss = run_values.results
    if self._start is None:  # the first step builds and warms up: not timed
      self._start, self._start_step = time.time(), self._step
    elif self._step % self._every_n_steps == 0:
      self._report()

  def end(self, session):
    if self._start is not None and self._step != self._reported_step:
      self._report()

  def _report(self):
    now = time.time()
    rate = (self._step - self._start_step) * self._batch_size / max(
        now - self._start, 1e-9)
    print('step {:5d}  loss {:.4f}  {:8.0f} examples/s'.format(
        self._step, self._last_loss, rate), flush=True)
    self._start, self._start_step = now, self._step
    self._reported_step = self._step


def with_throughput_logging(replicated_model_fn, batch_size, every_n_steps):
  """Adds a ThroughputHook on the (summed) training loss of the spec."""

  def logged_model_fn(features, labels, mode, params, config):
    spec = replicated_model_fn(features, labels, mode, params, config)
    if mode != tf1.estimator.ModeKeys.TRAIN:
      return spec
    hook = ThroughputHook(spec.loss, batch_size, every_n_steps)
    return spec._replace(training_hooks=list(spec.training_hooks) + [hook])

  return logged_model_fn


def load_digits():
  digits = datasets.load_digits()
  pixels = (digits.data / 16.0).astype(np.float32)
  labels = digits.target.astype(np.int64)
  return model_selection.train_test_split(
      pixels, labels, test_size=0.25, random_state=0, stratify=labels)


def eval_input_fn(pixels, labels, batch_size):
  """Every held-out digit once; the last batch may be partial."""
  return lambda: tf1.data.Dataset.from_tensor_slices(
      ({'pixels': pixels}, labels)).batch(batch_size)


def serving_input_fn():
  """Serving requests: any number of images of 64 pixels."""
  pixels = {'pixels': tf1.placeholder(tf.float32, [None, 64], name='pixels')}
  return tf1.estimator.export.ServingInputReceiver(pixels, pixels)


def serve(export_dir, pixels):
  """Loads the SavedModel as a server would and runs its default signature.

  A fresh graph, a session of one CPU without soft placement: the export
  holds the model once, unpinned, so it needs none of the training devices.
  """
  graph = tf.Graph()
  config = tf1.ConfigProto(device_count={'CPU': 1}, allow_soft_placement=False)
  with graph.as_default(), tf1.Session(graph=graph, config=config) as sess:
    meta_graph = tf1.saved_model.loader.load(
        sess, [tf1.saved_model.tag_constants.SERVING], export_dir)
    signature = meta_graph.signature_def['serving_default']
    return sess.run(
        {key: info.name for key, info in signature.outputs.items()},
        {signature.inputs['pixels'].name: pixels})


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--devices', type=int, default=4,
                      help='number of virtual CPU devices (towers) '
                      '(default: %(default)s)')
  parser.add_argument('--steps', type=int, default=1500,
                      help='training steps (default: %(default)s)')
  parser.add_argument('--batch_size', type=int, default=128,
                      help='global batch, split over the towers as evenly '
                      'as it goes (default: %(default)s)')
  parser.add_argument('--model_dir', default=None,
                      help='checkpoints and TensorBoard summaries '
                      '(default: a new temporary directory)')
  return parser.parse_args(argv)


def main(argv):
  args = parse_args(argv)
  verbosity = tf1.logging.get_verbosity()
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  try:
    return run(args)
  finally:
    tf1.logging.set_verbosity(verbosity)  # tests call main() in-process


def run(args):
  """Trains, evaluates, predicts and exports; 0 if accuracy is above 0.9."""
  model_dir = args.model_dir or tempfile.mkdtemp(prefix='replicate_digits_')

  x_train, x_test, y_train, y_test = load_digits()
  print('Digits: {} training and {} test images of 8x8 pixels; {} towers on '
        'virtual CPUs; global batch {}.'.format(
            len(x_train), len(x_test), args.devices, args.batch_size))

  def train_input_fn():
    dataset = tf1.data.Dataset.from_tensor_slices(({'pixels': x_train}, y_train))
    return dataset.shuffle(len(x_train), seed=0).repeat().batch(
        args.batch_size)

  config = tf1.estimator.RunConfig(
      model_dir=model_dir, tf_random_seed=0, save_summary_steps=50,
      log_step_count_steps=None,
      session_config=replicate.testing.virtual_cpu_config(args.devices))
  estimator = tf1.estimator.Estimator(
      model_fn=with_throughput_logging(
          replicate.replicate_model_fn(
              model_fn,
              devices=replicate.testing.virtual_cpu_devices(args.devices)),
          args.batch_size, every_n_steps=250),
      config=config,
      params={'hidden_units': [128, 64], 'learning_rate': 3e-3})

  start = time.time()
  estimator.train(train_input_fn, steps=args.steps)
  print('Trained {} steps in {:.1f} s.'.format(args.steps, time.time() - start))

  metrics = estimator.evaluate(
      eval_input_fn(x_test, y_test, args.batch_size))
  print('Evaluation on {} held-out digits: accuracy {:.4f}, loss {:.4f}'.format(
      len(x_test), metrics['accuracy'], metrics['loss']))

  few = 8
  predictions = estimator.predict(
      lambda: tf1.data.Dataset.from_tensor_slices(
          {'pixels': x_test[:few]}).batch(few))
  for i, prediction in enumerate(predictions):
    print('  digit {}: predicted {} (p={:.3f}), true {}'.format(
        i, prediction['class'], prediction['probabilities'].max(), y_test[i]))

  export_dir = estimator.export_saved_model(
      os.path.join(model_dir, 'export'), serving_input_fn)
  export_dir = export_dir.decode() if isinstance(export_dir, bytes) else (
      export_dir)
  served = serve(export_dir, x_test[:1])
  print('Exported SavedModel {}\n  reloaded on 1 CPU (no soft placement): '
        'digit 0 predicted {} (p={:.3f}), true {}'.format(
            export_dir, served['class'][0], served['probabilities'][0].max(),
            y_test[0]))

  print('TensorBoard summaries and checkpoints: {}\n  tensorboard --logdir {}'
        .format(model_dir, model_dir))
  if metrics['accuracy'] <= 0.9:
    print('FAILED: accuracy {:.4f} is not above 0.9'.format(
        metrics['accuracy']))
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))

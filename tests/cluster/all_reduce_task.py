"""One training task of a localhost all-reduce cluster (run by the tests).

Usage: TF_CONFIG=... python all_reduce_task.py OUT_JSON MODEL_DIR OPTIMIZER
STEPS [TIMEOUT_SECS [DIE_AT_STEP]]

Starts this task's server with `replicate.multi_worker.all_reduce_server`,
trains `replicate_model_fn(..., variable_placement=REPLICATED)` on two
virtual CPUs with `Estimator.train(max_steps=STEPS)`, and writes to OUT_JSON
the task's trainable variables (tower 0's), tower 1's copies, the global
step and tower 0's loss in the first local step. Task k of the training tasks (chief
first) reads rows 8k..8k+7 of `ROWS_X`/`ROWS_Y` every step (4 per tower).
The process ends itself after TIMEOUT_SECS (exit status 3) whatever TF does,
and, to stand for a lost task, at once after local step DIE_AT_STEP (exit
status 4). The chief saves checkpoints to MODEL_DIR; others never write.
ALL_REDUCE_TASK_EXTRA_VARIABLES (see model_fn_for) makes a task's model
differ from the others'; ALL_REDUCE_TASK_TOWERS gives a task another number
of towers (1 or 2).
"""
import json
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

NUM_CPUS = 2
ROWS_PER_TASK = 8
LEARNING_RATE = 0.1
OPERATION_TIMEOUT_MS = 20000
# 16 distinct rows: two tasks of 8, four towers of 4.
ROWS_X = (np.arange(48, dtype=np.float32).reshape(16, 3) % 7 / 7. -
          0.4).astype(np.float32)
ROWS_Y = (ROWS_X.dot(np.array([[1.], [-2.], [0.5]], np.float32)) +
          0.3).astype(np.float32)
# Non-uniform initial weights, equal on every task only if broadcast (the
# worker's own initializer is seeded differently, see model_fn).
INITIAL_KERNEL = np.array([[0.3], [-0.1], [0.2]], np.float32)


def make_optimizer(tf1, name):
  if name == 'sgd':
    return tf1.train.GradientDescentOptimizer(LEARNING_RATE)
  if name == 'adam':
    return tf1.train.AdamOptimizer(LEARNING_RATE)
  raise ValueError(name)


def model_fn_for(tf, tf1, optimizer_name, worker_offset):
  """Linear regression; the kernel starts at INITIAL_KERNEL + worker_offset.

  On the chief `worker_offset` is 0; a worker's own initial value differs,
  so equal results mean that the chief's values were broadcast.
  """
  import replicate  # pylint: disable=g-import-not-at-top

  def model_fn(features, labels, mode):
    # ALL_REDUCE_TASK_EXTRA_VARIABLES='ab' or 'ba': two more variables of
    # one shape, made in that order (tasks that differ built other models).
    for name in os.environ.get('ALL_REDUCE_TASK_EXTRA_VARIABLES', ''):
      tf1.get_variable('extra_' + name, [3], trainable=False,
                       initializer=tf1.zeros_initializer())
    predictions = tf1.layers.dense(
        features, 1,
        kernel_initializer=tf1.constant_initializer(
            INITIAL_KERNEL + worker_offset),
        bias_initializer=tf1.constant_initializer(-0.2 + worker_offset))
    loss = tf1.losses.mean_squared_error(labels, predictions)
    optimizer = replicate.TowerOptimizer(make_optimizer(tf1, optimizer_name))
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


class _Record(object):
  """Collects what the task writes at the end."""

  def __init__(self, tf1, die_at_step=None):

    class Hook(tf1.train.SessionRunHook):
      """Reads the first loss; reads the variables and copies at the end."""

      def __init__(hook):  # pylint: disable=no-self-argument
        hook.first_loss = None
        hook.steps = 0

      def before_run(hook, run_context):  # pylint: disable=no-self-argument
        if hook.first_loss is None:
          # Tower 0's loss: the mean over the task's first 4 rows.
          return tf1.train.SessionRunArgs(tf1.losses.get_losses()[0])
        return None

      def after_run(hook, run_context, run_values):  # pylint: disable=no-self-argument
        if hook.first_loss is None:
          hook.first_loss = float(run_values.results)
        hook.steps += 1
        if hook.steps == die_at_step:
          print('task dies at step %d' % hook.steps, flush=True)
          os._exit(4)  # pylint: disable=protected-access

      def end(hook, session):  # pylint: disable=no-self-argument
        self.values = {
            v.op.name: session.run(v).tolist()
            for v in tf1.global_variables() + tf1.local_variables()
            if v.op.name in ('dense/kernel', 'dense/bias', 'global_step') or
            v.op.name.startswith('tower_1/dense/')}
        self.first_loss = hook.first_loss

    self.hook = Hook()
    self.values = None
    self.first_loss = None


def main(argv):
  out_path, model_dir, optimizer_name, steps = argv[1:5]
  timeout_secs = float(argv[5]) if len(argv) > 5 else 80.
  die_at_step = int(argv[6]) if len(argv) > 6 else None

  def watchdog():
    time.sleep(timeout_secs)
    print('task timed out', flush=True)
    os._exit(3)  # pylint: disable=protected-access

  threading.Thread(target=watchdog, daemon=True).start()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import replicate  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  run_config = replicate.multi_worker.all_reduce_run_config(
      tf1.estimator.RunConfig(
          session_config=tf1.ConfigProto(
              device_count={'CPU': NUM_CPUS},
              operation_timeout_in_ms=OPERATION_TIMEOUT_MS),
          save_checkpoints_steps=1000, save_checkpoints_secs=None,
          save_summary_steps=None, log_step_count_steps=None,
          session_creation_timeout_secs=60))
  server = replicate.multi_worker.all_reduce_server(run_config)
  tasks = ([('chief', 0)] + [('worker', i) for i in range(
      len(run_config.cluster_spec.as_dict().get('worker', [])))])
  index = tasks.index((run_config.task_type, run_config.task_id))
  rows = slice(ROWS_PER_TASK * index, ROWS_PER_TASK * (index + 1))
  record = _Record(tf1, die_at_step)
  estimator = tf1.estimator.Estimator(
      replicate.replicate_model_fn(
          model_fn_for(tf, tf1, optimizer_name, 0.5 * index),
          devices=['/device:CPU:%d' % i for i in range(
              int(os.environ.get('ALL_REDUCE_TASK_TOWERS', NUM_CPUS)))],
          variable_placement=replicate.VariablePlacement.REPLICATED),
      model_dir=model_dir, config=run_config)

  def input_fn():
    return tf.data.Dataset.from_tensors(
        (ROWS_X[rows], ROWS_Y[rows])).repeat()

  try:
    estimator.train(input_fn, max_steps=int(steps), hooks=[record.hook])
  except Exception as e:  # pylint: disable=broad-except
    with open(out_path, 'w') as f:
      json.dump({'error': '%s: %s' % (type(e).__name__, e)}, f)
    raise
  with open(out_path, 'w') as f:
    json.dump({'variables': record.values, 'first_loss': record.first_loss},
              f)
  del server
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)  # pylint: disable=protected-access


if __name__ == '__main__':
  main(sys.argv)

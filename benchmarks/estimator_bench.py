"""Estimator training throughput: `replicate` side by side with its peers.

Runs, each in a process of its own, Estimator training of two models on four
virtual CPU devices (global batch 256, TF 1.15):

  single             the unreplicated model_fn (placed on /device:CPU:0)
  replicate          replicate.replicate_model_fn + replicate.TowerOptimizer
  contrib            tf.contrib.estimator.replicate_model_fn + TowerOptimizer
  replicate@pack=0   replicate with gradient packing off (A/B of the packing)
  replicate@build=per_tower
                     replicate calling model_fn once per tower
                     (TowerBuild.CALL_PER_TOWER; A/B of the tower copies)
  tf_mirrored        tf.distribute.MirroredStrategy via RunConfig(train_distribute)
  replicate_mirrored replicate.MirroredStrategy + TowerOptimizer, trained in a
                     MonitoredSession loop (TF 1.15's Estimator only accepts a
                     tf.distribute.Strategy as train_distribute)
  tf_mirrored_loop   tf.distribute.MirroredStrategy in the same loop
  independent        not a replication: four unreplicated models, one per
                     device, each training on its quarter of the batch with
                     its own variables and never exchanging a gradient. The
                     towers' work of a replication with no reads across
                     devices and no sums (it updates four times as many
                     variables): the reference for what one tower per
                     device can reach on this machine.

Models (synthetic in-memory data, `Dataset.from_tensors(...).repeat()`):
  wide  784-2048-2048-10 ReLU MLP, 10 classes (6 variables, 5.83 M parameters)
  deep  100 dense layers of 64 units (tanh), 64 classes (200 variables)

What is measured (identically for every configuration):
  examples/s      global batch / median wall time of one `session.run` step,
                  over `--steps` steps after `--warmup` steps (taken between
                  consecutive `after_run` calls of a SessionRunHook, so hooks
                  and Python overhead of MonitoredSession are included, graph
                  construction and session creation are not). The mean over the
                  window is reported too.
  graph build     seconds from the `Estimator.train()` call to the hook's
                  `begin()`, i.e. input_fn + model_fn (all towers, gradients,
                  train_op) + the Estimator's own graph bookkeeping; session
                  creation and variable initialization are excluded.

Usage:
  python benchmarks/estimator_bench.py [--quick] [--models wide,deep]
      [--configs single,replicate,...] [--rounds N] [--target-rounds N]
      [--json out.json]
  python benchmarks/estimator_bench.py --child --model wide --config contrib
      (one configuration in this process; prints `RESULT {json}`)
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time

import bench_util

GLOBAL_BATCH = 256
CONFIGS = ('single', 'replicate', 'contrib', 'replicate@build=per_tower',
           'replicate@pack=0', 'replicate@compress=fp16',
           'replicate@placement=replicated', 'tf_mirrored',
           'replicate_mirrored', 'tf_mirrored_loop', 'independent')
MODELS = ('wide', 'deep')
# The configurations the targets compare (run_all.py's TARGETS). A
# full run gives them TARGET_ROUNDS rounds and the other rows `rounds`: their
# ratios decide the targets, and on this 2-core host one round of identical
# code moves by 10-30 % with the machine's phase (profile_notes.md, section
# 10), so a median of 3 can land on either side of a bound.
TARGET_CONFIGS = ('single', 'replicate', 'contrib')
TARGET_ROUNDS = 9
CONFIG_LABELS = {
    'single': 'single device',
    'replicate': 'replicate.replicate_model_fn',
    'contrib': 'tf.contrib.estimator.replicate_model_fn',
    'tf_mirrored': 'tf.distribute.MirroredStrategy',
    'replicate_mirrored': 'replicate.MirroredStrategy (session loop)',
    'tf_mirrored_loop': 'tf.distribute.MirroredStrategy (session loop)',
    'replicate@build=per_tower': 'replicate.replicate_model_fn, model_fn '
                                 'per tower (A/B)',
    'replicate@pack=0': 'replicate.replicate_model_fn, packing off (A/B)',
    'replicate@compress=fp16': 'replicate.replicate_model_fn, fp16 gradient '
                               'compression',
    'replicate@placement=replicated': 'replicate.replicate_model_fn, '
                                      'VariablePlacement.REPLICATED',
    'independent': '4 independent models, one per device, no gradient '
                   'exchange (reference)',
}
# Configurations trained by a MonitoredSession loop instead of an Estimator:
# TF 1.15's Estimator only takes a tf.distribute.Strategy as train_distribute,
# and replicate.MirroredStrategy is this library's own (not a TF subclass).
LOOP_CONFIGS = ('replicate_mirrored', 'tf_mirrored_loop')
# (warmup, timed steps) per model. A timed window of ~2 s: this machine's
# load comes in bursts of about a second, which took over whole windows of
# 60 deep steps (~0.4 s) and moved their median step time.
FULL_STEPS = {'wide': (8, 50), 'deep': (10, 300)}
QUICK_STEPS = {'wide': (2, 5), 'deep': (3, 8)}


class NotApplicable(Exception):
  """The configuration cannot run in this tree (reported as n/a)."""


# ----------------------------------------------------------------------------
# Child: one configuration in this process.
# ----------------------------------------------------------------------------


def _model_spec(model):
  """(input width, number of classes) of a model."""
  return {'wide': (784, 10), 'deep': (64, 64), 'vars1000': (16, 16)}[model]


def _logits(tf, model, features):
  tf1 = tf.compat.v1
  h = features
  if model == 'wide':
    for i, units in enumerate((2048, 2048)):
      h = tf1.layers.dense(h, units, activation=tf.nn.relu,
                           name='dense_{}'.format(i))
    return tf1.layers.dense(h, 10, name='logits')
  if model == 'vars1000':
    # scale_bench.py's 1,000-variable model: 500 chained dense layers of 16.
    for i in range(500):
      h = tf1.layers.dense(h, 16, activation=tf.nn.tanh if i < 499 else None,
                           name='dense_{}'.format(i))
    return h
  for i in range(100):
    h = tf1.layers.dense(h, 64, activation=tf.nn.tanh if i < 99 else None,
                         name='dense_{}'.format(i))
  return h


def _make_model_fn(tf, model, wrap_optimizer, timings):
  tf1 = tf.compat.v1

  def model_fn(features, labels, mode):
    logits = _logits(tf, model, features)
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = wrap_optimizer(tf1.train.GradientDescentOptimizer(0.01))
    train_op = optimizer.minimize(loss,
                                  global_step=tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  def timed(model_fn_to_time):
    def fn(features, labels, mode):
      start = time.perf_counter()
      try:
        return model_fn_to_time(features, labels, mode)
      finally:
        timings['model_fn_s'] = (timings.get('model_fn_s', 0.0) +
                                 time.perf_counter() - start)
    return fn

  return model_fn, timed


def _make_input_fn(tf, model):
  import numpy as np  # pylint: disable=g-import-not-at-top
  width, classes = _model_spec(model)
  rng = np.random.RandomState(0)
  x = rng.standard_normal((GLOBAL_BATCH, width)).astype(np.float32)
  y = rng.randint(0, classes, size=(GLOBAL_BATCH,)).astype(np.int32)

  def input_fn(input_context=None):
    # Under a distribution strategy the Estimator calls input_fn with an
    # InputContext and every replica takes whole elements of the dataset, so
    # the batch there is the per-replica batch (TF 1.15 semantics).
    batch = GLOBAL_BATCH
    if input_context is not None:
      batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    return tf.data.Dataset.from_tensors((x[:batch], y[:batch])).repeat()

  return input_fn


def _session_config(tf):
  """The session config of every configuration: 4 virtual CPUs.

  $BENCH_INTER_OP / $BENCH_INTRA_OP set the thread pools (default 0: TF
  picks, i.e. the number of cores) for experiments.
  """
  return tf.compat.v1.ConfigProto(
      device_count={'CPU': bench_util.NUM_DEVICES},
      inter_op_parallelism_threads=int(os.environ.get('BENCH_INTER_OP', 0)),
      intra_op_parallelism_threads=int(os.environ.get('BENCH_INTRA_OP', 0)))


def _make_hook(tf, trace_steps):
  tf1 = tf.compat.v1

  class TimingHook(tf1.train.SessionRunHook):
    """Records wall times of begin, session creation and every step."""

    def __init__(self):
      self.begin_time = None
      self.begin_cpu = None
      self.session_time = None
      self.step_end = []
      self.step_cpu = []
      self.metadata = []
      self._trace_steps = set(trace_steps)

    def begin(self):
      self.begin_time = time.perf_counter()
      self.begin_cpu = time.process_time()

    def after_create_session(self, session, coord):
      del session, coord
      self.session_time = time.perf_counter()

    def before_run(self, run_context):
      if len(self.step_end) in self._trace_steps:
        return tf1.train.SessionRunArgs(
            fetches=None,
            options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))
      return None

    def after_run(self, run_context, run_values):
      self.step_end.append(time.perf_counter())
      self.step_cpu.append(time.process_time())
      if run_values.run_metadata is not None and (
          run_values.run_metadata.step_stats.dev_stats):
        md = tf1.RunMetadata()
        md.CopyFrom(run_values.run_metadata)
        self.metadata.append(md)

  return TimingHook()


def _apply_aggregation_variant(variant):
  """Sets replicate's Tuning (or the towers' gating) for an A/B experiment.

  Variants: `pack=<bytes>` sets the packing threshold (`pack=0`: one add_n
  per variable, the behaviour before packing); `group=<n>` the largest pack
  (`small=<bytes>`: beyond `small` bytes); `gate=none` computes the towers'
  gradients with `GATE_NONE`.
  """
  import replicate  # pylint: disable=g-import-not-at-top
  from replicate.core import tuning  # pylint: disable=g-import-not-at-top
  name, _, value = variant.partition('=')
  fields = {
      'pack': ('pack_max_bytes', int),
      'group': ('pack_max_group', int),
      # `small=0`: every pack holds at most `pack_max_group` variables.
      'small': ('pack_small_bytes', int),
  }
  if name in fields:
    field, parse = fields[name]
    tuning.set_tuning(tuning.get_tuning().replace(**{field: parse(value)}))
  elif name == 'gate' and value == 'none':
    # Towers compute gradients with gate_gradients=GATE_NONE (same values;
    # no tuple/identity gating ops per gradient op).
    original = replicate.TowerOptimizer.compute_gradients

    def compute_gradients(self, loss, var_list=None, **kwargs):
      kwargs['gate_gradients'] = replicate.TowerOptimizer.GATE_NONE
      return original(self, loss, var_list=var_list, **kwargs)
    replicate.TowerOptimizer.compute_gradients = compute_gradients
  else:
    raise ValueError('unknown aggregation variant {!r}'.format(variant))


def _independent_towers_fn(tf, model, devices):
  """The `independent` configuration's model_fn (see the module docstring).

  Tower i builds the model in its own variable scope on `devices[i]`, with
  its variables there too, and minimizes its own loss on its shard: the same
  per-tower work as a replication (forward and backward on 1/N of the batch)
  and none of its cross-device reads, gradient sums or shared update.
  """
  tf1 = tf.compat.v1

  def model_fn(features, labels, mode):
    num = len(devices)
    feature_shards = tf.split(features, num)
    label_shards = tf.split(labels, num)
    losses = []
    updates = []
    for i, device in enumerate(devices):
      scope = 'tower_{}'.format(i)
      with tf1.device(device), tf1.variable_scope(scope):
        logits = _logits(tf, model, feature_shards[i])
        loss = tf1.losses.sparse_softmax_cross_entropy(label_shards[i], logits)
        updates.append(tf1.train.GradientDescentOptimizer(0.01).minimize(
            loss, var_list=tf1.trainable_variables(scope + '/')))
      losses.append(loss)
    with tf1.control_dependencies(updates):
      train_op = tf1.assign_add(tf1.train.get_global_step(), 1)
    return tf1.estimator.EstimatorSpec(
        mode, loss=tf.add_n(losses) / num, train_op=train_op)

  return model_fn


def _wrapper_and_fn(tf, config, model, timings):
  """(optimizer wrapper, model_fn for the Estimator, train_distribute)."""
  devices = list(bench_util.DEVICES)
  identity = lambda opt: opt
  if config == 'single':
    model_fn, timed = _make_model_fn(tf, model, identity, timings)
    return timed(model_fn), None
  if config == 'contrib':
    if not hasattr(tf, 'contrib'):
      # TF 2.x: run with the TF 2.15 venv's python, contrib rows are n/a.
      raise NotApplicable('tf.contrib is not in TF {}'.format(tf.__version__))
    contrib_est = tf.contrib.estimator
    model_fn, timed = _make_model_fn(tf, model, contrib_est.TowerOptimizer,
                                     timings)
    return timed(contrib_est.replicate_model_fn(model_fn,
                                                devices=devices)), None
  if config == 'tf_mirrored':
    model_fn, timed = _make_model_fn(tf, model, identity, timings)
    return timed(model_fn), tf.distribute.MirroredStrategy(devices=devices)
  if config == 'independent':
    _, timed = _make_model_fn(tf, model, identity, timings)
    return timed(_independent_towers_fn(tf, model, devices)), None
  import replicate  # pylint: disable=g-import-not-at-top
  kwargs = {}
  wrapper = getattr(replicate, 'TowerOptimizer', None)
  if config == 'replicate@compress=fp16':
    # Gradients cross devices as float16 (TowerOptimizer's compression).
    if not hasattr(replicate, 'Compression'):
      raise NotApplicable('replicate.Compression is not in this tree')
    wrapper = functools.partial(replicate.TowerOptimizer,
                                compression=replicate.Compression.fp16)
    config = 'replicate'
  elif config == 'replicate@placement=replicated':
    # A copy of the variables per tower, gradients all-reduced.
    if not hasattr(getattr(replicate, 'VariablePlacement', None),
                   'REPLICATED'):
      raise NotApplicable('VariablePlacement.REPLICATED is not in this tree')
    kwargs['variable_placement'] = replicate.VariablePlacement.REPLICATED
    config = 'replicate'
  elif config == 'replicate@build=per_tower':
    # Experiment: every tower built by its own model_fn call.
    if not hasattr(replicate, 'TowerBuild'):
      raise NotApplicable('replicate.TowerBuild is not in this tree')
    kwargs['tower_build'] = replicate.TowerBuild.CALL_PER_TOWER
    config = 'replicate'
  elif config.startswith('replicate@'):
    # Experiment: replicate with a variant of its gradient aggregation.
    _apply_aggregation_variant(config.split('@', 1)[1])
    config = 'replicate'
  if config == 'replicate':
    if not hasattr(replicate, 'replicate_model_fn'):
      raise NotApplicable('replicate.replicate_model_fn is not in this tree')
    model_fn, timed = _make_model_fn(tf, model, wrapper, timings)
    return timed(replicate.replicate_model_fn(model_fn, devices=devices,
                                              **kwargs)), None
  raise ValueError('unknown config {!r}'.format(config))


def _op_type(node_stats, host):
  """Op type of one NodeExecStats entry of a step trace."""
  label = node_stats.timeline_label
  if not host and ' = ' in label:
    return label.split(' = ', 1)[1].split('(', 1)[0].strip()
  name = node_stats.node_name
  return name.rsplit(':', 1)[-1] if ':' in name else name


def _summarize_trace(metadata_list):
  """Aggregates step stats of traced steps per device and op type.

  Entries of the `/host:CPU` tracer (the _Send/_Recv of cross-device edges
  and the tf.data iterator) are kept apart from the kernels of the devices.

  Returns:
    {'steps': n, 'wall_us': [..], 'ops': {device: {op: {count, us}}}}, counts
    and times averaged over the traced steps.
  """
  per_dev = {}
  walls = []
  for md in metadata_list:
    lo, hi = None, None
    for dev in md.step_stats.dev_stats:
      host = '/host:' in dev.device
      name = 'host' if host else dev.device.rsplit('device:', 1)[-1]
      d = per_dev.setdefault(name, {})
      for ns in dev.node_stats:
        start = ns.all_start_micros
        end = start + ns.all_end_rel_micros
        lo = start if lo is None else min(lo, start)
        hi = end if hi is None else max(hi, end)
        e = d.setdefault(_op_type(ns, host), [0, 0])
        e[0] += 1
        e[1] += ns.all_end_rel_micros
    if lo is not None:
      walls.append(hi - lo)
  n = max(1, len(metadata_list))
  out = {}
  for dev, ops in per_dev.items():
    out[dev] = dict((op, {'count': c / n, 'us': us / n})
                    for op, (c, us) in sorted(ops.items(),
                                              key=lambda kv: -kv[1][1]))
  return {'steps': len(metadata_list), 'wall_us': walls, 'ops': out}


def _run_loop(tf, model, config, hook, total_steps, timings):
  """Trains with a strategy's own API in a MonitoredSession loop.

  Same model, data, optimizer, session config and hook as the Estimator
  configurations: the global batch of 256 is split by the strategy's
  `make_dataset_iterator`, each replica's loss is scaled to the global batch
  (divided by the number of replicas), `experimental_run` builds the step.

  Returns:
    When the graph construction started: `(perf_counter, process_time)`.
  """
  tf1 = tf.compat.v1
  devices = list(bench_util.DEVICES)
  if config.startswith('replicate_mirrored@'):
    # Experiment: replicate.MirroredStrategy with a variant applied.
    _apply_aggregation_variant(config.split('@', 1)[1])
    config = 'replicate_mirrored'
  if config == 'replicate_mirrored':
    import replicate  # pylint: disable=g-import-not-at-top
    if not hasattr(replicate, 'MirroredStrategy'):
      raise NotApplicable('replicate.MirroredStrategy is not in this tree')
    strategy = replicate.MirroredStrategy(devices=devices)
    wrap = replicate.TowerOptimizer
  else:
    strategy = tf.distribute.MirroredStrategy(devices=devices)
    wrap = lambda opt: opt
  import numpy as np  # pylint: disable=g-import-not-at-top
  width, classes = _model_spec(model)
  rng = np.random.RandomState(0)
  x = rng.standard_normal((GLOBAL_BATCH, width)).astype(np.float32)
  y = rng.randint(0, classes, size=(GLOBAL_BATCH,)).astype(np.int32)
  num_replicas = len(devices)

  def step(inputs):
    start = time.perf_counter()
    features, labels = inputs
    logits = _logits(tf, model, features)
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    loss = loss / float(num_replicas)
    optimizer = wrap(tf1.train.GradientDescentOptimizer(0.01))
    train_op = optimizer.minimize(loss,
                                  global_step=tf1.train.get_global_step())
    timings['model_fn_s'] = (timings.get('model_fn_s', 0.0) +
                             time.perf_counter() - start)
    return train_op

  with tf.Graph().as_default():
    start = time.perf_counter(), time.process_time()
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    iterator = strategy.make_dataset_iterator(dataset)
    with strategy.scope():
      tf1.train.get_or_create_global_step()
      train_op = strategy.group(strategy.experimental_run(step, iterator))
    scaffold = tf1.train.Scaffold(local_init_op=tf.group(
        tf1.local_variables_initializer(),
        *tf.nest.flatten(iterator.initialize())))
    creator = tf1.train.ChiefSessionCreator(
        scaffold=scaffold, config=_session_config(tf))
    with tf1.train.MonitoredSession(session_creator=creator,
                                    hooks=[hook]) as sess:
      for _ in range(total_steps):
        sess.run(train_op)
  return start


def run_one(model, config, warmup, steps, trace_dir=None, trace_steps=2):
  """Trains one configuration in this process and returns its result dict."""
  result = {'model': model, 'config': config, 'warmup': warmup,
            'steps': steps, 'global_batch': GLOBAL_BATCH}
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  tf1.logging.set_verbosity(tf1.logging.ERROR)
  result['tf_version'] = tf.__version__
  timings = {}
  total = warmup + steps
  trace = list(range(total, total + trace_steps)) if trace_dir else []
  hook = _make_hook(tf, trace)
  if config.split('@', 1)[0] in LOOP_CONFIGS:
    try:
      start, start_cpu = _run_loop(tf, model, config, hook,
                                   total + len(trace), timings)
    except NotApplicable as e:
      result.update(status='n/a', reason=str(e))
      return result
    end = time.perf_counter()
    return _finish(result, hook, timings, start, start_cpu, end, warmup,
                   total, trace_dir, model, config)
  try:
    model_fn, distribute = _wrapper_and_fn(tf, config, model, timings)
  except NotApplicable as e:
    result.update(status='n/a', reason=str(e))
    return result
  model_dir = tempfile.mkdtemp(prefix='bench_est_')
  try:
    run_config = tf1.estimator.RunConfig(
        model_dir=model_dir,
        session_config=_session_config(tf),
        train_distribute=distribute,
        save_summary_steps=None, save_checkpoints_steps=None,
        save_checkpoints_secs=None, log_step_count_steps=None)
    estimator = tf1.estimator.Estimator(model_fn, config=run_config)
    input_fn = _make_input_fn(tf, model)
    start, start_cpu = time.perf_counter(), time.process_time()
    estimator.train(input_fn, steps=total + len(trace), hooks=[hook])
    end = time.perf_counter()
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  return _finish(result, hook, timings, start, start_cpu, end, warmup, total,
                 trace_dir, model, config)


def _finish(result, hook, timings, start, start_cpu, end, warmup, total,
            trace_dir, model, config):
  """Computes the metrics of a finished run from the hook's records."""
  ends = hook.step_end
  # ends[i] is the end of step i (0-based), so step i (i >= 1) took
  # ends[i] - ends[i - 1]. Timed: steps warmup .. total - 1; the traced steps
  # (total ..) are never timed.
  first = max(1, warmup)
  step_s = [ends[i] - ends[i - 1] for i in range(first, total)]
  window = ends[total - 1] - ends[first - 1]
  cpu = hook.step_cpu
  cpu_per_step = (cpu[total - 1] - cpu[first - 1]) / len(step_s)
  med = bench_util.median(step_s)
  result.update(
      status='ok',
      graph_build_s=hook.begin_time - start,
      # The build is single-threaded Python: its CPU time is its wall time
      # less the time other processes held the core.
      graph_build_cpu_s=hook.begin_cpu - start_cpu,
      model_fn_s=timings.get('model_fn_s'),
      session_s=hook.session_time - hook.begin_time,
      first_step_s=ends[0] - hook.session_time,
      startup_s=ends[0] - start,
      train_call_s=end - start,
      step_s_median=med,
      step_s_min=min(step_s),
      examples_per_s=GLOBAL_BATCH / med,
      examples_per_s_mean=GLOBAL_BATCH * len(step_s) / window,
      cpu_s_per_step=cpu_per_step,
      timed_steps=len(step_s),
      # The timed window in time.perf_counter() seconds (CLOCK_MONOTONIC
      # on Linux): cpu_profile.py cuts its perf samples to it.
      window_s=[ends[first - 1], ends[total - 1]])
  if trace_dir and hook.metadata:
    from tensorflow.python.client import timeline  # pylint: disable=g-import-not-at-top
    if not os.path.isdir(trace_dir):
      os.makedirs(trace_dir)
    base = os.path.join(trace_dir, '{}_{}'.format(model, config))
    with open(base + '.trace.json', 'w') as f:
      f.write(timeline.Timeline(hook.metadata[-1].step_stats)
              .generate_chrome_trace_format())
    with open(base + '.ops.json', 'w') as f:
      json.dump(_summarize_trace(hook.metadata), f, indent=1)
    result['trace'] = base + '.trace.json'
  return result


# ----------------------------------------------------------------------------
# Parent: every configuration in its own process, interleaved rounds.
# ----------------------------------------------------------------------------


def run_all(models, configs, quick, rounds, timeout_s=900, log=print,
            target_rounds=None):
  """Runs every (model, config), interleaved; returns a dict.

  Args:
    models: model names.
    configs: configuration names.
    quick: few steps (a smoke test).
    rounds: how many rounds every configuration runs.
    timeout_s: the limit for one child process.
    log: prints one line per child.
    target_rounds: rounds for the configurations of `TARGET_CONFIGS`; the
      rounds after `rounds` run only those, still interleaved. None (or less
      than `rounds`) means `rounds`.

  Odd rounds run the configurations in reverse order (A B C, C B A, ...), so
  that a machine slowing down or speeding up over a run does not favour the
  configurations that come first in every round.

  Returns:
    `{'runs': [...], 'summary': {...}, 'quick', 'rounds', 'target_rounds'}`.
  """
  table = FULL_STEPS if not quick else QUICK_STEPS
  target_rounds = max(rounds, target_rounds or rounds)
  runs = []
  for r in range(target_rounds):
    for model in models:
      for config in (configs if r % 2 == 0 else configs[::-1]):
        if r >= rounds and config not in TARGET_CONFIGS:
          continue
        warmup, steps = table[model]
        args = ['--child', '--model', model, '--config', config,
                '--warmup', str(warmup), '--steps', str(steps)]
        res = bench_util.run_child(os.path.abspath(__file__), args, timeout_s)
        res.setdefault('model', model)
        res.setdefault('config', config)
        res['round'] = r
        runs.append(res)
        if res.get('status') == 'ok':
          log('[estimator r{}] {:5s} {:19s} {:8.1f} ex/s  cpu/step {:6.1f} ms  '
              'build {:6.2f}s (cpu {:5.2f}s)  ({:.0f}s)'.format(
                  r, model, config, res['examples_per_s'],
                  res['cpu_s_per_step'] * 1e3, res['graph_build_s'],
                  res['graph_build_cpu_s'], res['process_s']))
        else:
          log('[estimator r{}] {:5s} {:19s} {}: {}'.format(
              r, model, config, res.get('status'),
              res.get('reason', '')[-300:]))
  return {'runs': runs, 'summary': summarize(runs, models, configs),
          'quick': quick, 'rounds': rounds, 'target_rounds': target_rounds}


def round_counts(quick, rounds=None, target_rounds=None):
  """`(rounds, target_rounds)`, with the defaults of a full or quick run.

  Full: 3 rounds, `TARGET_ROUNDS` for the rows the targets compare; quick:
  one round of each (a smoke test). None or 0 means the default.
  """
  rounds = rounds or (1 if quick else 3)
  return rounds, target_rounds or (rounds if quick else TARGET_ROUNDS)


def summarize(runs, models, configs):
  """Median over rounds of each metric, per (model, config)."""
  out = {}
  for model in models:
    for config in configs:
      mine = [r for r in runs if r['model'] == model and r['config'] == config]
      ok = [r for r in mine if r.get('status') == 'ok']
      key = '{}/{}'.format(model, config)
      if not ok:
        reasons = [r.get('reason', '') for r in mine]
        out[key] = {'status': mine[0].get('status', 'error') if mine else 'n/a',
                    'reason': reasons[0] if reasons else 'not run'}
        continue
      agg = {'status': 'ok', 'rounds': len(ok)}
      for metric in ('examples_per_s', 'examples_per_s_mean', 'graph_build_s',
                     'graph_build_cpu_s', 'model_fn_s', 'session_s',
                     'step_s_median', 'cpu_s_per_step', 'startup_s'):
        vals = [r[metric] for r in ok if r.get(metric) is not None]
        if vals:
          agg[metric] = bench_util.median(vals)
          agg[metric + '_all'] = vals
      out[key] = agg
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='few steps, one round: a smoke test')
  parser.add_argument('--models', default=','.join(MODELS))
  parser.add_argument('--configs', default=','.join(CONFIGS))
  parser.add_argument('--rounds', type=int, default=None,
                      help='interleaved repetitions (default 3, quick 1)')
  parser.add_argument('--target-rounds', type=int, default=None,
                      help='rounds of the configurations the targets '
                      'compare ({}; default {}, quick: --rounds)'.format(
                          ', '.join(TARGET_CONFIGS), TARGET_ROUNDS))
  parser.add_argument('--json', default=None, help='write results here')
  parser.add_argument('--child', action='store_true')
  parser.add_argument('--model', default='wide')
  parser.add_argument('--config', default='single')
  parser.add_argument('--warmup', type=int, default=None)
  parser.add_argument('--steps', type=int, default=None)
  parser.add_argument('--trace-dir', default=None,
                      help='child: write Chrome traces + op summaries here')
  args = parser.parse_args(argv)
  if args.child:
    warmup, steps = (QUICK_STEPS if args.quick else FULL_STEPS)[args.model]
    warmup = warmup if args.warmup is None else args.warmup
    steps = steps if args.steps is None else args.steps
    try:
      res = run_one(args.model, args.config, warmup, steps, args.trace_dir)
    except Exception as e:  # pylint: disable=broad-except
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
      res = {'model': args.model, 'config': args.config, 'status': 'error',
             'reason': '{}: {}'.format(type(e).__name__, e)}
    bench_util.emit(res)
    return 0
  rounds, target_rounds = round_counts(args.quick, args.rounds,
                                      args.target_rounds)
  models = [m for m in args.models.split(',') if m]
  configs = [c for c in args.configs.split(',') if c]
  results = run_all(models, configs, args.quick, rounds,
                    target_rounds=target_rounds)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1, sort_keys=True)
  print(json.dumps(results['summary'], indent=1, sort_keys=True))
  return 0


if __name__ == '__main__':
  sys.exit(main())

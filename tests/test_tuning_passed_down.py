"""A `Tuning` is read where a build starts and passed down from there.

`replicate_model_fn(tuning=...)`, a cross-tower ops object and a
`MirroredStrategy` each fix the `Tuning` their graphs are built with; a
scope open elsewhere (later, or in another thread) does not change it.
Graph-only checks on virtual CPUs: packing off (`pack_max_bytes=0`) leaves
no concatenation in the gradient sums, packing on (the default) makes some.
"""
import threading

import tensorflow as tf

import replicate
from replicate import errors
from replicate._compat import tf1

_NO_PACKS = replicate.Tuning(pack_max_bytes=0)
# Ten small dense layers: twenty gradients of at most 4 KB, packed by
# default (pack_max_bytes 256 KiB), none of them when packing is off.
_WIDTHS = [8, 12, 16, 8, 12, 16, 8, 12, 16, 1]


def _model_fn(features, labels, mode, params):
  net = features
  for width in _WIDTHS:
    net = tf1.layers.dense(net, width, activation=tf.nn.tanh)
  loss = tf1.losses.mean_squared_error(labels, net)
  optimizer = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  train_op = optimizer.minimize(loss, tf1.train.get_or_create_global_step())
  return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _concats(graph):
  return sum(1 for op in graph.get_operations() if op.type == 'ConcatV2')


def _build_towers(**kwargs):
  """The TRAIN graph of 4 virtual CPU towers; its number of ConcatV2."""
  wrapped = replicate.replicate_model_fn(
      _model_fn, devices=replicate.testing.virtual_cpu_devices(4), **kwargs)
  graph = tf.Graph()
  with graph.as_default():
    wrapped(tf.ones([8, 4]), tf.ones([8, 1]), tf.estimator.ModeKeys.TRAIN)
  return _concats(graph)


class ReplicateModelFnTuningTest(tf.test.TestCase):

  def test_default_packs_and_explicit_tuning_does_not(self):
    self.assertGreater(_build_towers(), 0)
    self.assertEqual(0, _build_towers(tuning=_NO_PACKS))

  def test_explicit_tuning_wins_over_a_scope(self):
    with replicate.tuning_scope(replicate.Tuning()):
      self.assertEqual(0, _build_towers(tuning=_NO_PACKS))

  def test_scope_applies_where_the_model_fn_is_called(self):
    with replicate.tuning_scope(_NO_PACKS):
      self.assertEqual(0, _build_towers())

  def test_another_threads_scope_does_not_apply(self):
    # The other thread holds a scope open while this one builds.
    entered, built = threading.Event(), threading.Event()

    def other():
      with replicate.tuning_scope(_NO_PACKS):
        entered.set()
        built.wait(60)

    thread = threading.Thread(target=other)
    thread.start()
    try:
      self.assertTrue(entered.wait(10))
      self.assertGreater(_build_towers(), 0)
    finally:
      built.set()
      thread.join()

  def test_not_a_tuning_is_refused_through_an_estimator(self):
    with self.assertRaisesRegex(
        errors.InvalidTypeError,
        r"Expected a replicate.Tuning, got \{'pack_max_bytes': 0\}; build "
        r'one with replicate.Tuning\(field=value, ...\)'):
      tf.estimator.Estimator(replicate.replicate_model_fn(
          _model_fn, devices=['/cpu:0'], tuning={'pack_max_bytes': 0}))


def _per_device(values, devices):
  return replicate.PerDevice(dict(zip(devices, values)))


class CrossTowerOpsTuningTest(tf.test.TestCase):

  def _reduce(self, ops):
    """Batch-reduces 12 small values of 2 CPUs; the graph's ConcatV2s."""
    devices = replicate.testing.virtual_cpu_devices(2)
    graph = tf.Graph()
    with graph.as_default():
      pairs = []
      for index in range(12):
        values = []
        for device in devices:
          with tf.device(device):
            values.append(tf.fill([3], float(index)))
        pairs.append((_per_device(values, devices), devices))
      ops.batch_reduce(replicate.ReduceOp.SUM, pairs)
    return _concats(graph)

  def test_made_in_a_scope_keeps_its_tuning_after(self):
    with replicate.tuning_scope(_NO_PACKS):
      ops = replicate.ReductionToOneDeviceCrossTowerOps()
    self.assertIs(_NO_PACKS, ops.tuning)
    self.assertEqual(0, self._reduce(ops))
    self.assertGreater(
        self._reduce(replicate.ReductionToOneDeviceCrossTowerOps()), 0)

  def test_tuning_argument(self):
    ops = replicate.ReductionToOneDeviceCrossTowerOps(tuning=_NO_PACKS)
    self.assertEqual(0, self._reduce(ops))
    self.assertIs(_NO_PACKS, replicate.AllReduceCrossTowerOps(
        'hierarchical_copy', tuning=_NO_PACKS).tuning)
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'Expected a replicate.Tuning, got 0'):
      replicate.ReductionToOneDeviceCrossTowerOps(tuning=0)


class MirroredStrategyTuningTest(tf.test.TestCase):

  def _train_graph_concats(self, strategy):
    graph = tf.Graph()
    with graph.as_default(), strategy.scope():
      def step():
        return _model_fn(tf.ones([4, 4]), tf.ones([4, 1]),
                         tf.estimator.ModeKeys.TRAIN, None).train_op
      strategy.group(strategy.run(step))
    return _concats(graph)

  def test_made_in_a_scope_builds_its_replicas_with_it(self):
    # The replicas are built in threads of the strategy's own, after the
    # scope closed: they get the strategy's tuning, not a scope's.
    devices = replicate.testing.virtual_cpu_devices(2)
    with replicate.tuning_scope(_NO_PACKS):
      unpacked = replicate.MirroredStrategy(devices)
    self.assertEqual(0, self._train_graph_concats(unpacked))
    self.assertGreater(
        self._train_graph_concats(replicate.MirroredStrategy(devices)), 0)


if __name__ == '__main__':
  tf.test.main()

"""The drop-in surface: every name of the modules replicate re-implements.

Drop-in means the same names, at the same module paths under `replicate.`,
with the same parameter names:

* contrib 1.10's `contrib/estimator/python/estimator/replicate_model_fn.py`:
  `replicate_model_fn` is at `replicate.model_fn`, `TowerOptimizer` at
  `replicate.tower_optimizer` (both also at `replicate.`);
* contrib 1.10's `contrib/distribute/python/cross_tower_ops.py` (plus
  contrib 1.12's destination helpers and TF 1.14/1.15's `cross_device_ops`
  spellings) at `replicate.cross_tower_ops`;
* TF 1.14's `python/distribute/distribute_lib.py` at
  `replicate.distribute_lib`, and `MirroredStrategy` at
  `replicate.mirrored_strategy`.

The table below lists each name with the parameters its original has; ours
must start with them (later parameters, with defaults, are our additions).
On TF 1.15 the originals that are importable are compared too.
"""
import inspect

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import replicate
from replicate import cross_tower_ops
from replicate import distribute_lib
from replicate import errors
from replicate import mirrored_strategy
from replicate import model_fn
from replicate import tower_optimizer
from replicate import values

_IS_TF1 = tf.__version__.startswith('1.')

_CTOPS_METHODS = {
    'reduce': ('aggregation', 'per_device_value', 'destinations'),
    'batch_reduce': ('aggregation', 'value_destination_pairs'),
    'broadcast': ('tensor', 'destinations'),
}
_STRATEGY_METHODS = {
    '__init__': ('extended',),
    'scope': (), 'make_dataset_iterator': ('dataset',),
    'make_input_fn_iterator': ('input_fn', 'replication_mode'),
    'experimental_make_numpy_dataset': ('numpy_input', 'session'),
    'experimental_distribute_dataset': ('dataset',),
    'experimental_run': ('fn', 'input_iterator'),
    'experimental_run_v2': ('fn', 'args', 'kwargs'),
    'run': ('fn', 'args', 'kwargs'),
    'reduce': ('reduce_op', 'value', 'axis'),
    'unwrap': ('value',), 'experimental_local_results': ('value',),
    'group': ('value', 'name'),
    'colocate_vars_with': ('colocate_with_variable',),
    'configure': ('session_config', 'cluster_spec', 'task_type', 'task_id'),
    'update_config_proto': ('config_proto',),
    'extended': None, 'num_replicas_in_sync': None,
}
_EXTENDED_METHODS = {
    '__init__': ('container_strategy',),
    'colocate_vars_with': ('colocate_with_variable',),
    'variable_created_in_scope': ('v',), 'read_var': ('v',),
    'broadcast_to': ('tensor', 'destinations'),
    'call_for_each_replica': ('fn', 'args', 'kwargs'),
    'reduce_to': ('reduce_op', 'value', 'destinations'),
    'batch_reduce_to': ('reduce_op', 'value_destination_pairs'),
    'update': ('var', 'fn', 'args', 'kwargs', 'group'),
    'update_non_slot': ('colocate_with', 'fn', 'args', 'kwargs', 'group'),
    'value_container': ('value',), 'non_slot_devices': ('var_list',),
    'experimental_make_numpy_dataset': ('numpy_input', 'session'),
    'experimental_run_steps_on_iterator': ('fn', 'iterator', 'iterations',
                                           'initial_loop_values'),
    'worker_devices': None, 'parameter_devices': None,
    'experimental_require_static_shapes': None,
    'experimental_between_graph': None, 'experimental_should_init': None,
    'should_checkpoint': None, 'should_save_summary': None,
}

# module -> name -> parameters (a function), {member: parameters} (a class;
# None for a property or attribute), or None (any other value).
EXPECTED = {
    model_fn: {
        'replicate_model_fn': ('model_fn', 'loss_reduction', 'devices'),
    },
    tower_optimizer: {
        'TowerOptimizer': {
            '__init__': ('optimizer_or_optimizer_fn',),
            'compute_gradients': ('loss',),
            'apply_gradients': ('grads_and_vars', 'global_step'),
            'get_slot': (), 'get_slot_names': (), 'get_name': (),
            'variables': (), 'has_been_used': (),
            'COLLECTION_FOR_GRAPH_STATES': None,
        },
    },
    cross_tower_ops: {
        'CrossTowerOps': dict(_CTOPS_METHODS, __init__=()),
        'ReductionToOneDeviceCrossTowerOps': dict(
            _CTOPS_METHODS, __init__=('reduce_to_device', 'accumulation_fn')),
        'AllReduceCrossTowerOps': dict(
            _CTOPS_METHODS, __init__=('all_reduce_alg', 'num_packs',
                                      'agg_small_grads_max_bytes',
                                      'agg_small_grads_max_group')),
        'MultiWorkerAllReduce': dict(
            _CTOPS_METHODS, __init__=('worker_devices', 'num_gpus_per_worker',
                                      'all_reduce_spec', 'num_packs',
                                      'agg_small_grads_max_bytes',
                                      'agg_small_grads_max_group')),
        'CollectiveAllReduce': dict(
            _CTOPS_METHODS, __init__=('num_workers', 'num_gpus_per_worker',
                                      'all_reduce_merge_scope',
                                      'collective_keys')),
        'ConcatAndSplitPacker': {
            '__init__': ('num_packs',), 'pack': ('grouped_grads_and_vars',),
            'unpack': ('summed_device_grad_packs',)},
        'AggregateSmallTensorPacker': {
            '__init__': ('agg_small_grads_max_bytes',
                         'agg_small_grads_max_group'),
            'pack': ('grouped_grads_and_vars',),
            'unpack': ('summed_device_grad_packs',)},
        'AllReduceSpecTuple': {'alg': None, 'shards': None, 'limit': None},
        'choose_the_best': ('devices', 'session_config'),
        'check_destinations': ('destinations',),
        'validate_destinations': ('destinations',),
        'get_devices_from': ('destinations',),
        # TF 1.14/1.15's cross_device_ops spellings.
        'CrossDeviceOps': dict(_CTOPS_METHODS, __init__=()),
        'ReductionToOneDevice': dict(
            _CTOPS_METHODS, __init__=('reduce_to_device', 'accumulation_fn')),
        'AllReduceCrossDeviceOps': dict(
            _CTOPS_METHODS, __init__=('all_reduce_alg', 'num_packs',
                                      'agg_small_grads_max_bytes',
                                      'agg_small_grads_max_group')),
        'NcclAllReduce': dict(_CTOPS_METHODS, __init__=('num_packs',)),
        'HierarchicalCopyAllReduce': dict(_CTOPS_METHODS,
                                          __init__=('num_packs',)),
    },
    distribute_lib: {
        'Strategy': _STRATEGY_METHODS,
        'StrategyV1': _STRATEGY_METHODS,
        'StrategyExtended': _EXTENDED_METHODS,
        'StrategyExtendedV1': _EXTENDED_METHODS,
        'StrategyExtendedV2': _EXTENDED_METHODS,
        'ReplicaContext': {
            '__init__': ('strategy', 'replica_id_in_sync_group'),
            'merge_call': ('merge_fn', 'args', 'kwargs'),
            'all_reduce': ('reduce_op', 'value'),
            'num_replicas_in_sync': None, 'replica_id_in_sync_group': None,
            'strategy': None, 'devices': None},
        'InputContext': {
            '__init__': ('num_input_pipelines', 'input_pipeline_id',
                         'num_replicas_in_sync'),
            'get_per_replica_batch_size': ('global_batch_size',),
            'num_input_pipelines': None, 'input_pipeline_id': None,
            'num_replicas_in_sync': None},
        'InputReplicationMode': {'PER_WORKER': None},
        'UpdateContext': {'__init__': ('device',)},
        'ReduceOp': {'SUM': None, 'MEAN': None},
        'get_loss_reduction': (),
        'get_update_device': (),
        'require_replica_context': ('replica_ctx',),
        'get_replica_context': (), 'get_cross_replica_context': (),
        'get_strategy': (), 'has_strategy': (),
        'in_cross_replica_context': (),
    },
    mirrored_strategy: {
        'MirroredStrategy': dict(
            _STRATEGY_METHODS, __init__=('devices', 'cross_device_ops')),
        'ReplicaBuild': {'CLONE': None, 'CALL_PER_REPLICA': None},
    },
    values: {'PerDevice': {}, 'PerReplica': {}, 'Mirrored': {},
             'DistributedValues': {'is_tensor_like': None},
             'MirroredVariable': {}, 'SyncOnReadVariable': {},
             'ReplicaLocalVariable': {},
             'select_replica': ('replica_id', 'structured')},
}

# The same classes under two names (aliases, not copies).
ALIASES = [
    (cross_tower_ops.CrossDeviceOps, cross_tower_ops.CrossTowerOps),
    (cross_tower_ops.ReductionToOneDevice,
     cross_tower_ops.ReductionToOneDeviceCrossTowerOps),
    (cross_tower_ops.AllReduceCrossDeviceOps,
     cross_tower_ops.AllReduceCrossTowerOps),
    (distribute_lib.StrategyV1, distribute_lib.Strategy),
    (distribute_lib.StrategyExtendedV1, distribute_lib.StrategyExtended),
    (distribute_lib.StrategyExtendedV2, distribute_lib.StrategyExtended),
    (distribute_lib.DistributionStrategy, distribute_lib.Strategy),
    (replicate.TowerOptimizer, tower_optimizer.TowerOptimizer),
    # contrib's replicate_model_fn module held TowerOptimizer too.
    (model_fn.TowerOptimizer, tower_optimizer.TowerOptimizer),
    (replicate.replicate_model_fn, model_fn.replicate_model_fn),
    (replicate.MirroredStrategy, mirrored_strategy.MirroredStrategy),
    (replicate.NcclAllReduce, cross_tower_ops.NcclAllReduce),
]

# TF names our originals' parameters go by in TF 1.15 (contrib 1.11's).
_TF15_RENAMES = {'reduce_op': 'aggregation',
                 'per_replica_value': 'per_device_value'}


def _parameters(fn):
  """The names of the parameters of `fn` one can pass, without `self`."""
  if isinstance(fn, (staticmethod, classmethod)):
    fn = fn.__func__
  names = [p.name for p in inspect.signature(fn).parameters.values()
           if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY,
                         p.POSITIONAL_ONLY)]
  return tuple(names[1:] if names[:1] in (['self'], ['cls']) else names)


def _cases():
  for module, names in EXPECTED.items():
    for name, spec in names.items():
      yield ('{}.{}'.format(module.__name__, name), module, name, spec)


class ApiSurfaceTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*[(c[0], c[1], c[2], c[3])
                                    for c in _cases()])
  def test_name_resolves_with_its_parameters(self, module, name, spec):
    self.assertTrue(hasattr(module, name), name)
    value = getattr(module, name)
    if isinstance(spec, tuple):
      self.assertTrue(callable(value), name)
      self.assertEqual(_parameters(value)[:len(spec)], spec)
    elif isinstance(spec, dict):
      self.assertTrue(inspect.isclass(value), name)
      for member, params in spec.items():
        self.assertTrue(hasattr(value, member), '{}.{}'.format(name, member))
        if params is None:
          continue
        static = inspect.getattr_static(value, member)
        self.assertEqual(_parameters(static)[:len(params)], params,
                         '{}.{}'.format(name, member))

  def test_aliases_are_the_same_objects(self):
    for alias, original in ALIASES:
      self.assertIs(alias, original)

  def test_tf_names_are_subclasses_as_in_tf(self):
    for cls in (cross_tower_ops.NcclAllReduce,
                cross_tower_ops.HierarchicalCopyAllReduce):
      self.assertTrue(issubclass(cls, cross_tower_ops.AllReduceCrossTowerOps))
    self.assertEqual(cross_tower_ops.NcclAllReduce().all_reduce_alg.value,
                     'nccl')
    self.assertEqual(
        cross_tower_ops.HierarchicalCopyAllReduce(num_packs=2)
        .all_reduce_alg.value, 'hierarchical_copy')

  def test_all_lists_exactly_the_public_names(self):
    subpackages = {'core', 'cross_tower', 'gradients', 'graph_copy', 'towers',
                   'strategy', 'cluster', 'version'}
    public = {n for n in vars(replicate) if not n.startswith('_')}
    self.assertEqual(set(replicate.__all__) - {'__version__'},
                     public - subpackages)
    self.assertLen(replicate.__all__, len(set(replicate.__all__)))
    self.assertRegex(replicate.__version__, r'^\d+\.\d+\.\d+')

  def test_tuning_fields(self):
    # The knobs users may set. `matmul_min_elements` went with the CPU
    # MatMul gradient override (its graphs needed `import replicate`), five
    # more with the other CPU-only rewrites (docs/performance.md).
    self.assertEqual(
        ('pack_max_bytes', 'pack_max_group', 'pack_small_bytes',
         'all_reduce_bucket_bytes', 'all_reduce_min_buckets'),
        replicate.Tuning._fields)


class ExceptionTypesTest(tf.test.TestCase):
  """Where the originals raise ValueError, so do we."""

  def test_value_errors(self):
    with tf.Graph().as_default():
      with tf.device('/cpu:0'):
        value = values.PerDevice({'/cpu:0': tf.constant(1.)})
      ops = cross_tower_ops.ReductionToOneDeviceCrossTowerOps()
      cases = [
          # batch_reduce without destination pairs.
          lambda: ops.batch_reduce(replicate.ReduceOp.SUM, [value]),
          lambda: ops.batch_reduce(replicate.ReduceOp.SUM, value),
          lambda: ops.reduce(replicate.ReduceOp.SUM, [1.], '/cpu:0'),
          lambda: ops.reduce(replicate.ReduceOp.SUM, value, 5),
          lambda: cross_tower_ops.validate_destinations(None),
          lambda: cross_tower_ops.validate_destinations([]),
          lambda: cross_tower_ops.validate_destinations(5),
          lambda: cross_tower_ops.NcclAllReduce(num_packs=-1),
          lambda: cross_tower_ops.HierarchicalCopyAllReduce(num_packs=-1),
          lambda: cross_tower_ops.ConcatAndSplitPacker(0),
          lambda: cross_tower_ops.AggregateSmallTensorPacker(0, 16),
      ]
      for i, case in enumerate(cases):
        with self.assertRaises(ValueError, msg='case {}'.format(i)):
          case()
      self.assertTrue(cross_tower_ops.check_destinations('/cpu:0'))
      self.assertTrue(cross_tower_ops.check_destinations(value))
      self.assertFalse(cross_tower_ops.check_destinations([]))
      self.assertFalse(cross_tower_ops.check_destinations(None))

  def test_require_replica_context_is_a_runtime_error(self):
    strategy = replicate.MirroredStrategy(['/cpu:0'])
    context = distribute_lib.ReplicaContext(strategy, 0)
    with self.assertRaisesRegex(RuntimeError, 'require_replica_context'):
      distribute_lib.require_replica_context(context)
    # The default replica context outside any strategy is current.
    distribute_lib.require_replica_context(replicate.get_replica_context())


class NewNamesWorkTest(tf.test.TestCase):

  def test_packers_round_trip(self):
    with tf.Graph().as_default():
      device_grads = []
      for d in range(2):
        with tf.device('/cpu:0'):
          # Distinct values per device and per gradient.
          device_grads.append([
              (tf.constant(np.arange(6.).reshape(2, 3) + 10 * d,
                           tf.float32), 'w'),
              (tf.constant([1. + d, 2. + d]), 'b')])
      for packer in (cross_tower_ops.ConcatAndSplitPacker(num_packs=2),
                     cross_tower_ops.AggregateSmallTensorPacker()):
        packed = packer.pack(device_grads)
        unpacked = packer.unpack(packed)
        with self.cached_session() as sess:
          got = sess.run([[g for g, _ in grads] for grads in unpacked])
          want = sess.run([[g for g, _ in grads] for grads in device_grads])
        for got_device, want_device in zip(got, want):
          for g, w in zip(got_device, want_device):
            self.assertAllEqual(g, w)
        self.assertEqual([v for _, v in unpacked[1]], ['w', 'b'])

  def test_unpack_before_pack_is_an_error(self):
    with self.assertRaisesRegex(errors.ContextError, 'before pack'):
      cross_tower_ops.ConcatAndSplitPacker().unpack([])

  def test_get_loss_reduction_is_sum(self):
    self.assertEqual(distribute_lib.get_loss_reduction(),
                     replicate.ReduceOp.SUM)

  def test_tower_optimizer_has_been_used(self):
    with tf.Graph().as_default():
      self.assertFalse(replicate.TowerOptimizer.has_been_used())
      w = tf.compat.v1.get_variable('w', initializer=2.)
      optimizer = replicate.TowerOptimizer(
          tf.compat.v1.train.GradientDescentOptimizer(0.1))
      optimizer.minimize(w * w)
      self.assertTrue(replicate.TowerOptimizer.has_been_used())
      # The collection is only a name: nothing is kept in it.
      self.assertEqual(tf.compat.v1.get_collection(
          replicate.TowerOptimizer.COLLECTION_FOR_GRAPH_STATES), [])
    with tf.Graph().as_default():
      self.assertFalse(replicate.TowerOptimizer.has_been_used())

  def test_keras_optimizer_names_the_v1_optimizer(self):
    with self.assertRaisesRegex(
        TypeError, r'Keras optimizer Adam .*tf\.compat\.v1\.train\.'
        r'AdamOptimizer'):
      replicate.TowerOptimizer(tf.keras.optimizers.Adam(0.1))
    with self.assertRaisesRegex(
        TypeError, r'tf\.compat\.v1\.train\.GradientDescentOptimizer'):
      replicate.TowerOptimizer(lambda: tf.keras.optimizers.SGD(0.1)
                              ).get_slot_names()

  def test_strategy_run_numpy_dataset_and_colocation(self):
    devices = replicate.testing.virtual_cpu_devices(2)
    with tf.Graph().as_default():
      strategy = replicate.MirroredStrategy(
          devices, cross_device_ops=cross_tower_ops.ReductionToOneDevice())
      self.assertFalse(strategy.extended.experimental_require_static_shapes)
      dataset = strategy.experimental_make_numpy_dataset(
          np.arange(8, dtype=np.float32).reshape(4, 2))
      iterator = strategy.make_dataset_iterator(dataset.batch(4))
      with strategy.scope():
        v = tf.compat.v1.get_variable('v', initializer=1.)
        with strategy.colocate_vars_with(v):
          u = tf.compat.v1.get_variable('u', initializer=2.)
      self.assertEqual(u.device, v.device)
      # Each replica gets 2 rows of [[0, 1], [2, 3]] / [[4, 5], [6, 7]]:
      # sums 6 and 22, plus v = 1 each: 7 + 23 = 30.
      per_replica = strategy.run(lambda x: tf.reduce_sum(x) + v,
                                 args=(iterator.get_next(),))
      total = strategy.reduce(replicate.ReduceOp.SUM, per_replica)
      with self.session(config=replicate.testing.virtual_cpu_config(2)) as s:
        s.run(tf.compat.v1.global_variables_initializer())
        s.run(iterator.initialize())
        self.assertEqual(s.run(total), 30.)

  def test_both_cross_device_ops_names_is_an_error(self):
    ops = cross_tower_ops.ReductionToOneDevice()
    with self.assertRaisesRegex(ValueError, 'both cross_device_ops and '
                                'cross_tower_ops'):
      replicate.MirroredStrategy(['/cpu:0'], cross_device_ops=ops,
                                 cross_tower_ops=ops)
    # contrib's keyword still works.
    replicate.MirroredStrategy(['/cpu:0'], cross_tower_ops=ops)


class Tf115OriginalsTest(tf.test.TestCase):
  """On TF 1.15, the originals that are importable agree with the table."""

  def setUp(self):
    super(Tf115OriginalsTest, self).setUp()
    if not _IS_TF1:
      self.skipTest('The originals are TF 1.15 (contrib) only.')

  def _compare_class(self, ours, theirs, skip=(), renames=None):
    renames = renames or {}
    for member in dir(theirs):
      if member.startswith('_') and member != '__init__' or member in skip:
        continue
      self.assertTrue(hasattr(ours, member),
                      '{} lacks {}'.format(ours.__name__, member))
      their_static = inspect.getattr_static(theirs, member)
      if not callable(their_static) and not isinstance(
          their_static, (staticmethod, classmethod)):
        continue
      if member == '__init__' and their_static is object.__init__:
        continue
      want = tuple(renames.get(p, p) for p in _parameters(their_static)
                   if p not in ('args', 'kwargs') or member != '__init__')
      got = _parameters(inspect.getattr_static(ours, member))
      self.assertEqual(got[:len(want)], want,
                       '{}.{}'.format(ours.__name__, member))

  def test_replicate_model_fn_module(self):
    from tensorflow_estimator.contrib.estimator.python.estimator import (
      replicate_model_fn as contrib,  # pylint: disable=g-import-not-at-top
    )
    self.assertEqual(_parameters(contrib.replicate_model_fn),
                     _parameters(model_fn.replicate_model_fn)[:3])
    self.assertEqual(tower_optimizer.TowerOptimizer.COLLECTION_FOR_GRAPH_STATES,
                     contrib.TowerOptimizer.COLLECTION_FOR_GRAPH_STATES)
    public = [m for m in vars(contrib.TowerOptimizer) if not m.startswith('_')]
    for member in public:
      self.assertTrue(hasattr(tower_optimizer.TowerOptimizer, member), member)

  def test_distribute_lib(self):
    from tensorflow.python.distribute import distribute_lib as tf_lib  # pylint: disable=g-import-not-at-top
    skip = set()
    self._compare_class(distribute_lib.Strategy, tf_lib.StrategyV1, skip)
    self._compare_class(distribute_lib.StrategyExtended,
                        tf_lib.StrategyExtendedV1, skip)
    self._compare_class(distribute_lib.ReplicaContext, tf_lib.ReplicaContext)
    self._compare_class(distribute_lib.InputContext, tf_lib.InputContext)
    for name in ('get_loss_reduction', 'require_replica_context',
                 'get_update_device'):
      theirs = _parameters(getattr(tf_lib, name))
      self.assertEqual(_parameters(getattr(distribute_lib, name))[
          :len(theirs)], theirs, name)

  def test_cross_device_ops(self):
    from tensorflow.python.distribute import cross_device_ops as tf_ops  # pylint: disable=g-import-not-at-top
    for name in ('CrossDeviceOps', 'ReductionToOneDevice',
                 'AllReduceCrossDeviceOps', 'NcclAllReduce',
                 'HierarchicalCopyAllReduce', 'MultiWorkerAllReduce',
                 'CollectiveAllReduce'):
      self._compare_class(
          getattr(cross_tower_ops, name), getattr(tf_ops, name),
          skip={'reduce_implementation', 'batch_reduce_implementation',
                'broadcast_implementation'},
          renames=_TF15_RENAMES)
    for name in ('check_destinations', 'validate_destinations',
                 'get_devices_from', 'choose_the_best'):
      self.assertEqual(_parameters(getattr(cross_tower_ops, name)),
                       _parameters(getattr(tf_ops, name)), name)
    self.assertEqual(cross_tower_ops.AllReduceSpecTuple._fields,
                     tf_ops.AllReduceSpecTuple._fields)
    # The same exception types as TF's.
    with self.assertRaises(ValueError):
      tf_ops.NcclAllReduce(num_packs=-1)
    with self.assertRaises(ValueError):
      tf_ops.validate_destinations(5)

  def test_mirrored_strategy(self):
    from tensorflow.python.distribute import mirrored_strategy as tf_mirrored  # pylint: disable=g-import-not-at-top
    self.assertEqual(
        _parameters(tf_mirrored.MirroredStrategyV1.__init__),
        _parameters(mirrored_strategy.MirroredStrategy.__init__)[:2])


if __name__ == '__main__':
  tf.test.main()

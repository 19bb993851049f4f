"""The model_fns Estimator users write, replicated, against one device.

Each case starts from one checkpoint, written by the unreplicated model after
one step; from there the unreplicated and the replicated Estimator each train
the same batches, and then:
- TRAIN: every variable (weights, slots, counters) is compared by name;
- EVAL: every metric and the loss, on the same checkpoint;
- PREDICT: every prediction, in input order, on the same checkpoint.
The data is 32 distinct rows in batches of 8: 2 rows per tower on 4 towers.
"""
import shutil

from absl.testing import parameterized
import model_zoo as zoo
import numpy as np
import tensorflow as tf

import replicate
from replicate._compat import tf1

TOWERS = 4
CLONE = replicate.TowerBuild.CLONE
PER_TOWER = replicate.TowerBuild.CALL_PER_TOWER
CONSOLIDATED = replicate.VariablePlacement.CONSOLIDATION_DEVICE
REPLICATED = replicate.VariablePlacement.REPLICATED

# name, model_fn, label key, whether the input is parsed tf.Examples. The
# loss reduction is SUM_BY_NONZERO_WEIGHTS (tf.compat.v1.losses' default)
# but for `SUM_CASES`.
CASES = [
    ('numeric_bucketized', zoo.numeric_bucketized, 'value', False),
    ('vocabulary_list', zoo.vocabulary_list, 'value', False),
    ('vocabulary_file', zoo.vocabulary_file_model, 'value', False),
    ('hash_identity_crossed', zoo.hash_identity_crossed, 'value', False),
    ('shared_embedding', zoo.shared_embedding, 'value', False),
    ('linear_model', zoo.linear_model, 'value', False),
    ('sparse_tags_from_examples', zoo.sparse_tags, 'value', True),
    ('partitioned', zoo.partitioned, 'value', False),
    ('lstm', zoo.lstm, 'value', False),
    ('stacked_gru', zoo.stacked_gru, 'value', False),
    ('bidirectional', zoo.bidirectional, 'value', False),
    ('while_loop', zoo.while_loop, 'value', False),
    ('cond_per_row', zoo.cond_per_row, 'value', False),
    ('sampled_softmax', zoo.sampled_softmax, 'class', False),
    ('py_func', zoo.py_function, 'value', False),
    ('string_labels', zoo.string_labels, 'animal', False),
    ('summaries', zoo.summaries, 'value', False),
    ('keras_layers', zoo.keras_layers, 'value', False),
    ('keras_lstm', zoo.keras_lstm, 'value', False),
    ('clipped_schedule', zoo.clipped_schedule, 'value', False),
    ('forward_counter', zoo.forward_counter, 'value', False),
    ('canned_dnn', zoo.canned_dnn, 'animal', False),
    ('scaffold', zoo.scaffolded, 'value', False),
]
# A canned tf.compat.v1 Estimator sums its losses (loss_reduction=SUM).
SUM_CASES = ['canned_dnn']
# Cases whose trainable variables REPLICATED can copy (every case but those
# with partitioned variables, which REPLICATED does not copy).
REPLICATED_CASES = ['vocabulary_list', 'sparse_tags_from_examples', 'lstm',
                    'while_loop', 'string_labels', 'keras_layers', 'canned_dnn']


def _config(model_dir):
  # Soft placement, as in the Estimator's default session config: a TF1
  # map_fn's TensorArray is colocated with the shard it unstacks, which sits
  # on the consolidation device, and read on the tower's (so does a model_fn
  # call per tower, and tower 0 of /gpu towers).
  return tf1.estimator.RunConfig(
      model_dir=model_dir, tf_random_seed=3,
      session_config=replicate.testing.virtual_cpu_config(
          TOWERS, allow_soft_placement=True),
      save_summary_steps=1, log_step_count_steps=None)


class ModelSuiteTest(tf.test.TestCase, parameterized.TestCase):

  def _estimator(self, model_fn, model_dir, params, **replication):
    if replication:
      reduction = (tf1.losses.Reduction.SUM
                   if model_fn in [c[1] for c in CASES if c[0] in SUM_CASES]
                   else tf1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS)
      model_fn = replicate.replicate_model_fn(
          model_fn, devices=replicate.testing.virtual_cpu_devices(TOWERS),
          loss_reduction=reduction, **replication)
    return tf1.estimator.Estimator(model_fn, config=_config(model_dir),
                                   params=params)

  def _compare(self, model_fn, label_key, examples, optimizer='sgd',
               steps=2, **replication):
    root = self.get_temp_dir() + '/' + self.id().split('.')[-1]
    params = {'optimizer': optimizer,
              'vocabulary_file': zoo.vocabulary_file(self.get_temp_dir())}
    train_input = zoo.input_fn(label_key, examples=examples)
    once_input = zoo.input_fn(label_key, epochs=1, examples=examples)
    # One unreplicated step writes the checkpoint both runs start from.
    one = self._estimator(model_fn, root + '/one', params)
    one.train(train_input, steps=1)
    shutil.copytree(root + '/one', root + '/many')
    many = self._estimator(model_fn, root + '/many', params, **replication)
    one.train(train_input, steps=steps)
    many.train(train_input, steps=steps)

    # TRAIN: the same variables, the same values (slots and counters too).
    names = one.get_variable_names()
    self.assertCountEqual(names, many.get_variable_names())
    for name in names:
      self.assertAllClose(one.get_variable_value(name),
                          many.get_variable_value(name), rtol=2e-5,
                          atol=2e-6, msg=name)
    self.assertEqual(1 + steps, many.get_variable_value('global_step'))

    # EVAL and PREDICT on the same checkpoint.
    checkpoint = one.latest_checkpoint()
    expected = one.evaluate(once_input, checkpoint_path=checkpoint,
                            name='one')
    metrics = many.evaluate(once_input, checkpoint_path=checkpoint,
                            name='many')
    self.assertCountEqual(expected, metrics)
    for key in expected:
      if key != 'global_step':
        self.assertAllClose(expected[key], metrics[key], rtol=2e-5,
                            atol=2e-6, msg=key)
    expected = list(one.predict(once_input, checkpoint_path=checkpoint))
    predictions = list(many.predict(once_input, checkpoint_path=checkpoint))
    self.assertLen(predictions, zoo.ROWS)
    for want, got in zip(expected, predictions):
      self.assertCountEqual(want, got)
      for key in want:
        if np.asarray(want[key]).dtype.kind in 'SUO':
          self.assertAllEqual(want[key], got[key])
        else:
          self.assertAllClose(want[key], got[key], rtol=2e-5, atol=2e-6)
    return many

  @parameterized.named_parameters(*[(c[0], c[1], c[2], c[3]) for c in CASES])
  def test_copied_towers(self, model_fn, label_key, examples):
    self._compare(model_fn, label_key, examples, tower_build=CLONE)

  @parameterized.named_parameters(
      *[(c[0], c[1], c[2], c[3]) for c in CASES if c[0] in REPLICATED_CASES])
  def test_replicated_variables(self, model_fn, label_key, examples):
    self._compare(model_fn, label_key, examples, tower_build=CLONE,
                  variable_placement=REPLICATED)

  @parameterized.named_parameters(
      ('adam', 'adam'), ('momentum', 'momentum'))
  def test_other_optimizers(self, optimizer):
    self._compare(zoo.vocabulary_list, 'value', False, optimizer=optimizer,
                  tower_build=CLONE)

  def test_forward_counter_counts_every_row(self):
    many = self._compare(zoo.forward_counter, 'value', False, steps=3,
                         tower_build=CLONE)
    # 1 unreplicated step + 3 replicated steps, 8 rows each.
    self.assertEqual(32.0, many.get_variable_value('examples_seen'))

  def test_batch_norm_copies_equal_per_tower_calls(self):
    # Batch norm normalizes each tower's rows by that tower's statistics (as
    # tf.contrib did), so the reference is a model built by one model_fn call
    # per tower; both take the moving statistics from tower 0.
    root = self.get_temp_dir() + '/bn'
    params = {'optimizer': 'sgd'}
    train_input = zoo.input_fn('value')
    self._estimator(zoo.batch_norm, root + '/start', params).train(
        train_input, steps=1)
    results = []
    for build in (CLONE, PER_TOWER):
      shutil.copytree(root + '/start', root + '/' + build.value)
      estimator = self._estimator(zoo.batch_norm, root + '/' + build.value,
                                  params, tower_build=build)
      estimator.train(train_input, steps=2)
      results.append({n: estimator.get_variable_value(n)
                      for n in estimator.get_variable_names()})
    self.assertCountEqual(results[0], results[1])
    for name in results[0]:
      self.assertAllClose(results[0][name], results[1][name], rtol=2e-5,
                          atol=2e-6, msg=name)

  def test_train_and_evaluate_with_exporter(self):
    root = self.get_temp_dir() + '/tae'
    params = {'optimizer': 'sgd'}
    receiver = tf1.estimator.export.build_parsing_serving_input_receiver_fn(
        zoo.EXAMPLE_SPEC)
    one = self._estimator(zoo.sparse_tags, root + '/one', params)
    one.train(zoo.input_fn(examples=True), steps=1)
    shutil.copytree(root + '/one', root + '/many')
    results = []
    for name, replication in (('one', {}), ('many', {'tower_build': CLONE})):
      estimator = self._estimator(zoo.sparse_tags, root + '/' + name, params,
                                  **replication)
      metrics, exports = tf1.estimator.train_and_evaluate(
          estimator,
          tf1.estimator.TrainSpec(zoo.input_fn(examples=True), max_steps=3),
          tf1.estimator.EvalSpec(
              zoo.input_fn(epochs=1, examples=True), steps=None,
              exporters=[tf1.estimator.LatestExporter('latest', receiver)],
              throttle_secs=0))
      self.assertLen(exports, 1)
      results.append((metrics, {n: estimator.get_variable_value(n)
                                for n in estimator.get_variable_names()}))
    (want_metrics, want), (metrics, got) = results
    self.assertCountEqual(want, got)
    for name in want:
      self.assertAllClose(want[name], got[name], rtol=2e-5, atol=2e-6,
                          msg=name)
    for key in want_metrics:
      self.assertAllClose(want_metrics[key], metrics[key], rtol=2e-5,
                          atol=2e-6, msg=key)

  def test_export_with_parsing_serving_input(self):
    many = self._compare(zoo.sparse_tags, 'value', True, tower_build=CLONE)
    receiver = tf1.estimator.export.build_parsing_serving_input_receiver_fn(
        zoo.EXAMPLE_SPEC)
    path = many.export_saved_model(self.get_temp_dir() + '/export', receiver)
    examples = zoo.serialized_examples()
    with tf.Graph().as_default(), tf1.Session() as sess:
      meta = tf1.saved_model.loader.load(sess, ['serve'], path)
      signature = meta.signature_def['serving_default']
      outputs = sess.run(
          {k: v.name for k, v in signature.outputs.items()},
          # A regression signature names its one input 'inputs'.
          {signature.inputs['inputs'].name: examples})
    predictions = list(many.predict(zoo.input_fn(epochs=1, examples=True)))
    self.assertAllClose(
        np.array([p['prediction'] for p in predictions]),
        outputs['outputs'], rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()

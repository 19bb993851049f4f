"""test_mirrored_strategy's replica tests with the opt-in
`ReplicaBuild.CLONE`: the copies must give what per-replica calls give.

Tests whose function asks which replica it builds, or that build the
replicas inside a loop body, are skipped: copying refuses them (the errors
are tested in test_mirrored_copies.py)."""
import re

import tensorflow as tf
import test_mirrored_strategy as calls

import replicate


def _copying_strategy(**kwargs):
  kwargs.setdefault('replica_build', replicate.ReplicaBuild.CLONE)
  return replicate.MirroredStrategy(calls.DEVICES, **kwargs)


_ASK_REPLICA_ID = 'the function asks replica_id_in_sync_group'
_REFUSED = {
    'test_different_number_of_merge_calls_raises': _ASK_REPLICA_ID,
    'test_different_structures_raise': _ASK_REPLICA_ID,
    'test_exception_in_a_replica_surfaces': _ASK_REPLICA_ID,
    'test_merge_call_order_and_results': _ASK_REPLICA_ID,
    'test_merge_function_runs_under_the_replicas_control_dependencies':
        _ASK_REPLICA_ID,
    'test_gradients': _ASK_REPLICA_ID,
    'test_gradient_tape': _ASK_REPLICA_ID,
    'test_gradients_of_a_mirrored_variable': _ASK_REPLICA_ID,
    'test_values': _ASK_REPLICA_ID,
    'test_plain_optimizer_inside_replica_raises': _ASK_REPLICA_ID,
    'test_replicas_creating_different_variables_raise': _ASK_REPLICA_ID,
    'test_callers_creators_apply_in_the_replicas_below_their_own':
        _ASK_REPLICA_ID,
    'test_run_steps_on_iterator': 'the replicas are built in a loop body',
    'test_summaries_are_recorded_by_replica_zero':
        'TF 2-style summaries are written (test_mirrored_copies.py)',
    'test_summaries_are_recorded_by_replica_zero_writer_inside':
        'TF 2-style summaries are written (test_mirrored_copies.py)',
}


class _Copying(object):
  """Builds every `_strategy()` of the test with `ReplicaBuild.CLONE`."""

  def setUp(self):
    super(_Copying, self).setUp()
    name = re.sub(r'\d+$', '', self._testMethodName)
    if name in _REFUSED:
      self.skipTest('ReplicaBuild.CLONE refuses it: ' + _REFUSED[name])
    original = calls._strategy  # pylint: disable=protected-access
    calls._strategy = _copying_strategy  # pylint: disable=protected-access
    self.addCleanup(setattr, calls, '_strategy', original)


class MergeCallCopiesTest(_Copying, calls.MergeCallTest):
  pass


class AllReduceCopiesTest(_Copying, calls.AllReduceTest):
  pass


class InputCopiesTest(_Copying, calls.InputTest):
  pass


class TrainingCopiesTest(_Copying, calls.TrainingTest):
  pass


class MirroredVariableCopiesTest(_Copying, calls.MirroredVariableTest):
  pass


if __name__ == '__main__':
  tf.test.main()

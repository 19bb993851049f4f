"""Tests for `replicate.core.tuning`: one immutable object for every knob."""
import copy
import pickle
import threading

from absl.testing import parameterized
import tensorflow as tf

from replicate import errors
from replicate.core import tuning


class TuningTest(parameterized.TestCase, tf.test.TestCase):

  def test_defaults_and_replace(self):
    default = tuning.Tuning()
    self.assertEqual(256 * 1024, default.pack_max_bytes)
    self.assertEqual(16, default.pack_max_group)
    self.assertEqual(64 * 1024, default.pack_small_bytes)
    changed = default.replace(pack_max_group=4, pack_small_bytes=0)
    self.assertEqual(4, changed.pack_max_group)
    self.assertEqual(0, changed.pack_small_bytes)
    # The original is untouched: the object is immutable.
    self.assertEqual(16, default.pack_max_group)
    with self.assertRaises(AttributeError):
      default.pack_max_group = 3  # pylint: disable=assigning-non-slot

  @parameterized.named_parameters(
      ('unknown_field', dict(pack_bytes=1), errors.InvalidArgumentError,
       r"Unknown Tuning field\(s\) \['pack_bytes'\]; the fields are "
       'pack_max_bytes'),
      ('negative', dict(pack_max_bytes=-1), errors.InvalidArgumentError,
       'Tuning.pack_max_bytes must be at least 0, got -1'),
      ('empty_group', dict(pack_max_group=0), errors.InvalidArgumentError,
       'Tuning.pack_max_group must be at least 1, got 0'),
      ('no_buckets', dict(all_reduce_min_buckets=0),
       errors.InvalidArgumentError,
       'Tuning.all_reduce_min_buckets must be at least 1, got 0'),
      ('float', dict(all_reduce_bucket_bytes=1.5), errors.InvalidTypeError,
       'Tuning.all_reduce_bucket_bytes must be an int, got 1.5'),
      ('none_not_allowed', dict(pack_small_bytes=None),
       errors.InvalidTypeError, 'Tuning.pack_small_bytes must be an int'),
      ('bool_size', dict(pack_max_bytes=True), errors.InvalidTypeError,
       'Tuning.pack_max_bytes must be an int'),
      # The CPU MatMul gradient override and its threshold are gone (an
      # override left an attribute only `import replicate` could resolve).
      ('removed_matmul_field', dict(matmul_min_elements=None),
       errors.InvalidArgumentError,
       r"Unknown Tuning field\(s\) \['matmul_min_elements'\]"),
      # So are the CPU-only rewrites' fields (fused MatMul gradients, packed
      # reads, one-thread copies, CPU pack sizing): an old name is an error.
      ('removed_cpu_fields',
       dict(fuse_min_bytes=None, one_thread_bytes=1, pack_size_sources=4,
            read_pack_max_bytes=0, stitch_on_cpus=False),
       errors.InvalidArgumentError,
       r"Unknown Tuning field\(s\) \['fuse_min_bytes', 'one_thread_bytes', "
       r"'pack_size_sources', 'read_pack_max_bytes', 'stitch_on_cpus'\]; "
       'the fields are pack_max_bytes, pack_max_group, pack_small_bytes, '
       'all_reduce_bucket_bytes, all_reduce_min_buckets'),
  )
  def test_bad_fields(self, kwargs, error, message):
    with self.assertRaisesRegex(error, message):
      tuning.Tuning(**kwargs)

  def test_scope_nests_and_restores(self):
    outer = tuning.Tuning(pack_max_group=2)
    inner = tuning.Tuning(pack_max_group=3)
    default = tuning.get_tuning()
    with tuning.tuning_scope(outer) as entered:
      self.assertIs(outer, entered)
      self.assertIs(outer, tuning.get_tuning())
      with tuning.tuning_scope(inner):
        self.assertIs(inner, tuning.get_tuning())
      self.assertIs(outer, tuning.get_tuning())
    self.assertIs(default, tuning.get_tuning())

  def test_scope_restores_after_an_error(self):
    default = tuning.get_tuning()
    with self.assertRaisesRegex(RuntimeError, 'boom'):
      with tuning.tuning_scope(tuning.Tuning(pack_max_group=2)):
        raise RuntimeError('boom')
    self.assertIs(default, tuning.get_tuning())

  def test_scopes_are_per_thread(self):
    # A scope open in one thread does not reach a build another thread
    # starts meanwhile: each build reads its own thread's scope once and
    # passes it down (a strategy's replica threads get it that way).
    knobs = tuning.Tuning(pack_max_group=5)
    entered, read = threading.Event(), threading.Event()
    seen = {}

    def other():
      with tuning.tuning_scope(knobs):
        entered.set()
        read.wait(10)
        seen['other'] = tuning.get_tuning()

    thread = threading.Thread(target=other)
    thread.start()
    self.assertTrue(entered.wait(10))
    seen['main'] = tuning.get_tuning()
    read.set()
    thread.join()
    self.assertIs(knobs, seen['other'])
    self.assertEqual(tuning.Tuning(), seen['main'])

  def test_resolve_reads_the_scope_or_checks_the_argument(self):
    knobs = tuning.Tuning(pack_max_group=4)
    with tuning.tuning_scope(knobs):
      self.assertIs(knobs, tuning.resolve(None))
      given = tuning.Tuning(pack_max_group=6)
      self.assertIs(given, tuning.resolve(given))
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                r"Expected a replicate.Tuning, got \{'pack"):
      tuning.resolve({'pack_max_group': 6})

  def test_improper_nesting_raises(self):
    first = tuning.tuning_scope(tuning.Tuning(pack_max_group=2))
    second = tuning.tuning_scope(tuning.Tuning(pack_max_group=3))
    default = tuning.get_tuning()
    first.__enter__()
    second.__enter__()
    with self.assertRaisesRegex(errors.ContextError, 'not properly nested'):
      first.__exit__(None, None, None)
    # The stack is consistent again.
    self.assertIs(default, tuning.get_tuning())

  def test_set_tuning_returns_the_previous_default(self):
    knobs = tuning.Tuning(pack_max_bytes=0)
    previous = tuning.set_tuning(knobs)
    try:
      self.assertIs(knobs, tuning.get_tuning())
      with tuning.tuning_scope(tuning.Tuning()):
        self.assertEqual(256 * 1024, tuning.get_tuning().pack_max_bytes)
    finally:
      self.assertIs(knobs, tuning.set_tuning(previous))
    self.assertIs(previous, tuning.get_tuning())

  def test_copies_and_pickles(self):
    # A MirroredStrategy holds its Tuning, and deep copies of a strategy
    # must work (contrib's CopyTest).
    knobs = tuning.Tuning(pack_max_group=3, all_reduce_min_buckets=2)
    self.assertIs(knobs, copy.copy(knobs))
    self.assertIs(knobs, copy.deepcopy({'k': knobs})['k'])
    restored = pickle.loads(pickle.dumps(knobs))
    self.assertEqual(knobs, restored)
    self.assertIsInstance(restored, tuning.Tuning)

  def test_only_a_tuning_is_accepted(self):
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'Expected a replicate.Tuning, got'):
      tuning.set_tuning({'pack_max_bytes': 0})
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'Expected a replicate.Tuning'):
      with tuning.tuning_scope(None):
        pass


  def test_replace_keeps_the_other_non_default_fields(self):
    # Every field off its default, then one changed: the other four must
    # keep their (non-default) values, not fall back to the defaults.
    custom = tuning.Tuning(pack_max_bytes=1000, pack_max_group=3,
                           pack_small_bytes=7, all_reduce_bucket_bytes=5000,
                           all_reduce_min_buckets=2)
    changed = custom.replace(pack_max_group=9)
    self.assertEqual(
        tuning.Tuning(pack_max_bytes=1000, pack_max_group=9,
                      pack_small_bytes=7, all_reduce_bucket_bytes=5000,
                      all_reduce_min_buckets=2), changed)
    self.assertEqual(3, custom.pack_max_group)  # Untouched.
    self.assertEqual(custom, custom.replace())

  def test_replace_validates_like_the_constructor(self):
    custom = tuning.Tuning(pack_max_bytes=1000)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'Tuning.pack_max_group must be at least 1'):
      custom.replace(pack_max_group=0)
    with self.assertRaisesRegex(errors.InvalidTypeError,
                                'Tuning.pack_max_bytes must be an int'):
      custom.replace(pack_max_bytes=1.5)
    with self.assertRaisesRegex(errors.InvalidArgumentError,
                                'Unknown Tuning field'):
      custom.replace(pack_bytes=1)


if __name__ == '__main__':
  tf.test.main()

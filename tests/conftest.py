"""Test configuration shared by the whole suite."""
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# `make test-tf2-v1` runs the fidelity suites on TF 2.15 as TF1 code meets it
# there: after `tf.compat.v1.disable_v2_behavior()` (TF1 control flow,
# reference-free resource variables), set before any test builds a graph.
if os.environ.get('REPLICATE_TEST_V1_BEHAVIOR') == '1':
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.compat.v1.disable_v2_behavior()

# The suite's shared helpers (model_testing, ctops_testlib) sit beside this
# file; the tests are grouped in folders that mirror the package.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(items):
  # tf.test.TestCase inherits a deprecated `test_session` context manager that
  # pytest would collect and report as a skipped test; it is not a test.
  items[:] = [item for item in items if item.name != 'test_session']

"""Test configuration shared by the whole suite."""
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# The suite's shared helpers (model_testing, ctops_testlib) sit beside this
# file; the tests are grouped in folders that mirror the package.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(items):
  # tf.test.TestCase inherits a deprecated `test_session` context manager that
  # pytest would collect and report as a skipped test; it is not a test.
  items[:] = [item for item in items if item.name != 'test_session']

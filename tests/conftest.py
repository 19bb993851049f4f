"""Test configuration shared by the whole suite."""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


def pytest_collection_modifyitems(items):
  # tf.test.TestCase inherits a deprecated `test_session` context manager that
  # pytest would collect and report as a skipped test; it is not a test.
  items[:] = [item for item in items if item.name != 'test_session']

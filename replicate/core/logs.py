"""Logging through `tf.compat.v1.logging`, with the caller's location.

Every module of the library logs through here, so that
`tf.compat.v1.logging.set_verbosity` controls replicate's messages as it
controls TensorFlow's. Import it as `from replicate.core import logs as
logging`: `info`, `warning`, `log_first_n` and the level constants have the
signatures of absl's and TF's.

Warnings name where user code called into the library: the first frame
outside `replicate/` and outside TensorFlow, appended as
`[called from file:line]`, since the library frame that logs means nothing
to the user.
"""
import os
import sys

import tensorflow as tf

_tf_logging = tf.compat.v1.logging

DEBUG = _tf_logging.DEBUG
INFO = _tf_logging.INFO
WARNING = _tf_logging.WARN
WARN = _tf_logging.WARN
ERROR = _tf_logging.ERROR

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIPPED = (_PACKAGE_DIR + os.sep, os.sep + 'tensorflow' + os.sep,
            os.sep + 'tensorflow_core' + os.sep,
            os.sep + 'tensorflow_estimator' + os.sep,
            os.sep + 'contextlib.py', os.sep + 'threading.py')

# (file, line) of a log_first_n call -> how many times it logged.
_COUNTS = {}


def caller_location():
  """`file:line` of the innermost frame of user code, or None.

  User code: not in this package, TensorFlow, the Estimator, or the standard
  library's context managers and threads (which run replica functions).
  """
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    filename = os.path.abspath(frame.f_code.co_filename)
    if not any(part in filename for part in _SKIPPED):
      return '{}:{}'.format(filename, frame.f_lineno)
    frame = frame.f_back
  return None


def _with_location(msg):
  location = caller_location()
  return msg if location is None else '{} [called from {}]'.format(
      msg, location)


def info(msg, *args):
  """Logs `msg % args` at INFO."""
  _tf_logging.info(msg, *args)


def warning(msg, *args):
  """Logs `msg % args` at WARNING, with the user code's location."""
  _tf_logging.warning(_with_location(msg), *args)


def log(level, msg, *args):
  """Logs `msg % args` at `level` (warnings with the user's location)."""
  if level >= WARNING:
    msg = _with_location(msg)
  _tf_logging.log(level, msg, *args)


def log_first_n(level, msg, n, *args):
  """Logs `msg % args` at `level` the first `n` times this line calls it."""
  caller = sys._getframe(1)  # pylint: disable=protected-access
  key = (caller.f_code.co_filename, caller.f_lineno)
  count = _COUNTS.get(key, 0)
  if count < n:
    _COUNTS[key] = count + 1
    log(level, msg, *args)

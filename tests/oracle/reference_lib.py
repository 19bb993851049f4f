"""TF 1.15's reference results, recorded, so the oracle tests run on TF 2 too.

The oracle tests compare replicate with TF 1.15's own implementations
(`tf.contrib.estimator.replicate_model_fn`, TF's cross_device_ops and
all_reduce builders), which TF 2.15 does not have. `record_reference.py` runs
each case's reference once on TF 1.15 and writes its results to
`reference/<group>/<case>.npz`; `reference_results` hands them to a test:

* on TF 1.15 it runs the reference live, checks that the recorded file still
  holds the same numbers (a stale file fails, naming the recorder), and
  returns the live results;
* on TF 2.x it returns the recorded results, after checking that the inputs
  the test code makes now (seeded numpy data, numpy initial values) are the
  ones the file was recorded from.

Only replicate's side is computed on TF 2, so each case's inputs must be fully
determined by numpy: seeded initializers are avoided, as their values are
TF's to change between versions.
"""
import hashlib
import io
import json
import os
import zipfile

import numpy as np
import tensorflow as tf

from replicate._compat import IS_TF2

REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             'reference')
RECORD_COMMAND = '.venv/tf1/bin/python tests/oracle/record_reference.py'
# Whether TF's own implementations (the oracles) can run here.
HAS_ORACLE = not IS_TF2


class Case(object):
  """One reference computation, stored as `reference/<group>/<name>.npz`.

  Attributes:
    group: the folder (one per test module).
    name: the file name, without `.npz`.
    compute: `() -> {name: array}`, the reference's results (TF 1.15 only).
    inputs: `() -> {name: array}`, every numpy input of the case (data and
      initial values); its digest is recorded, so that a test whose inputs
      changed since the recording fails on TF 2 as well.
  """

  def __init__(self, group, name, compute, inputs):
    self.group = group
    self.name = name
    self.compute = compute
    self.inputs = inputs

  @property
  def path(self):
    return os.path.join(REFERENCE_DIR, self.group, self.name + '.npz')


def digest(arrays):
  """A hex digest of `{name: array}`: names, dtypes, shapes and bytes."""
  sha = hashlib.sha256()
  for name in sorted(arrays):
    array = np.ascontiguousarray(arrays[name])
    sha.update('{}|{}|{}|'.format(name, array.dtype.str, array.shape).encode())
    sha.update(array.tobytes())
  return sha.hexdigest()


def _versions():
  # pylint: disable=g-import-not-at-top
  import pkg_resources
  # pylint: enable=g-import-not-at-top
  return {
      'tensorflow': tf.__version__,
      'tensorflow_git': tf.__git_version__,
      # tf.contrib.estimator's replicate_model_fn is tensorflow_estimator's.
      'tensorflow_estimator':
          pkg_resources.get_distribution('tensorflow-estimator').version,
      'numpy': np.__version__,
  }


def save(case, results, reference):
  """Writes `results` ({name: array}) of `case`, with the versions.

  Bit-identical arrays (the same value on every device) are stored once.

  Args:
    case: the `Case`.
    results: {name: array} computed by `case.compute()`.
    reference: which implementation computed them (e.g. its module).
  """
  arrays, names = [], {}
  for name in sorted(results):
    value = np.asarray(results[name])
    for i, stored in enumerate(arrays):
      if (stored.dtype == value.dtype and stored.shape == value.shape and
          stored.tobytes() == value.tobytes()):
        names[name] = 'a{}'.format(i)
        break
    else:
      names[name] = 'a{}'.format(len(arrays))
      arrays.append(value)
  meta = {'case': '{}/{}'.format(case.group, case.name),
          'reference': reference, 'versions': _versions(),
          'inputs_digest': digest(case.inputs()), 'names': names,
          'recorded_by': RECORD_COMMAND}
  if not os.path.isdir(os.path.dirname(case.path)):
    os.makedirs(os.path.dirname(case.path))
  payload = {'a{}'.format(i): a for i, a in enumerate(arrays)}
  payload['meta'] = np.array(json.dumps(meta, sort_keys=True))
  # np.savez_compressed's layout, with a fixed date: recording the same
  # numbers again leaves the file unchanged.
  with zipfile.ZipFile(case.path, 'w') as archive:
    for key in sorted(payload):
      info = zipfile.ZipInfo(key + '.npy', date_time=(1980, 1, 1, 0, 0, 0))
      info.compress_type = zipfile.ZIP_DEFLATED
      buffer = io.BytesIO()
      np.lib.format.write_array(buffer, payload[key], allow_pickle=False)
      archive.writestr(info, buffer.getvalue())


def load(case):
  """(results, meta) recorded for `case`; results as {name: array}."""
  with np.load(case.path, allow_pickle=False) as stored:
    meta = json.loads(str(stored['meta']))
    results = {name: stored[key] for name, key in meta['names'].items()}
  return results, meta


def assert_same_results(test, expected, actual, rtol, atol, msg=''):
  """Same names; each value close (numbers) or equal (strings, integers)."""
  test.assertEqual(sorted(expected), sorted(actual), msg)
  for name in sorted(expected):
    want, got = np.asarray(expected[name]), np.asarray(actual[name])
    if want.dtype.kind in 'fc':
      test.assertAllClose(want, got, rtol=rtol, atol=atol,
                          msg='{} {}'.format(msg, name))
    else:
      test.assertAllEqual(want, got, msg='{} {}'.format(msg, name))


def reference_results(test, case, rtol, atol):
  """The reference's results for `case`: live on TF 1.15, recorded on TF 2.

  Args:
    test: the `tf.test.TestCase` (assertions fail it).
    case: the `Case`.
    rtol: relative tolerance of the stale-file check on TF 1.15 (the
      tolerance of the test's own comparison: another TF 1.15 build may add
      in another order).
    atol: absolute tolerance of that check.

  Returns:
    {name: array}.
  """
  stale = ('{}: the recorded reference {} is missing or stale; rerun {} on '
           'TF 1.15'.format(case.name, os.path.relpath(case.path),
                            RECORD_COMMAND))
  test.assertTrue(os.path.exists(case.path), stale)
  recorded, meta = load(case)
  test.assertTrue(meta['versions']['tensorflow'].startswith('1.15'), meta)
  test.assertEqual(meta['inputs_digest'], digest(case.inputs()), stale)
  if not HAS_ORACLE:
    return recorded
  live = case.compute()
  assert_same_results(test, recorded, live, rtol=rtol, atol=atol, msg=stale)
  return live

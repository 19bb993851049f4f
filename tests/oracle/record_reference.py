"""Records TF 1.15's reference results for the oracle tests (TF 1.15 only).

  .venv/tf1/bin/python tests/oracle/record_reference.py [CASE ...]

Runs every oracle case's reference (contrib's replicate_model_fn, TF's
cross_device_ops and all_reduce builders) and writes its results to
tests/oracle/reference/<group>/<case>.npz, which the oracle tests compare
with on TF 2 (see reference_lib.py). With CASE arguments (`group/name`
substrings) only the matching cases are recorded; without, all are, and
files of cases that no longer exist are removed.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# The oracle modules import the suite's helpers (model_testing) and
# reference_lib, as they do under pytest.
sys.path[:0] = [os.path.dirname(_HERE), _HERE]
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,wrong-import-position
import reference_lib  # noqa: E402
import test_all_reduce_oracle  # noqa: E402
import test_contrib_oracle  # noqa: E402
import test_cross_tower_oracle  # noqa: E402
import test_oracle_models  # noqa: E402
import test_packers_oracle  # noqa: E402

_MODULES = (test_contrib_oracle, test_oracle_models, test_all_reduce_oracle,
            test_cross_tower_oracle, test_packers_oracle)


def main(patterns):
  if not reference_lib.HAS_ORACLE:
    sys.exit('record_reference.py runs the references of TF 1.15 (tf.contrib); '
             'run it with {}'.format(reference_lib.RECORD_COMMAND))
  written = set()
  for module in _MODULES:
    for case in module.REFERENCE_CASES:
      label = '{}/{}'.format(case.group, case.name)
      if patterns and not any(p in label for p in patterns):
        continue
      reference_lib.save(case, case.compute(),
                         reference=module.REFERENCE_IMPLEMENTATION)
      written.add(os.path.abspath(case.path))
      print('recorded {} ({} bytes)'.format(
          os.path.relpath(case.path), os.path.getsize(case.path)))
  if patterns:
    return
  for dirpath, _, filenames in os.walk(reference_lib.REFERENCE_DIR):
    for name in filenames:
      path = os.path.abspath(os.path.join(dirpath, name))
      if path not in written:
        os.remove(path)
        print('removed {} (no such case)'.format(os.path.relpath(path)))


if __name__ == '__main__':
  main(sys.argv[1:])

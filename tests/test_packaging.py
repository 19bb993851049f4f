"""Packaging: the sdist's contents and metadata, and the import-time TF check.

The sdist is built from the working tree with setuptools (no network); the
import check runs `import replicate` in a subprocess with `tensorflow` (or
`tensorflow_estimator`) made missing or replaced by a fake reporting another
version.
"""
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap

import tensorflow as tf

import replicate

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_IS_TF2 = tf.__version__.startswith('2.')


def _tree_files(folder, suffix):
  """Paths (relative to the root) of the files under `folder` ending in `suffix`."""
  result = set()
  for dirpath, dirnames, filenames in os.walk(os.path.join(_ROOT, folder)):
    dirnames[:] = [d for d in dirnames if d not in ('__pycache__', 'tmp')]
    for name in filenames:
      if name.endswith(suffix):
        result.add(os.path.relpath(os.path.join(dirpath, name), _ROOT))
  return result


def _run(args, env=None, cwd=_ROOT, timeout=120):
  return subprocess.run(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, universal_newlines=True,
                        timeout=timeout)


class SdistTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super(SdistTest, cls).setUpClass()
    cls._tmp = tempfile.TemporaryDirectory()
    # egg_info goes to the temporary folder too: the tree stays untouched.
    result = _run([sys.executable, 'setup.py', '-q', 'egg_info', '--egg-base',
                   cls._tmp.name, 'sdist', '--dist-dir', cls._tmp.name])
    assert result.returncode == 0, result.stderr
    archives = [f for f in os.listdir(cls._tmp.name) if f.endswith('.tar.gz')]
    assert len(archives) == 1, archives
    cls.archive_name = archives[0]
    with tarfile.open(os.path.join(cls._tmp.name, archives[0])) as archive:
      names = archive.getnames()
      prefix = names[0].split('/')[0] + '/'
      cls.files = {n[len(prefix):] for n in names if n.startswith(prefix)}
      cls.pkg_info = archive.extractfile(prefix + 'PKG-INFO').read().decode()
    # What installing the sdist requires (egg_info wrote it beside it).
    with open(os.path.join(cls._tmp.name, 'tf_replicate.egg-info',
                           'requires.txt')) as f:
      cls.requires = f.read()

  @classmethod
  def tearDownClass(cls):
    cls._tmp.cleanup()
    super(SdistTest, cls).tearDownClass()

  def test_named_tf_replicate_with_the_package_version(self):
    # setuptools >= 69 normalizes the file name to tf_replicate.
    self.assertIn(self.archive_name, [
        '{}-{}.tar.gz'.format(name, replicate.__version__)
        for name in ('tf_replicate', 'tf-replicate')])
    self.assertIn('\nName: tf-replicate\n', self.pkg_info[:200])
    self.assertIn('\nVersion: {}\n'.format(replicate.__version__),
                  self.pkg_info[:200])

  def test_top_level_files(self):
    for name in ('LICENSE', 'README.md', 'CHANGELOG.md', 'Makefile',
                 'MANIFEST.in', 'setup.py', 'setup.cfg', '.ci/run'):
      self.assertIn(name, self.files)

  def test_every_module_test_doc_example_and_benchmark(self):
    expected = (_tree_files('replicate', '.py') | _tree_files('tests', '.py') |
                _tree_files('docs', '.md') | _tree_files('examples', '.py') |
                _tree_files('benchmarks', '.py'))
    self.assertGreater(len(expected), 100)
    self.assertEqual(expected - self.files, set())

  def test_oracle_references(self):
    # The oracle tests compare with them on TF 2 (tests/oracle/reference_lib).
    expected = _tree_files('tests/oracle/reference', '.npz')
    self.assertNotEmpty(expected)
    self.assertEqual(expected - self.files, set())

  def test_no_build_leftovers(self):
    leftovers = [f for f in self.files
                 if f.endswith(('.pyc', '.so')) or '__pycache__' in f or
                 f.startswith(('.venv/', 'build/', 'dist/',
                               'benchmarks/results/tmp/'))]
    self.assertEqual(leftovers, [])

  def test_metadata(self):
    header = self.pkg_info.split('\n\n')[0].splitlines()
    python = [l for l in header if l.startswith('Requires-Python: ')]
    self.assertLen(python, 1)
    self.assertEqual(
        set(python[0][len('Requires-Python: '):].replace(' ', '').split(',')),
        {'>=3.7', '!=3.8.*', '<3.12'})
    for classifier in ('Programming Language :: Python :: 3.7',
                       'Programming Language :: Python :: 3.11',
                       'License :: OSI Approved :: Apache Software License'):
      self.assertIn('Classifier: ' + classifier, header)
    for extra in ('tf', 'tf-gpu', 'tf2', 'test'):
      self.assertIn('Provides-Extra: {}'.format(extra), header)

  def test_only_extras_are_required(self):
    # TensorFlow is chosen by the user through an extra; six and absl-py are
    # no longer needed: requires.txt has no requirement before its first
    # [extra] section.
    requires = self.requires.strip()
    self.assertTrue(requires.startswith('['), requires[:200])
    self.assertNotIn('six', requires)
    self.assertIn('[tf:python_version < "3.8"]\ntensorflow==1.15.5', requires)
    self.assertIn('[tf:python_version >= "3.9"]\ntensorflow==2.15.1', requires)


class ImportCheckTest(tf.test.TestCase):
  """`import replicate` raises one ImportError naming the fix."""

  def _import_replicate(self, prelude='', fake_version=None):
    env = dict(os.environ)
    path = [_ROOT]
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    if fake_version is not None:
      os.makedirs(os.path.join(tmp.name, 'tensorflow'))
      with open(os.path.join(tmp.name, 'tensorflow', '__init__.py'), 'w') as f:
        f.write('__version__ = {!r}\n'.format(fake_version))
      path.insert(0, tmp.name)
    env['PYTHONPATH'] = os.pathsep.join(path)
    code = textwrap.dedent(prelude) + '\nimport replicate\n'
    return _run([sys.executable, '-c', code], env=env)

  def _assert_one_import_error(self, result, *fragments):
    self.assertNotEqual(result.returncode, 0)
    last = result.stderr.strip().splitlines()[-1]
    self.assertTrue(last.startswith('ImportError: replicate needs '), last)
    self.assertIn('TensorFlow 1.15 on Python 3.7', last)
    self.assertIn("pip install 'tf-replicate[tf]'", last)
    for fragment in fragments:
      self.assertIn(fragment, last)
    # Nothing else failed first (absl, six, an AttributeError in TF).
    self.assertNotIn('absl', result.stderr)
    self.assertNotIn('During handling', result.stderr)

  def test_no_tensorflow(self):
    result = self._import_replicate(
        "import sys\nsys.modules['tensorflow'] = None")
    self._assert_one_import_error(result, 'no TensorFlow is installed')

  def test_tensorflow_without_estimator(self):
    result = self._import_replicate(fake_version='2.17.0')
    self._assert_one_import_error(
        result, 'TensorFlow 2.17.0 is installed',
        'TensorFlow 2.16 and later have no Estimator')

  def test_tensorflow_too_old(self):
    result = self._import_replicate(fake_version='1.14.0')
    self._assert_one_import_error(result, 'TensorFlow 1.14.0 is installed')

  def test_tf2_without_tensorflow_estimator(self):
    if not _IS_TF2:
      self.skipTest('TF 1.15 has the Estimator built in')
    result = self._import_replicate(
        "import sys\nsys.modules['tensorflow_estimator'] = None")
    self._assert_one_import_error(result, 'without tensorflow-estimator',
                                  "pip install 'tensorflow-estimator==2.15.*'")

  def test_supported_tensorflow_imports(self):
    result = self._import_replicate()
    self.assertEqual(result.returncode, 0, result.stderr)


if __name__ == '__main__':
  tf.test.main()

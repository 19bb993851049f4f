"""Packaging for `replicate`, distributed as `tf-replicate`.

PyPI's `replicate` is an unrelated project (an API client) that also imports
as `replicate`; this distribution is `tf-replicate` and imports as
`replicate` (like `dm-sonnet` -> `sonnet`). Never `pip install replicate`.

TensorFlow is an extra, not a hard requirement, so that users choose the build
(CPU, GPU, 1.15 or 2.15) that matches their machine:

  pip install 'tf-replicate[tf]'      # the supported TF for this Python:
                                      #   3.7: TF 1.15; 3.9-3.11: TF 2.15
  pip install 'tf-replicate[tf-gpu]'  # TF 1.15 GPU, Python 3.7 (CUDA 10.0,
                                      #   cuDNN 7.6)
  pip install 'tf-replicate[tf2]'     # TF 2.15 + Estimator (Python 3.9-3.11)

From a clone: pip install -e '.[tf]' (or '/path/to/clone[tf]').
"""
import os

from setuptools import find_packages
from setuptools import setup

_HERE = os.path.dirname(os.path.abspath(__file__))

# The public repository's address, once there is one: project_urls (Source,
# Documentation, Changelog, Issues) are derived from it.
_REPOSITORY = os.environ.get('TF_REPLICATE_REPOSITORY')


def _version():
  scope = {}
  with open(os.path.join(_HERE, 'replicate', 'version.py')) as f:
    exec(f.read(), scope)  # pylint: disable=exec-used
  return scope['__version__']


def _long_description():
  with open(os.path.join(_HERE, 'README.md')) as f:
    return f.read()


def _project_urls():
  if not _REPOSITORY:
    return {}
  return {
      'Source': _REPOSITORY,
      'Documentation': _REPOSITORY + '/tree/main/docs',
      'Changelog': _REPOSITORY + '/blob/main/CHANGELOG.md',
      'Issues': _REPOSITORY + '/issues',
  }


_PY37 = '; python_version < "3.8"'
_PY39_311 = '; python_version >= "3.9"'
_TF1 = ['tensorflow==1.15.5', 'protobuf<3.21', 'numpy<1.19']
_TF1_GPU = ['tensorflow-gpu==1.15.5', 'protobuf<3.21', 'numpy<1.19']
_TF2 = ['tensorflow==2.15.1', 'tensorflow-estimator==2.15.0']

setup(
    name='tf-replicate',
    version=_version(),
    description=('Multi-device data-parallel training for TensorFlow 1.15 / '
                 '2.15 graph and Estimator code: replicate_model_fn, '
                 'TowerOptimizer, cross-tower reductions and MirroredStrategy '
                 '(the tf.contrib APIs, imported as `replicate`).'),
    long_description=_long_description(),
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    project_urls=_project_urls(),
    packages=find_packages(include=['replicate', 'replicate.*']),
    # TF 1.15 runs on Python 3.7, TF 2.15 (the last with Estimator) on
    # 3.9-3.11: nothing else can run the library.
    python_requires='>=3.7, !=3.8.*, <3.12',
    # Only TensorFlow (an extra) and its own dependencies are needed.
    install_requires=[],
    extras_require={
        # The supported TensorFlow for the running Python.
        'tf': [r + _PY37 for r in _TF1] + [r + _PY39_311 for r in _TF2],
        # TF 1.15's GPU build needs CUDA 10.0 and cuDNN 7.6.
        'tf-gpu': [r + _PY37 for r in _TF1_GPU],
        'tf2': _TF2,
        'test': ['pytest', 'pytest-timeout', 'absl-py'],
        'demo': ['scikit-learn'],
        'bench': ['matplotlib'],
        # `make lint`: pinned, so that every machine sorts imports alike.
        'lint': ['ruff==0.17.6'],
    },
    keywords=['tensorflow', 'estimator', 'distributed', 'multi-gpu',
              'data-parallel', 'contrib', 'replicate_model_fn'],
    classifiers=[
        'Development Status :: 4 - Beta',
        'Intended Audience :: Developers',
        'Intended Audience :: Science/Research',
        'License :: OSI Approved :: Apache Software License',
        'Operating System :: POSIX :: Linux',
        'Programming Language :: Python :: 3',
        'Programming Language :: Python :: 3 :: Only',
        'Programming Language :: Python :: 3.7',
        'Programming Language :: Python :: 3.9',
        'Programming Language :: Python :: 3.10',
        'Programming Language :: Python :: 3.11',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
        'Topic :: Software Development :: Libraries :: Python Modules',
    ],
)

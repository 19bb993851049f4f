"""Packaging for `replicate`.

TensorFlow is an extra, not a hard requirement, so that users choose the build
(CPU, GPU, 1.15 or 2.15) that matches their machine:

  pip install 'replicate[tf]'      # TF 1.15 CPU (Python 3.7)
  pip install 'replicate[tf-gpu]'  # TF 1.15 GPU (Python 3.7)
  pip install 'replicate[tf2]'     # TF 2.15 + Estimator (Python 3.9-3.11)
"""
import os

from setuptools import find_packages
from setuptools import setup

_HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
  scope = {}
  with open(os.path.join(_HERE, 'replicate', 'version.py')) as f:
    exec(f.read(), scope)  # pylint: disable=exec-used
  return scope['__version__']


def _long_description():
  with open(os.path.join(_HERE, 'README.md')) as f:
    return f.read()


_TF1 = ['tensorflow==1.15.5', 'protobuf<3.21', 'numpy<1.19']
_TF1_GPU = ['tensorflow-gpu==1.15.5', 'protobuf<3.21', 'numpy<1.19']
_TF2 = ['tensorflow==2.15.1', 'tensorflow-estimator==2.15.0']

setup(
    name='replicate',
    version=_version(),
    description=('Multi-device data-parallel training for TensorFlow graph and '
                 'Estimator code: replicate_model_fn, TowerOptimizer, '
                 'cross-tower reductions and distribution strategies.'),
    long_description=_long_description(),
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    packages=find_packages(include=['replicate', 'replicate.*']),
    python_requires='>=3.7',
    install_requires=['six', 'absl-py'],
    extras_require={
        'tf': _TF1,
        'tf-gpu': _TF1_GPU,
        'tf2': _TF2,
        'test': ['pytest', 'pytest-timeout', 'ruff==0.17.6'],
        'demo': ['scikit-learn'],
        'bench': ['matplotlib'],
    },
    classifiers=[
        'License :: OSI Approved :: Apache Software License',
        'Programming Language :: Python :: 3.7',
        'Programming Language :: Python :: 3.11',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)

"""replicate: multi-device data-parallel training for TF graph / Estimator code.

The public API is exactly what is imported here; everything else is private.
"""
# pylint: disable=g-bad-import-order,g-importing-member

from replicate.version import __version__

# Errors and test helpers.
from replicate import errors
from replicate import testing

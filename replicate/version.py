"""The version of `replicate` (distribution `tf-replicate`); read by setup.py."""
__version__ = '0.2.0'

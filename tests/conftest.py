"""Test configuration shared by the whole suite."""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

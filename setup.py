# cffi_modules cannot be declared in pyproject.toml alone (see README, "Building").
from setuptools import setup

setup(cffi_modules=["csrc/_build.py:ffibuilder"])

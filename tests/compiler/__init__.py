"""Tests of the compiler layer (a package, so that basenames like test_dtypes.py may repeat tests/numpy/)."""

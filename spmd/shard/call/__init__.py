"""The call path: one plan per call signature of a program on placed values, eager dispatch, jit's front door, agreement across processes."""

"""The primitives, grouped by family; importing this package registers them all."""

from spmd.compiler.ops import elementwise, linalg, reduce, structural  # noqa: F401

"""The primitives, grouped by family; importing this package registers them all."""

from spmd.compiler.ops import elementwise, linalg, reduce, structural  # noqa: F401
from spmd.compiler.ops import slicing  # noqa: F401
from spmd.compiler.ops import cumulative  # noqa: F401
from spmd.compiler.ops import indexing  # noqa: F401
from spmd.compiler.ops import sort  # noqa: F401
from spmd.compiler.ops import conv, linalg_decomp, special  # noqa: F401
from spmd.compiler.ops import control_cond, control_scan, control_while  # noqa: F401
from spmd.compiler.ops import threefry  # noqa: F401
from spmd.compiler.ops import complex  # noqa: F401

# The five ops the transformations build (transforms/array_ops.py): given here, once.
from spmd.compiler.transforms.array_ops import OPS as _TRANSFORM_OPS  # noqa: E402

_TRANSFORM_OPS.install(transpose=structural.transpose,
                       broadcast_in_dim=structural.broadcast_in_dim,
                       zeros=structural.zeros, add=elementwise.add,
                       convert=elementwise.convert)

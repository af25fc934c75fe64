"""The primitives, grouped by family; importing this package registers them all."""

from spmd.compiler.ops import elementwise, linalg, reduce, structural  # noqa: F401
from spmd.compiler.ops import slicing  # noqa: F401
from spmd.compiler.ops import indexing  # noqa: F401
from spmd.compiler.ops import sort  # noqa: F401
from spmd.compiler.ops import conv, linalg_decomp, special  # noqa: F401
from spmd.compiler.ops import control_cond, control_scan, control_while  # noqa: F401
from spmd.compiler.ops import threefry  # noqa: F401
from spmd.compiler.ops import complex  # noqa: F401  (after elementwise: amends its rules)

"""``spmd.custom_derivatives``: user-defined derivative rules (as ``jax.custom_derivatives``).

>>> from spmd.custom_derivatives import custom_jvp, SymbolicZero
"""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.compiler.transforms.custom import (CustomVJPPrimal, SymbolicZero, custom_jvp,  # noqa: F401
                                  custom_vjp, zero_from_primal)

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()

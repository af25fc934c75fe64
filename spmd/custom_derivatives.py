"""``spmd.custom_derivatives``: user-defined derivative rules (as ``jax.custom_derivatives``).

>>> from spmd.custom_derivatives import custom_jvp, SymbolicZero
"""

from spmd.compiler.custom import (SymbolicZero, custom_jvp, custom_vjp,  # noqa: F401
                                  zero_from_primal)

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()

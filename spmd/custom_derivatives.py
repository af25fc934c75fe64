"""``spmd.custom_derivatives``: user-defined derivative rules (as ``jax.custom_derivatives``).

>>> from spmd.custom_derivatives import custom_jvp, SymbolicZero
"""

from spmd.compiler.custom import (SymbolicZero, custom_jvp, custom_vjp,  # noqa: F401
                                  zero_from_primal)

"""``spmd.custom_derivatives``: user-defined derivative rules (as ``jax.custom_derivatives``).

>>> from spmd.custom_derivatives import custom_jvp, SymbolicZero
"""

from spmd.compiler.custom import (CustomVJPPrimal, SymbolicZero, custom_jvp,  # noqa: F401
                                  custom_vjp, zero_from_primal)

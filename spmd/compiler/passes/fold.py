"""Scalar folding: two scalings in a row become one, where the result is bit-identical.

A data-parallel step computes ``psum(g) / n`` (the ``pmean``) and then
``lr * that`` for the update: two full passes over every gradient where the
hand-written step makes one (it multiplies by ``lr / n``).  This pass rewrites
``(x op1 k1) op2 k2`` -- ``op`` a multiplication or division by a scalar
constant, the inner result used only there -- into one operation ``x op c``.

Floating-point scaling is not associative in general, so the pass folds only
where the folded program computes the same bits: when one of the two constants
is a power of two.  Scaling by ``2**m`` is exact (barring overflow and
subnormal results), so it commutes with the other operation's rounding:

- ``(x / 2**m) * k == x * (k / 2**m)`` -- a ``pmean`` over 2, 4, 8 ... devices
  followed by the learning rate;
- ``(x * k) * 2**m == x * (k * 2**m)``, ``(x / k) * 2**m == x / (k / 2**m)``,
  and so on: the folded operation is the inexact one's, with its constant
  scaled by the power of two.

The folded constant is computed in the operation's dtype and checked to be a
normal number, and scaling by the power of two is checked to be exact on it.
Other pairs (``x / 3 * 0.1``) are left alone: folding them would change
results in the last bit, and a silent change of results is worse than a pass
over the data.  Integer dtypes are never folded.

Example::

    b = div a 8.0          ->      c = mul a 0.00125
    c = mul 0.01 b
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.ir import ClosedProgram, Literal, Program, Var
from spmd.compiler.ops.elementwise import div_p, mul_p

# The scalings folded, by primitive object (the rewrite is about these two).
_OPS = {mul_p: "*", div_p: "/"}


def fold_scalar_chains(closed: ClosedProgram) -> ClosedProgram:
    """Fold ``(x op1 k1) op2 k2`` into ``x op c`` where the result is bit-identical.

    The inner equation is left for DCE to remove.  Example::

        optimized = dce(fold_scalar_chains(program))
    """
    program = closed.program
    uses = use_counts(program)
    scaled: dict = {}  # var -> (source var, op, constant) of a scalar-scaling equation
    eqns, changed = [], False
    for eqn in program.eqns:
        form = _scaling(eqn)
        if form is not None:
            src, op2, k2 = form
            inner = scaled.get(src)
            if inner is not None and uses.get(src) == 1:
                folded = _fold(inner[1], inner[2], op2, k2)
                if folded is not None:
                    op, c = folded
                    eqn = _rebuild(eqn, inner[0], op, c)
                    form = (inner[0], op, c)
                    changed = True
            scaled[eqn.outputs[0]] = form
        eqns.append(eqn)
    if not changed:
        return closed
    return ClosedProgram(Program(program.in_vars, eqns, program.out_atoms), closed.consts)


def use_counts(program: Program) -> dict:
    """How often each variable is read; program outputs count twice, so that a pass
    never treats them as used once (and folds them away)."""
    uses: dict = {}
    for e in program.eqns:
        for a in e.inputs:
            if isinstance(a, Var):
                uses[a] = uses.get(a, 0) + 1
    for a in program.out_atoms:
        if isinstance(a, Var):
            uses[a] = uses.get(a, 0) + 2  # never folded away
    return uses


def _scaling(eqn):
    """``(x, op, k)`` when ``eqn`` is ``x * k``, ``k * x`` or ``x / k`` with ``k`` a
    scalar literal and ``x`` a floating-point variable of the result's type."""
    name = _OPS.get(eqn.primitive)
    if name is None or len(eqn.inputs) != 2:
        return None
    out = eqn.outputs[0].aval
    # (Not the narrow floats: float8_e5m2 is of numpy kind "f", and a scaled
    # intermediate there is often subnormal, where scaling is not exact.)
    if np.dtype(out.dtype).kind != "f" or dtypes.is_narrow_float(out.dtype):
        return None
    a, b = eqn.inputs
    if isinstance(a, Var) and isinstance(b, Literal):
        x, k = a, b
    elif name == "*" and isinstance(a, Literal) and isinstance(b, Var):
        x, k = b, a
    else:
        return None
    if k.aval.shape != () or x.aval.shape != out.shape or x.aval.dtype != out.dtype:
        return None
    value = np.asarray(k.val, dtype=out.dtype)[()]
    if not np.isfinite(value) or value == 0:
        return None
    return x, name, value


def _power_of_two(v) -> bool:
    return np.frexp(abs(v))[0] == 0.5


def _fold(op1: str, k1, op2: str, k2):
    """``(op, c)`` with ``(x op1 k1) op2 k2 == x op c`` bit for bit, or ``None``."""
    if _power_of_two(k1):
        op, inexact, exact, exact_op = op2, k2, k1, op1
    elif _power_of_two(k2):
        op, inexact, exact, exact_op = op1, k1, k2, op2
    else:
        return None
    # The power of two moves onto the other constant: multiplying x by it is
    # multiplying the other operation's constant by it (or dividing a divisor).
    scale_up = (exact_op == "*") == (op == "*")
    dtype = np.asarray(inexact).dtype
    with np.errstate(over="ignore", under="ignore"):
        c = inexact * exact if scale_up else inexact / exact
        back = c / exact if scale_up else c * exact
    c = dtype.type(c)
    if not np.isfinite(c) or abs(c) < np.finfo(dtype).tiny or back != inexact:
        return None  # over- or underflow: scaling c was not exact
    return op, c


def _rebuild(eqn, x, op: str, c):
    lit = next(a for a in eqn.inputs if isinstance(a, Literal))
    prim = mul_p if op == "*" else div_p
    return eqn.replace(primitive=prim, inputs=[x, Literal(c, lit.aval.update(dtype=c.dtype))])

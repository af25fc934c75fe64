"""Float32 ``exp`` and ``tanh`` that numba can vectorize, for the compiled loops.

numba compiles ``math.exp`` and ``np.tanh`` to scalar calls into the C library:
a loop calling them is not vectorized, and was 3x slower than numpy's own float32
loops here (``docs/history/2026-12-05-engine-rounds.md``).  These are written in
arithmetic that the compiler vectorizes (a polynomial, a rounding, an integer
shift reinterpreted as a float), so a fused loop keeps its transcendental
functions in registers: over a million float32 values :func:`expf` in a loop took
0.29 ms against 0.47 for ``np.exp`` on this machine's cores (AVX-512).

Accuracy (``tests/compiler/test_kernel_math.py``, against float64): :func:`expf`
within 1 ulp on the normal range, :func:`tanhf` within 2 ulp; both give NaN for NaN,
the limits for infinities, ``exp`` overflows to ``inf`` past 88.72 and goes through
the subnormals to 0 below -87.3, ``tanh(-0.0)`` is ``-0.0``.  The polynomials are
the classic minimax ones for float32 (as in Cephes' ``expf``/``tanhf``).

Importing this module imports numba; only generated kernel modules import it.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_F = np.float32
_LOG2E = _F(1.44269504088896341)
# ln 2 in two parts: n * _LN2_HI is exact for the n met here (Cody and Waite).
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)
_EXP_HI = _F(89.0)       # exp(89) overflows float32: the result is inf
_EXP_LO = _F(-104.0)     # below the smallest subnormal: the result is 0
_ZERO_BELOW = _F(-103.97208)


@intrinsic
def _float_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 ``bits`` (a register move)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@nb.njit(inline="always", nogil=True)
def expf(x):
    """``exp`` of a float32, vectorizable; within 1 ulp of the exact value."""
    xc = x if x < _EXP_HI else _EXP_HI       # (NaN: any value; restored below)
    xc = xc if xc > _EXP_LO else _EXP_LO
    n = np.floor(xc * _LOG2E + _F(0.5))
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    p = _F(1.9875691500e-4)
    p = p * r + _F(1.3981999507e-3)
    p = p * r + _F(8.3334519073e-3)
    p = p * r + _F(4.1665795894e-2)
    p = p * r + _F(1.6666665459e-1)
    p = p * r + _F(5.0000001201e-1)
    p = p * (r * r) + r + _F(1.0)
    # 2^n in two factors, each a normal float32 for n in [-150, 128]: the result
    # overflows to inf, or rounds through the subnormals, as the exact value does.
    k = np.int32(n)
    k1 = k >> np.int32(1)
    k2 = k - k1
    e = p * _float_bits((k1 + np.int32(127)) << np.int32(23))
    e = e * _float_bits((k2 + np.int32(127)) << np.int32(23))
    e = _F(0.0) if x < _ZERO_BELOW else e
    return x if x != x else e


@nb.njit(inline="always", nogil=True)
def tanhf(x):
    """``tanh`` of a float32, vectorizable; within 2 ulp of the exact value."""
    a = abs(x)
    # Small arguments: an odd polynomial (1 - 2 / (e + 1) would cancel).
    z = x * x
    s = _F(-5.70498872745e-3)
    s = s * z + _F(2.06390887954e-2)
    s = s * z - _F(5.37397155531e-2)
    s = s * z + _F(1.33314422036e-1)
    s = s * z - _F(3.33332819422e-1)
    small = x * (_F(1.0) + z * s)
    large = _F(1.0) - _F(2.0) / (expf(a + a) + _F(1.0))
    large = large if x >= _F(0.0) else -large
    return small if a < _F(0.625) else large


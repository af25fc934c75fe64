"""Special functions: ``erf``, ``erf_inv``, ``lgamma``, ``digamma``, ``polygamma``.

The implementations are ``scipy.special``'s ufuncs (``cupyx.scipy.special``
on the GPU), except ``erf_inv`` below float64, which evaluates XLA's polynomial
(see ``_erf_inv_impl``); derivatives are the textbook ones:

- ``erf'(x) = 2/sqrt(pi) exp(-x^2)``, ``erf_inv'(x) = sqrt(pi)/2 exp(erf_inv(x)^2)``;
- ``lgamma'(x) = digamma(x)``, ``digamma'(x) = polygamma(1, x)``,
  ``polygamma(m, .)' = polygamma(m + 1, .)`` (``m`` is a static order).
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.transforms.ad_util import Zero
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.ops import threefry_native
from spmd.compiler.ops.elementwise import _batch_elementwise, exp, mul, neg, unary
from spmd.compiler.ops.elementwise_eval import check_kind, in_float32
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, Tracer
from spmd.errors import ArgumentError


def _special(xp):
    """The ``scipy.special`` of the array module ``xp``."""
    if xp is np:
        import scipy.special

        return scipy.special
    import cupyx.scipy.special  # the GPU array module

    return cupyx.scipy.special


def _ufunc(name):
    def impl(xp, x):
        return _special(xp).__dict__[name](x).astype(x.dtype, copy=False)
    return impl


def _scaled(c):
    return lambda x: np.array(c, x.dtype)


erf_p = unary("erf", "erf",
              lambda t, x, y: mul(t, mul(_scaled(2 / np.sqrt(np.pi))(x), exp(neg(mul(x, x))))))
erf_inv_p = unary("erf_inv", "erfinv",
                  lambda t, x, y: mul(t, mul(_scaled(np.sqrt(np.pi) / 2)(y), exp(mul(y, y)))))
lgamma_p = unary("lgamma", "gammaln", lambda t, x, y: mul(t, digamma(x)))
# erfc(x) = 1 - erf(x), computed directly: accurate where erf(x) rounds to 1.
erfc_p = unary("erfc", "erfc",
               lambda t, x, y: neg(mul(t, mul(_scaled(2 / np.sqrt(np.pi))(x),
                                              exp(neg(mul(x, x)))))))
digamma_p = unary("digamma", "digamma", lambda t, x, y: mul(t, polygamma(1, x)))
for _p, _name in ((erf_p, "erf"), (erfc_p, "erfc"), (lgamma_p, "gammaln"),
                  (digamma_p, "digamma")):
    _p.def_impl(_ufunc(_name))
for _p in (erf_p, erfc_p, erf_inv_p, lgamma_p, digamma_p):
    _p.def_emit(None)  # the generated code calls the impl (it picks scipy or cupyx)


# ----------------------------------------------------------------- erf_inv
# One primitive for lax.erf_inv and spmd.random's normal samplers (normal is
# sqrt(2) * erf_inv(uniform)), evaluated as XLA evaluates it where that is accurate:
#
# - float32 (and narrower floats, computed in float32 as XLA does): the single-
#   precision polynomial of Giles (2010), "Approximating the erfinv function", in
#   w = -log1p(-x^2), which XLA's ErfInv32 evaluates.  Measured against JAX 0.10.2
#   (tests/random/jax_values.json): within 2 float32 ulps (XLA rounds log1p and the
#   polynomial's multiply-adds differently), and, like JAX's, up to 44 ulps from the
#   true value near +-1 (against mpmath).  So spmd.random gives JAX's numbers and
#   lax.erf_inv JAX's values.
# - float64: scipy's erfinv, within 2 ulps of the true value.  XLA's ErfInv64 is
#   Giles' double-precision polynomial, measured up to 5e5 ulps (relative 1.1e-10)
#   from the true value near x = 1 - 2^-27; matching it would trade accuracy for
#   agreement, so float64 keeps the accurate function (it agrees with JAX's to a
#   relative 1.1e-10).
_GILES_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                  0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
               0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _horner(coeffs, w, xp):
    f32 = np.float32
    p = xp.full_like(w, f32(coeffs[0]))
    for c in coeffs[1:]:
        p *= w
        p += f32(c)
    return p


def _erf_inv_f32(xp, x):
    """Giles' polynomial in float32 arithmetic: central for w < 5, tail beyond."""
    shape = x.shape
    # 1-d, so that in-place ops never meet numpy scalars.
    x = xp.asarray(x).astype(np.float32, copy=False).reshape(-1)
    w = x * x
    xp.negative(w, out=w)
    xp.log1p(w, out=w)
    xp.negative(w, out=w)
    tail = w >= np.float32(5.0)
    central = w - np.float32(2.5)
    p = _horner(_GILES_CENTRAL, central, xp)
    if bool(tail.any()):
        wt = xp.sqrt(w[tail]) - np.float32(3.0)
        p[tail] = _horner(_GILES_TAIL, wt, xp)
    p *= x
    ends = xp.abs(x) == np.float32(1.0)
    if bool(ends.any()):
        p[ends] = x[ends] * np.float32(np.inf)
    return p.reshape(shape)


def _erf_inv_impl(xp, x):
    if x.dtype == np.float64:
        return _special(xp).erfinv(x)
    if xp is np and x.dtype == np.float32:
        out = threefry_native.erf_inv_f32(x)  # the same polynomial in C, when built
        if out is not None:
            return out
    with np.errstate(divide="ignore", invalid="ignore"):  # |x| = 1 gives +-inf, as XLA
        return _erf_inv_f32(xp, x).astype(x.dtype, copy=False)


erf_inv_p.def_impl(in_float32(_erf_inv_impl))  # (narrow floats: the float32 polynomial)

polygamma_p = Primitive("polygamma", traits=())


@polygamma_p.def_impl
def _polygamma_impl(xp, x, *, m):
    return _special(xp).polygamma(m, x).astype(x.dtype, copy=False)


@polygamma_p.def_abstract_eval
def _polygamma_aval(x, *, m):
    check_kind("polygamma", x, ("float",))
    return ShapedArray(x.shape, x.dtype, x.weak_type)


@polygamma_p.def_jvp
def _polygamma_jvp(primals, tangents, *, m):
    (x,), (t,) = primals, tangents
    y = polygamma(m, x)
    return y, (t if isinstance(t, Zero) else mul(t, polygamma(m + 1, x)))


polygamma_p.def_batch(_batch_elementwise(polygamma_p))


def erf(x):
    """The error function, elementwise."""
    return bind(erf_p, x)


def erfc(x):
    """The complementary error function ``1 - erf(x)``, elementwise (accurate in the
    right tail, where ``1 - erf(x)`` would round to 0)."""
    return bind(erfc_p, x)


def erf_inv(x):
    """The inverse of :func:`erf` on (-1, 1) (``±inf`` at ``±1``), elementwise.

    float32 (and narrower) is XLA's evaluation, so values match JAX's (within 2
    ulps); float64 is scipy's, accurate to 2 ulps.

    >>> float(erf_inv(np.float32(0.5)))   # doctest: +SKIP
    0.4769362807273865
    """
    return bind(erf_inv_p, x)


def lgamma(x):
    """``log |Gamma(x)|``, elementwise."""
    return bind(lgamma_p, x)


def digamma(x):
    """The derivative of :func:`lgamma`, elementwise."""
    return bind(digamma_p, x)


def polygamma(m, x):
    """The ``m``-th derivative of :func:`digamma` (``m`` a static non-negative int)."""
    if isinstance(m, Tracer):
        raise ArgumentError("polygamma: the order m must be a static int, got a traced value")
    mv = np.asarray(m)
    if mv.ndim != 0 or mv.dtype.kind not in "iuf" or mv != int(mv) or int(mv) < 0:
        raise ArgumentError(f"polygamma: the order m must be a non-negative integer, got {m!r}")
    return bind(polygamma_p, x, m=int(mv))

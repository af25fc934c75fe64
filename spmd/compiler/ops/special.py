"""Special functions: ``erf``, ``erf_inv``, ``lgamma``, ``digamma``, ``polygamma``.

The implementations are ``scipy.special``'s ufuncs (``cupyx.scipy.special``
on the GPU); derivatives are the textbook ones:

- ``erf'(x) = 2/sqrt(pi) exp(-x^2)``, ``erf_inv'(x) = sqrt(pi)/2 exp(erf_inv(x)^2)``;
- ``lgamma'(x) = digamma(x)``, ``digamma'(x) = polygamma(1, x)``,
  ``polygamma(m, .)' = polygamma(m + 1, .)`` (``m`` is a static order).
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.ad_util import Zero
from spmd.compiler.avals import ShapedArray
from spmd.compiler.ops.elementwise import _batch_elementwise, _check_kind, exp, mul, neg, unary
from spmd.compiler.primitives import Primitive
from spmd.compiler.trace import bind
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
for _p, _name in ((erf_p, "erf"), (erfc_p, "erfc"), (erf_inv_p, "erfinv"),
                  (lgamma_p, "gammaln"), (digamma_p, "digamma")):
    _p.def_impl(_ufunc(_name))
    _p.def_emit(None)  # the generated code calls the impl (it picks scipy or cupyx)

polygamma_p = Primitive("polygamma")


@polygamma_p.def_impl
def _polygamma_impl(xp, x, *, m):
    return _special(xp).polygamma(m, x).astype(x.dtype, copy=False)


@polygamma_p.def_abstract_eval
def _polygamma_aval(x, *, m):
    _check_kind("polygamma", x, ("float",))
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
    """The inverse of :func:`erf` on (-1, 1) (``±inf`` at ``±1``)."""
    return bind(erf_inv_p, x)


def lgamma(x):
    """``log |Gamma(x)|``, elementwise."""
    return bind(lgamma_p, x)


def digamma(x):
    """The derivative of :func:`lgamma`, elementwise."""
    return bind(digamma_p, x)


def polygamma(m, x):
    """The ``m``-th derivative of :func:`digamma` (``m`` a static non-negative int)."""
    from spmd.compiler.trace import Tracer

    if isinstance(m, Tracer):
        raise ArgumentError("polygamma: the order m must be a static int, got a traced value")
    mv = np.asarray(m)
    if mv.ndim != 0 or mv.dtype.kind not in "iuf" or mv != int(mv) or int(mv) < 0:
        raise ArgumentError(f"polygamma: the order m must be a non-negative integer, got {m!r}")
    return bind(polygamma_p, x, m=int(mv))

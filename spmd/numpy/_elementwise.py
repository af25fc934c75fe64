"""Elementwise functions with numpy's broadcasting and JAX's type promotion."""

from __future__ import annotations

import numpy as np

from spmd.compiler import dtypes
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.trace import get_aval
from spmd.numpy._util import promote_and_broadcast, promote_dtypes, to_array


def _binary(lax_fn, name, to_float=False):
    def f(x1, x2, /):
        a, b = promote_and_broadcast(x1, x2, fname=f"spmd.numpy.{name}", to_float=to_float)
        return lax_fn(a, b)

    f.__name__ = name
    f.__doc__ = f"Elementwise ``{name}`` with broadcasting (like ``numpy.{name}``)."
    return f


def _unary(lax_fn, name, to_float=True):
    def f(x, /):
        (a,) = promote_and_broadcast(x, fname=f"spmd.numpy.{name}", to_float=to_float)
        return lax_fn(a)

    f.__name__ = name
    f.__doc__ = f"Elementwise ``{name}`` (like ``numpy.{name}``)."
    return f


add = _binary(ew.add, "add")
subtract = _binary(ew.sub, "subtract")
multiply = _binary(ew.mul, "multiply")
divide = true_divide = _binary(ew.div, "divide", to_float=True)
maximum = _binary(ew.max, "maximum")
minimum = _binary(ew.min, "minimum")
arctan2 = _binary(ew.atan2, "arctan2", to_float=True)
equal = _binary(ew.eq, "equal")
not_equal = _binary(ew.ne, "not_equal")
less = _binary(ew.lt, "less")
less_equal = _binary(ew.le, "less_equal")
greater = _binary(ew.gt, "greater")
greater_equal = _binary(ew.ge, "greater_equal")
bitwise_and = _binary(ew.bitwise_and, "bitwise_and")
bitwise_or = _binary(ew.bitwise_or, "bitwise_or")
bitwise_xor = _binary(ew.bitwise_xor, "bitwise_xor")

exp = _unary(ew.exp, "exp")
log = _unary(ew.log, "log")
log1p = _unary(ew.log1p, "log1p")
expm1 = _unary(ew.expm1, "expm1")
sqrt = _unary(ew.sqrt, "sqrt")
sin = _unary(ew.sin, "sin")
cos = _unary(ew.cos, "cos")
tan = _unary(ew.tan, "tan")
tanh = _unary(ew.tanh, "tanh")
sinh = _unary(ew.sinh, "sinh")
cosh = _unary(ew.cosh, "cosh")
arcsin = _unary(ew.asin, "arcsin")
arccos = _unary(ew.acos, "arccos")
arctan = _unary(ew.atan, "arctan")
negative = _unary(ew.neg, "negative", to_float=False)
sign = _unary(ew.sign, "sign", to_float=False)
isfinite = _unary(ew.is_finite, "isfinite")


def absolute(x, /):
    (a,) = promote_dtypes(x, fname="spmd.numpy.abs")
    if dtypes.is_bool(get_aval(a).dtype) or get_aval(a).dtype.kind == "u":
        return a
    return ew.abs(a)


abs = absolute


def _rounding(lax_fn, name):
    def f(x, /):
        (a,) = promote_dtypes(x, fname=f"spmd.numpy.{name}")
        if not dtypes.is_float(get_aval(a).dtype):
            return a  # integers are already whole
        return lax_fn(a)

    f.__name__ = name
    return f


floor = _rounding(ew.floor, "floor")
ceil = _rounding(ew.ceil, "ceil")


def round(x, decimals: int = 0):
    """Round half to even, like ``numpy.round``."""
    (a,) = promote_dtypes(x, fname="spmd.numpy.round")
    if not dtypes.is_float(get_aval(a).dtype):
        return a
    if decimals == 0:
        return ew.round(a)
    f = np.array(10.0 ** decimals, get_aval(a).dtype)[()]
    return ew.div(ew.round(ew.mul(a, f)), f)


around = round


def square(x, /):
    (a,) = promote_dtypes(x, fname="spmd.numpy.square")
    return ew.integer_pow(a, 2)


def reciprocal(x, /):
    (a,) = promote_dtypes(x, fname="spmd.numpy.reciprocal")
    return ew.div(np.array(1, get_aval(a).dtype)[()], a)


def floor_divide(x1, x2, /):
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.floor_divide")
    dt = get_aval(a).dtype
    if dtypes.is_float(dt):
        return ew.floor(ew.div(a, b))
    if dtypes.is_bool(dt):
        raise TypeError("spmd.numpy.floor_divide: bool operands are not supported")
    # lax div truncates; adjust toward -inf where the remainder has the other sign.
    q = ew.div(a, b)
    r = ew.rem(a, b)
    zero = np.array(0, dt)[()]
    fix = ew.bitwise_and(ew.ne(r, zero), ew.ne(ew.lt(r, zero), ew.lt(b, zero)))
    return ew.sub(q, ew.convert(fix, dt))


def remainder(x1, x2, /):
    """``x1 - floor(x1 / x2) * x2``: the result has the sign of ``x2`` (numpy's ``%``)."""
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.remainder")
    dt = get_aval(a).dtype
    r = ew.rem(a, b)
    zero = np.array(0, dt)[()]
    fix = ew.bitwise_and(ew.ne(r, zero), ew.ne(ew.lt(r, zero), ew.lt(b, zero)))
    return ew.select(fix, ew.add(r, b), r)


mod = remainder


def power(x1, x2, /):
    # An integer Python exponent keeps x**2 a multiply and integer powers exact.
    if isinstance(x2, int) and not isinstance(x2, bool):
        (a,) = promote_dtypes(x1, fname="spmd.numpy.power")
        if x2 >= 0 or dtypes.is_float(get_aval(a).dtype):
            return ew.integer_pow(a, x2)
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.power")
    dt = get_aval(a).dtype
    if dtypes.is_float(dt):
        return ew.pow(a, b)
    fa, fb = ew.convert(a, dtypes.float64 if dtypes.x64_enabled() else dtypes.float32), None
    fb = ew.convert(b, get_aval(fa).dtype)
    return ew.convert(ew.round(ew.pow(fa, fb)), dt)


def invert(x, /):
    (a,) = promote_dtypes(x, fname="spmd.numpy.invert")
    return ew.bitwise_not(a)


bitwise_not = invert


def logical_not(x, /):
    return ew.bitwise_not(to_array(x, np.bool_))


def logical_and(x1, x2, /):
    return bitwise_and(to_array(x1, np.bool_), to_array(x2, np.bool_))


def logical_or(x1, x2, /):
    return bitwise_or(to_array(x1, np.bool_), to_array(x2, np.bool_))


def logical_xor(x1, x2, /):
    return bitwise_xor(to_array(x1, np.bool_), to_array(x2, np.bool_))


def where(condition, x=None, y=None, /):
    """``x`` where ``condition`` else ``y`` (the one-argument form is not traceable)."""
    if x is None or y is None:
        raise TypeError("spmd.numpy.where: the one-argument form needs a data-dependent "
                        "shape; pass both x and y (use snp.nonzero outside jit)")
    c = to_array(condition, np.bool_) if get_aval(to_array(condition)).dtype != np.bool_ \
        else to_array(condition)
    a, b = promote_dtypes(x, y, fname="spmd.numpy.where")
    c, a, b = _broadcast_all(c, a, b)
    return ew.select(c, a, b)


def _broadcast_all(*arrs):
    from spmd.numpy._util import broadcast_shapes, broadcast_to_shape

    shape = broadcast_shapes(*[np.shape(a) for a in arrs], fname="spmd.numpy.where")
    return [broadcast_to_shape(a, shape) for a in arrs]


def clip(a, a_min=None, a_max=None, *, min=None, max=None):
    """Clip to ``[a_min, a_max]`` (either may be None)."""
    lo = a_min if a_min is not None else min
    hi = a_max if a_max is not None else max
    out = to_array(a)
    if lo is not None:
        out = maximum(out, lo)
    if hi is not None:
        out = minimum(out, hi)
    return out


def logaddexp(x1, x2, /):
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.logaddexp", to_float=True)
    m = ew.max(a, b)
    d = ew.neg(ew.abs(ew.sub(a, b)))
    return ew.add(m, ew.log1p(ew.exp(d)))

"""Elementwise functions with numpy's broadcasting and JAX's type promotion."""

from __future__ import annotations

import operator

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.ops import complex as cx
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops.structural import full
from spmd.compiler.core.trace import get_aval
from spmd.errors import DTypeError
from spmd.numpy._util import (broadcast_shapes, broadcast_to_shape, promote_and_broadcast,
                              promote_dtypes, static_int, to_array)
from spmd.shard.call.jit import Jit
from spmd.shard.arrays.sharded import ShardedArray

__all__ = ["add", "subtract", "multiply", "divide", "true_divide", "maximum", "minimum",
           "arctan2", "equal", "not_equal", "less", "less_equal", "greater",
           "greater_equal", "bitwise_and", "bitwise_or", "bitwise_xor", "exp", "log",
           "log1p", "expm1", "sqrt", "sin", "cos", "tan", "tanh", "sinh", "cosh",
           "arcsin", "arccos", "arctan", "negative", "sign", "isfinite", "absolute",
           "abs", "floor", "ceil", "round", "around", "square", "reciprocal",
           "floor_divide", "remainder", "mod", "power", "invert", "bitwise_not",
           "logical_not", "logical_and", "logical_or", "logical_xor", "where", "clip",
           "logaddexp"]


# An eager call with a placed (sharded) Array among its operands runs as one jitted
# call of the whole function -- promotion, broadcasting and the operation -- through
# the shard layer's call plans (spmd.shard.call.jit): one plan lookup instead of a
# partitioned call per primitive.  Under a transformation the jit equation is bound
# and inlined, as any nested jit.
_Placed = ShardedArray


def _binary(lax_fn, name, to_float=False, ordered=False):
    def body(x1, x2):
        a, b = promote_and_broadcast(x1, x2, fname=f"spmd.numpy.{name}", to_float=to_float)
        if ordered and dtypes.is_complex(get_aval(a).dtype):
            return _lexicographic(lax_fn, a, b)
        return lax_fn(a, b)

    def f(x1, x2, /):
        if x1.__class__ is _Placed or x2.__class__ is _Placed:
            return placed(x1, x2)
        return body(x1, x2)

    body.__name__ = f.__name__ = name
    placed = Jit(body, user=False)
    f.__doc__ = f"Elementwise ``{name}`` with broadcasting (like ``numpy.{name}``)."
    return f


def _unary(lax_fn, name, to_float=True):
    def body(x):
        (a,) = promote_and_broadcast(x, fname=f"spmd.numpy.{name}", to_float=to_float)
        return lax_fn(a)

    def f(x, /):
        if x.__class__ is _Placed:
            return placed(x)
        return body(x)

    body.__name__ = f.__name__ = name
    placed = Jit(body, user=False)
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
less = _binary(ew.lt, "less", ordered=True)
less_equal = _binary(ew.le, "less_equal", ordered=True)
greater = _binary(ew.gt, "greater", ordered=True)
greater_equal = _binary(ew.ge, "greater_equal", ordered=True)


def _lexicographic(lax_fn, a, b):
    """Order complex numbers by real part, then imaginary part (numpy and JAX do)."""
    ra, rb = cx.real(a), cx.real(b)
    return ew.select(ew.eq(ra, rb), lax_fn(cx.imag(a), cx.imag(b)), lax_fn(ra, rb))
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
        _no_complex(a, name)
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
    decimals = static_int(decimals, "spmd.numpy.round", "decimals")
    if dtypes.is_complex(get_aval(a).dtype):  # each part on its own, as numpy and JAX
        return cx.make_complex(round(cx.real(a), decimals), round(cx.imag(a), decimals))
    if not dtypes.is_float(get_aval(a).dtype):
        return a
    if decimals == 0:
        return ew.round(a)
    f = np.array(10.0 ** decimals, get_aval(a).dtype)[()]
    return ew.div(ew.round(ew.mul(a, f)), f)


around = round


def _no_complex(a, name):
    if dtypes.is_complex(get_aval(a).dtype):  # numpy and JAX refuse complex floor/ceil too
        raise DTypeError(f"spmd.numpy.{name}: complex input ({get_aval(a).dtype}) is not "
                         "supported (numpy and JAX refuse it too); apply it to snp.real(x) "
                         "and snp.imag(x) separately")


def square(x, /):
    (a,) = promote_dtypes(x, fname="spmd.numpy.square")
    return ew.integer_pow(a, 2)


def reciprocal(x, /):
    """``1 / x``; integers promote to float, as in JAX (numpy keeps them integer).

    >>> reciprocal(np.array([1, 2]))  # doctest: +SKIP
    Array([1. , 0.5], dtype=float32)
    """
    (a,) = promote_and_broadcast(x, fname="spmd.numpy.reciprocal", to_float=True)
    return ew.div(np.array(1, get_aval(a).dtype)[()], a)


def _float_divmod(a, b):
    """``(a // b, a % b)`` for floats, exactly as numpy's ``npy_divmod``.

    The quotient comes from the exact remainder, ``(a - fmod(a, b)) / b`` rounded
    to the nearest integer, not from ``floor(a / b)``: in float32 ``1 // 0.1`` is 9
    (``0.1`` is a little above 1/10), and ``a == (a // b) * b + a % b`` holds.
    """
    c = lambda v: np.array(v, get_aval(a).dtype)[()]  # noqa: E731
    mod = ew.rem(a, b)
    div = ew.div(ew.sub(a, mod), b)
    # Python's convention: a non-zero remainder has the sign of b.
    fix = ew.bitwise_and(ew.ne(mod, c(0)), ew.ne(ew.lt(b, c(0)), ew.lt(mod, c(0))))
    mod = ew.select(fix, ew.add(mod, b), mod)
    div = ew.select(fix, ew.sub(div, c(1)), div)
    zero = ew.sub(mod, mod)  # +0 (or NaN where mod is NaN, where it is not selected)
    mod = ew.select(ew.eq(mod, c(0)), ew.select(ew.lt(b, c(0)), ew.neg(zero), zero), mod)
    # Snap the quotient to the nearest integer; a zero one has the sign of a / b.
    fl = ew.floor(div)
    q = ew.select(ew.gt(ew.sub(div, fl), c(0.5)), ew.add(fl, c(1)), fl)
    exact = ew.div(a, b)
    q = ew.select(ew.eq(div, c(0)), ew.mul(exact, c(0)), q)
    # Division by zero: numpy returns a / b (inf or nan) and fmod's nan.
    return ew.select(ew.eq(b, c(0)), exact, q), mod


def floor_divide(x1, x2, /):
    """``x1 // x2``: rounds toward -inf; floats as numpy's divmod (``1.0 // 0.1 == 9``).

    >>> floor_divide(np.float32(1.0), np.float32(0.1))  # doctest: +SKIP
    Array(9., dtype=float32)
    """
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.floor_divide")
    dt = get_aval(a).dtype
    if dtypes.is_float(dt):
        return _float_divmod(a, b)[0]
    if dtypes.is_complex(dt):
        return _complex_floor_divide(a, b)
    if dtypes.is_bool(dt):
        raise TypeError("spmd.numpy.floor_divide: bool operands are not supported")
    # lax div truncates; adjust toward -inf where the remainder has the other sign.
    q = ew.div(a, b)
    r = ew.rem(a, b)
    zero = np.array(0, dt)[()]
    fix = ew.bitwise_and(ew.ne(r, zero), ew.ne(ew.lt(r, zero), ew.lt(b, zero)))
    return ew.sub(q, ew.convert(fix, dt))


def _complex_floor_divide(a, b):
    """JAX's complex ``//``: the floor of the real part of ``a / b``, as a complex number
    with zero imaginary part.  The quotient's real part is computed scaled by the
    larger of ``|Re b|``, ``|Im b|`` (so it neither overflows nor loses digits)."""
    ar, ai, br, bi = cx.real(a), cx.imag(a), cx.real(b), cx.imag(b)
    rdt, shape = get_aval(br).dtype, tuple(get_aval(br).shape)
    ones = full(shape, 1, rdt)
    by_re = ew.ge(ew.abs(br), ew.abs(bi))
    # The branch not taken divides by ones, not by a possible zero.
    r1 = ew.select(by_re, ones, ew.div(br, ew.select(by_re, ones, bi)))
    r2 = ew.select(by_re, ew.div(bi, ew.select(by_re, br, ones)), ones)
    q = ew.floor(ew.div(ew.add(ew.mul(ar, r1), ew.mul(ai, r2)),
                        ew.add(ew.mul(br, r1), ew.mul(bi, r2))))
    return cx.make_complex(q, full(shape, 0, rdt))


def remainder(x1, x2, /):
    """``x1 - floor(x1 / x2) * x2``: the result has the sign of ``x2`` (numpy's ``%``)."""
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.remainder")
    dt = get_aval(a).dtype
    if dtypes.is_complex(dt):
        raise DTypeError(f"spmd.numpy.remainder: complex operands ({dt}) have no remainder "
                         "(numpy and JAX refuse them); apply it to snp.real and snp.imag")
    if dtypes.is_float(dt):
        return _float_divmod(a, b)[1]
    r = ew.rem(a, b)
    zero = np.array(0, dt)[()]
    fix = ew.bitwise_and(ew.ne(r, zero), ew.ne(ew.lt(r, zero), ew.lt(b, zero)))
    return ew.select(fix, ew.add(r, b), r)


mod = remainder


def power(x1, x2, /):
    """``x1 ** x2`` elementwise; integer powers of integers are exact (wrapping on overflow).

    A static integer exponent (a Python or numpy int, as in JAX) keeps ``x ** 2`` a
    multiply; a negative static exponent of an integer base raises, as in JAX.  For
    integer arrays of exponents, a negative power is ``1 / x1 ** -x2`` truncated
    toward zero (numpy raises there; it cannot under ``jit``).

    >>> power(np.int32(3), np.int32(19))  # doctest: +SKIP
    Array(1162261467, dtype=int32)
    """
    try:
        n = operator.index(x2)  # JAX's test: concrete ints (not traced ones) are static
    except TypeError:
        pass
    else:
        (a,) = _numeric(promote_dtypes(x1, fname="spmd.numpy.power"))
        if n < 0 and not dtypes.is_inexact(get_aval(a).dtype):
            raise DTypeError(f"spmd.numpy.power: integers cannot be raised to a negative "
                             f"static power, got {get_aval(a).dtype} ** {n} (as in JAX); "
                             "convert the base to float first, e.g. x.astype(float) ** n")
        return ew.integer_pow(a, n)
    a, b = _numeric(promote_and_broadcast(x1, x2, fname="spmd.numpy.power"))
    return ew.pow(a, b)


def _numeric(arrs):
    """Bools as the default int (JAX's ``promote_dtypes_numeric``)."""
    av = get_aval(arrs[0])
    if not dtypes.is_bool(av.dtype):
        return arrs
    return [ew.convert(a, dtypes.default_int(), av.weak_type) for a in arrs]


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
                        "shape; pass both x and y, or use numpy on the concrete value outside jit: "
                        "np.nonzero(np.asarray(condition))")
    c = to_array(condition, np.bool_) if get_aval(to_array(condition)).dtype != np.bool_ \
        else to_array(condition)
    a, b = promote_dtypes(x, y, fname="spmd.numpy.where")
    c, a, b = _broadcast_all(c, a, b)
    return ew.select(c, a, b)


def _broadcast_all(*arrs):
    shape = broadcast_shapes(*[np.shape(a) for a in arrs], fname="spmd.numpy.where")
    return [broadcast_to_shape(a, shape) for a in arrs]


def clip(a, a_min=None, a_max=None, *, min=None, max=None):
    """Clip to ``[a_min, a_max]`` (either may be None)."""
    lo = a_min if a_min is not None else min
    hi = a_max if a_max is not None else max
    out = to_array(a)
    for name, v in (("a", out), ("min", lo), ("max", hi)):
        if v is not None and dtypes.is_complex(get_aval(to_array(v)).dtype):
            # JAX refuses too: complex numbers have no order to clip by.
            raise DTypeError(f"spmd.numpy.clip: {name} is complex "
                             f"({get_aval(to_array(v)).dtype}); complex values have no order "
                             "to clip by (JAX refuses them too): clip snp.real(x) or "
                             "snp.imag(x), or the magnitude snp.abs(x)")
    if lo is not None:
        out = maximum(out, lo)
    if hi is not None:
        out = minimum(out, hi)
    return out


def logaddexp(x1, x2, /):
    """``log(exp(x1) + exp(x2))`` without overflow; ``logaddexp(-inf, -inf) == -inf``.

    >>> logaddexp(np.float32(1000), np.float32(1000))  # doctest: +SKIP
    Array(1000.6931, dtype=float32)
    """
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.logaddexp", to_float=True)
    hi, lo = ew.max(a, b), ew.min(a, b)
    # d = lo - hi <= 0, taken as 0 on ties, so that equal infinities give hi + log(2)
    # = hi instead of inf - inf = NaN.  On ties d is a constant, so the gradient
    # is max's even split (1/2 each); elsewhere it is exp(x - out), as it should be.
    tie, zero = ew.eq(lo, hi), np.array(0, get_aval(lo).dtype)[()]
    d = ew.sub(ew.select(tie, zero, lo), ew.select(tie, zero, hi))
    return ew.add(hi, ew.log1p(ew.exp(d)))

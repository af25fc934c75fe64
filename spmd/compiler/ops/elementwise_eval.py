"""How the elementwise primitives evaluate, concretely and abstractly, where a rule is
more than one numpy call or one dtype: the operand checks and result types, and the
implementations and generated code of division, power, sign, logistic, select_n,
convert_element_type and integer_pow, and how the narrow floats (bfloat16, float8)
evaluate: in float32, each op's result rounded once.  They act on avals and buffers
only (no other primitive); :mod:`spmd.compiler.ops.elementwise` defines the primitives with them,
beside their derivative and batching rules.

>>> from spmd.compiler.core.avals import ShapedArray
>>> binary_aval("add", ShapedArray((2,), np.float32), ShapedArray((), np.float32))
f32[2]
>>> div_impl(np, np.array([-7]), np.array([2]))  # integers round toward zero, as lax
array([-3])
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.avals import ShapedArray
from spmd.errors import DTypeError, ShapeError


# ------------------------------------------------------------- result types

def binary_aval(name, *avals, out_dtype=None):
    shapes = [a.shape for a in avals if a.shape != ()]
    shape = shapes[0] if shapes else ()
    for s in shapes[1:]:
        if s != shape:
            raise ShapeError(f"{name}: operand shapes {shape} and {s} differ; broadcast them "
                             "first (spmd.numpy does), e.g. snp.broadcast_to")
    dts = {a.dtype for a in avals}
    if len(dts) > 1:
        raise DTypeError(f"{name}: operand dtypes {sorted(map(str, dts))} differ; convert "
                         "first with .astype (spmd.numpy promotes automatically)")
    weak = all(a.weak_type for a in avals)
    return ShapedArray(shape, out_dtype or avals[0].dtype, weak)


def check_kind(name, aval, kinds):
    ok = {"float": dtypes.is_float, "int": dtypes.is_int, "bool": dtypes.is_bool,
          "complex": dtypes.is_complex}
    if not any(ok[k](aval.dtype) for k in kinds):
        raise DTypeError(f"{name}: operand dtype {aval.dtype} is not supported "
                         f"(expects {' or '.join(kinds)}); convert with .astype")


def select_aval(pred, *cases):
    if not (dtypes.is_bool(pred.dtype) or dtypes.is_int(pred.dtype)):
        raise DTypeError(f"select_n: predicate dtype {pred.dtype} must be bool or int")
    out = binary_aval("select_n", *cases)
    if pred.shape not in ((), out.shape):
        raise ShapeError(f"select_n: predicate shape {pred.shape} must be () or {out.shape}")
    return out


def check_convert(x, new_dtype):
    if dtypes.is_complex(x.dtype) and not dtypes.is_complex(new_dtype):
        raise DTypeError(f"convert_element_type: converting {x.dtype} to {new_dtype} would "
                         "drop the imaginary part; take snp.real(x), snp.imag(x) or "
                         "snp.abs(x) first")


def convert_aval(x, *, new_dtype, weak_type):
    check_convert(x, new_dtype)
    return ShapedArray(x.shape, new_dtype, weak_type)


def ipow_aval(x, *, y):
    if y < 0 and not dtypes.is_inexact(x.dtype):
        raise DTypeError(f"integer_pow: integers cannot be raised to negative powers, got "
                         f"{x.dtype} ** {y}; convert the base to float first "
                         "(x.astype(float) ** y)")
    return x


# ------------------------------------------------ implementations and code

def in_float32(impl):
    """``impl`` for operands of the narrow floats (bfloat16, float8) computed in float32
    and its float result rounded once, as XLA's CPU evaluates one op: an impl of several
    numpy calls (logistic, rsqrt, erf_inv) would otherwise round after each call.
    Other dtypes call ``impl`` as it is.

    >>> import ml_dtypes
    >>> in_float32(lambda xp, x: 1 / xp.sqrt(x))(np, np.array([3.0], ml_dtypes.bfloat16))
    array([0.577148], dtype=bfloat16)
    """
    def run(xp, *args, **params):
        narrow = next((a.dtype for a in args
                       if dtypes.is_narrow_float(getattr(a, "dtype", np.float32))), None)
        if narrow is None:
            return impl(xp, *args, **params)
        wide = [a.astype(np.float32) if dtypes.is_narrow_float(getattr(a, "dtype", np.float32))
                else a for a in args]
        out = impl(xp, *wide, **params)
        return out.astype(narrow) if out.dtype == np.float32 else out
    run.__doc__ = impl.__doc__
    return run


def narrow_in_float32(p, default, fn_name, result_dtype):
    """The emit rule of a one-ufunc unary primitive: on a narrow float (bfloat16,
    float8), the ufunc of the operand widened to float32, its float result rounded
    back once -- the same values as ml_dtypes' own loop (which computes in float32
    too), and numpy's vectorized float32 loop instead of a scalar one (``tanh`` of
    2**20 bfloat16 values: 36 ms in ml_dtypes' loop, 3.6 ms so); a bool result
    (``is_finite``) as it comes.  ``result_dtype(operand dtype)`` is the primitive's.
    ``p.emit`` is read at each call: a primitive given another emit rule after (or
    none: its impl) keeps it."""
    def rule(names, avals, *, xp=np, out=None, **params):
        if p.emit is None or (p.rules.emit_numpy_only and xp is not np):
            return None
        dt = avals[0].dtype
        if p.emit is default and dtypes.is_narrow_float(dt):
            code = f"xp.{fn_name}({names[0]}.astype(xp.float32))"
            res = np.dtype(result_dtype(dt))
            if res == dt:
                return f"{code}.astype({names[0]}.dtype)"
            return code if res == np.dtype(bool) else None
        return p.emit(names, **params)
    return rule


def unless_narrow(emit):
    """An ``emit_avals`` rule: ``emit``'s code, or None (the impl, through
    :func:`in_float32`) when an operand is a narrow float, where ``emit``'s code is
    more than one numpy call and would round after each."""
    def rule(names, avals, *, xp=np, out=None, **params):
        if any(dtypes.is_narrow_float(a.dtype) for a in avals):
            return None
        return emit(names, **params)
    return rule


# The numpy module has no `logistic` or `rsqrt`; the impl reaches them here.
def logistic_impl(xp, x):
    if x.dtype.kind == "c":  # 1 / (1 + e^-x), holomorphic (JAX's complex logistic)
        return (1 / (1 + xp.exp(-x))).astype(x.dtype, copy=False)
    # Stable for large |x|: never exponentiates a large positive number.
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def sign_impl(xp, x):
    if x.dtype.kind != "c":
        return xp.sign(x)
    # An infinite part: x / |x| is inf / inf = nan there; numpy gives the unit along
    # that part when only one is infinite (sign(inf + 5j) = 1, sign(3 - inf j) = -1j)
    # and nan when both are.
    re_inf, im_inf = xp.isinf(x.real), xp.isinf(x.imag)
    inf = re_inf | im_inf
    finite = xp.where(inf, 0, x)  # no inf / inf (numpy would warn) where it is replaced
    mag = xp.abs(finite)
    out = xp.where(mag == 0, 0, finite / xp.where(mag == 0, 1, mag))
    unit = xp.where(re_inf, xp.sign(x.real), 0) + 1j * xp.where(im_inf, xp.sign(x.imag), 0)
    out = xp.where(re_inf ^ im_inf, unit, xp.where(inf, complex(np.nan, np.nan), out))
    return out.astype(x.dtype, copy=False)


# Integer division truncates toward zero in lax (C semantics), as XLA's does.
def div_impl(xp, x, y):
    if x.dtype.kind in "iu":
        q = xp.floor_divide(x, y)
        r = xp.fmod(x, y)
        # floor_divide rounds toward -inf; move toward zero where signs differ.
        fix = (r != 0) & ((x < 0) != (y < 0))
        return (q + fix).astype(x.dtype, copy=False)
    return xp.divide(x, y)


def div_emit(names, avals, *, xp=np, out=None):
    # Floats: the impl's ufunc, inline, so that the generated code can write it into a
    # dead buffer (an optimizer's bias corrections of every parameter); integers: the
    # impl (rounding toward zero).
    if all(np.dtype(a.dtype).kind in "fc" for a in avals):
        return f"xp.divide({names[0]}, {names[1]})"
    return None


def pow_impl(xp, x, y):
    """``x ** y``; integers exactly (wrapping on overflow, as numpy's)."""
    if x.dtype.kind != "i":
        return xp.power(x, y)
    neg = y < 0
    out = xp.power(x, xp.where(neg, 0, y))
    # A negative power is 1 / x**|y| truncated toward zero: 1 for x == 1, (-1)**y for
    # x == -1, else 0 (numpy raises here; 0**-n is 0 too, as in JAX's integer pow).
    frac = xp.where(x == 1, 1, xp.where(x == -1, 1 - 2 * (y & 1), 0))
    return xp.where(neg, frac, out).astype(x.dtype, copy=False)


def select_impl(xp, pred, *cases):
    if pred.dtype == bool:
        return xp.where(pred, cases[1], cases[0])
    if xp is not np:  # CuPy's choose takes the cases as one array
        cases = xp.stack(xp.broadcast_arrays(*cases))
    dt = np.result_type(*cases)
    if dtypes.is_narrow_float(dt):  # numpy's choose refuses ml_dtypes' types: move bits
        bits = np.dtype(f"u{dt.itemsize}")
        return xp.choose(pred, [xp.asarray(c).view(bits) for c in cases]).view(dt)
    return xp.choose(pred, cases)


def convert_impl(xp, x, *, new_dtype, weak_type):
    return x.astype(new_dtype)


# (``xp.bool_``: numpy 2 and cupy both have it; cupy may lack ``bool``.)
_XP_TYPE = {"bool": "bool_"}


_INLINE_CONVERT = ("float32", "float64", "int32", "int64", "bool", "float16", "int8",
                   "int16", "uint8", "uint16", "uint32", "uint64", "complex64", "complex128")


def convert_emit(ins, new_dtype, weak_type):
    if new_dtype.name not in _INLINE_CONVERT:
        return None
    return f"{ins[0]}.astype(xp.{_XP_TYPE.get(new_dtype.name, new_dtype.name)})"


def ipow_impl(xp, x, *, y):
    # integer_pow (x ** n for a static int n) keeps x**2 a cheap multiply.
    if y == 2:
        return x * x
    return xp.power(x, x.dtype.type(y)) if y >= 0 else (1 / xp.power(x, x.dtype.type(-y))).astype(
        x.dtype, copy=False)

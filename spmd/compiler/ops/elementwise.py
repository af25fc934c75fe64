"""Elementwise primitives: unary math, binary arithmetic, comparisons, select.

Operands of a binary primitive have equal shapes, or one of them is a scalar
(shape ``()``), which broadcasts; equal dtypes always (``spmd.numpy`` promotes
and broadcasts before binding).  The rules of each primitive, complex operands
included (``abs`` is the modulus), are here; their implementations and result types
where those are more than one numpy call are :mod:`spmd.compiler.ops.elementwise_eval`'s.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.array_module import is_device_array
from spmd.compiler.transforms.ad_util import Zero, add_tangents, instantiate, is_undefined
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.compiler.core.array import Array
from spmd.compiler.ops.elementwise_eval import (  # how they evaluate; here, their rules
    binary_aval, check_convert, check_kind, convert_aval, convert_emit, convert_impl,
    div_emit, div_impl, in_float32, ipow_aval, ipow_impl, logistic_impl, pow_impl,
    narrow_in_float32, select_aval, select_impl, sign_impl, unless_narrow)
from spmd.compiler import ops  # sibling families, read at call time (rules build each other's ops)
from spmd.compiler.transforms.batching import bdim_size, move_to_front


# --------------------------------------------------------- shape/type rules

def _sum_to_shape(ct, shape):
    """Reduce a cotangent of a broadcast scalar operand back to that operand's shape."""
    if ct is None or isinstance(ct, Zero) or getattr(ct, "shape", ()) == shape:
        return ct
    return ops.reduce.reduce_sum(ct, tuple(range(len(ct.shape))))


def _shaped(t, aval):
    """Broadcast a scalar tangent to ``aval``'s shape (for rules mixing scalars)."""
    if isinstance(t, Zero) or t.shape == aval.shape:
        return t
    return ops.structural.broadcast_in_dim(t, aval.shape, ())


# --------------------------------------------------------------- batching

def _batch_elementwise(prim, scalars_follow_first: bool = False):
    """The batching rule of an elementwise primitive.  ``scalars_follow_first``
    (select_n): the first operand's shape must equal the output's, so when it is
    batched, unbatched scalar operands get the batch axis too (a batched scalar
    predicate with scalar cases gives a (size,) predicate and () cases otherwise)."""
    def rule(args, dims, **params):
        size = bdim_size(args, dims)
        shapes = [tuple(np.shape(a)) if d is None else
                  tuple(np.shape(a))[:d] + tuple(np.shape(a))[d + 1:] for a, d in zip(args, dims)]
        out_shape = next((s for s in shapes if s), ())
        new = []
        widen = scalars_follow_first and dims[0] is not None
        for a, d, s in zip(args, dims, shapes):
            if d is None and s == () and widen and out_shape == ():
                new.append(ops.structural.broadcast_in_dim(a, (size,), ()))
            elif d is None:
                # Unbatched scalars broadcast by themselves; arrays get the batch axis.
                new.append(a if s == () else ops.structural.broadcast_in_dim(
                    a, (size,) + s, tuple(range(1, len(s) + 1))))
            else:
                a = move_to_front(a, d)
                if s == () and out_shape:
                    a = ops.structural.broadcast_in_dim(a, (size,) + out_shape, (0,))
                new.append(a)
        out = bind(prim, *new, **params)
        return (out, [0] * len(out)) if prim.multiple_results else (out, 0)

    return rule


# ------------------------------------------------------------- definitions

def unary(name, np_name, jvp=None, kinds=("float",), emit=None, out_dtype=None,
          jvp_rule=None):
    """Define an elementwise unary primitive (impl from ``xp.<np_name>``).  ``out_dtype``
    is a dtype or a function of the operand's; ``jvp(t, x, y)`` is the tangent of
    ``y = f(x)``, or ``jvp_rule`` the whole rule (where the tangent's type is not x's)."""
    p = Primitive(name, traits=())
    fn_name = np_name

    @p.def_impl
    def impl(xp, x):
        return getattr(xp, fn_name)(x)

    @p.def_abstract_eval
    def abstract_eval(x):
        check_kind(name, x, kinds)
        dtype = out_dtype(x.dtype) if callable(out_dtype) else out_dtype or x.dtype
        return ShapedArray(x.shape, dtype, x.weak_type)

    p.def_emit(emit or (lambda ins: f"xp.{fn_name}({ins[0]})"))
    if emit is None:
        p.rules.emit_avals = narrow_in_float32(p, p.emit, fn_name, lambda d: (
            out_dtype(d) if callable(out_dtype) else out_dtype or d))
    p.def_batch(_batch_elementwise(p))
    if jvp_rule is not None:
        p.def_jvp(jvp_rule)
    elif jvp is not None:
        def jvp_rule(primals, tangents):
            (x,), (t,) = primals, tangents
            y = bind(p, x)
            if isinstance(t, Zero):
                return y, Zero(t.aval)
            return y, jvp(t, x, y)

        p.def_jvp(jvp_rule)
    else:  # piecewise-constant functions (floor, sign, comparisons): zero derivative
        _zero_jvp(p)
    return p


def binary(name, np_name, kinds=("float", "int", "complex"), emit_op=None, out_dtype=None):
    # ``xp.<np_name>`` (or the operator) broadcasts its operands as numpy does.
    p = Primitive(name, traits=("implicit_broadcast",))

    @p.def_impl
    def impl(xp, x, y):
        return getattr(xp, np_name)(x, y)

    @p.def_abstract_eval
    def abstract_eval(x, y):
        check_kind(name, x, kinds)
        return binary_aval(name, x, y, out_dtype=out_dtype)

    if emit_op is not None:
        p.def_emit(lambda ins: f"({ins[0]} {emit_op} {ins[1]})")
    else:
        p.def_emit(lambda ins: f"xp.{np_name}({ins[0]}, {ins[1]})")
    p.def_batch(_batch_elementwise(p))
    return p


def _zero_jvp(p):
    def rule(primals, tangents, **params):
        y = bind(p, *primals, **params)
        return y, Zero(tangent_aval(_aval(y)))

    p.def_jvp(rule)
    return p


# Unary math.  Each jvp maps (tangent, x, y=f(x)) to the output tangent.
_FC = ("float", "complex")  # holomorphic functions: the jvp rule is the same for both
neg_p = unary("neg", "negative", lambda t, x, y: neg(t), kinds=("float", "int", "complex"),
              emit=lambda ins: f"(-{ins[0]})")
neg_p.linear = True
neg_p.unreduced = "keep"
exp_p = unary("exp", "exp", lambda t, x, y: mul(t, y), kinds=_FC)
log_p = unary("log", "log", lambda t, x, y: div(t, x), kinds=_FC)
log1p_p = unary("log1p", "log1p", lambda t, x, y: div(t, add(x, _one(x))), kinds=_FC)
expm1_p = unary("expm1", "expm1", lambda t, x, y: mul(t, add(y, _one(y))), kinds=_FC)
tanh_p = unary("tanh", "tanh", lambda t, x, y: mul(t, sub(_one(y), mul(y, y))), kinds=_FC)
logistic_p = unary("logistic", "logistic", lambda t, x, y: mul(t, mul(y, sub(_one(y), y))),
                   kinds=_FC)
sin_p = unary("sin", "sin", lambda t, x, y: mul(t, cos(x)), kinds=_FC)
cos_p = unary("cos", "cos", lambda t, x, y: neg(mul(t, sin(x))), kinds=_FC)
tan_p = unary("tan", "tan", lambda t, x, y: mul(t, add(_one(y), mul(y, y))), kinds=_FC)
sinh_p = unary("sinh", "sinh", lambda t, x, y: mul(t, cosh(x)), kinds=_FC)
cosh_p = unary("cosh", "cosh", lambda t, x, y: mul(t, sinh(x)), kinds=_FC)
# Holomorphic on complex too (numpy's principal branches, as JAX's).
arcsin_p = unary("asin", "arcsin", lambda t, x, y: mul(t, rsqrt(sub(_one(x), mul(x, x)))),
                 kinds=_FC)
arccos_p = unary("acos", "arccos", lambda t, x, y: neg(mul(t, rsqrt(sub(_one(x), mul(x, x))))),
                 kinds=_FC)
arctan_p = unary("atan", "arctan", lambda t, x, y: div(t, add(_one(x), mul(x, x))), kinds=_FC)
sqrt_p = unary("sqrt", "sqrt", lambda t, x, y: div(t, mul(_const(y, 2), y)), kinds=_FC)
rsqrt_p = unary("rsqrt", "rsqrt",
                lambda t, x, y: mul(t, mul(_const(y, -0.5), div(y, x))), kinds=_FC,
                emit=lambda ins: f"(1 / xp.sqrt({ins[0]}))")


def _abs_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = abs(x)
    if isinstance(t, Zero):
        return y, Zero(_aval(y).update(weak_type=False))
    if not dtypes.is_complex(_aval(x).dtype):
        return y, select(ge(x, _zero(x)), t, neg(t))
    # d|z| = Re(conj(z) dz) / |z|, taken as 0 at z = 0 (as JAX does).  (The complex
    # primitives are built on this module: reached through the package at call time.)
    is_zero = eq(y, _zero(y))
    safe = select(is_zero, _full_like(y, 1), y)
    return y, div(ops.complex.real(mul(ops.complex.conj(x), t)), safe)


# The modulus on complex: a real result.
abs_p = unary("abs", "abs", kinds=("float", "int", "complex"), out_dtype=dtypes.real_dtype,
              jvp_rule=_abs_jvp)
# On complex, x / |x| (0 at 0), as JAX's lax.sign and numpy 2 (numpy's values where a
# part is infinite, see sign_impl); zero derivative as in JAX.
sign_p = unary("sign", "sign", kinds=("float", "int", "complex"), emit=lambda ins: None)
floor_p = unary("floor", "floor")
ceil_p = unary("ceil", "ceil")
round_p = unary("round", "round")  # half to even, as numpy and JAX's jnp.round
is_finite_p = unary("is_finite", "isfinite", out_dtype=np.dtype(bool), kinds=_FC)
not_p = unary("not", "invert", kinds=("bool", "int"), emit=lambda ins: f"(~{ins[0]})")


# The numpy module has no `logistic` or `rsqrt`; the impl reaches them here.
# (Narrow floats: these take several numpy calls, computed in float32 and rounded once.)
logistic_p.def_impl(in_float32(logistic_impl))
logistic_p.def_emit(None)
rsqrt_p.def_impl(in_float32(lambda xp, x: 1 / xp.sqrt(x)))
rsqrt_p.rules.emit_avals = unless_narrow(rsqrt_p.emit)
sign_p.def_impl(sign_impl)

# Binary arithmetic.
add_p = binary("add", "add", emit_op="+")
add_p.linear = True
add_p.unreduced = "joint"
sub_p = binary("sub", "subtract", emit_op="-")
sub_p.linear = True
sub_p.unreduced = "joint"
mul_p = binary("mul", "multiply", emit_op="*")
div_p = binary("div", "divide")
mul_p.unreduced = "one"
div_p.unreduced = "first"
rem_p = binary("rem", "fmod", kinds=("float", "int"))
pow_p = binary("pow", "power")  # integers too: exact, unlike JAX's lax.pow
# On complex: lexicographic order on (real, imaginary), as JAX's lax.max/min and numpy.
max_p = binary("max", "maximum", kinds=("float", "int", "complex"))
min_p = binary("min", "minimum", kinds=("float", "int", "complex"))
atan2_p = binary("atan2", "arctan2", kinds=("float",))
and_p = binary("and", "bitwise_and", kinds=("bool", "int"), emit_op="&")
or_p = binary("or", "bitwise_or", kinds=("bool", "int"), emit_op="|")
xor_p = binary("xor", "bitwise_xor", kinds=("bool", "int"), emit_op="^")
_BOOL = np.dtype(bool)
eq_p = binary("eq", "equal", kinds=("float", "int", "bool", "complex"), emit_op="==",
              out_dtype=_BOOL)
ne_p = binary("ne", "not_equal", kinds=("float", "int", "bool", "complex"), emit_op="!=",
              out_dtype=_BOOL)
lt_p = binary("lt", "less", kinds=("float", "int", "bool"), emit_op="<", out_dtype=_BOOL)
le_p = binary("le", "less_equal", kinds=("float", "int", "bool"), emit_op="<=", out_dtype=_BOOL)
gt_p = binary("gt", "greater", kinds=("float", "int", "bool"), emit_op=">", out_dtype=_BOOL)
ge_p = binary("ge", "greater_equal", kinds=("float", "int", "bool"), emit_op=">=",
              out_dtype=_BOOL)
for _p in (and_p, or_p, xor_p, eq_p, ne_p, lt_p, le_p, gt_p, ge_p):
    _zero_jvp(_p)


div_p.def_impl(div_impl)  # integers round toward zero (C semantics), as XLA's
div_p.rules.emit_avals = div_emit
pow_p.def_impl(pow_impl)
pow_p.def_emit(lambda ins: None)


# --------------------------------------------------------------- binders

def _b(p):
    def f(*args):
        return bind(p, *args)

    f.__name__ = p.name
    f.__doc__ = f"Elementwise ``{p.name}`` (lax level: no promotion or broadcasting)."
    return f


neg, exp, log, log1p, expm1, tanh, logistic = map(
    _b, (neg_p, exp_p, log_p, log1p_p, expm1_p, tanh_p, logistic_p))
sin, cos, tan, sinh, cosh, asin, acos, atan = map(
    _b, (sin_p, cos_p, tan_p, sinh_p, cosh_p, arcsin_p, arccos_p, arctan_p))
sqrt, rsqrt, abs, sign, floor, ceil, round, is_finite, bitwise_not = map(
    _b, (sqrt_p, rsqrt_p, abs_p, sign_p, floor_p, ceil_p, round_p, is_finite_p, not_p))
add, sub, mul, div, rem, pow, max, min, atan2 = map(
    _b, (add_p, sub_p, mul_p, div_p, rem_p, pow_p, max_p, min_p, atan2_p))
bitwise_and, bitwise_or, bitwise_xor = map(_b, (and_p, or_p, xor_p))
eq, ne, lt, le, gt, ge = map(_b, (eq_p, ne_p, lt_p, le_p, gt_p, ge_p))


def _const(like, value):
    """A scalar of ``like``'s dtype (a literal in traced programs)."""
    return np.array(value, dtype=like.dtype)[()]


def _one(like):
    return _const(like, 1)


def _zero(like):
    return _const(like, 0)


# ------------------------------------------------------- linear rules: add

def _add_jvp(primals, tangents):
    x, y = primals
    tx, ty = tangents
    out = add(x, y)
    if isinstance(tx, Zero) and isinstance(ty, Zero):
        return out, Zero(tx.aval.update(shape=np.shape(out)))
    return out, add_tangents(_shaped(tx, _aval(out)), _shaped(ty, _aval(out)))


_aval = get_aval


def _add_transpose(ct, x, y):
    if isinstance(ct, Zero):
        return [None if not is_undefined(x) else Zero(x.aval),
                None if not is_undefined(y) else Zero(y.aval)]
    return [_sum_to_shape(ct, x.aval.shape) if is_undefined(x) else None,
            _sum_to_shape(ct, y.aval.shape) if is_undefined(y) else None]


add_p.def_jvp(_add_jvp)
add_p.def_transpose(_add_transpose)


def _sub_jvp(primals, tangents):
    x, y = primals
    tx, ty = tangents
    out = sub(x, y)
    if isinstance(ty, Zero):
        return out, _shaped(tx, _aval(out)) if not isinstance(tx, Zero) else \
            Zero(tx.aval.update(shape=np.shape(out)))
    nty = _shaped(neg(ty), _aval(out))
    return out, nty if isinstance(tx, Zero) else add(_shaped(tx, _aval(out)), nty)


def _sub_transpose(ct, x, y):
    if isinstance(ct, Zero):
        return [Zero(x.aval) if is_undefined(x) else None,
                Zero(y.aval) if is_undefined(y) else None]
    return [_sum_to_shape(ct, x.aval.shape) if is_undefined(x) else None,
            _sum_to_shape(neg(ct), y.aval.shape) if is_undefined(y) else None]


sub_p.def_jvp(_sub_jvp)
sub_p.def_transpose(_sub_transpose)
neg_p.def_transpose(lambda ct, x: [Zero(x.aval) if isinstance(ct, Zero) else neg(ct)])


def _mul_jvp(primals, tangents):
    x, y = primals
    tx, ty = tangents
    out = mul(x, y)
    terms = Zero(tangent_aval(_aval(out)))
    if not isinstance(tx, Zero):
        terms = add_tangents(terms, _shaped(mul(tx, y), _aval(out)))
    if not isinstance(ty, Zero):
        terms = add_tangents(terms, _shaped(mul(x, ty), _aval(out)))
    return out, terms


def _mul_transpose(ct, x, y):
    # Linear in whichever operand is undefined (never both: mul is bilinear).
    assert not (is_undefined(x) and is_undefined(y))
    if isinstance(ct, Zero):
        return [Zero(x.aval) if is_undefined(x) else None,
                Zero(y.aval) if is_undefined(y) else None]
    if is_undefined(x):
        return [_sum_to_shape(mul(ct, y), x.aval.shape), None]
    return [None, _sum_to_shape(mul(x, ct), y.aval.shape)]


mul_p.def_jvp(_mul_jvp)
mul_p.def_transpose(_mul_transpose)


def _div_jvp(primals, tangents):
    x, y = primals
    tx, ty = tangents
    out = div(x, y)
    t = Zero(tangent_aval(_aval(out)))
    if not isinstance(tx, Zero):
        t = add_tangents(t, _shaped(div(tx, y), _aval(out)))
    if not isinstance(ty, Zero):
        t = add_tangents(t, _shaped(neg(mul(ty, div(out, y))), _aval(out)))
    return out, t


def _div_transpose(ct, x, y):
    assert is_undefined(x) and not is_undefined(y)
    if isinstance(ct, Zero):
        return [Zero(x.aval), None]
    return [_sum_to_shape(div(ct, y), x.aval.shape), None]


div_p.def_jvp(_div_jvp)
div_p.def_transpose(_div_transpose)


def _binary_jvp(p, dx, dy):
    """jvp for f(x, y) from partials ``dx(x, y, out)`` and ``dy(x, y, out)``."""
    def rule(primals, tangents):
        x, y = primals
        tx, ty = tangents
        out = bind(p, x, y)
        t = Zero(tangent_aval(_aval(out)))
        if not isinstance(tx, Zero):
            t = add_tangents(t, _shaped(mul(tx, dx(x, y, out)), _aval(out)))
        if not isinstance(ty, Zero):
            t = add_tangents(t, _shaped(mul(ty, dy(x, y, out)), _aval(out)))
        return out, t

    p.def_jvp(rule)


def _pow_dy(x, y, out):
    # d/dy x**y = log(x) * x**y, taken as 0 where x == 0 (as JAX does).
    safe = select(eq(x, _zero(x)), _one(x) if np.ndim(x) == 0 else
                  _full_like(x, 1), x)
    return select(eq(x, _zero(x)), _zero_like_out(out), mul(log(safe), out))


def _full_like(x, v):
    return ops.structural.full(np.shape(x), v, _aval(x).dtype)


def _zero_like_out(out):
    return _full_like(out, 0)


_binary_jvp(pow_p, lambda x, y, out: mul(y, pow(x, sub(y, _one(y)))), _pow_dy)
_binary_jvp(max_p, lambda x, y, out: _pick(_ordered(gt, x, y), eq(x, y), x),
            lambda x, y, out: _pick(_ordered(lt, x, y), eq(x, y), x))
_binary_jvp(min_p, lambda x, y, out: _pick(_ordered(lt, x, y), eq(x, y), x),
            lambda x, y, out: _pick(_ordered(gt, x, y), eq(x, y), x))


def _ordered(cmp, x, y):
    """``cmp(x, y)``; on complex, lexicographically on (real, imaginary) parts."""
    if not dtypes.is_complex(_aval(x).dtype):
        return cmp(x, y)

    rx, ry = ops.complex.real(x), ops.complex.real(y)
    return select(eq(rx, ry), cmp(ops.complex.imag(x), ops.complex.imag(y)), cmp(rx, ry))


_binary_jvp(atan2_p, lambda x, y, out: div(y, add(mul(x, x), mul(y, y))),
            lambda x, y, out: neg(div(x, add(mul(x, x), mul(y, y)))))
_binary_jvp(rem_p, lambda x, y, out: _full_like(out, 1),
            lambda x, y, out: neg(_trunc(div(x, y))))


def _trunc(x):
    return mul(sign(x), floor(abs(x)))


def _pick(strict, tie, like):
    """1 where ``strict``, 0.5 on ties (JAX's convention for max/min), else 0."""
    one = convert(strict, _aval(like).dtype)
    half = mul(convert(tie, _aval(like).dtype), _const(like, 0.5))
    return add(one, half)


# -------------------------------------------------------------- select_n

select_n_p = Primitive("select_n", traits=("implicit_broadcast", "fresh_result"))  # where, choose
select_n_p.def_impl(select_impl)
select_n_p.def_abstract_eval(select_aval)
select_n_p.def_emit(lambda ins: None)


def select_n(pred, *cases):
    """``cases[pred]`` elementwise (``pred`` bool picks between two cases)."""
    return bind(select_n_p, pred, *cases)


def select(pred, on_true, on_false):
    return bind(select_n_p, pred, on_false, on_true)


def _select_jvp(primals, tangents):
    pred, *cases = primals
    out = bind(select_n_p, pred, *cases)
    ts = tangents[1:]
    if all(isinstance(t, Zero) for t in ts):
        return out, Zero(ts[0].aval.update(shape=np.shape(out)))
    ts = [_shaped(instantiate(t), _aval(out).update(weak_type=False)) for t in ts]
    return out, bind(select_n_p, pred, *ts)


def _select_transpose(ct, pred, *cases):
    assert not is_undefined(pred)
    if isinstance(ct, Zero):
        return [None] + [Zero(c.aval) if is_undefined(c) else None for c in cases]
    zeros = _full_like(ct, 0)
    outs = [None]
    for i, c in enumerate(cases):
        if not is_undefined(c):
            outs.append(None)
            continue
        picked = [zeros] * len(cases)
        picked[i] = ct
        outs.append(_sum_to_shape(bind(select_n_p, pred, *picked), c.aval.shape))
    return outs


select_n_p.def_jvp(_select_jvp)
select_n_p.def_transpose(_select_transpose)
select_n_p.linear = False  # linear in the cases only; its transpose handles that
select_n_p.def_batch(_batch_elementwise(select_n_p, scalars_follow_first=True))


# -------------------------------------------------- convert_element_type

convert_p = Primitive("convert_element_type", traits=())
convert_p.def_impl(convert_impl)
convert_p.def_emit(convert_emit)
convert_p.def_abstract_eval(convert_aval)


def convert(x, dtype, weak_type: bool = False):
    """Convert ``x`` to ``dtype`` (no-op when it already has it)."""
    dtype = dtypes.check_dtype(dtype, "convert_element_type")
    av = _aval(x)
    check_convert(av, dtype)
    if av.dtype == dtype and av.weak_type == weak_type:
        return x
    # A known value converts now, not as a program equation.  (Only the compiler's own
    # Arrays: an upper layer's -- a sharded Array, perhaps spread over processes --
    # evaluates the equation itself, keeping its placement.)
    if type(x) is Array:
        v = x.value  # numpy, or cupy on GPUs (converted where it lives)
        v = v.astype(dtype) if is_device_array(v) else np.asarray(v, dtype=dtype)
        return Array(v, ShapedArray(av.shape, dtype, weak_type))
    return bind(convert_p, x, new_dtype=dtype, weak_type=bool(weak_type))


def _convert_jvp(primals, tangents, *, new_dtype, weak_type):
    (x,), (t,) = primals, tangents
    out = bind(convert_p, x, new_dtype=new_dtype, weak_type=weak_type)
    zero = Zero(tangent_aval(_aval(out)))
    if isinstance(t, Zero) or not dtypes.is_inexact(new_dtype) \
            or not dtypes.is_inexact(_aval(t).dtype):
        return out, zero
    return out, bind(convert_p, t, new_dtype=new_dtype, weak_type=False)


def _convert_transpose(ct, x, *, new_dtype, weak_type):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    if dtypes.is_complex(_aval(ct).dtype) and not dtypes.is_complex(x.aval.dtype):
        ct = ops.complex.real(ct)  # real -> complex embeds; its transpose keeps the real part
    return [bind(convert_p, ct, new_dtype=x.aval.dtype, weak_type=False)]


convert_p.def_jvp(_convert_jvp)
convert_p.def_transpose(_convert_transpose)
convert_p.linear = True
convert_p.unreduced = "float"


def _convert_batch(args, dims, **params):
    return bind(convert_p, args[0], **params), dims[0]


convert_p.def_batch(_convert_batch)

# `integer_pow` (x ** n for a static int n) keeps x**2 a cheap multiply.
integer_pow_p = Primitive("integer_pow", traits=())
integer_pow_p.def_impl(in_float32(ipow_impl))
integer_pow_p.def_abstract_eval(ipow_aval)
integer_pow_p.def_emit(lambda ins, y: f"({ins[0]} * {ins[0]})" if y == 2 else None)


def integer_pow(x, y: int):
    return bind(integer_pow_p, x, y=int(y))


def _ipow_jvp(primals, tangents, *, y):
    (x,), (t,) = primals, tangents
    out = integer_pow(x, y)
    if isinstance(t, Zero):
        return out, t
    if y == 0:
        return out, Zero(t.aval)
    d = mul(_const(x, y), x if y == 2 else (integer_pow(x, y - 1) if y != 1 else _one(x)))
    return out, mul(t, d)


integer_pow_p.def_jvp(_ipow_jvp)
integer_pow_p.def_batch(lambda args, dims, y: (integer_pow(args[0], y), dims[0]))


# Kernel ops (spmd.compiler.engine.fusion): the numpy function that computes each primitive
# on floats, by which a fused kernel calls it with ``out=`` (the same bits as its
# impl); integer_pow and select_n are called as their impls are.
for _p, _op in ((add_p, "add"), (sub_p, "subtract"), (mul_p, "multiply"), (div_p, "divide"),
                (neg_p, "negative"), (pow_p, "power"), (exp_p, "exp"), (log_p, "log"),
                (log1p_p, "log1p"), (expm1_p, "expm1"), (tanh_p, "tanh"), (sqrt_p, "sqrt"),
                (rsqrt_p, "rsqrt"), (sin_p, "sin"), (cos_p, "cos"), (abs_p, "absolute"),
                (select_n_p, "where"), (lt_p, "less"), (le_p, "less_equal"),
                (gt_p, "greater"), (ge_p, "greater_equal"), (eq_p, "equal"),
                (ne_p, "not_equal"), (integer_pow_p, "integer_pow")):
    _p.rules.kernel_op = _op

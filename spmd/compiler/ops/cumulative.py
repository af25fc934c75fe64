"""The reductions differentiated through slices of their operand: the cumulative
ones (``cumsum``, ``cumprod``, ``cummax``, ``cummin``) through :func:`associative_scan`'s
parallel prefix scan, and ``reduce_prod`` through a pairwise product tree (the same
halving, folded to one value).  They sit above :mod:`spmd.compiler.ops.slicing`,
which the plain reductions (:mod:`spmd.compiler.ops.reduce`) do not need.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops import slicing, structural
from spmd.compiler.ops.reduce import (_batch_reduce, _check_dtype, _norm_axes, _reduced_aval,
                                      _scalar, _zero_tangent)
from spmd.compiler.transforms.ad_util import Zero
from spmd.errors import ArgumentError


# -------------------------------------------------------------- reduce_prod

reduce_prod_p = _batch_reduce(Primitive("reduce_prod", traits=()))
reduce_prod_p.def_impl(lambda xp, x, *, axes: xp.prod(x, axis=axes, dtype=x.dtype))
reduce_prod_p.def_emit(lambda ins, axes: f"xp.prod({ins[0]}, axis={axes!r}, dtype={ins[0]}.dtype)")


@reduce_prod_p.def_abstract_eval
def _prod_aval(x, *, axes):
    _check_dtype("reduce_prod", x, ("float", "int", "complex"))  # the jvp is holomorphic
    return _reduced_aval("reduce_prod", x, axes)


def reduce_prod(x, axes):
    """The product of ``x`` over ``axes`` (lax level: no dtype promotion)."""
    axes = _norm_axes(axes)
    return bind(reduce_prod_p, x, axes=axes) if axes else x


@reduce_prod_p.def_jvp
def _prod_jvp(primals, tangents, *, axes):
    (x,), (t,) = primals, tangents
    out = reduce_prod(x, axes)
    if isinstance(t, Zero):
        return out, _zero_tangent(out)
    return out, _prod_tree_tangent(x, t, axes)


def _prod_tree_tangent(x, t, axes):
    """The tangent of ``prod(x, axes)`` by a pairwise product tree (as JAX).

    Each level multiplies the two halves with the product rule, so zeros in
    ``x`` get exact derivatives of every order (no division by ``x``).
    """
    shape = np.shape(x)
    kept = tuple(i for i in range(len(shape)) if i not in axes)
    kept_shape = tuple(shape[i] for i in kept)
    n = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    tdt = get_aval(t).dtype
    if n == 0:
        return structural.zeros(kept_shape, tdt)
    x = structural.reshape(structural.transpose(x, tuple(axes) + kept), (n,) + kept_shape)
    t = structural.reshape(structural.transpose(t, tuple(axes) + kept), (n,) + kept_shape)
    rest = ((0, 0, 0),) * len(kept)
    while n > 1:
        n1 = (n + 1) // 2
        a, b = slicing.slice_in_dim(x, 0, n1), slicing.slice_in_dim(x, n1, n)
        ta, tb = slicing.slice_in_dim(t, 0, n1), slicing.slice_in_dim(t, n1, n)
        if n - n1 != n1:  # odd length: the second half gets a neutral 1 (tangent 0)
            b = slicing.pad(b, _scalar(1, get_aval(x).dtype), ((0, 1, 0),) + rest)
            tb = slicing.pad(tb, _scalar(0, tdt), ((0, 1, 0),) + rest)
        x, t = ew.mul(a, b), ew.add(ew.mul(ta, b), ew.mul(a, tb))
        n = n1
    return structural.reshape(t, kept_shape)


# ------------------------------------------------ cumulative reductions
#
# cumsum / cumprod / cummax / cummin(x, axis, reverse): the running reduction
# along one axis (from the end when ``reverse``).  cumsum is linear (its
# transpose is the cumsum the other way); the others differentiate through a
# parallel prefix scan of (value, tangent) pairs, as JAX's rules do.

def _cumulative(name, np_expr, kinds, emit_expr):
    p = Primitive(name, traits=())

    @p.def_impl
    def impl(xp, x, *, axis, reverse):
        if reverse:
            x = xp.flip(x, axis)
        if dtypes.is_narrow_float(x.dtype):  # each prefix in float32, rounded once
            out = np_expr(xp, x.astype(np.float32), axis).astype(x.dtype)
        else:
            out = np_expr(xp, x, axis)
        return xp.flip(out, axis) if reverse else out

    # The common forward case is one inline numpy call (the impl's for narrow floats).
    def emit(names, avals, *, axis, reverse, xp=np, out=None):
        narrow = dtypes.is_narrow_float(avals[0].dtype)
        if reverse or narrow or (p.rules.emit_numpy_only and xp is not np):
            return None
        return emit_expr(names[0], axis)

    p.rules.emit_avals = emit

    @p.def_abstract_eval
    def aval(x, *, axis, reverse):
        _check_dtype(name, x, kinds)
        if not 0 <= axis < x.ndim:
            raise ArgumentError(f"{name}: axis {axis} is out of range for an operand of shape "
                                f"{x.shape}")
        return ShapedArray(x.shape, x.dtype, x.weak_type)

    @p.def_batch
    def batch(args, dims, *, axis, reverse):
        (x,), (d,) = args, dims
        # The batch axis stays where it is; the scanned axis moves past it.
        return bind(p, x, axis=axis + (d <= axis), reverse=reverse), d

    return p


cumsum_p = _cumulative("cumsum", lambda xp, x, a: xp.cumsum(x, axis=a, dtype=x.dtype),
                       ("float", "int", "complex"), lambda x, a: f"xp.cumsum({x}, axis={a}, dtype={x}.dtype)")
cumprod_p = _cumulative("cumprod", lambda xp, x, a: xp.cumprod(x, axis=a, dtype=x.dtype),
                        ("float", "int", "complex"),
                        lambda x, a: f"xp.cumprod({x}, axis={a}, dtype={x}.dtype)")


def _running(xp, x, axis, fn):
    """``fn.accumulate(x, axis)`` by doubling (Hillis-Steele), for array modules whose
    ufuncs lack ``accumulate`` (CuPy has it for add and multiply only): log2(n) rounds of
    ``out[i] = fn(out[i], out[i - k])``.  NaNs propagate as in numpy's accumulate."""
    n = x.shape[axis]
    out, k = x, 1
    while k < n:
        head, hi, lo = ([slice(None)] * x.ndim for _ in range(3))
        head[axis], hi[axis], lo[axis] = slice(None, k), slice(k, None), slice(None, n - k)
        out = xp.concatenate([out[tuple(head)], fn(out[tuple(hi)], out[tuple(lo)])], axis=axis)
        k *= 2
    return out


cummax_p = _cumulative("cummax", lambda xp, x, a: xp.maximum.accumulate(x, axis=a)
                       if xp is np else _running(xp, x, a, xp.maximum),
                       ("float", "int", "bool"),
                       lambda x, a: f"xp.maximum.accumulate({x}, axis={a})")
cummin_p = _cumulative("cummin", lambda xp, x, a: xp.minimum.accumulate(x, axis=a)
                       if xp is np else _running(xp, x, a, xp.minimum),
                       ("float", "int", "bool"),
                       lambda x, a: f"xp.minimum.accumulate({x}, axis={a})")
# Their inline code is numpy's; other array modules call the impl (spmd.compiler.engine.codegen).
cummax_p.rules.emit_numpy_only = cummin_p.rules.emit_numpy_only = True


def _cum_binder(p):
    def f(operand, axis: int = 0, reverse: bool = False):
        nd = len(np.shape(operand))
        a = int(axis)
        if nd and -nd <= a < nd:
            a %= nd
        return bind(p, operand, axis=a, reverse=bool(reverse))

    f.__name__ = p.name
    f.__doc__ = (f"``{p.name}`` of ``operand`` along ``axis`` (from the end when ``reverse``), "
                 f"as ``lax.{p.name}``.\n\n    >>> {p.name}(np.arange(1, 4), 0)  # doctest: +SKIP")
    return f


cumsum = _cum_binder(cumsum_p)
cumprod = _cum_binder(cumprod_p)
cummax = _cum_binder(cummax_p)
cummin = _cum_binder(cummin_p)

cumsum_p.linear = True


@cumsum_p.def_jvp
def _cumsum_jvp(primals, tangents, *, axis, reverse):
    out = bind(cumsum_p, primals[0], axis=axis, reverse=reverse)
    t = tangents[0]
    if isinstance(t, Zero):
        return out, _zero_tangent(out)
    return out, bind(cumsum_p, t, axis=axis, reverse=reverse)


@cumsum_p.def_transpose
def _cumsum_transpose(ct, x, *, axis, reverse):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    # Each input feeds every later output: the cotangent sums the other way.
    return [bind(cumsum_p, ct, axis=axis, reverse=not reverse)]


def _scan_jvp(p, combine_prim):
    """jvp of a cumulative op: a prefix scan of (value, tangent) pairs combined
    with ``combine_prim``'s own jvp rule (so ties and zeros follow its rules)."""
    def rule(primals, tangents, *, axis, reverse):
        (x,), (t,) = primals, tangents
        out = bind(p, x, axis=axis, reverse=reverse)
        if isinstance(t, Zero):
            return out, _zero_tangent(out)

        def combine(a, b):
            return list(combine_prim.jvp((a[0], b[0]), (a[1], b[1])))

        if reverse:
            x, t = slicing.rev(x, (axis,)), slicing.rev(t, (axis,))
        _, tout = associative_scan(combine, [x, t], axis)
        return out, slicing.rev(tout, (axis,)) if reverse else tout

    p.def_jvp(rule)


_scan_jvp(cumprod_p, ew.mul_p)
_scan_jvp(cummax_p, ew.max_p)
_scan_jvp(cummin_p, ew.min_p)


def associative_scan(combine, elems, axis: int):
    """Inclusive prefix scan of the arrays ``elems`` along ``axis`` (Blelloch-style).

    ``combine(a, b)`` maps two lists of arrays (earlier, later) to one list; it
    must be associative.  O(n) work in O(log n) levels of slices (JAX's
    ``lax.associative_scan``).

    >>> associative_scan(lambda a, b: [add(a[0], b[0])], [x], 0)  # doctest: +SKIP
    """
    n = np.shape(elems[0])[axis]
    if n < 2:
        return list(elems)

    def sl(e, start, limit, stride=1):
        return slicing.slice_in_dim(e, start, limit, stride, axis)

    # Combine adjacent pairs, scan those recursively: that gives the odd positions.
    odd = associative_scan(combine, combine([sl(e, 0, n - 1, 2) for e in elems],
                                            [sl(e, 1, n, 2) for e in elems]), axis)
    # Even positions (after the first) add one more element to an odd result.
    head = odd if n % 2 else [sl(o, 0, np.shape(o)[axis] - 1) for o in odd]
    even = combine(head, [sl(e, 2, n, 2) for e in elems])
    even = [slicing.concatenate([sl(e, 0, 1), r], axis) for e, r in zip(elems, even)]
    return [_interleave(a, b, axis) for a, b in zip(even, odd)]


def _interleave(a, b, axis):
    """``a[0], b[0], a[1], b[1], ...`` along ``axis`` (``a`` may be one longer)."""
    na, nb = np.shape(a)[axis], np.shape(b)[axis]
    nd = len(np.shape(a))
    cfg_a = [(0, 0, 0)] * nd
    cfg_b = [(0, 0, 0)] * nd
    cfg_a[axis] = (0, 1 if na == nb else 0, 1)
    cfg_b[axis] = (1, 0 if na == nb else 1, 1)
    dt = get_aval(a).dtype
    # Adding a zero is exact, so interleaving by padding and adding loses nothing.
    op = ew.bitwise_or if dtypes.is_bool(dt) else ew.add
    pad = slicing.pad
    return op(pad(a, _scalar(0, dt), tuple(cfg_a)), pad(b, _scalar(0, dt), tuple(cfg_b)))

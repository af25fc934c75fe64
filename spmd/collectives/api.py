"""The collectives as users call them (exported from ``spmd.lax``).

Each accepts a pytree of arrays and an axis name or a tuple of names; inside a
``shard_map`` traced with ``check_vma`` it follows the varying-axes types:
``psum`` of a value that does not vary along an axis multiplies by the axis
size with no communication, and a collective that needs a varying operand
gets an explicit ``pvary`` first.
"""

from __future__ import annotations

import numpy as np

from spmd import tree_util
from spmd.collectives.primitives import (_axes, _size, _tracking, all_gather_p, all_to_all_p,
                                         as_summands, as_varying,  # noqa: F401 (SUMMANDS)
                                         axis_index_p, pcast_p, pmax_p, pmin_p, ppermute_p,
                                         psum_p, psum_scatter_p, pvary_p)
from spmd.compiler.core import dtypes
from spmd.compiler.core.array_module import to_host
from spmd.compiler.ops.elementwise import bitwise_or, convert, div, eq, mul, ne, select
from spmd.compiler.ops.structural import broadcast_in_dim, full, reshape
from spmd.compiler.core.trace import Tracer, bind, get_aval
from spmd.errors import ArgumentError, ShapeError
from spmd.compiler.ops import complex as cx


def _leafwise(f, x):
    return tree_util.tree_map(f, x)


def _varying_split(x, axes):
    """(axes along which x varies, the rest) — all axes count as varying when untyped."""
    if not _tracking(axes):
        return axes, ()
    vma = get_aval(x).vma
    return tuple(a for a in axes if a in vma), tuple(a for a in axes if a not in vma)


def _ensure_varying(x, axes):
    return as_varying(x, axes) if _tracking(axes) else x


def _groups(axis_index_groups, axes, fname):
    """Validated ``axis_index_groups`` over ``axes`` (None when not given)."""
    if axis_index_groups is None:
        return None
    # (spmd.collectives.groups here and below: it imports this module's collectives.)
    from spmd.collectives.groups import Groups

    return Groups(axis_index_groups, _size(axes), fname)


def psum(x, axis_name, *, axis_index_groups=None):
    """Sum over the devices along ``axis_name`` (all-reduce); the result is invariant there.
    With ``axis_index_groups`` (lists of indices along the axis), each group sums apart.

    >>> lax.psum(x_block, "i")  # inside shard_map
    """
    axes = _axes(axis_name, "psum")
    groups = _groups(axis_index_groups, axes, "psum")

    def leaf(v):
        if get_aval(v).dtype == np.bool_:  # as in JAX: a count of the True values
            v = convert(v, dtypes.int32)
        if not isinstance(v, Tracer):
            # A constant is the same on every device: the sum is known now
            # (so ``psum(1, 'i')`` is the axis size as a concrete value, as in JAX).
            dt = get_aval(v).dtype
            value = np.asarray(to_host(v.value if hasattr(v, "value") else v), dtype=dt)
            return (value * dt.type(groups.size if groups else _size(axes)))[()]
        if groups is not None:
            return _grouped_sum(v, axes, groups)
        # A value reduced along an axis is summed as a varying one, so that its
        # cotangent leaves as the devices' summands (pvary of a reduced value).
        reduced = tuple(a for a in axes if a in get_aval(v).reduced)
        if reduced and _tracking(reduced):
            v = bind(pvary_p, v, axes=reduced)
        varying, invariant = _varying_split(v, axes)
        if invariant:  # the same on every device: no communication
            v = mul(v, np.array(_size(invariant), get_aval(v).dtype)[()])
        return bind(psum_p, v, axes=varying) if varying else v

    return _leafwise(leaf, x)


def _grouped_sum(v, axes, groups):
    from spmd.collectives.groups import grouped_psum

    varying, _ = _varying_split(v, axes)
    if len(varying) < len(axes):  # the same on every device: each group sums k copies
        v = mul(v, np.array(groups.size, get_aval(v).dtype)[()])
        return pvary(v, axes) if _tracking(axes) else v
    return grouped_psum(v, axes, groups)


def pmean(x, axis_name, *, axis_index_groups=None):
    """The mean over the devices along ``axis_name`` (of each group, with
    ``axis_index_groups``)."""
    axes = _axes(axis_name, "pmean")
    groups = _groups(axis_index_groups, axes, "pmean")
    n = groups.size if groups else _size(axes)
    return _leafwise(lambda v: div(v, np.array(n, get_aval(v).dtype)[()]),
                     psum(x, axes, axis_index_groups=axis_index_groups))


def _pextremum(p, name):
    def f(x, axis_name, *, axis_index_groups=None):
        axes = _axes(axis_name, name)
        groups = _groups(axis_index_groups, axes, name)

        def leaf(v):
            if dtypes.is_complex(get_aval(v).dtype):
                return _complex_extremum(v, lambda r: f(r, axes, axis_index_groups=
                                                        axis_index_groups), name, axes)
            if groups is not None:
                from spmd.collectives.groups import grouped_extremum

                varying, _ = _varying_split(v, axes)
                if len(varying) < len(axes):  # the same value throughout each group
                    return v
                return grouped_extremum(v, axes, groups, name[1:])
            varying, _ = _varying_split(v, axes)
            return bind(p, v, axes=varying) if varying else v

        return _leafwise(leaf, x)

    f.__name__ = name
    f.__doc__ = f"The elementwise {name[1:]} over the devices along ``axis_name``."
    return f


def _complex_extremum(v, reduce, name, axes):
    """The lexicographic max/min of complex ``v`` over devices (as ``snp.max`` orders
    complex numbers: real part, then imaginary part), from real reductions: the real
    part's extremum, then that of the imaginary parts where it is attained.

    NaN as numpy's (and ``snp.max``'s) rule: an element with a NaN in either part
    wins, the one on the first device (row-major over ``axes``) when several do.
    Without this a NaN imaginary part was ignored and a NaN real part gave -inf as
    the imaginary part."""
    re, im = cx.real(v), cx.imag(v)
    aval = get_aval(im)
    sign = -1.0 if name == "pmax" else 1.0  # so `reduce` finds the first device
    fill = full(aval.shape, -np.inf if name == "pmax" else np.inf, aval.dtype)
    nan = bitwise_or(ne(re, re), ne(im, im))
    # The extremum of the elements without NaN.
    best_re = reduce(select(nan, fill, re))
    best_im = reduce(select(bitwise_or(nan, ne(re, best_re)), fill, im))
    # The first device holding a NaN element, and that element.
    here = broadcast_in_dim(mul(convert(axis_index(axes), aval.dtype),
                                np.array(sign, aval.dtype)[()]), aval.shape, ())
    first = reduce(select(nan, here, fill))
    mine = eq(here, first)
    nan_re, nan_im = reduce(select(mine, re, fill)), reduce(select(mine, im, fill))
    found = ne(first, fill)
    return cx.make_complex(select(found, nan_re, best_re), select(found, nan_im, best_im))


pmax = _pextremum(pmax_p, "pmax")
pmin = _pextremum(pmin_p, "pmin")


def pvary(x, axis_names):
    """Mark ``x`` as varying along ``axis_names`` (no data moves; its transpose is psum)."""
    axes = _axes(axis_names, "pvary")
    return _leafwise(lambda v: _ensure_varying(v, axes), x)


def _norm_dim(d, ndim, fname, arg):
    if not -ndim <= d < ndim:
        raise ArgumentError(f"{fname}: {arg}={d} is out of range for an operand of rank {ndim}")
    return d % ndim


_ALL_GATHER_TO = ("varying", "invarying", "reduced")


def all_gather(x, axis_name, *, axis_index_groups=None, axis: int = 0, tiled: bool = False,
               to: str = "varying"):
    """Every device gets the blocks of all devices along ``axis_name``, stacked at ``axis``
    (``tiled=True``: concatenated along ``axis``); with ``axis_index_groups``, the blocks of
    its group's members, in group order.

    ``to`` is the result's type along ``axis_name`` (JAX's names): ``'varying'`` (the
    default; the transpose is a ``psum_scatter``), ``'invarying'``, as
    :func:`all_gather_invariant` (the transpose keeps each device's block), or
    ``'reduced'`` (the same on every device, with its cotangent left as summands: the
    transpose is a ``psum_scatter`` of them; FSDP's gather of a weight).

    >>> w = lax.all_gather(w_block, "fsdp", tiled=True, to="invarying")  # doctest: +SKIP
    """
    if to not in _ALL_GATHER_TO:
        raise ArgumentError(f"all_gather: to={to!r}; the allowed values are 'varying', "
                            "'invarying' and 'reduced'")
    invariant = to == "invarying"
    axes = _axes(axis_name, "all_gather")
    n = _size(axes)
    groups = _groups(axis_index_groups, axes, "all_gather")
    if to != "varying" and groups is not None:
        raise ArgumentError(f"all_gather(to={to!r}) gathers whole axes: it takes no "
                            "axis_index_groups (the groups' results differ, so they are varying)")
    typed = {"invariant": True} if invariant else \
        {"reduced": True} if to == "reduced" and _tracking(axes) else {}

    def leaf(v):
        nd = len(get_aval(v).shape)
        ax = _norm_dim(axis, nd + (0 if tiled else 1), "all_gather", "axis")
        if groups is not None:
            from spmd.collectives.groups import grouped_all_gather

            return grouped_all_gather(v, axes, groups, ax, bool(tiled))
        return bind(all_gather_p, _ensure_varying(v, axes), axes=axes, axis=ax,
                    tiled=bool(tiled), axis_size=n, **typed)

    return _leafwise(leaf, x)


def all_gather_invariant(x, axis_name, *, axis: int = 0, tiled: bool = False):
    """:func:`all_gather` typed invariant along ``axis_name``: every device holds the same
    result, so it may be returned with an ``out_specs`` that leaves those axes out, and
    its transpose keeps each device's own block of the cotangent (no communication)
    where ``all_gather``'s sums and scatters it.

    >>> full = lax.all_gather_invariant(block, "i", tiled=True)  # doctest: +SKIP
    """
    return all_gather(x, axis_name, axis=axis, tiled=tiled, to="invarying")


def psum_scatter(x, axis_name, *, scatter_dimension: int = 0, axis_index_groups=None,
                 tiled: bool = False):
    """Sum over ``axis_name`` and give device k the k-th block of ``scatter_dimension``
    (reduce-scatter).  Untiled, that dimension's size must equal the axis size and is removed.
    With ``axis_index_groups`` each group reduces apart and the k-th member of a group gets
    the k-th block (sizes are then those of a group)."""
    axes = _axes(axis_name, "psum_scatter")
    groups = _groups(axis_index_groups, axes, "psum_scatter")
    n = groups.size if groups else _size(axes)

    def leaf(v):
        shape = get_aval(v).shape
        sd = _norm_dim(scatter_dimension, len(shape), "psum_scatter", "scatter_dimension")
        if (tiled and shape[sd] % n) or (not tiled and shape[sd] != n):
            need = f"a multiple of {n}" if tiled else f"equal to {n}"
            raise ShapeError(f"psum_scatter: dimension {sd} of the operand (shape {shape}) has "
                             f"size {shape[sd]}, which must be {need}, the size of "
                             f"{'each axis_index_groups group of ' if groups else ''}axes {axes}"
                             + ("" if tiled else "; pass tiled=True to split it into blocks"))
        if groups is not None:
            from spmd.collectives.groups import grouped_psum_scatter

            return grouped_psum_scatter(v, axes, groups, sd, bool(tiled))
        return bind(psum_scatter_p, _ensure_varying(v, axes), axes=axes, scatter_dimension=sd,
                    tiled=bool(tiled), axis_size=n)

    return _leafwise(leaf, x)


def all_to_all(x, axis_name, split_axis: int, concat_axis: int, *, axis_index_groups=None,
               tiled: bool = False):
    """Split ``split_axis`` into one chunk per device along ``axis_name``, send chunk j to
    device j, and concatenate what arrives along ``concat_axis``.  Untiled (JAX's default)
    ``split_axis`` must have the axis size; it is removed and a new axis of that size
    appears at ``concat_axis``.  With ``axis_index_groups`` the exchange happens within
    each group (sizes are then those of a group)."""
    axes = _axes(axis_name, "all_to_all")
    groups = _groups(axis_index_groups, axes, "all_to_all")
    n = groups.size if groups else _size(axes)

    def exchange(v, s, c):
        if groups is not None:
            from spmd.collectives.groups import grouped_all_to_all

            return grouped_all_to_all(v, axes, groups, s, c)
        return bind(all_to_all_p, v, axes=axes, split_axis=s, concat_axis=c, axis_size=n)

    def leaf(v):
        shape = get_aval(v).shape
        nd = len(shape)
        s = _norm_dim(split_axis, nd, "all_to_all", "split_axis")
        c = _norm_dim(concat_axis, nd if tiled else nd, "all_to_all", "concat_axis")
        if (tiled and shape[s] % n) or (not tiled and shape[s] != n):
            need = f"a multiple of {n}" if tiled else f"equal to {n}"
            raise ShapeError(f"all_to_all: split_axis {s} of the operand (shape {shape}) has "
                             f"size {shape[s]}, which must be {need}, the size of "
                             f"{'each axis_index_groups group of ' if groups else ''}axes {axes}")
        v = _ensure_varying(v, axes)
        if tiled:
            return exchange(v, s, c)
        # Untiled: make room for the new axis, exchange, then drop the split axis.  As in
        # JAX, concat_axis is a position in the result, i.e. after split_axis is removed.
        ci = c + 1 if s < c else c
        v = reshape(v, shape[:ci] + (1,) + shape[ci:])
        s2 = s + 1 if s >= c else s
        out = exchange(v, s2, ci)
        out_shape = get_aval(out).shape
        return reshape(out, out_shape[:s2] + out_shape[s2 + 1:])

    return _leafwise(leaf, x)


def ppermute(x, axis_name, perm):
    """Send device ``src``'s value to device ``dst`` for each ``(src, dst)`` in ``perm``
    (indices along ``axis_name``); devices that receive nothing get zeros."""
    axes = _axes(axis_name, "ppermute")
    n = _size(axes)
    try:
        pairs = tuple((int(s), int(d)) for s, d in perm)
    except (TypeError, ValueError):
        raise ArgumentError(f"ppermute: perm must be a sequence of (source, destination) "
                            f"index pairs, got {perm!r}") from None
    srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
    bad = [i for i in srcs + dsts if not 0 <= i < n]
    if bad or len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
        why = (f"index {bad[0]} is outside 0..{n - 1}" if bad else
               "a source or destination appears twice")
        raise ArgumentError(f"ppermute: perm {list(pairs)} is not a permutation over axis "
                            f"{axes} of size {n}: {why}")
    return _leafwise(lambda v: bind(ppermute_p, _ensure_varying(v, axes), axes=axes,
                                    perm=pairs), x)


def axis_size(axis_name) -> int:
    """The number of devices along ``axis_name`` (the product, for a tuple of axes), as a
    Python int; inside ``shard_map``, ``pmap`` or ``vmap(axis_name=...)``.

    >>> n = lax.axis_size("i")  # inside shard_map over a mesh with axis i of size 4: 4
    """
    return _size(_axes(axis_name, "axis_size"))


_PCAST_TO = ("varying", "unreduced", "reduced")


class PcastError(ArgumentError, ValueError):
    """A ``pcast`` whose operand does not have the type the cast starts from."""


def pcast(x, axis_name, *, to: str):
    """Cast the manual-axes type of ``x`` along ``axis_name`` (no data moves):

    - ``to='varying'``: an invariant or reduced value becomes varying (``pvary``; its
      transpose sums the cotangent, or for a reduced value leaves it as summands);
    - ``to='unreduced'``: a varying value becomes the devices' summands of one value
      (its cotangent is reduced);
    - ``to='reduced'``: an invariant value becomes reduced (its cotangent arrives as
      summands, which the transpose sums).

    >>> y = lax.pcast(w, "i", to="varying")
    >>> total = lax.pcast(partial_product, "i", to="unreduced")  # doctest: +SKIP
    """
    if to not in _PCAST_TO:
        raise ArgumentError(f"pcast: to={to!r}; the allowed values are 'varying', "
                            "'unreduced' and 'reduced'")
    if to == "varying":
        return pvary(x, axis_name)
    axes = _axes(axis_name, "pcast")

    def leaf(v):
        if not _tracking(axes):  # an untyped body (check_vma=False): no types to change
            return v
        aval = get_aval(v)
        var = aval.vma - aval.unreduced
        bad = [a for a in axes if (a not in var) == (to == "unreduced")
               or a in aval.unreduced or a in aval.reduced]
        if bad:
            want = "varying" if to == "unreduced" else "invariant"
            raise PcastError(
                f"pcast(to={to!r}) can only accept axis_name which the operand is {want} "
                f"along; along {bad[0]!r} it is {_kind(aval, bad[0])} ({aval})")
        return bind(pcast_p, v, axes=axes, to=to)

    return _leafwise(leaf, x)


def _kind(aval, a) -> str:
    if a in aval.unreduced:
        return "unreduced"
    if a in aval.reduced:
        return "reduced"
    return "varying" if a in aval.vma else "invariant"


def axis_index(axis_name):
    """This device's index along ``axis_name`` (row-major over a tuple of axes)."""
    axes = _axes(axis_name, "axis_index")
    return bind(axis_index_p, axes=axes)


def preduced_traced(x, axes):
    """``pcast(x, axes, to='reduced')`` of one traced value (no checks: the compiler's
    PREDUCED extension point, filled by :func:`spmd._install.install_extensions`)."""
    return bind(pcast_p, x, axes=tuple(axes), to="reduced")


def pvary_traced(x, axes):
    """``pvary`` of one traced value along ``axes`` (no checks: the compiler's PVARY
    extension point, filled by :func:`spmd._install.install_extensions`)."""
    return bind(pvary_p, x, axes=tuple(axes))

"""How ``gather`` and ``scatter`` (:mod:`spmd.compiler.ops.indexing`) run on arrays:
numpy's indexing and ``ufunc.at``, with faster paths for the common cases (an
embedding's lookup and gradient, a loss's picked logits), and another array module's
(CuPy's) where it has them.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core.array_module import to_host


def _moved(xp, x, axes):
    """A view of ``x`` with the indexed ``axes`` first, in order (``x`` itself when they
    are: ``a.at[i]``'s case, where ``moveaxis`` cost 7 us of a loop step's 19)."""
    first = tuple(range(len(axes)))
    return x if tuple(axes) == first else xp.moveaxis(x, axes, first)


def _wide(idx):
    """Index arrays as at least 32-bit signed ints (narrow ones cannot hold the bounds)."""
    return [i if i.dtype.kind == "i" and i.dtype.itemsize >= 4 else i.astype("int64")
            for i in idx]


def _in_bounds(xp, idx, sizes):
    ok = None
    for i, n in zip(idx, sizes):
        m = (i >= 0) & (i < n)
        ok = m if ok is None else ok & m
    return ok


def gather_impl(xp, x, *idx, axes, mode, fill_value):
    """``gather``'s impl: ``x`` indexed on ``axes`` by ``idx``, out-of-range indices
    clipped (``mode="clip"``) or reading ``fill_value`` (``"fill"``)."""
    idx = _wide(idx)
    sizes = [x.shape[a] for a in axes]
    b_shape = idx[0].shape
    rest = tuple(s for d, s in enumerate(x.shape) if d not in axes)
    fill = 0 if fill_value is None else fill_value
    if mode == "fill" and 0 in sizes:  # nothing to read: every index is out of bounds
        return xp.full(b_shape + rest, fill, dtype=x.dtype)
    moved = _moved(xp, x, axes)
    ok = _in_bounds(xp, idx, sizes) if mode == "fill" else None
    if xp is np and (ok is None or ok.all()):
        # (Every index in bounds: "fill" reads what "clip" does.)  One pass that clips
        # as it reads (an embedding's lookup: 12 against 37 us); over every axis of a
        # contiguous operand, through flat indices (a loss's picked logits: 16 against
        # 38 us).
        if len(idx) == 1:
            return np.take(moved, idx[0], axis=0, mode="clip")
        if not rest and moved.flags.c_contiguous:
            return np.take(moved.reshape(-1), np.ravel_multi_index(idx, sizes, mode="clip"))
    clipped = tuple(xp.clip(i, 0, n - 1) for i, n in zip(idx, sizes))
    out = moved[clipped]
    if mode == "fill":
        ok = xp.reshape(ok, b_shape + (1,) * len(rest))
        out = xp.where(ok, out, xp.asarray(fill, dtype=x.dtype))
    return out


_UFUNCS = {"add": "add", "mul": "multiply", "min": "minimum", "max": "maximum"}


def scatter_in_place(xp, out, updates, *idx, axes, mode):
    """Scatter ``updates`` into ``out`` itself, out-of-range indices dropped (``scatter``'s
    ``in_place`` rule; its impl calls it on a copy)."""
    idx = _wide(idx)
    view = _moved(xp, out, axes)
    ok = _in_bounds(xp, idx, [out.shape[a] for a in axes])
    if ok.all():
        ids, upd = tuple(idx), updates
    else:  # drop the out-of-bounds updates (a boolean mask over the B dims)
        ids, upd = tuple(i[ok] for i in idx), updates[ok]
    if mode == "set":
        view[ids] = upd
    elif xp is np and mode == "add" and len(ids) == view.ndim and \
            np.shape(upd) == ids[0].shape and view.flags.c_contiguous:
        # Single elements (a loss's gradient at the picked logits): numpy's add.at on
        # flat indices, one update at a time in order (21 against 125 us sorted).
        np.add.at(view.reshape(-1), np.ravel_multi_index(ids, view.shape).ravel(),
                  np.ravel(upd))
    elif xp is np and mode == "add" and _sums_by_row(ids, upd):
        _scatter_add_sorted(view, ids, upd)
    elif xp is np:
        getattr(xp, _UFUNCS[mode]).at(view, ids, upd)
    else:
        _device_ufunc_at(xp, _UFUNCS[mode], view, ids, upd)
    return out


# np.add.at visits the updates one at a time: an embedding's gradient (2048 rows of
# 64 into a table of 96) took 1.2 ms of the example's 40 ms step.  At least this many
# updates are summed per target first (sorted, np.add.reduceat) and added once each.
SORTED_ADD_MIN = 32


def _sums_by_row(ids, upd) -> bool:
    return ids[0].size >= SORTED_ADD_MIN and upd.dtype.kind in "fciu"


def _scatter_add_sorted(view, ids, upd) -> None:
    """``np.add.at(view, ids, upd)`` by sorting: the updates of each target are summed
    (``np.add.reduceat`` over a stable sort, so the same inputs give the same bits
    every time), then added to the target once.  It differs from np.add.at, which adds
    one update at a time, by float rounding only (the order of a sum; XLA leaves a
    scatter-add's order unspecified too); integers are exact."""
    sizes = view.shape[:len(ids)]
    flat = np.ravel_multi_index(tuple(np.ravel(i) for i in ids), sizes)
    rows = np.reshape(upd, (flat.size,) + upd.shape[ids[0].ndim:])
    order = np.argsort(flat, kind="stable")
    ordered = flat[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    sums = np.add.reduceat(rows[order], starts, axis=0)
    view[np.unravel_index(ordered[starts], sizes)] += sums  # distinct targets: exact


def _device_ufunc_at(xp, name, view, ids, upd):
    """``ufunc.at`` on another array module (cupy): its own where it has one for this
    operation and dtype (CuPy: add, maximum, minimum, on the dtypes its atomics take),
    else numpy's on a host copy, written back (slow, but right)."""
    try:
        getattr(xp, name).at(view, ids, upd)
        return
    except (NotImplementedError, TypeError):
        pass
    host = to_host(view).copy()
    getattr(np, name).at(host, tuple(to_host(i) for i in ids), to_host(upd))
    view[...] = xp.asarray(host)

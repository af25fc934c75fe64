"""Indexing with numpy's semantics: ``x[idx]``, ``x.at[idx].set(...)`` (``take`` and
``take_along_axis`` are in :mod:`spmd.numpy._take`).

Every index expression is first parsed (:func:`_parse`) into one entry per
dimension of ``x`` (after inserting the size-1 dims of ``None`` and of boolean
scalars): a static slice, a static int, a traced scalar int (``dyn``) or an
integer index array (``arr``, numpy or traced; concrete boolean masks become
their ``nonzero`` arrays).  Reading (``_getitem``) then slices statically,
takes traced scalars with ``dynamic_slice`` and gathers the arrays; updates
(``.at``) turn the whole expression into one index array per dimension and
scatter (or use ``dynamic_update_slice`` for plain static windows).

Out-of-range indices follow JAX: a static int raises
:class:`~spmd.errors.IndexOutOfBoundsError`; index arrays and traced ints are
clamped when reading and dropped when updating.
"""

from __future__ import annotations

import operator

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.array import Array
from spmd.compiler.core.array_module import to_host
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops import indexing as ix
from spmd.compiler.ops import slicing as sm
from spmd.compiler.ops import structural as st
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.errors import (ArgumentError, ConcretizationError, DTypeError, IndexOutOfBoundsError,
                         ShapeError)
from spmd.numpy._util import broadcast_to_shape, to_array

__all__: list = []  # take and take_along_axis are in _take.py


def _shape_ops():
    """``slice`` and ``rev``: structural primitives kept beside the basic ones."""
    if hasattr(st, "slice") and hasattr(st, "rev"):
        return st.slice, st.rev
    return sm.slice, sm.rev


# ----------------------------------------------------------------- parsing

class _Entry:
    """How one dimension (of ``x`` with the new axes inserted) is indexed."""

    __slots__ = ("kind", "value", "group")

    def __init__(self, kind, value, group):
        self.kind = kind      # 'slice' | 'int' | 'dyn' | 'arr'
        self.value = value
        self.group = group    # position of the index item it came from


class _Plan:
    __slots__ = ("shape", "entries", "adjacent")

    def __init__(self, shape, entries, adjacent):
        self.shape = tuple(shape)
        self.entries = entries
        self.adjacent = adjacent

    def dims(self, *kinds):
        return [d for d, e in enumerate(self.entries) if e.kind in kinds]


def _classify(e):
    """``(kind, value, dims consumed)`` of one item of an index tuple."""
    if e is None:
        return "new", None, 0
    if e is Ellipsis:
        return "ellipsis", None, 0
    if isinstance(e, slice):
        return "slice", _static_slice(e), 1
    if isinstance(e, (bool, np.bool_)):
        return "boolscalar", bool(e), 0
    if isinstance(e, (int, np.integer)):
        return "int", int(e), 1
    if isinstance(e, Tracer):
        av = e.aval
        if dtypes.is_bool(av.dtype):
            raise ConcretizationError(
                f"boolean mask indexing with a traced mask {av}: the result's shape would depend "
                "on the mask's values. Use snp.where(mask, x, 0) (or x * mask) to keep the shape, "
                "or pass the mask as a concrete numpy array")
        _check_int_index(av.dtype)
        return ("dyn" if av.ndim == 0 else "arr"), e, 1
    if isinstance(e, (list, tuple)) and any(isinstance(a, Tracer) for a in _leaves(e)):
        return _classify(to_array(e))
    a = to_host(e.value if isinstance(e, Array) else e)  # concrete: a static index
    if a.dtype == bool:
        return ("boolscalar", bool(a), 0) if a.ndim == 0 else ("bool", a, a.ndim)
    if a.size == 0 and a.dtype.kind == "f" and not isinstance(e, np.ndarray):
        a = a.astype(np.intp)  # `x[[], :]`: an empty list is an empty integer index
    _check_int_index(a.dtype)
    return ("int", int(a), 1) if a.ndim == 0 else ("arr", a, 1)


def _short(x, limit: int = 40) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[:limit - 4] + " ...]"


def _leaves(x):
    for e in x:
        if isinstance(e, (list, tuple)):
            yield from _leaves(e)
        else:
            yield e


def _check_int_index(dtype):
    if not dtypes.is_int(dtype):
        raise DTypeError(f"indexing: indices must be integers, slices, None, Ellipsis or "
                         f"boolean masks, got an index of dtype {dtype}; convert it with "
                         ".astype(int)")


def _static_slice(s):
    def bound(v, what):
        if v is None:
            return None
        if isinstance(v, Tracer):
            raise ConcretizationError(
                f"slice {what} {v.aval} is traced: slice bounds must be static. Use "
                "spmd.lax.dynamic_slice(x, starts, sizes) for a window at a traced position")
        try:
            return operator.index(v)
        except TypeError:
            raise DTypeError(f"indexing: slice {what} must be an integer or None, got "
                             f"{v!r}") from None

    out = slice(bound(s.start, "start"), bound(s.stop, "stop"), bound(s.step, "step"))
    if out.step == 0:
        raise ArgumentError("indexing: slice step cannot be zero")
    return out


def _parse(shape, idx, check_bounds: bool = True) -> _Plan:
    if isinstance(idx, list):
        # numpy once read x[[0, 1]] as x[0, 1]; JAX refuses the ambiguity, and so do we.
        raise DTypeError(
            f"indexing: a Python list {_short(idx)} is not a valid index; use a tuple for "
            "multidimensional indexing (x[(0, 1)] is x[0, 1]) or an array for integer-array "
            "indexing (x[np.array([0, 1])] or x[snp.array(seq)])")
    items = [_classify(e) for e in (idx if isinstance(idx, tuple) else (idx,))]
    if sum(k == "ellipsis" for k, _, _ in items) > 1:
        raise ArgumentError("indexing: an index can only have a single ellipsis ('...')")
    used = sum(n for _, _, n in items)
    if used > len(shape):
        raise IndexOutOfBoundsError(f"too many indices for array: array of shape {shape} is "
                                    f"{len(shape)}-dimensional, but {used} were indexed")
    new_shape, entries, d = [], [], 0
    for g, (kind, v, n) in enumerate(items):
        if kind in ("new", "boolscalar"):
            # x[True] is x[None][[0]] and x[False] is x[None][[]] (numpy's rule).
            new_shape.append(1)
            entries.append(_Entry("slice", slice(None), g) if kind == "new" else
                           _Entry("arr", np.zeros(int(v), np.intp), g))
        elif kind == "ellipsis":
            for _ in range(len(shape) - used):
                new_shape.append(shape[d])
                entries.append(_Entry("slice", slice(None), g))
                d += 1
        elif kind == "bool":
            if v.shape != tuple(shape[d:d + n]):
                raise IndexOutOfBoundsError(
                    f"boolean index of shape {v.shape} does not match the indexed dims "
                    f"{tuple(shape[d:d + n])} (axes {d}..{d + n - 1}) of the array of shape "
                    f"{shape}")
            for a in np.nonzero(v):
                new_shape.append(shape[d])
                entries.append(_Entry("arr", a, g))
                d += 1
        else:
            size = shape[d]
            if kind == "int" and check_bounds:
                if not -size <= v < size:
                    raise IndexOutOfBoundsError(
                        f"index {v} is out of bounds for axis {d} with size {size}")
                v %= size
            new_shape.append(size)
            entries.append(_Entry(kind, v, g))
            d += 1
    for g in range(len(items), len(items) + len(shape) - d):  # the unindexed trailing dims
        new_shape.append(shape[d])
        entries.append(_Entry("slice", slice(None), g))
        d += 1
    adjacent = True
    if any(e.kind == "arr" for e in entries):
        # With index arrays present, scalar ints are index arrays too (numpy's rule).
        for e in entries:
            if e.kind in ("int", "dyn"):
                e.kind = "arr"
        groups = sorted({e.group for e in entries if e.kind == "arr"})
        adjacent = groups == list(range(groups[0], groups[0] + len(groups)))
    return _Plan(new_shape, entries, adjacent)


def _normalized(i, size):
    """``i + size`` where ``i < 0`` (numpy arrays stay numpy, tracers stay traced)."""
    if isinstance(i, np.ndarray) or np.ndim(i) == 0 and not isinstance(i, (Tracer, Array)):
        a = np.asarray(i)
        a = np.where(a < 0, a + size, a) if a.dtype.kind == "i" else a
        return a.astype(dtypes.default_int())
    i = ew.convert(i, dtypes.default_int())  # narrow or unsigned ints cannot hold the size
    av = get_aval(i)
    return ew.select(ew.lt(i, ix._scalar(0, av.dtype)), ew.add(i, ix._scalar(size, av.dtype)), i)


def _index_arrays(plan):
    """The normalised index arrays of the ``arr`` dims, broadcast to their shape B."""
    dims = plan.dims("arr")
    arrs = [_normalized(plan.entries[d].value, plan.shape[d]) for d in dims]
    try:
        b_shape = tuple(np.broadcast_shapes(*[np.shape(a) for a in arrs]))
    except ValueError:
        raise ShapeError(f"indexing: index arrays of shapes {[np.shape(a) for a in arrs]} "
                         "cannot be broadcast together") from None
    return dims, [_broadcast(a, b_shape) for a in arrs], b_shape


def _broadcast(a, shape):
    if isinstance(a, np.ndarray):
        return np.broadcast_to(a, shape)
    return broadcast_to_shape(a, shape)


# ------------------------------------------------------------------ reading

def _getitem(x, idx):
    """``x[idx]`` with numpy's semantics (installed as ``__getitem__``).

    >>> import spmd.numpy as snp
    >>> snp.arange(6).reshape(2, 3)[:, ::-1]
    Array([[2, 1, 0],
           [5, 4, 3]], dtype=int32)
    """
    x = to_array(x)
    plan = _parse(x.shape, idx)
    y = st.reshape(x, plan.shape)
    y = _static_part(y, plan)
    dyn = plan.dims("dyn")
    if dyn:
        starts = [_normalized(e.value, n) if e.kind == "dyn" else np.int32(0)
                  for e, n in zip(plan.entries, plan.shape)]
        sizes = [1 if d in dyn else s for d, s in enumerate(np.shape(y))]
        y = ix.dynamic_slice(y, starts, sizes)
    y = st.squeeze(y, plan.dims("int", "dyn"))
    if plan.dims("arr"):
        dims, arrs, b_shape = _index_arrays(plan)
        y = ix.gather(y, arrs, dims)
        y = _place_b(y, len(b_shape), dims[0] if plan.adjacent else 0)
    return y


def _static_part(y, plan):
    """Apply the static slices (and static ints, as size-1 slices) in one slice op."""
    lax_slice, lax_rev = _shape_ops()
    starts, limits, strides, flips = [], [], [], []
    for d, (e, n) in enumerate(zip(plan.entries, plan.shape)):
        s, lim, step = 0, n, 1
        if e.kind == "int":
            s, lim = e.value, e.value + 1
        elif e.kind == "slice":
            s, stop, step = e.value.indices(n)
            length = len(range(s, stop, step))
            if step < 0:  # reversed, the same elements are a forward slice
                flips.append(d)
                s, step = n - 1 - s, -step
            s, lim = (s, s + (length - 1) * step + 1) if length else (0, 0)
        starts.append(s)
        limits.append(lim)
        strides.append(step)
    return lax_slice(lax_rev(y, flips), starts, limits, strides)


def _place_b(y, nb, pos):
    """Move the leading ``nb`` (index-shape) dims of ``y`` to position ``pos``."""
    if pos == 0 or nb == 0:
        return y
    nd = len(np.shape(y))
    perm = list(range(nb, nb + pos)) + list(range(nb)) + list(range(nb + pos, nd))
    return st.transpose(y, perm)


# ----------------------------------------------------------------- updates

def _full_indices(plan):
    """The indexed shape S and one index array (broadcast to S) per dim of ``plan.shape``."""
    slices = plan.dims("slice")
    layout: list = []  # the result's dims, in order: a dim number, or "B"
    b_shape = ()
    if plan.dims("arr"):
        dims, arrs, b_shape = _index_arrays(plan)
        by_dim = dict(zip(dims, arrs))
        if plan.adjacent:
            layout = [d for d in slices if d < dims[0]] + ["B"] + [d for d in slices if d > dims[0]]
        else:
            layout = ["B"] + slices
    else:
        by_dim = {}
        layout = list(slices)
    sizes, pos, p = [], {}, 0
    for item in layout:
        pos[item] = p
        if item == "B":
            sizes.extend(b_shape)
            p += len(b_shape)
        else:
            start, stop, step = plan.entries[item].value.indices(plan.shape[item])
            sizes.append(len(range(start, stop, step)))
            p += 1
    s_shape = tuple(sizes)
    out = []
    for d, e in enumerate(plan.entries):
        ones = [1] * len(s_shape)
        if e.kind == "slice":
            start, stop, step = e.value.indices(plan.shape[d])
            ones[pos[d]] = s_shape[pos[d]]
            a = (start + step * np.arange(s_shape[pos[d]])).astype(dtypes.default_int())
            out.append(np.broadcast_to(a.reshape(ones), s_shape))
        elif e.kind == "arr":
            b = pos["B"]
            ones[b:b + len(b_shape)] = b_shape
            a = by_dim[d]
            a = a.reshape(ones) if isinstance(a, np.ndarray) else st.reshape(a, ones)
            out.append(_broadcast(a, s_shape))
        else:  # a static or traced scalar int: the same position everywhere
            a = _normalized(e.value, plan.shape[d])
            a = a.reshape(ones) if isinstance(a, np.ndarray) else st.reshape(a, ones)
            out.append(_broadcast(a, s_shape))
    return s_shape, out


def _values_to(v, shape, fname):
    """Broadcast update values to the indexed shape (leading size-1 dims may be dropped)."""
    vs = tuple(np.shape(v))
    extra = len(vs) - len(shape)
    if extra > 0 and all(s == 1 for s in vs[:extra]):
        v, vs = st.reshape(v, vs[extra:]), vs[extra:]
    try:
        if tuple(np.broadcast_shapes(vs, shape)) != tuple(shape):
            raise ValueError
    except ValueError:
        raise ShapeError(f"{fname}: values of shape {tuple(np.shape(v))} cannot be broadcast to "
                         f"the indexed shape {tuple(shape)}") from None
    return broadcast_to_shape(v, shape)


_COMBINE = {"add": ew.add, "mul": ew.mul, "min": ew.min, "max": ew.max}


def _combine(old, v, mode):
    return v if mode == "set" else _COMBINE[mode](old, v)


def _update(x, idx, values, mode, oob_mode, fname):
    x = to_array(x)
    av = get_aval(x)
    if oob_mode not in (None, "drop", "promise_in_bounds", "clip"):
        raise ArgumentError(f"{fname}: mode={oob_mode!r}; expected 'drop', 'clip' or "
                            "'promise_in_bounds' for an update")
    v = ew.convert(to_array(values, fname=fname), av.dtype, av.weak_type)
    plan = _parse(av.shape, idx)
    y = st.reshape(x, plan.shape)
    if not plan.shape:  # a 0-d array: the update is elementwise
        return _combine(y, _values_to(v, (), fname), mode)
    window = _static_window(plan)
    axes_form = None if window is not None else _indexed_axes(plan)
    if window is not None:
        starts, sizes = window
        v = st.reshape(_values_to(v, _full_indices(plan)[0], fname), sizes)
        if sizes == plan.shape:
            out = _combine(y, v, mode)
        else:
            old = None if mode == "set" else ix.dynamic_slice(y, starts, sizes)
            out = ix.dynamic_update_slice(y, _combine(old, v, mode), starts)
    elif axes_form is not None:
        # Only some axes indexed, the others taken whole: scatter on those axes.
        dims, idx_arrays, s_shape, b_pos, nb = axes_form
        v = _values_to(v, s_shape, fname)
        perm = list(range(b_pos, b_pos + nb)) + [d for d in range(len(s_shape))
                                                 if not b_pos <= d < b_pos + nb]
        idx_arrays = _clip_if(idx_arrays, [plan.shape[d] for d in dims], oob_mode)
        out = ix.scatter(y, st.transpose(v, perm), idx_arrays, dims, mode)
    else:
        s_shape, idx_arrays = _full_indices(plan)
        idx_arrays = _clip_if(idx_arrays, plan.shape, oob_mode)
        out = ix.scatter(y, _values_to(v, s_shape, fname), idx_arrays,
                         tuple(range(len(plan.shape))), mode)
    return st.reshape(out, av.shape)


def _clip_if(idx_arrays, sizes, oob_mode):
    if oob_mode != "clip":
        return idx_arrays
    return [ix._clamp_index(i, 0, n - 1) for i, n in zip(idx_arrays, sizes)]


def _indexed_axes(plan):
    """When every non-indexed dim is a whole slice: ``(dims, index arrays, S, B position,
    B rank)`` of the indexed dims (ints and traced scalars count as 0-d index arrays)."""
    for e, n in zip(plan.entries, plan.shape):
        if e.kind == "slice" and e.value.indices(n) != (0, n, 1):
            return None
    if plan.dims("arr"):
        dims, arrs, b_shape = _index_arrays(plan)
    else:
        dims = plan.dims("int", "dyn")
        arrs, b_shape = [_normalized(plan.entries[d].value, plan.shape[d]) for d in dims], ()
    rest = [n for d, n in enumerate(plan.shape) if d not in dims]
    b_pos = len([d for d in range(dims[0]) if d not in dims]) if plan.adjacent else 0
    s_shape = tuple(rest[:b_pos]) + tuple(b_shape) + tuple(rest[b_pos:])
    return dims, arrs, s_shape, b_pos, len(b_shape)


def _static_window(plan):
    """``(starts, sizes)`` when the index is a static box (unit-step slices and ints)."""
    if plan.dims("arr", "dyn"):
        return None
    starts, sizes = [], []
    for e, n in zip(plan.entries, plan.shape):
        if e.kind == "int":
            starts.append(np.int32(e.value))
            sizes.append(1)
            continue
        start, stop, step = e.value.indices(n)
        if step != 1:
            return None
        starts.append(np.int32(start))
        sizes.append(max(stop - start, 0))
    return starts, tuple(sizes)


def _default_fill(dtype):
    """JAX's fill for out-of-bounds reads: NaN, the most negative int, uint max, True."""
    dtype = np.dtype(dtype)
    if dtypes.is_inexact(dtype):
        return float("nan")
    if dtype.kind == "i":
        return int(np.iinfo(dtype).min)
    if dtype.kind == "u":
        return int(np.iinfo(dtype).max)
    return True


def _clipped_index(shape, idx):
    """``idx`` with its static integer indices moved into bounds (negative ones
    counted from the end first): JAX's ``mode='clip'`` on concrete indices."""
    items = list(idx) if isinstance(idx, tuple) else [idx]
    plan = _parse(shape, idx, check_bounds=False)
    size_of = {e.group: plan.shape[d] for d, e in enumerate(plan.entries)
               if e.kind in ("int", "arr")}
    for g, size in size_of.items():
        item = items[g]
        if isinstance(item, (bool, np.bool_)) or isinstance(item, Tracer) or item is None:
            continue  # masks and traced indices (gathers clamp those) stay as they are
        a = np.asarray(to_host(item.value) if isinstance(item, Array) else item)
        if a.dtype.kind not in "iu" or size == 0:
            continue
        a = np.clip(np.where(a < 0, a + size, a), 0, size - 1)
        items[g] = int(a) if a.ndim == 0 else a
    return tuple(items) if isinstance(idx, tuple) else items[0]


def _get(x, idx, mode, fill_value):
    x = to_array(x)
    if mode == "clip":
        return _getitem(x, _clipped_index(x.shape, idx))
    if mode in (None, "promise_in_bounds"):
        return _getitem(x, idx)
    if mode != "fill":
        raise ArgumentError(f".at[].get: mode={mode!r}; expected 'clip', 'fill' or "
                            "'promise_in_bounds'")
    plan = _parse(x.shape, idx, check_bounds=False)
    if not plan.shape:
        return x
    y = st.reshape(x, plan.shape)
    fill = _default_fill(x.dtype) if fill_value is None else fill_value
    _, idx_arrays = _full_indices(plan)
    return ix.gather(y, idx_arrays, tuple(range(len(plan.shape))), "fill", fill)


class _IndexUpdateRef:
    """``x.at[idx]``: functional updates of the positions ``idx`` selects."""

    __slots__ = ("array", "index")

    def __init__(self, array, index):
        self.array = array
        self.index = index

    def __repr__(self):
        return f"_IndexUpdateRef({self.array!r}, {self.index!r})"

    def get(self, *, mode=None, fill_value=None, indices_are_sorted=False, unique_indices=False):
        """``x[idx]``; ``mode='fill'`` returns ``fill_value`` for out-of-bounds indices."""
        return _get(self.array, self.index, mode, fill_value)

    def set(self, values, *, mode=None, indices_are_sorted=False, unique_indices=False):
        """A copy of ``x`` with ``x[idx] = values``.

        >>> import spmd.numpy as snp
        >>> snp.zeros(3).at[1].set(5.0)
        Array([0., 5., 0.], dtype=float32)
        """
        return _update(self.array, self.index, values, "set", mode, "at[].set")

    def add(self, values, *, mode=None, indices_are_sorted=False, unique_indices=False):
        """A copy of ``x`` with ``x[idx] += values`` (repeated indices accumulate)."""
        return _update(self.array, self.index, values, "add", mode, "at[].add")

    def multiply(self, values, *, mode=None, indices_are_sorted=False, unique_indices=False):
        """A copy of ``x`` with ``x[idx] *= values`` (repeated indices accumulate)."""
        return _update(self.array, self.index, values, "mul", mode, "at[].multiply")

    mul = multiply

    def min(self, values, *, mode=None, indices_are_sorted=False, unique_indices=False):
        """A copy of ``x`` with ``x[idx] = minimum(x[idx], values)``."""
        return _update(self.array, self.index, values, "min", mode, "at[].min")

    def max(self, values, *, mode=None, indices_are_sorted=False, unique_indices=False):
        """A copy of ``x`` with ``x[idx] = maximum(x[idx], values)``."""
        return _update(self.array, self.index, values, "max", mode, "at[].max")


class _IndexUpdateHelper:
    """The ``.at`` property: ``x.at[idx].set(v)`` and friends (JAX's functional updates)."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __getitem__(self, index):
        return _IndexUpdateRef(self.array, index)

    def __repr__(self):
        return f"_IndexUpdateHelper({self.array!r})"

"""Collectives over subgroups of an axis: JAX's ``axis_index_groups=``.

``psum(x, "i", axis_index_groups=[[0, 1], [2, 3]])`` sums over devices 0 and 1
of axis ``i`` and, separately, over devices 2 and 3.  Groups must cover every
index of the axis exactly once and have one size (as JAX requires).

Each grouped collective is built from the ungrouped primitives, so it needs
nothing new from the backends and inherits their transposes, batching rules
and varying-axes types: a device finds its group and its position in it by
looking up its ``axis_index`` in constant tables, the reductions put each
device's value in its group's slot of a small stack and reduce that stack over
the whole axis (one slot per group), and the gathers gather the whole axis and
keep the group's rows.  The price is bandwidth: a grouped reduction moves
``number of groups`` times the data of a plain one, a grouped gather or
all-to-all moves the whole axis's data.  Results vary along the axis (groups
hold different values).
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.ops.elementwise import mul
from spmd.compiler.ops.indexing import dynamic_slice, dynamic_update_slice, gather
from spmd.compiler.ops.structural import full, reshape, transpose
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError
from spmd.collectives.api import all_gather, axis_index, pmax, pmin, psum


class Groups:
    """Validated ``axis_index_groups`` for an axis (or tuple of axes) of size ``n``:
    ``members[g]`` lists group g's indices in order; ``group_of[i]`` and ``pos_of[i]``
    are index i's group and position in it."""

    def __init__(self, groups, n: int, fname: str):
        try:
            members = [[_index(i) for i in g] for g in groups]
        except TypeError:
            raise ArgumentError(f"{fname}: axis_index_groups must be a list of lists of axis "
                                f"indices, e.g. [[0, 1], [2, 3]], got {groups!r}") from None
        if not members or any(not g for g in members):
            raise ArgumentError(f"{fname}: axis_index_groups={groups!r} has no group or an "
                                "empty group")
        flat = [i for g in members for i in g]
        if sorted(flat) != list(range(n)):
            raise ArgumentError(f"{fname}: axis_index_groups={members} must cover each index "
                                f"0..{n - 1} of the axis (size {n}) exactly once")
        if len({len(g) for g in members}) != 1:
            raise ArgumentError(f"{fname}: the groups of axis_index_groups={members} must all "
                                "have the same size")
        self.members = np.asarray(members, np.int32)
        self.n_groups, self.size = self.members.shape
        self.group_of = np.zeros(n, np.int32)
        self.pos_of = np.zeros(n, np.int32)
        for g, row in enumerate(members):
            for p, i in enumerate(row):
                self.group_of[i], self.pos_of[i] = g, p


def _index(i) -> int:
    if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
        raise TypeError
    return int(i)


def _lookup(table, idx):
    """``table[idx]`` for a constant table and a traced scalar index."""
    return gather(table, [idx], (0,))


def _me(axes):
    return axis_index(axes)


def _slot_reduce(x, axes, groups: Groups, reduce, fill):
    """Each device's value in its group's slot of a (groups, ...) stack, ``reduce`` over
    the axis, then this device's group's slot."""
    aval = get_aval(x)
    gid = _lookup(groups.group_of, _me(axes))
    stack = full((groups.n_groups,) + aval.shape, fill, aval.dtype)
    zeros = [np.int32(0)] * len(aval.shape)
    stack = dynamic_update_slice(stack, reshape(x, (1,) + aval.shape), [gid] + zeros)
    total = reduce(stack, axes)
    return reshape(dynamic_slice(total, [gid] + zeros, (1,) + aval.shape), aval.shape)


def grouped_psum(x, axes, groups: Groups):
    return _slot_reduce(x, axes, groups, psum, 0)


def grouped_extremum(x, axes, groups: Groups, which: str):
    dt = get_aval(x).dtype
    if dtypes.is_float(dt):  # (bfloat16 too, which numpy does not count as floating)
        fill = -np.inf if which == "max" else np.inf
    elif dt == np.bool_:
        fill = which != "max"
    else:
        info = np.iinfo(dt)
        fill = info.min if which == "max" else info.max
    return _slot_reduce(x, axes, groups, pmax if which == "max" else pmin, fill)


def _group_rows(x, axes, groups: Groups):
    """The values of this device's group members, stacked in group order: (k, ...)."""
    every = all_gather(x, axes, axis=0, tiled=False)  # (n, ...)
    members = _lookup(groups.members, _lookup(groups.group_of, _me(axes)))  # (k,)
    return gather(every, [members], (0,))


def grouped_all_gather(x, axes, groups: Groups, axis: int, tiled: bool):
    rows = _group_rows(x, axes, groups)  # (k, *s)
    shape = get_aval(rows).shape
    nd = len(shape) - 1
    perm = tuple(range(1, 1 + axis)) + (0,) + tuple(range(1 + axis, 1 + nd))
    out = transpose(rows, perm)  # the group axis at ``axis``
    if tiled:
        s = get_aval(out).shape
        out = reshape(out, s[:axis] + (s[axis] * s[axis + 1],) + s[axis + 2:])
    return out


def grouped_psum_scatter(x, axes, groups: Groups, dim: int, tiled: bool):
    total = grouped_psum(x, axes, groups)
    shape = get_aval(total).shape
    c = shape[dim] // groups.size
    pos = _lookup(groups.pos_of, _me(axes))
    starts = [np.int32(0)] * len(shape)
    starts[dim] = mul(pos, np.int32(c))
    block = dynamic_slice(total, starts, shape[:dim] + (c,) + shape[dim + 1:])
    if not tiled:
        block = reshape(block, shape[:dim] + shape[dim + 1:])
    return block


def grouped_all_to_all(x, axes, groups: Groups, split_axis: int, concat_axis: int):
    """Tiled: member p of a group receives chunk p of ``split_axis`` from every member,
    concatenated along ``concat_axis`` in group order."""
    k = groups.size
    rows = _group_rows(x, axes, groups)  # (k, *s)
    s = get_aval(rows).shape[1:]
    c = s[split_axis] // k
    split = reshape(rows, (k,) + s[:split_axis] + (k, c) + s[split_axis + 1:])
    pos = _lookup(groups.pos_of, _me(axes))
    starts = [np.int32(0)] * len(get_aval(split).shape)
    starts[1 + split_axis] = pos
    sizes = (k,) + s[:split_axis] + (1, c) + s[split_axis + 1:]
    mine = reshape(dynamic_slice(split, starts, sizes), (k,) + s[:split_axis] + (c,)
                   + s[split_axis + 1:])  # (k, *s with split_axis cut to c)
    nd = len(s)
    perm = tuple(range(1, 1 + concat_axis)) + (0,) + tuple(range(1 + concat_axis, 1 + nd))
    out = transpose(mine, perm)
    o = get_aval(out).shape
    return reshape(out, o[:concat_axis] + (o[concat_axis] * o[concat_axis + 1],)
                   + o[concat_axis + 2:])

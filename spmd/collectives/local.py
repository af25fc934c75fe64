"""The ``local`` backend: collectives among devices simulated in one process.

The devices of a mesh run together: a per-device value is one stacked array
whose leading axis is the device's position in the mesh (row-major), or an
unstacked array when it is the same on every device.  Each collective is a
few array operations over the stacked axis, written with the compiler's
primitives so that a jitted ``shard_map`` compiles into one straight-line
numpy program for all devices at once.

The interface is the seven collectives over a group of mesh axes (the
``Group`` protocol of ``spmd.collectives.backend``); ``stacked`` values have the
device axis first.

**On a trace** (:mod:`spmd.launch.timeline.recorder`): a program stacked while a
trace is on (its devices given, see :func:`stacked_devices`) brackets each
collective's array operations with two effectful ``timeline_mark`` equations,
without results, off the data path (the first reads nothing, the second the
collective's result): when the program runs, the first notes the arrival, the
second records one span per member device on that device's track,
with the fields every collective of a trace has (``comm``: the member device ids,
``seq``: its number on that member set, ``op``: the spmd collective's name,
``bytes``: one member's operand bytes).  All members of a stacked collective
arrive together (one array operation runs them all), so the merge finds their
wait phase ~0: that is the truth of simulated devices, not a lost measurement.
A program stacked without a trace has no markers; the caches keep the two apart
(the trace state is part of the traced programs' context key,
:func:`spmd.shard.explicit.mesh_context.context_key`).
"""

from __future__ import annotations

import time

import numpy as np

from spmd.compiler.core.primitives import Primitive
from spmd.compiler.ops import reduce as red
from spmd.compiler.ops.elementwise import mul
from spmd.compiler.ops.slicing import concatenate, slice_in_dim
from spmd.compiler.ops.structural import broadcast_in_dim, full, reshape, transpose
from spmd.compiler.core.trace import Tracer, bind, get_aval
from spmd.launch.timeline import recorder as _timeline


class LocalGroup:
    """Collectives over ``axes`` among devices stacked along axis 0.

    ``names``/``sizes`` describe the whole mesh the stacked axis stands for;
    ``axes`` (a subset of ``names``) is the group the collective spans: devices
    that share their coordinates on the other axes form one group.  ``devices``:
    the global ids of the stacked devices (row-major), given only while a trace is
    on: then each collective is bracketed by markers (see the module docstring).
    """

    def __init__(self, names, sizes, axes, devices=None):
        self.names, self.sizes, self.axes = tuple(names), tuple(sizes), tuple(axes)
        self.a_pos = [self.names.index(a) for a in self.axes]  # in the group's order
        self.b_pos = [i for i in range(len(self.names)) if i not in self.a_pos]
        self.n = int(np.prod(self.sizes, dtype=np.int64))
        self.stacked = self.n  # every device of the mesh is stacked here
        self.na = int(np.prod([self.sizes[i] for i in self.a_pos], dtype=np.int64))
        self.nb = self.n // self.na
        self.devices = None if devices is None else tuple(devices)

    # (N, *r) -> (nB, nA, *r): each row of nB is one group, in group order.
    def _groups(self, x):
        r = tuple(get_aval(x).shape[1:])
        k = len(self.names)
        xm = reshape(x, self.sizes + r)
        perm = tuple(self.b_pos) + tuple(self.a_pos) + tuple(range(k, k + len(r)))
        return reshape(transpose(xm, perm), (self.nb, self.na) + r)

    # (nB, nA, *r) -> (N, *r): the inverse of _groups.
    def _ungroup(self, g):
        r = tuple(get_aval(g).shape[2:])
        k = len(self.names)
        order = self.b_pos + self.a_pos
        shaped = reshape(g, tuple(self.sizes[i] for i in order) + r)
        inv = tuple(int(i) for i in np.argsort(order)) + tuple(range(k, k + len(r)))
        return reshape(transpose(shaped, inv), (self.n,) + r)

    # (nB, *r) -> (N, *r) or unstacked when nB == 1: the same value on each group member.
    def _spread(self, g):
        r = tuple(get_aval(g).shape[1:])
        if self.nb == 1:
            return reshape(g, r), None
        k = len(self.names)
        bshape = tuple(self.sizes[i] for i in self.b_pos)
        g = reshape(g, bshape + r)
        full_shape = self.sizes + r
        dims = tuple(self.b_pos) + tuple(range(k, k + len(r)))
        return reshape(broadcast_in_dim(g, full_shape, dims), (self.n,) + r), 0

    # ----------------------------------------------------------- collectives
    def all_reduce(self, x, op: str):
        """Sum/max/min over the group; every member gets the result."""
        if self.devices is not None:
            return self._marked(_REDUCE_NAMES[op], self._all_reduce, x, op)
        return self._all_reduce(x, op)

    def _all_reduce(self, x, op: str):
        reducer = {"sum": red.reduce_sum, "max": red.reduce_max, "min": red.reduce_min}[op]
        if self.nb == 1:
            # The group is the whole mesh: reduce the stacked axis directly (a sum
            # of per-device products then folds into one product, see passes).
            return reducer(x, (0,)), None
        return self._spread(reducer(self._groups(x), (1,)))

    def all_gather(self, x, axis: int, tiled: bool):
        if self.devices is not None:
            return self._marked("all_gather", self._all_gather, x, axis, tiled)
        return self._all_gather(x, axis, tiled)

    def _all_gather(self, x, axis: int, tiled: bool):
        g = self._groups(x)  # (nB, nA, *r)
        r = tuple(get_aval(g).shape[2:])
        nd = len(r)
        perm = (0,) + tuple(range(2, 2 + axis)) + (1,) + tuple(range(2 + axis, 2 + nd))
        g = transpose(g, perm)  # (nB, *r[:axis], nA, *r[axis:])
        if tiled:
            shape = get_aval(g).shape
            g = reshape(g, shape[:1 + axis] + (shape[1 + axis] * shape[2 + axis],)
                        + shape[3 + axis:])
        return self._spread(g)

    def reduce_scatter(self, x, dim: int, tiled: bool):
        if self.devices is not None:
            return self._marked("psum_scatter", self._reduce_scatter, x, dim, tiled)
        return self._reduce_scatter(x, dim, tiled)

    def _reduce_scatter(self, x, dim: int, tiled: bool):
        s = red.reduce_sum(self._groups(x), (1,))  # (nB, *r)
        r = tuple(get_aval(s).shape[1:])
        c = r[dim] // self.na
        split = reshape(s, (self.nb,) + r[:dim] + (self.na, c) + r[dim + 1:])
        nd = len(r) + 1
        perm = (0, 1 + dim) + tuple(i for i in range(1, nd + 1) if i != 1 + dim)
        out = transpose(split, perm)  # (nB, nA, *r[:dim], c, *r[dim+1:])
        if not tiled:
            shape = get_aval(out).shape
            out = reshape(out, shape[:2 + dim] + shape[3 + dim:])
        return self._ungroup(out), 0

    def all_to_all(self, x, split_axis: int, concat_axis: int):
        """Tiled all-to-all: chunk j of ``split_axis`` goes to member j, and the chunks a
        member receives are concatenated along ``concat_axis`` in source order."""
        if self.devices is not None:
            return self._marked("all_to_all", self._all_to_all, x, split_axis, concat_axis)
        return self._all_to_all(x, split_axis, concat_axis)

    def _all_to_all(self, x, split_axis: int, concat_axis: int):
        g = self._groups(x)  # (nB, nA_src, *r)
        r = tuple(get_aval(g).shape[2:])
        s = split_axis
        c = r[s] // self.na
        y = reshape(g, (self.nb, self.na) + r[:s] + (self.na, c) + r[s + 1:])
        # Positions in y: 0 nB, 1 src, r_i at 2+i (i<s), dst at 2+s, c at 3+s, r_i at 3+i (i>s).
        pos = [2 + i if i < s else (3 + s if i == s else 3 + i) for i in range(len(r))]
        order = [0, 2 + s]
        for i in range(len(r)):
            order += [1, pos[i]] if i == concat_axis else [pos[i]]
        y = transpose(y, tuple(order))
        shape = get_aval(y).shape
        k = 2 + concat_axis
        y = reshape(y, shape[:k] + (shape[k] * shape[k + 1],) + shape[k + 2:])
        return self._ungroup(y), 0

    def ppermute(self, x, perm):
        """Member ``dst`` receives member ``src``'s value for each ``(src, dst)``; others
        receive zeros."""
        if self.devices is not None:
            return self._marked("ppermute", self._ppermute, x, perm)
        return self._ppermute(x, perm)

    def _ppermute(self, x, perm):
        g = self._groups(x)  # (nB, nA, *r)
        source = {d: s for s, d in perm}
        parts = []
        for dst in range(self.na):
            if dst in source:
                parts.append(slice_in_dim(g, source[dst], source[dst] + 1, axis=1))
            else:
                shape = (self.nb, 1) + tuple(get_aval(g).shape[2:])
                parts.append(full(shape, 0, get_aval(g).dtype))
        out = concatenate(parts, 1) if len(parts) > 1 else parts[0]
        return self._ungroup(out), 0

    def _marked(self, op: str, run, x, *params):
        """``run(x, *params)`` between the trace's two markers (see the module
        docstring).  Neither sits on the data path: the arrival marker reads nothing
        and the exit marker only reads the result, so the passes see the collective's
        operations as they are (a psum of per-device products still folds into one
        product, :func:`spmd.compiler.passes.pipeline.sum_batched_dots`; its time then
        shows in the product, before the arrival)."""
        site = _Site(op, self._comms(), _member_bytes(x))
        _arrive(x, site)
        out, d = run(x, *params)
        bind(timeline_mark_p, out, site=site, phase="exit")
        return out, d

    def _comms(self) -> tuple:
        """Per group: ``(comm, member ids)``, ``comm`` the sorted ids joined by commas."""
        ids = np.asarray(self.devices).reshape(self.sizes)
        rows = np.transpose(ids, tuple(self.b_pos) + tuple(self.a_pos)).reshape(self.nb, self.na)
        return tuple((",".join(map(str, sorted(int(i) for i in row))),
                      tuple(int(i) for i in row)) for row in rows)

    def axis_index(self):
        """Each device's index in its group (a constant stacked array)."""
        coords = np.indices(self.sizes).reshape(len(self.sizes), -1)
        idx = np.zeros(self.n, np.int32)
        for p in self.a_pos:
            idx = idx * self.sizes[p] + coords[p]
        return idx.astype(np.int32), 0

    def scale(self, x, dim):
        """``psum`` of a value that is the same on every member: multiply by the group size."""
        return mul(x, np.array(self.na, get_aval(x).dtype)[()]), dim


# ------------------------------------------------------------ the trace's markers

_REDUCE_NAMES = {"sum": "psum", "max": "pmax", "min": "pmin"}

# Effectful (never removed, merged or moved past another effectful equation) and
# without results: the arrival reads nothing, the exit reads the collective's result.
timeline_mark_p = Primitive("timeline_mark", traits=(), multiple_results=True, effectful=True)
timeline_mark_p.def_abstract_eval(lambda *xs, site, phase: [])
timeline_mark_p.def_vma(lambda *xs, site, phase: [])


class _Site:
    """One collective of a stacked program: its op, its groups ``(comm, member ids)``,
    one member's operand bytes, and the arrival time of the run in progress."""

    __slots__ = ("op", "comms", "bytes", "t0")

    def __init__(self, op: str, comms: tuple, nbytes: int):
        self.op, self.comms, self.bytes, self.t0 = op, comms, nbytes, 0.0

    def __repr__(self):
        return f"{self.op}[{' | '.join(c for c, _ in self.comms)}]"


def _member_bytes(x) -> int:
    """One member's bytes of a stacked operand (device axis first)."""
    aval = get_aval(x)
    return int(np.prod(aval.shape[1:], dtype=np.int64)) * np.dtype(aval.dtype).itemsize


@timeline_mark_p.def_impl
def _mark(xp, *xs, site, phase):
    if phase == "arrive":
        site.t0 = time.monotonic()
    else:
        _record(site, time.monotonic())
    return []


# Under a transformation of a program that holds a marker (the stacked program is
# final, but the rules keep the primitive usable anywhere): it marks the primal
# values, once, with nothing to differentiate or batch.
@timeline_mark_p.def_jvp
def _mark_jvp(primals, tangents, *, site, phase):
    bind(timeline_mark_p, *primals, site=site, phase=phase)
    return [], []


@timeline_mark_p.def_batch
def _mark_batch(args, dims, *, site, phase):
    bind(timeline_mark_p, *args, site=site, phase=phase)
    return [], []


def _arrive(x, site: "_Site") -> None:
    """The arrival marker, in the program ``x`` is traced into (an equation without
    operands: bound to ``x``'s trace, not through ``bind``, which would place it in
    the innermost one); on a concrete ``x`` (an eager body) the arrival is now."""
    if isinstance(x, Tracer):
        x._trace.process_primitive(timeline_mark_p, [], {"site": site, "phase": "arrive"})
    else:
        site.t0 = time.monotonic()


# Per recording: comm -> the next sequence number on it (equal for all its members,
# since one marker records them all).
_seqs: dict = {}
_seqs_of: list = [None]


def _record(site: _Site, t1: float) -> None:
    """One span per member device of each of the site's groups, on its track."""
    r = _timeline.ACTIVE
    if r is None:
        return  # (a program stacked while a trace was on, run after it stopped)
    if _seqs_of[0] is not r:
        _seqs.clear()
        _seqs_of[0] = r
    op, t0 = site.op, site.t0
    for comm, members in site.comms:
        seq = _seqs.get(comm, 0)
        _seqs[comm] = seq + 1
        # (One args dict for the members' spans: events are read, never changed.)
        r.spans(op, "collective", t0, t1, members,
                {"comm": comm, "seq": seq, "op": op, "bytes": site.bytes})


# While a trace is on, the stacked runner notes here which devices a batch level
# stands for (id of its NamedAxes -> their global ids, row-major), for the
# collectives' groups (spmd.collectives.primitives.group_for).
STACKED: dict = {}


def stacked_devices(level):
    """The global ids of the devices ``level`` stands for, when noted (a trace is on
    and the level stacks a mesh's devices), else None.

    >>> stacked_devices(object()) is None
    True
    """
    return STACKED.get(id(level))

"""Collectives among devices spread over processes (the ``mpi`` backend's groups).

A process runs its local devices stacked along one axis (as the local backend
runs all of them).  :class:`ProcessGroup` has the same seven operations as
:class:`spmd.collectives.local.LocalGroup`; it builds them from MPI calls
(``spmd.collectives.mpi``) and local array operations:

- one device per process: each group of devices is a communicator of
  processes in mesh order, and each collective is one MPI call
  (``Allreduce``, ``Allgather``, ``Reduce_scatter_block``, ``Alltoall``,
  ``Isend``/``Irecv``);
- several devices per process (hybrid meshes): groups entirely inside the
  process need no MPI; otherwise the processes that share groups exchange
  their stacked blocks with one ``Allgather`` and finish locally.

On GPU devices the same calls go through NCCL (``spmd.collectives.nccl``, the
same interface) when CuPy has it, unless ``SPMD_GPU_BACKEND=mpi`` asks for the
``mpi`` backend, which stages GPU arrays through host memory.
"""

from __future__ import annotations

import numpy as np

from spmd.collectives import mpi, nccl
from spmd.collectives.local import LocalGroup
from spmd.compiler.ops.elementwise import mul
from spmd.compiler.ops.slicing import concatenate, slice_in_dim
from spmd.compiler.ops.structural import full, reshape, transpose
from spmd.compiler.core.trace import get_aval
from spmd.launch import platform


# The spmd collective each operation implements (named in timeout messages).
_NAMES = {"all_gather": "all_gather", "reduce_scatter": "psum_scatter",
          "all_to_all": "all_to_all", "ppermute": "ppermute"}
_REDUCE_NAMES = {"sum": "psum", "max": "pmax", "min": "pmin"}


def backend():
    """The module that moves data between processes (a
    :class:`spmd.collectives.backend.Transport`): ``nccl`` for GPU devices when NCCL is
    available (and not ``SPMD_GPU_BACKEND=mpi``), else ``mpi``."""
    if platform.current() == "gpu" and platform.gpu_backend() == "nccl":
        return nccl
    return mpi


def _backend_op(x, op: str) -> str:
    """The backends reduce bools as uint8 0/1 and cast back, so a sum is "any": send
    it as a max, which a uint8 sum is not past 255 members (it wraps to False)."""
    return "max" if op == "sum" and get_aval(x).dtype == np.bool_ else op


class ProcessGroup:
    """Collectives over ``axes`` for the local devices ``local`` (flat mesh positions) of
    this process; ``procs[f]`` is the process owning flat position ``f``."""

    def __init__(self, names, sizes, axes, local, procs, me):
        self.local_group = LocalGroup(names, sizes, axes)
        # The Transport (spmd.collectives.backend) that moves blocks: mpi or nccl.
        self.comm = backend()
        self.names, self.sizes, self.axes = tuple(names), tuple(sizes), tuple(axes)
        self.local, self.procs, self.me = tuple(local), tuple(procs), me
        self.n = len(procs)
        self.stacked = len(self.local)  # only this process's devices are stacked
        coords = np.array(np.unravel_index(np.arange(self.n), self.sizes)).T  # (N, k)
        a_pos, b_pos = self.local_group.a_pos, self.local_group.b_pos
        self.na = self.local_group.na
        group_id = [tuple(c[b_pos]) for c in coords]
        position = []
        for c in coords:
            p = 0
            for i in a_pos:
                p = p * self.sizes[i] + int(c[i])
            position.append(p)
        self.position = position
        members: dict = {}
        for f in range(self.n):
            members.setdefault(group_id[f], [None] * self.na)[position[f]] = f
        self.members = members
        self.group_of = group_id
        self.fast = len(self.local) == 1 and all(
            len({procs[f] for f in m}) == self.na for m in members.values())
        if self.fast:
            f = self.local[0]
            self.ranks = tuple(procs[g] for g in members[group_id[f]])
            self.pos = position[f]
        else:
            self.component = self._component()

    def _component(self) -> tuple:
        """The processes this one must exchange blocks with (sharing a group, transitively)."""
        parent = {p: p for p in set(self.procs)}

        def find(p):
            while parent[p] != p:
                parent[p] = parent[parent[p]]
                p = parent[p]
            return p

        for m in self.members.values():
            for f in m[1:]:
                parent[find(self.procs[f])] = find(self.procs[m[0]])
        root = find(self.me)
        return tuple(sorted(p for p in parent if find(p) == root))

    # -------------------------------------------------------- fast path
    def _strip(self, x):
        return reshape(x, tuple(get_aval(x).shape[1:]))

    def _stack(self, y):
        return reshape(y, (1,) + tuple(get_aval(y).shape)), 0

    # --------------------------------------------------- general path
    def _everyone(self, x, what: str):
        """The stacked blocks of every device of the mesh (zeros outside this component)."""
        shape = tuple(get_aval(x).shape[1:])
        dtype = get_aval(x).dtype
        if self.component == (self.me,):
            rows = {f: slice_in_dim(x, i, i + 1, axis=0) for i, f in enumerate(self.local)}
        else:
            gathered = self.comm.call("allgather", x, self.component,
                                      what=what)  # (P_c, L, *r)
            rows = {}
            for qi, q in enumerate(self.component):
                mine = [f for f in range(self.n) if self.procs[f] == q]
                for j, f in enumerate(mine):
                    row = slice_in_dim(slice_in_dim(gathered, qi, qi + 1, axis=0), j, j + 1,
                                       axis=1)
                    rows[f] = reshape(row, (1,) + shape)
        zero = full((1,) + shape, 0, dtype)
        return concatenate([rows.get(f, zero) for f in range(self.n)], 0)

    def _mine(self, out, d):
        if d is None:
            return out, None
        return concatenate([slice_in_dim(out, f, f + 1, axis=0) for f in self.local], 0) \
            if len(self.local) > 1 else slice_in_dim(out, self.local[0], self.local[0] + 1,
                                                     axis=0), 0

    def _general(self, method, x, *args):
        what = _NAMES[method] if method != "all_reduce" else _REDUCE_NAMES[args[0]]
        out, d = getattr(self.local_group, method)(self._everyone(x, what), *args)
        return self._mine(out, d)

    # ------------------------------------------------------ collectives
    def all_reduce(self, x, op: str):
        if not self.fast:
            return self._general("all_reduce", x, op)
        return self.comm.call("allreduce", x, self.ranks, op=_backend_op(x, op),
                              what=_REDUCE_NAMES[op]), 0

    def all_gather(self, x, axis: int, tiled: bool):
        if not self.fast:
            return self._general("all_gather", x, axis, tiled)
        g = self.comm.call("allgather", self._strip(x), self.ranks, what="all_gather")  # (nA, *r)
        r = tuple(get_aval(g).shape[1:])
        perm = tuple(range(1, 1 + axis)) + (0,) + tuple(range(1 + axis, 1 + len(r)))
        g = transpose(g, perm)
        if tiled:
            shape = get_aval(g).shape
            g = reshape(g, shape[:axis] + (shape[axis] * shape[axis + 1],) + shape[axis + 2:])
        return self._stack(g)

    def reduce_scatter(self, x, dim: int, tiled: bool):
        if not self.fast:
            return self._general("reduce_scatter", x, dim, tiled)
        v = self._strip(x)
        r = tuple(get_aval(v).shape)
        c = r[dim] // self.na
        v = reshape(v, r[:dim] + (self.na, c) + r[dim + 1:])
        v = transpose(v, (dim,) + tuple(i for i in range(len(r) + 1) if i != dim))
        out = self.comm.call("reduce_scatter", v, self.ranks, op=_backend_op(v, "sum"),
                             what="psum_scatter")  # r with c at dim
        if not tiled:
            out = reshape(out, r[:dim] + r[dim + 1:])
        return self._stack(out)

    def all_to_all(self, x, split_axis: int, concat_axis: int):
        if not self.fast:
            return self._general("all_to_all", x, split_axis, concat_axis)
        v = self._strip(x)
        r = tuple(get_aval(v).shape)
        s, c = split_axis, r[split_axis] // self.na
        v = reshape(v, r[:s] + (self.na, c) + r[s + 1:])
        v = transpose(v, (s,) + tuple(i for i in range(len(r) + 1) if i != s))
        got = self.comm.call("alltoall", v, self.ranks, what="all_to_all")  # (nA_src, *r, c at s)
        rr = tuple(get_aval(got).shape[1:])
        order = []
        for i in range(len(rr)):
            order += [0, 1 + i] if i == concat_axis else [1 + i]
        got = transpose(got, tuple(order))
        shape = get_aval(got).shape
        k = concat_axis
        return self._stack(reshape(got, shape[:k] + (shape[k] * shape[k + 1],) + shape[k + 2:]))

    def ppermute(self, x, perm):
        if not self.fast:
            return self._general("ppermute", x, perm)
        dst = next((d for s, d in perm if s == self.pos), None)
        src = next((s for s, d in perm if d == self.pos), None)
        # A member with neither partner still issues the (empty) exchange, which
        # returns zeros: every process's program then has the same collectives in
        # the same order with the same data dependences, which collective
        # combining (spmd.compiler.passes.combine) relies on to group them alike on
        # every rank, and the group's communicator is made by all its members.
        return self.comm.call("sendrecv", x, self.ranks, dst=dst, src=src, what="ppermute"), 0

    def axis_index(self):
        return np.array([self.position[f] for f in self.local], np.int32), 0

    def scale(self, x, dim):
        return mul(x, np.array(self.na, get_aval(x).dtype)[()]), dim

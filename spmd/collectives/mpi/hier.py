"""Hierarchical collectives for communicators whose members span several nodes.

Between nodes the link is slow; inside a node the members share memory.  A flat
all-reduce over ranks on ``M`` nodes of ``L`` ranks each sends every byte of
every member between nodes.  Here a sum of ``N`` elements becomes three steps
(``psum``, and ``pmean`` which is a ``psum`` then a division):

1. **within each node**, a reduce-scatter over the node's ``L`` members (the
   operand cut into ``L`` equal chunks, zero-padded to a multiple of ``L``):
   node member ``j`` gets the node's partial sum of chunk ``j``.  It runs through
   :func:`spmd.collectives.mpi.reduce_scatter`, which takes the node's shared
   window (:mod:`spmd.collectives.mpi.shm`) from its size range on;
2. **across nodes**, in parallel for every ``j``: the members of local index
   ``j`` on the ``M`` nodes all-reduce chunk ``j`` (MPI, one chunk of ``N / L``
   elements each: the traffic between nodes is ``1/L`` of the flat call's);
3. **within each node**, an all-gather of the ``L`` reduced chunks.

A sum whose nodes have shared windows runs the three steps in one exchange of
the node's window (:meth:`spmd.collectives.mpi.shm.Segment.allreduce_sum` with
``across``): every member copies its operand in (but for its own part), adds its
own part of the members' operands, sums that part across nodes, writes it back to
its slot, and after the window's second barrier copies the other members' parts
out.  Against the three separate steps this saves a barrier, a copy-in and the
calls' bookkeeping: on 2 emulated nodes x 2 ranks a 256 KiB sum took 0.65-0.72x
MPI's ``Allreduce`` against 0.96x for the three steps (docs/performance.md,
"Several nodes").  Between two nodes, step 2 is one exchange with the other
node's member of the same local index and an addition (``mine + theirs``: IEEE
addition commutes, so both hold the same bits), on a communicator of its own
(a user's ``ppermute`` over the same ranks cannot take its message); MPI's
all-reduce of two members costs two exchanges from 2 KiB up.  From three nodes
step 2 is MPI's all-reduce.  Whether the nodes' windows exist is agreed over
every member once (a node without room in ``/dev/shm`` sends every node through
the three separate steps).

``psum_scatter`` (reduce-scatter) is step 1 on the rows each cross-node group
needs (the rows of its members), then a reduce-scatter across nodes;
``all_gather`` is an all-gather across nodes (each member gathers the blocks of
its local index), then one within the node, and the rows put back in member
order.

**Summation order.**  Element ``e`` of a sum is ``T_0 + T_1 + ... + T_{M-1}``
where ``T_a`` is node ``a``'s partial sum of ``e`` over its members in member
order (the shared window adds in member order; below its size range MPI's
``Reduce_scatter_block`` adds in its own order), and the node partials are
combined in the order of MPI's all-reduce across nodes (with two nodes: exactly
``T_0 + T_1``).  The flat call adds the ``n`` terms in MPI's order instead, so
the two differ within float summation error (a few ulps of the summed
magnitudes), and integer sums are equal.  Every member ends with the same bits:
each element is reduced by one cross-node group, whose members all compute the
same sum (MPI's all-reduce combines pairs symmetrically and IEEE addition
commutes), and is then copied to every member of its node.

**When.**  A plan is made once per communicator, at its first operand of
:func:`min_bytes` or more, collectively over its members: their nodes
(:func:`spmd.launch.nodes.split_by_node`, real nodes split further by
``SPMD_SIMULATE_NODES``) are exchanged over the control communicator.  A
communicator gets a plan when its members are on 2 or more nodes with the same
number of members on each, and at least 2 members per node; otherwise (one node,
one member per node, or nodes of different sizes such as 2 + 1) its collectives
stay flat.  Every member derives the plan from the same exchanged layout and
every operand's size is the same on every member, so all members take the same
path.  ``max`` and ``min`` reduce the same way (every step through MPI's own
``MAX``/``MIN``: the shared window only sums); integer and widened types
(float16, bfloat16, bool) too.

A started sum (:func:`spmd.collectives.mpi.iallreduce`, the overlap pass's)
runs step 1 at its start (a node-local exchange, fast), starts step 2 without
waiting (the slow part overlaps the computation that follows), and runs step 3
at its wait.

>>> plan = plan_of((0, 1, 2, 3))  # doctest: +SKIP
>>> plan.nodes, plan.per_node, plan.calls["allreduce"]  # doctest: +SKIP
(2, 2, 5)
"""

from __future__ import annotations

import numpy as np

from spmd.collectives.mpi import shm as mpi_shm
from spmd.collectives.mpi.buffers import recv_buffer
from spmd.collectives.mpi.control import Collective, Site, control
from spmd.collectives.mpi.settings import HIER_MIN_BYTES, min_bytes  # noqa: F401
from spmd.launch import nodes

class Plan:
    """How the members of one communicator reduce through their nodes.

    ``members[a][j]``: the member index (position in the communicator) of node
    ``a``'s ``j``-th member; nodes are ordered by their first member, a node's
    members by their position.  ``node_ranks``: this member's node, as world ranks;
    ``cross_ranks``: the members of this one's local index on every node.
    ``calls`` counts the operations that took this plan, by kind."""

    def __init__(self, ranks: tuple, members: list, me: int):
        self.ranks, self.members = ranks, members
        self.nodes, self.per_node = len(members), len(members[0])
        node, local = next((a, j) for a, m in enumerate(members) for j, i in enumerate(m)
                           if i == me)
        self.node, self.local = node, local
        self.node_ranks = tuple(ranks[i] for i in members[node])
        self.cross_ranks = tuple(ranks[m[local]] for m in members)
        n, count = len(ranks), self.nodes
        # Rows in the order the steps produce them (local index major, node minor),
        # and back: None where that order is member order already.
        order = [m[j] for j in range(self.per_node) for m in members]
        back = [0] * n
        for pos, i in enumerate(order):
            back[i] = pos
        self.order = None if order == list(range(n)) else np.array(order, np.intp)
        self.back = None if back == list(range(n)) else np.array(back, np.intp)
        self.calls = {"allreduce": 0, "reduce_scatter": 0, "allgather": 0, "started": 0}
        self.node_comm = self.cross_comm = self.pair = None  # (made by _make)
        self.fused = None  # (the node's window, whether every node has one)
        assert len(order) == n and count * self.per_node == n

    def __repr__(self):
        return (f"Plan(ranks={list(self.ranks)}, nodes={self.nodes}, per_node={self.per_node}, "
                f"node_ranks={list(self.node_ranks)}, cross_ranks={list(self.cross_ranks)})")

    # ----------------------------------------------------------- the operations

    def _chunks(self, buf: np.ndarray) -> np.ndarray:
        """``buf`` as ``(per_node, chunk)`` rows, zero-padded past its end when its
        length is not a multiple of ``per_node``."""
        flat, L = buf.reshape(-1), self.per_node
        if flat.size % L == 0:
            return flat.reshape(L, -1)
        padded = recv_buffer((L, -(-flat.size // L)), flat.dtype)
        whole = padded.reshape(-1)
        whole[:flat.size] = flat
        whole[flat.size:] = 0
        return padded

    def _spread(self, part: np.ndarray, shape: tuple, what) -> np.ndarray:
        """Step 3: every node member's reduced chunk, gathered and cut to ``shape``."""
        whole = _mpi.allgather(part, self.node_ranks, what).reshape(-1)
        size = int(np.prod(shape, dtype=np.int64))
        return (whole if whole.size == size else whole[:size]).reshape(shape)

    def allreduce(self, buf: np.ndarray, op: str, what) -> np.ndarray:
        """The all-reduce of ``buf`` (contiguous, of a type MPI reduces) over the
        communicator: node reduce-scatter, cross-node all-reduce, node all-gather.  A
        sum whose node has a shared window runs the three in one exchange of it
        (:meth:`spmd.collectives.mpi.shm.Segment.allreduce_sum` with ``across``)."""
        self.calls["allreduce"] += 1
        lo, hi = mpi_shm.size_range()
        if op == "sum" and hi > 0 and buf.nbytes >= lo:
            with Collective(self.ranks, what) as c:
                c.nbytes = buf.nbytes
                seg = mpi_shm.segment_for(self.node_ranks, self.node_comm, buf.nbytes,
                                          "allreduce")
                if self.fused is None or self.fused[0] is not seg:
                    # Every node must take the same path (one node's members exchanging
                    # inside their window while the other's wait in MPI's reduce-scatter
                    # would never meet): agreed over the control communicator at the
                    # first sum in the window's range (a node may lack the room), and
                    # again after the windows were reset (tests).
                    self.fused = (seg, all(control(self.ranks).allgather(seg is not None)))
                if self.fused[1]:
                    out = recv_buffer(buf.shape, buf.dtype)
                    seg.allreduce_sum(buf, out, self._across)
                    return out
        part = _mpi.reduce_scatter(self._chunks(buf), self.node_ranks, op, what)
        if op == "sum":
            with Collective(self.cross_ranks, what) as c:
                c.nbytes = part.nbytes
                self._across(part)
        else:
            part = _mpi.allreduce(part, self.cross_ranks, op, what)
        return self._spread(part, buf.shape, what)

    def _across(self, part: np.ndarray) -> None:
        """Step 2 of a sum, in place on this member's contiguous ``part`` of its node's
        sum: the sum over the nodes.  Between two nodes one exchange with the other
        node's member of this local index, then ``mine + theirs`` (the same bits on
        both: IEEE addition commutes); MPI's all-reduce counts two (its reduce-scatter
        and all-gather) from 2 KiB up.  From three nodes, MPI's all-reduce."""
        if self.nodes == 2:
            theirs = recv_buffer(part.shape, part.dtype)
            peer = 1 - self.node
            self.pair.Sendrecv(part, peer, 0, theirs, peer, 0)
            np.add(part, theirs, out=part)
        else:
            from mpi4py import MPI

            self.cross_comm.Allreduce(MPI.IN_PLACE, part, op=MPI.SUM)

    def reduce_scatter(self, buf: np.ndarray, op: str, what) -> np.ndarray:
        """Row ``me`` of the sum of every member's ``buf`` (leading axis: the members):
        the rows of each cross-node group reduced within the node, then across nodes."""
        self.calls["reduce_scatter"] += 1
        rows = buf
        if self.order is not None:
            rows = recv_buffer(buf.shape, buf.dtype)
            np.take(buf, self.order, axis=0, out=rows)
        rows = rows.reshape((self.per_node, self.nodes) + buf.shape[1:])
        part = _mpi.reduce_scatter(rows, self.node_ranks, op, what)  # (nodes, *row)
        return _mpi.reduce_scatter(part, self.cross_ranks, op, what)

    def allgather(self, src: np.ndarray, what) -> np.ndarray:
        """Every member's ``src`` stacked in member order: gathered across nodes (the
        blocks of this local index), then within the node, then put in order."""
        self.calls["allgather"] += 1
        across = _mpi.allgather(src, self.cross_ranks, what)           # (nodes, *s)
        both = _mpi.allgather(across, self.node_ranks, what)           # (per_node, nodes, *s)
        rows = both.reshape((len(self.ranks),) + src.shape)
        if self.back is None:
            return rows
        out = recv_buffer(rows.shape, rows.dtype)
        np.take(rows, self.back, axis=0, out=out)
        return out

    def start(self, buf: np.ndarray, op: str, what, orig, xp) -> "Started":
        """Start the all-reduce of ``buf``: step 1 now, step 2 started, step 3 at the
        returned request's ``wait()``."""
        self.calls["started"] += 1
        part = _mpi.reduce_scatter(self._chunks(buf), self.node_ranks, op, what)
        req = _mpi.iallreduce(part, self.cross_ranks, op, what)
        return Started(self, req, buf.shape, orig, what, xp)


class Started:
    """A started hierarchical all-reduce (:meth:`Plan.start`), with the interface of
    :class:`spmd.collectives.mpi.Request`: ``test()`` moves the cross-node step on,
    ``wait()`` completes it, gathers the chunks in the node and returns the sum."""

    __slots__ = ("plan", "req", "shape", "orig", "what", "xp")

    def __init__(self, plan: Plan, req, shape: tuple, orig, what, xp):
        self.plan, self.req, self.shape, self.orig = plan, req, shape, orig
        self.what, self.xp = what, xp

    def test(self) -> bool:
        return self.req.test()

    def wait(self):
        out = self.plan._spread(self.req.wait(), self.shape, self.what)
        if self.orig is not None:
            out = out.astype(self.orig)
        return out if self.xp is np else self.xp.asarray(out)


# ------------------------------------------------------------------- the plans

plans: dict = {}  # ranks -> Plan, or None where the collectives stay flat


def plan_of(ranks: tuple):
    """The plan made for the communicator of world ``ranks`` (None: flat, or none made
    yet): for tests and reports.

    >>> plan_of((0,)) is None
    True
    """
    return plans.get(ranks)


def plan_for(ranks: tuple, comm, what=None):
    """The :class:`Plan` of ``ranks`` (whose data communicator is ``comm``), or None
    where collectives over them stay flat.  The first call for ``ranks`` is collective
    over them (every member calls it at the same point: for the same operand)."""
    plan = plans.get(ranks, False)
    return plan if plan is not False else _make(ranks, comm, what)


def _make(ranks: tuple, comm, what):
    """Exchange the members' nodes, build the plan (None: flat) and keep it."""
    if len(ranks) < 4:  # two nodes of two members at least
        plans[ranks] = None
        return None
    site = what.setting_up() if isinstance(what, Site) else \
        Site(str(what or "a collective"), phase="finding the nodes of its ranks")
    with Collective(ranks, site, control_traffic=True, checked=False):
        plan = plans.get(ranks, False)
        if plan is not False:  # another thread of this process made it meanwhile
            return plan
        ctl = control(ranks)
        # Every member first agrees on the simulated nodes (each raises alike when they
        # differ): one raising alone inside the split would strand the others there.
        nodes.check_agreed(ctl.allgather(nodes.reading()), ranks)
        node = nodes.split_by_node(comm)
        first = node.bcast(comm.Get_rank(), root=0)  # the node's first member names it
        node.Free()
        leaders = ctl.allgather(first)
        members = layout(leaders)
        plan = plans[ranks] = None if members is None else \
            Plan(ranks, members, comm.Get_rank())
    if plan is None:
        return None
    # The step communicators, made now at one point of every member's program (each
    # collective over its own members only: the node's first, then the cross group's).
    plan.node_comm = _mpi.communicator(plan.node_ranks, what)
    plan.cross_comm = _mpi.communicator(plan.cross_ranks, what)
    # The exchange between two nodes has a communicator of its own: on the cross
    # group's, which a user's ppermute over the same ranks shares, its message could
    # pair with theirs.
    plan.pair = plan.cross_comm.Dup() if plan.nodes == 2 else None
    return plan


def layout(leaders: list):
    """``members[a][j]`` from each member's node label (``leaders[i]``, the same on the
    members of one node), or None when the hierarchy does not apply: one node, one
    member per node, or nodes of different sizes.

    >>> layout([0, 0, 2, 2])
    [[0, 1], [2, 3]]
    >>> layout([0, 0, 2]) is None, layout([0, 1, 2]) is None, layout([0, 0, 0]) is None
    (True, True, True)
    """
    groups: dict = {}
    for i, label in enumerate(leaders):
        groups.setdefault(label, []).append(i)
    members = sorted(groups.values(), key=lambda m: m[0])
    sizes = {len(m) for m in members}
    if len(members) < 2 or len(sizes) != 1 or sizes.pop() < 2:
        return None
    return members


def reset() -> None:
    """Forget the plans and read ``SPMD_MPI_HIER_MIN_BYTES`` again (tests; every member
    calls it at the same point)."""
    for plan in plans.values():
        if plan is not None and plan.pair is not None:
            plan.pair.Free()
    plans.clear()
    min_bytes.cache_clear()


# Last, and the package (its operations read when called): spmd.collectives.mpi.calls
# imports this module and reads ``plans`` as it loads, so whichever of the two is
# imported first, everything above exists by then.
from spmd.collectives import mpi as _mpi  # noqa: E402

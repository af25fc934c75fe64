"""The ``mpi`` primitive: one effectful primitive whose ``kind`` says which MPI call it
makes, its rules (shape, start without waiting, the bound call generated code makes),
and :func:`call`, which binds it.

>>> from spmd.collectives import mpi
>>> mpi.call("allgather", x, (0, 1), what="all_gather")  # doctest: +SKIP
"""

from __future__ import annotations

import sys

import numpy as np

from spmd.collectives.backend import bound, run
from spmd.collectives.mpi.buffers import POOL_MIN_BYTES, WIDEN, reduce_op
from spmd.collectives.mpi.calls import allreduce, hier_plan, split_slice
from spmd.collectives.mpi import shm as mpi_shm
from spmd.collectives.mpi.communicators import communicator
from spmd.collectives.mpi.control import Collective, site_here
from spmd.collectives.mpi.nonblocking import iallreduce, isendrecv
from spmd.collectives.transport import define_rules
from spmd.compiler.core.trace import bind
from spmd.compiler.core.primitives import Primitive


def _mpi_start(xp, x, *, kind, ranks, op=None, dst=None, src=None, what=None):
    """The ``start`` rule (spmd.compiler.passes.overlap) of the ``mpi`` primitive: an
    all-reduce or a send-receive (a ``ppermute``) started without waiting."""
    host = np.asarray(x) if xp is np else xp.asnumpy(x)
    if kind == "sendrecv":
        return isendrecv(host, ranks, dst, src, what, xp)
    if kind != "allreduce":
        raise ValueError(f"mpi: only an all-reduce or a send-receive can be started "
                         f"without waiting, not {kind!r}")
    return iallreduce(host, ranks, op, what, xp)


# --------------------------------------------------------- the primitive
#
# The transport (backend.Transport) whose operations the impl and the bound calls
# look up is the package, ``spmd.collectives.mpi``: its names are the interface.

mpi_p = Primitive("mpi", traits=(), effectful=True)


@mpi_p.def_impl
def _mpi_impl(xp, x, *, kind, ranks, op=None, dst=None, src=None, what=None):
    # GPU arrays are staged through host memory (NCCL is the GPU path).
    host = np.asarray(x) if xp is np else xp.asnumpy(x)
    out = run(sys.modules[__package__], kind, host, ranks,
              {"op": op, "dst": dst, "src": src, "what": what})
    return out if xp is np else xp.asarray(out)


define_rules(mpi_p, "mpi")
mpi_p.rules.start = _mpi_start  # its all-reduces may overlap compute
# A send-receive starts on its own (it is never combined with another): the overlap
# pass waits for it where its result is first needed.
mpi_p.rules.starts_alone = lambda eqn: eqn.params["kind"] == "sendrecv"

# The blocking kinds, whose impl on host arrays is exactly the backend call.
_DIRECT_KINDS = frozenset({"allreduce", "allgather", "reduce_scatter", "alltoall", "sendrecv"})


class _BoundAllreduce:
    """:func:`allreduce` with its parameters bound, for one equation of generated code.

    Its first call of an operand's shape and dtype runs :func:`allreduce` and notes
    whether that was MPI's own ``Allreduce`` into a fresh array (a contiguous operand of
    a type MPI reduces, below the shared-memory, split and pool sizes: choices fixed by
    the size and the settings, read once).  Later calls of that shape and dtype make
    just that call, inside the same bookkeeping (:class:`Collective`, reused: a call
    sets every field it reads), so the per-call cost is the deadline's and thread
    rules' record and the array, not the choosing."""

    __slots__ = ("ranks", "op", "what", "fast", "record")

    def __init__(self, ranks: tuple, op: str, what):
        self.ranks, self.op, self.what = ranks, op, what
        self.fast = None    # (shape, dtype, communicator, MPI op) once known
        self.record = None  # the Collective reused by the fast calls

    def __call__(self, x):
        fast = self.fast
        if fast is None or x.__class__ is not np.ndarray or x.shape != fast[0] \
                or x.dtype is not fast[1] or not x.flags.c_contiguous:
            return self._first(x)
        out = np.empty(fast[0], fast[1])
        with self.record:
            fast[2].Allreduce(x, out, op=fast[3])
        return out

    def _first(self, x):
        out = allreduce(x, self.ranks, self.op, self.what)
        if self.fast is None and type(x) is np.ndarray and x.flags.c_contiguous \
                and x.dtype not in WIDEN \
                and x.dtype.kind != "V" and x.nbytes < POOL_MIN_BYTES:
            comm = communicator(self.ranks, self.what)
            shm = self.op == "sum" and mpi_shm.segment_for(self.ranks, comm, x.nbytes,
                                                           "allreduce")
            if not shm and split_slice(comm, x, x, len(self.ranks)) is None \
                    and hier_plan(self.ranks, comm, x.nbytes, self.what) is None:
                self.record = Collective(self.ranks, self.what)
                self.record.nbytes = x.nbytes  # (the fast calls' shape is this one)
                self.fast = (x.shape, x.dtype, comm, reduce_op(self.op))
        return out


def _bind_impl(xp, *, kind, ranks, op=None, dst=None, src=None, what=None):
    """For generated code on numpy: the backend operation itself, its parameters bound
    (no impl frame, kind lookup or keyword dict per call); None: the impl."""
    if xp is not np or kind not in _DIRECT_KINDS:
        return None
    if kind == "allreduce":
        return _BoundAllreduce(ranks, op, what)
    return bound(sys.modules[__package__], kind, ranks,
                 {"op": op, "dst": dst, "src": src, "what": what})


mpi_p.rules.bind_impl = _bind_impl
mpi_p.rules.communicates = True


def call(kind, x, ranks, **params):
    """Bind the ``mpi`` primitive; ``what=`` names the spmd collective it implements (for
    the timeout message)."""
    if "what" in params:  # where it comes from, for deadline reports (at trace time)
        params["what"] = site_here(params["what"])
    return bind(mpi_p, x, kind=kind, ranks=tuple(int(r) for r in ranks), **params)

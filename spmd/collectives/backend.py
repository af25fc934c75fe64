"""The collective backends' interfaces, written down.

Two levels, each a ``Protocol``:

- :class:`Group`: the collective operations over one group of devices (the
  devices that share their coordinates off a set of mesh axes), on a
  per-device program's stacked blocks.  The collective primitives' batching
  rules call these; :class:`spmd.collectives.local.LocalGroup` (every device in
  this process) and :class:`spmd.collectives.process_group.ProcessGroup` (devices
  spread over processes) implement them.
- :class:`Transport`: moves blocks between processes, one module per backend
  (:mod:`spmd.collectives.mpi`, :mod:`spmd.collectives.nccl`): the five operations
  of :data:`KINDS` and ``call``, which binds the backend's effectful primitive so
  that the transfer is an equation of the per-process program.

:data:`KINDS` is the one table of transport kinds: each kind's shape rule (used by
:func:`spmd.collectives.transport.define_rules` for every transport primitive) and
the operation and parameters a transport's implementation calls (:func:`run`, the
dispatch every transport shares).

>>> KINDS["allgather"].shape((4, 2), 3)
(3, 4, 2)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable


@runtime_checkable
class Group(Protocol):
    """Collectives over one group of ``na`` devices; values are stacked blocks
    (``stacked`` devices along axis 0).  Each returns ``(value, batch_dim)``, the
    batch dim ``None`` for a value that is the same on every device."""

    stacked: int
    na: int

    def all_reduce(self, x, op: str) -> tuple: ...

    def all_gather(self, x, axis: int, tiled: bool) -> tuple: ...

    def reduce_scatter(self, x, dim: int, tiled: bool) -> tuple: ...

    def all_to_all(self, x, split_axis: int, concat_axis: int) -> tuple: ...

    def ppermute(self, x, perm) -> tuple: ...

    def axis_index(self) -> tuple: ...

    def scale(self, x, dim) -> tuple: ...


@runtime_checkable
class Transport(Protocol):
    """A backend moving blocks between processes (``ranks``: world ranks, in group
    order; ``what`` names the spmd collective for error messages)."""

    def call(self, kind: str, x, ranks, **params) -> Any: ...

    def allreduce(self, x, ranks, op: str, what: str | None = None) -> Any: ...

    def allgather(self, x, ranks, what: str | None = None) -> Any: ...

    def reduce_scatter(self, x, ranks, op: str = "sum", what: str | None = None) -> Any: ...

    def alltoall(self, x, ranks, what: str | None = None) -> Any: ...

    def sendrecv(self, x, ranks, dst, src, what: str | None = None) -> Any: ...


@runtime_checkable
class Request(Protocol):
    """A collective started without waiting (a transport's optional ``iallreduce``:
    :func:`spmd.collectives.mpi.iallreduce`).  The code generated for an overlapped
    bucket (:mod:`spmd.compiler.passes.overlap`) calls ``test()`` between the equations that
    follow its start and ``wait()`` where the result is first needed.  A transport
    without it (``nccl``) runs its all-reduces blocking."""

    def test(self) -> bool: ...

    def wait(self) -> Any: ...


class Kind(NamedTuple):
    """One transport kind: ``op`` (the Transport operation), ``params`` (what it takes
    after ``x, ranks``), ``shape(in_shape, n) -> out_shape`` over ``n`` ranks, and
    ``reduces`` (linear only for ``op='sum'``)."""

    op: str
    params: tuple
    shape: Callable
    reduces: bool = False


KINDS: dict[str, Kind] = {
    "allreduce": Kind("allreduce", ("op", "what"), lambda s, n: s, reduces=True),
    "allgather": Kind("allgather", ("what",), lambda s, n: (n,) + tuple(s)),
    "reduce_scatter": Kind("reduce_scatter", ("op", "what"), lambda s, n: tuple(s[1:]),
                           reduces=True),
    "alltoall": Kind("alltoall", ("what",), lambda s, n: s),
    "sendrecv": Kind("sendrecv", ("dst", "src", "what"), lambda s, n: s),
}


def kind(name: str, backend: str) -> Kind:
    """The row of ``name``, or ValueError naming the kinds there are."""
    k = KINDS.get(name)
    if k is None:
        raise ValueError(f"{backend}: unknown transport kind {name!r}; the kinds are "
                         f"{sorted(KINDS)} (spmd.collectives.backend.KINDS)")
    return k


def run(transport, name: str, x, ranks, params: dict):
    """Call ``transport``'s operation for kind ``name`` with the parameters it takes.

    >>> run(mpi, "allgather", x, (0, 1), {"what": "all_gather"})  # doctest: +SKIP
    """
    k = kind(name, getattr(transport, "__name__", str(transport)))
    return getattr(transport, k.op)(x, ranks, **{p: params.get(p) for p in k.params})


def bound(transport, name: str, ranks, params: dict) -> Callable:
    """``transport``'s operation for kind ``name`` with ``ranks`` and its parameters
    bound: ``bound(t, name, ranks, params)(x)`` is ``run(t, name, x, ranks, params)``
    without the per-call lookups (for generated code, which calls it on every run).

    >>> bound(mpi, "allreduce", (0, 1), {"op": "sum", "what": "psum"})(x)  # doctest: +SKIP
    """
    k = kind(name, getattr(transport, "__name__", str(transport)))
    return functools.partial(getattr(transport, k.op), ranks=ranks,
                             **{p: params.get(p) for p in k.params})

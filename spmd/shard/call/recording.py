"""What a program call adds to a trace (:mod:`spmd.launch.timeline.recorder`).

While a trace is on, each call of a compiled program (``spmd.jit``'s, see
:meth:`spmd.shard.call.jit.Jit.__call__`; and each eager ``shard_map`` call, run
on concrete blocks) records a span named after the function (``"jit(step)"``,
``"shard_map(f)"``), ``cat == "program"``, on the track of every device of this
process that it runs on (``tid`` = the device's global id): the devices of the
meshes its values are placed on and of the ``shard_map``s inside it; without any,
this process's first device, where an unplaced program runs.  After it, the
``memory`` counters of each such device (:mod:`spmd.shard.arrays.memory`) where they
changed since the last ones recorded (a counter track holds its value until its
next event; steady training steps end with the same numbers).  Nothing here
runs when no trace is on: the caller tests ``recorder.ACTIVE`` first.

>>> recorder.start()                                      # doctest: +SKIP
>>> program_called("step", plan, t0, t1)                  # doctest: +SKIP
>>> recorder.stop()["events"][0][:3]                      # doctest: +SKIP
('X', 'jit(step)', 'program')
"""

from __future__ import annotations

import weakref

from spmd.compiler.core.ir import ClosedProgram
from spmd.launch.timeline import recorder as _timeline
from spmd.mesh import Mesh
from spmd.mesh.devices import local_devices, process_index
from spmd.shard.arrays import memory

# Per traced program: the ids of this process's devices it runs on.
_devices: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def program_called(name: str, plan, t0: float, t1: float) -> None:
    """Record the call of ``plan`` (a jit's call plan) of function ``name`` from ``t0``
    to ``t1`` (``time.monotonic()``), and the memory of its devices after it."""
    if _timeline.ACTIVE is not None:
        ran(f"jit({name})", devices_of(plan), t0, t1)


def eager_called(label: str, mesh, t0: float, t1: float) -> None:
    """Record an eager ``shard_map`` call (``label``: ``"shard_map(f)"``) over ``mesh``
    from ``t0`` to ``t1``, and the memory of this process's devices of it after it."""
    if _timeline.ACTIVE is not None:
        me = process_index()
        ran(label, tuple(d.id for d in mesh.devices.flat if d.process_index == me), t0, t1)


def ran(label: str, tids: tuple, t0: float, t1: float) -> None:
    """A program's span on each device of ``tids``, then their memory counters."""
    r = _timeline.ACTIVE
    r.spans(label, "program", t0, t1, tids)
    if not memory.COUNTING:
        memory.start("trace")  # (a trace the launcher started: count from here)
    in_use, peak = memory.IN_USE, memory.PEAK  # (read here: one call per program call)
    if _last_of[0] is not r:
        _last.clear()
        _last_of[0] = r
    for tid in tids:
        now = (in_use.get(tid, 0), peak.get(tid, 0))
        if _last.get(tid) != now:  # (a counter holds its value until the next event)
            _last[tid] = now
            r.counter("memory", t1, tid, {"bytes_in_use": now[0], "peak_bytes_in_use": now[1]})


# Per recording: device id -> the memory counters last recorded (steady steps repeat them).
_last: dict = {}
_last_of: list = [None]


def devices_of(plan) -> tuple:
    """The ids of this process's devices that ``plan``'s program runs on (cached per
    program; see the module docstring)."""
    closed = plan.entry.closed
    hit = _devices.get(closed)
    if hit is None:
        meshes = []
        placed = getattr(getattr(plan, "plan", None), "mesh", None)  # (a Placed plan's)
        if placed is not None:
            meshes.append(placed)
        _meshes_in(closed, meshes)
        me = process_index()
        ids = sorted({d.id for m in meshes for d in m.devices.flat if d.process_index == me})
        hit = _devices[closed] = tuple(ids) or (local_devices()[0].id,)
    return hit


def _meshes_in(closed: ClosedProgram, out: list) -> None:
    """Append the meshes of the equations of ``closed`` (and of the programs in their
    parameters, e.g. a ``shard_map``'s or a nested ``jit``'s)."""
    for eqn in closed.program.eqns:
        for v in eqn.params.values():
            if isinstance(v, Mesh):
                out.append(v)
            elif isinstance(v, ClosedProgram):
                _meshes_in(v, out)

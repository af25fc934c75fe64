"""``spmd.profiler``: record a timeline of this process, with JAX's names.

``with spmd.profiler.trace(path):`` (or :func:`start_trace` / :func:`stop_trace`)
records, until it ends:

- each call of a compiled program (``"jit(step)"``, ``cat == "program"``) on the
  track of each device it runs on (``tid`` = the device's global id; simulated
  devices each get their own track);
- each collective among simulated devices (``cat == "collective"``, ``args``:
  ``comm``, ``seq``, ``op``, ``bytes``), one span per member device, split by the
  merge into a ``wait`` and a ``transfer`` phase.  Simulated devices run a
  collective together in one array operation, so their wait is ~0: that is what
  happens, not a lost measurement (:mod:`spmd.collectives.local`);
- checkpoint saves and restores, and the spans of :class:`TraceAnnotation`,
  :class:`StepTraceAnnotation` and :func:`annotate_function`, on the host track;
- after each program call, each of its devices' memory where it changed (``memory``
  counters: ``bytes_in_use``, ``peak_bytes_in_use``, :mod:`spmd.shard.arrays.memory`;
  counting begins with the trace, and ends with it unless ``Device.memory_stats()``
  asked for it meanwhile).

At the end the events are written as one Chrome trace (``{"traceEvents": [...]}``),
which Perfetto and ``chrome://tracing`` open.  ``path``: a file name ending in
``.json`` or ``.json.gz`` is written as it is; anything else is a directory
(created if needed) and the file is ``<path>/trace.json.gz``.

Programs compiled while a trace is on carry the markers of their collectives, and
are kept apart from those compiled without one: the first call of each jitted
function under a trace compiles it again (once; later traces reuse that program,
and calls after the trace the one from before).  Without a trace, annotations cost
one test of a module global.

In a job of several processes, every process calls :func:`start_trace` and
:func:`stop_trace` (they are collective, like a collective operation): the start
aligns the ranks' clocks (:mod:`spmd.launch.timeline.clock`), the stop gathers
every rank's events to rank 0, which writes the one merged file (on rank 0's
file system); each rank returns its path.  ``spmd-run --trace PATH`` records the
whole job instead, and its ranks then refuse a second recording.

>>> import spmd, numpy as np
>>> with spmd.profiler.trace("/tmp/spmd-trace"):                # doctest: +SKIP
...     with spmd.profiler.StepTraceAnnotation("train", step_num=0):
...         step(params, batch)
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import time

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.errors import SpmdError
from spmd.launch import mpi_init
from spmd.launch.timeline import clock, merge, recorder as _timeline
from spmd.mesh import process_count
from spmd.shard.arrays import memory

__all__ = ["trace", "start_trace", "stop_trace", "TraceAnnotation", "StepTraceAnnotation",
           "annotate_function", "ProfilerError"]

DEFAULT_FILE = "trace.json.gz"  # the file written in a directory ``path``


class ProfilerError(SpmdError, RuntimeError):
    """A trace started twice, stopped without a start, or given a path it cannot write."""


# The file the recording in progress will be written to (None: no trace of this module).
_file: list = [None]


def start_trace(log_dir, create_perfetto_link: bool = False,
                create_perfetto_trace: bool = False) -> None:
    """Begin recording this process's timeline, to be written to ``log_dir`` by
    :func:`stop_trace` (a ``.json``/``.json.gz`` file, else a directory holding
    ``trace.json.gz``; checked writable now).  The two flags are JAX's, accepted and
    ignored: the file is Chrome trace JSON, which Perfetto opens.

    >>> spmd.profiler.start_trace("/tmp/run1")          # doctest: +SKIP
    >>> step(x); spmd.profiler.stop_trace()             # doctest: +SKIP
    """
    if _timeline.ACTIVE is not None:
        raise ProfilerError(
            "spmd.profiler.start_trace: a trace is already being recorded in this process "
            f"(to {_file[0] or 'the launcher (spmd-run --trace)'}); call "
            "spmd.profiler.stop_trace() first, or use one spmd.profiler.trace(...) block")
    if process_count() > 1:
        path = _start_ranks(log_dir)
    else:
        path = output_file(log_dir)
        _timeline.start()
    _file[0] = path
    _counting_starts()


def stop_trace() -> str:
    """End the recording :func:`start_trace` began and write it (merged into one Chrome
    trace, :mod:`spmd.launch.timeline.merge`); the file's path.

    >>> spmd.profiler.stop_trace()                      # doctest: +SKIP
    '/tmp/run1/trace.json.gz'
    """
    path = _file[0]
    if path is None:
        raise ProfilerError(
            "spmd.profiler.stop_trace: no trace was started by spmd.profiler in this process "
            "(call spmd.profiler.start_trace(path) first; a trace of spmd-run --trace ends "
            "with the job)")
    _file[0] = None
    part = _timeline.stop()
    _counting_ends()
    if process_count() > 1:
        return _stop_ranks(part, path)
    return write(part, path)


@contextlib.contextmanager
def trace(log_dir, create_perfetto_link: bool = False, create_perfetto_trace: bool = False):
    """Record this process's timeline inside the block and write it at its end (even
    when the block raises): :func:`start_trace` / :func:`stop_trace` as a context
    manager.

    >>> with spmd.profiler.trace("/tmp/t.json.gz"):     # doctest: +SKIP
    ...     step(x)
    """
    start_trace(log_dir, create_perfetto_link, create_perfetto_trace)
    try:
        yield
    finally:
        stop_trace()


# ------------------------------------------------------------ the small steps

def output_file(log_dir) -> str:
    """The file a trace to ``log_dir`` is written to (see the module docstring), its
    directory made and checked writable.

    >>> output_file("/tmp/x.json")
    '/tmp/x.json'
    """
    path = os.fspath(log_dir)
    if not path:
        raise ProfilerError("spmd.profiler: log_dir is empty; give a directory or a file "
                            "name ending in .json or .json.gz")
    if not path.endswith((".json", ".json.gz")):
        path = os.path.join(path, DEFAULT_FILE)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ProfilerError(f"spmd.profiler: cannot create the directory {folder!r} for the "
                            f"trace {path!r} ({e}); give a path in a writable place") from e
    if not os.access(folder, os.W_OK | os.X_OK) or os.path.isdir(path):
        raise ProfilerError(f"spmd.profiler: cannot write the trace {path!r} (its directory "
                            f"{folder!r} is not writable, or the path is a directory); give "
                            "a path in a writable place")
    return path


def write(part: dict, path: str) -> str:
    """Merge one process's recorded ``part`` into a Chrome trace and write it to ``path``."""
    return write_parts([part], path)


# ------------------------------------------------------- several processes
#
# Rank 0 checks the path and writes the file; every rank learns its verdict, so that
# a path bad on rank 0 raises on every rank alike (instead of leaving the others in
# the clock's exchange).  One duplicate of the world communicator carries it all: no
# message of the program pairs with these.

_comm: list = [None]


def _world():
    if _comm[0] is None:
        _comm[0] = mpi_init.world().Dup()
    return _comm[0]


def _on_rank0(comm, fn):
    """``fn()`` on rank 0, its result (or its error, raised as a ProfilerError) on every
    rank: whatever rank 0 meets, the others are told instead of left waiting."""
    result = None
    if comm.Get_rank() == 0:
        try:
            result = ("ok", fn())
        except ProfilerError as e:
            result = ("error", str(e))
        except Exception as e:  # noqa: BLE001 - every rank must hear of it
            result = ("error", f"spmd.profiler: on rank 0: {type(e).__name__}: {e}")
    kind, value = comm.bcast(result, root=0)
    if kind == "error":
        raise ProfilerError(value)
    return value


def _start_ranks(log_dir) -> str:
    """Every rank's recording, its clock aligned with rank 0's (collective)."""
    comm = _world()
    path = _on_rank0(comm, lambda: output_file(log_dir))
    _timeline.start(rank=comm.Get_rank(), host=socket.gethostname())
    clock.align(comm)
    return path


def _stop_ranks(part: dict, path: str) -> str:
    """Every rank's events gathered to rank 0, merged and written there (collective)."""
    comm = _world()
    parts = comm.gather(part, root=0)

    def written():
        try:
            return write_parts(parts, path)
        except (OSError, ValueError) as e:
            raise ProfilerError(f"spmd.profiler.stop_trace: cannot write the trace {path!r} "
                                f"({e})") from e
    return _on_rank0(comm, written)


def write_parts(parts: list, path: str) -> str:
    """Merge the recorded ``parts`` (one per process) and write them to ``path``."""
    merge.write(merge.merge(parts), path)
    return path


def _counting_starts() -> None:
    """Memory counting begins with the trace (one scan of the live Arrays)."""
    memory.start("trace")


def _counting_ends() -> None:
    memory.release("trace")


# ---------------------------------------------------------------- annotations

class TraceAnnotation:
    """A span of host work on the trace (``cat == "user"``), named ``name``, with
    ``kwargs`` as its ``args``; nothing (one test) when no trace is on.

    >>> with spmd.profiler.TraceAnnotation("load batch", shard=3):   # doctest: +SKIP
    ...     batch = next(loader)
    """

    __slots__ = ("name", "args", "cat", "_t0")
    CAT = "user"

    def __init__(self, name: str, **kwargs):
        self.name = name
        self.args = kwargs or None
        self.cat = self.CAT
        self._t0 = None

    def __enter__(self):
        if _timeline.ACTIVE is not None:
            self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        t0 = self._t0
        if t0 is not None:
            self._t0 = None
            r = _timeline.ACTIVE
            if r is not None:
                r.span(self.name, self.cat, t0, time.monotonic(), _timeline.HOST, self.args)
        return False


class StepTraceAnnotation(TraceAnnotation):
    """A training step on the trace (``cat == "step"``, ``args.step_num``), as JAX's.

    >>> for i in range(3):                                           # doctest: +SKIP
    ...     with spmd.profiler.StepTraceAnnotation("train", step_num=i):
    ...         state = step(state)
    """

    __slots__ = ()
    CAT = "step"


def host_span(name: str, cat: str, **args) -> TraceAnnotation:
    """A span of the library's own host work (e.g. ``cat="checkpoint"``): a
    :class:`TraceAnnotation` of another category.

    >>> with host_span("checkpoint save", "checkpoint", path="ckpt", step=3):
    ...     pass
    """
    span = TraceAnnotation(name, **args)
    span.cat = cat
    return span


def annotate_function(func=None, name: str | None = None, **kwargs):
    """Decorate ``func`` so that each call is a :class:`TraceAnnotation` span named
    ``name`` (default: its qualified name); one test per call when no trace is on.

    >>> @spmd.profiler.annotate_function
    ... def load(i):
    ...     return i
    >>> load(2)
    2
    """
    if func is None:
        return functools.partial(annotate_function, name=name, **kwargs)
    label = name or getattr(func, "__qualname__", None) or getattr(func, "__name__", "function")

    @functools.wraps(func)
    def annotated(*args, **kw):
        if _timeline.ACTIVE is None:
            return func(*args, **kw)
        with TraceAnnotation(label, **kwargs):
            return func(*args, **kw)

    return annotated

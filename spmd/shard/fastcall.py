"""The fast path of an eager jitted call over a mesh spread over processes.

The general path of such a call passes through about ten layers (``jit_p.bind``,
the eager trace, the jit's ``eval_arrays`` rule or a sharded argument's
``_eval_primitive``, :mod:`spmd.shard.dispatch`, the partitioner's cache,
:func:`spmd.shard.execute.call`), each re-deriving on every call what the
previous call derived: which mesh, which partition, which per-process program,
how each argument is read.  That cost ~25 µs per call, more than a small
collective itself.

Here the first call of a jit's call plan (one argument signature: structure,
leaf types, shapes, dtypes, named axes in scope, x64, mesh context) runs the
general path while :func:`recording` watches it.  When that call turned out to
be exactly one partitioned run of the whole jitted program
(:func:`spmd.shard.dispatch` reports it with :func:`note`: same program, the
call's own leaves in, the call's own results out), a :class:`Runner` is built
from that run: the per-process plan, and for each leaf how it is read and the
guard it must pass.  Later calls with the same plan run the Runner, which checks
the guards -- everything that could send a call another way and is not in the
plan's key: each sharded leaf's sharding (identity, else equality) and whether
it holds blocks or the whole value -- and hands the leaves to the compiled
per-process program.  A failed guard returns None and the general path runs
(nothing is skipped that could change the result).  Every check that reads the
values themselves stays on the path: a donated (deleted) argument raises, the
collectives keep their thread, order and deadline checks
(:mod:`spmd.collectives.mpi_control`).  Arrays on GPUs (CuPy) take the general
path.
"""

from __future__ import annotations

import threading

import numpy as np

_local = threading.local()  # .log: the runs noted during this thread's first call


class recording:
    """``with recording() as log:`` notes, in ``log``, the partitioned runs this
    thread makes meanwhile (see :func:`note`); nested recordings each see their own.

    >>> with recording() as log:                                  # doctest: +SKIP
    ...     outs = f(x)
    """

    __slots__ = ("log", "outer")

    def __enter__(self) -> list:
        self.outer = getattr(_local, "log", None)
        self.log = _local.log = []
        return self.log

    def __exit__(self, *exc):
        _local.log = self.outer
        return False


def note(program, part, mesh, args, outs) -> None:
    """Called by the dispatch after it ran the jitted ``program`` partitioned as
    ``part`` over ``mesh`` on ``args``, with results ``outs``."""
    log = getattr(_local, "log", None)
    if log is not None:
        log.append((program, part, mesh, args, outs))


def first_call(program, leaves: list, general) -> tuple:
    """The extension point ``EAGER_CALL`` (see :mod:`spmd.compiler.extensions`): run
    ``general`` (the general path of a jitted call) watching it, and return its results
    with a :class:`Runner` for the call plan's later calls (or None).

    >>> outs, runner = first_call(program, leaves, general)       # doctest: +SKIP
    """
    with recording() as log:
        outs = general()
    return outs, eager_runner(program, leaves, outs, log)


def eager_runner(program, leaves, outs, log) -> "Runner | None":
    """A :class:`Runner` for later calls like this one, or None when this call was
    not one partitioned run of ``program`` on ``leaves`` giving ``outs`` (then every
    call takes the general path)."""
    from spmd.compiler import array_module

    if len(log) != 1 or array_module.on_device[0] or array_module.current() is not np:
        return None
    prog, part, mesh, args, results = log[0]
    if prog is not program or len(args) != len(leaves) or len(results) != len(outs) \
            or any(a is not b for a, b in zip(args, leaves)) \
            or any(a is not b for a, b in zip(results, outs)):
        return None
    return Runner.build(part, mesh, leaves)


# How a Runner reads each leaf.
_AS_IS, _CONVERT, _BLOCKS, _WHOLE = range(4)


class Runner:
    """Runs one call plan's partitioned program on a call's leaves (see the module
    docstring); ``runner(leaves)`` returns the results, or None when a guard fails."""

    __slots__ = ("plan", "consts", "const_steps", "steps")

    def __init__(self, plan, consts: list, const_steps: tuple, steps: tuple):
        self.plan = plan                # spmd.shard.execute._Plan
        self.consts = consts            # the program's constants that numpy reads as they are
        self.const_steps = const_steps  # the others: (object, how, sharding or aval)
        self.steps = steps              # per leaf: (how, sharding or aval)

    @classmethod
    def build(cls, part, mesh, leaves) -> "Runner | None":
        from spmd.shard import execute

        program, in_specs, args = execute.with_consts(part.body, part.in_specs, leaves)
        n = len(args) - len(leaves)
        wants = execute._in_shardings(mesh, in_specs)
        steps, kinds = [], []
        for x, want in zip(args, wants):
            step = _step(x, want)
            if step is None:
                return None
            steps.append(step)
            kinds.append("blocks" if step[0] == _BLOCKS else "whole")
        consts, const_steps = [], []
        for c, step in zip(args[:n], steps[:n]):
            if step[0] == _AS_IS and not const_steps:  # read as it is: pass it as it is
                consts.append(c)
            else:  # read on every call (an Array's value may be deleted meanwhile)
                const_steps.append((c,) + step)
        plan = execute.plan_for(program, mesh, in_specs, tuple(part.out_specs), tuple(kinds))
        return cls(plan, consts, tuple(const_steps), tuple(steps[n:]))

    def __call__(self, leaves) -> list | None:
        raws = self.consts.copy()
        for c, how, what in self.const_steps:
            if _read(c, how, what, raws) is None:
                return None
        for x, (how, what) in zip(leaves, self.steps):
            if how == _AS_IS:
                raws.append(x)
            elif _read(x, how, what, raws) is None:
                return None
        plan = self.plan
        return plan.results(plan.exe.fn(*raws))


def _step(x, want) -> tuple | None:
    """How a Runner reads argument ``x`` where the program wants sharding ``want``,
    as :func:`spmd.shard.execute.call` reads it; None when that is not fixed by the
    call plan (an argument resharded on every call, an array type of another layer)."""
    from spmd.compiler.trace import get_aval
    from spmd.shard.sharded import ShardedArray

    if isinstance(x, ShardedArray):
        if type(x) is not ShardedArray:
            return None
        if x._value is not None:
            return (_WHOLE, x._sharding)
        if x._sharding is not want and x._sharding != want:
            return None
        return (_BLOCKS, x._sharding)
    aval = get_aval(x)
    exact = type(x) is np.ndarray and x.dtype == aval.dtype
    return (_AS_IS, None) if exact else (_CONVERT, aval)


def _read(x, how, what, raws: list):
    """Append what the program reads of ``x`` to ``raws`` (True), or None when its
    guard fails."""
    if how == _BLOCKS:
        s = x._sharding
        if (s is not what and s != what) or x._value is not None:
            return None
        raws.append(x.local_blocks())  # raises for a donated array
    elif how == _WHOLE:
        s = x._sharding
        if (s is not what and s != what) or x._value is None:
            return None
        raws.append(x.value)  # raises for a donated array
    else:
        from spmd.compiler.trace import to_array_value

        raws.append(to_array_value(x, what))
    return True

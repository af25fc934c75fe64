"""Pipeline schedules as tables: which stage does what at each tick.

In the lockstep model a tick ends with the ``ppermute`` s that move activations one
stage on and cotangents one stage back, which every stage joins, so a tick lasts as
long as its slowest stage's work (:meth:`Schedule.lockstep_time`).  The pipeline sends
each result as soon as it has it and reads what came at the end of its tick, and a
stage's parameters' gradient comes after its input's cotangent has gone back
(:meth:`Schedule.dataflow_time`).  ``ticks[t][s]`` is the tuple of operations stage
``s`` does at tick ``t``, in order: ``("F", i)`` (the forward of microbatch ``i``),
``("B", i)`` (its backward), or none.  A forward needs the previous stage's forward of
that microbatch at an earlier tick; a backward needs this stage's forward of it (the
last stage: at the same tick or earlier; the backward recomputes the forward from the
stage's input) and the next stage's backward of it at an earlier tick.

- ``gpipe``: every forward, then every backward, one operation per tick:
  ``2 (M + S - 1)`` ticks.  A stage holds the inputs of all ``M`` microbatches.
- ``1f1b``: the forward of microbatch ``i`` on stage ``s`` at tick ``i + s`` and its
  backward at tick ``i + 2 (S - 1) - s``; ``M + 2 (S - 1)`` ticks.  In the steady state
  each stage does one forward and one backward per tick (the tick costs ``f + b`` on
  every stage, where a tick of one forward on one stage and one backward on its
  neighbour would cost ``b`` on both: lockstep, they would wait for each other), so
  the idle time is the fill and the drain only.  A stage ``s > 0`` holds at most
  ``2 (S - 1 - s) + 1`` inputs (``2 S - 3`` on stage 1), however large ``M`` is.

Stage 0 reads its inputs where they are (the microbatches every device has): it holds
none.  Both schedules' bubble, the idle share of the time when every tick lasts as long
as its slowest stage's operations, is the theory's ``(S - 1) / (M + S - 1)`` when a
forward and a backward cost the same; :meth:`Schedule.lockstep_time` prices a table with
measured costs.  :func:`build` checks the table and the buffers each stage needs.

>>> build("1f1b", 2, 3).ticks[:3]
[[(('F', 0),), ()], [(('F', 1),), (('F', 0), ('B', 0))], [(('F', 2), ('B', 0)), (('F', 1), ('B', 1))]]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from spmd.errors import ArgumentError

SCHEDULES = ("gpipe", "1f1b")


class Schedule(NamedTuple):
    """``ticks[t][s]``: the operations stage ``s`` does at tick ``t``, a tuple of
    ``("F", i)`` and ``("B", i)`` in the order they run (empty: idle)."""

    name: str
    stages: int
    microbatches: int
    ticks: list
    # Per stage: the most microbatch inputs held at once (arrived, not yet backwarded;
    # stage 0 reads its own where they are), and the most cotangents waiting.
    inputs_held: list
    cotangents_held: list

    def arrays(self):
        """The table as ``(T, S)`` int32 arrays, one row per tick, for a program to
        index by stage: the microbatch each stage forwards and backwards at the tick (-1:
        none); which microbatch's input arrives at the tick's start (from the stage
        before; -1: none) and which cotangent (from the stage after)."""
        T, S = len(self.ticks), self.stages
        f_mb, b_mb, f_in, b_in = (np.full((T, S), -1, np.int32) for _ in range(4))
        for t, row in enumerate(self.ticks):
            for s, ops in enumerate(row):
                for kind, i in ops:
                    if kind == "F":
                        f_mb[t, s] = i
                        if s + 1 < S and t + 1 < T:
                            f_in[t + 1, s + 1] = i
                    else:
                        b_mb[t, s] = i
                        if s > 0 and t + 1 < T:
                            b_in[t + 1, s - 1] = i
        return f_mb, b_mb, f_in, b_in

    def lockstep_time(self, f: float = 1.0, b: float = 1.0) -> float:
        """The table's time when a forward costs ``f``, a backward ``b``, and every tick
        lasts as long as its busiest stage's operations."""
        return sum(max(sum(f if k == "F" else b for k, _ in ops) for ops in row)
                   for row in self.ticks)

    def dataflow_time(self, f: float = 1.0, b: float = 1.0, w: float = 0.0,
                      f_last: float = 0.0) -> float:
        """The table's time as :mod:`spmd.parallel.pipeline` runs it: each stage sends
        a result as soon as it has computed it and reads what its neighbours sent at
        the end of its tick (it waits there for the sends of that tick).  A forward
        costs ``f``, a backward ``b``, of which ``w`` (the parameters' gradient) runs
        after the input's cotangent has been sent; the last stage's forward costs
        ``f_last`` on its own (``0``: the pipeline runs it only inside that stage's
        backward, its result going to no stage).  With ``w = 0`` and ``f_last = f``
        this is :meth:`lockstep_time` when every operation of a kind costs the same;
        ``w`` of each backward on the path from the fill to the drain comes off it.
        (The last stage's weights' gradient held for one backward is not priced: on
        equal stages it moves no operation on the path; it gives the stage before
        slack against a slower last stage.)

        >>> build("gpipe", 2, 2).dataflow_time(1.0, 2.0, 1.0)
        7.0
        """
        S = self.stages
        clock = [0.0] * S
        for row in self.ticks:
            sent_f, sent_b, done = [], [], []
            for s, ops in enumerate(row):
                cost = f_last if s == S - 1 else f
                t = clock[s] + (cost if any(k == "F" for k, _ in ops) else 0.0)
                sent_f.append(t)
                backward = any(k == "B" for k, _ in ops)
                t += b - w if backward else 0.0
                sent_b.append(t)
                done.append(t + (w if backward else 0.0))
            # A tick moves activations when some stage but the last runs a forward,
            # cotangents when some stage but the first runs a backward; a stage waits
            # for the neighbour that sends to it.
            moves_f = any(k == "F" for ops in row[:-1] for k, _ in ops)
            moves_b = any(k == "B" for ops in row[1:] for k, _ in ops)
            clock = [max(done[s], sent_f[s - 1] if moves_f and s > 0 else 0.0,
                         sent_b[s + 1] if moves_b and s + 1 < S else 0.0)
                     for s in range(S)]
        return max(clock)

    @property
    def bubble(self) -> float:
        """The idle share of the stages' time, a forward costing what a backward does:
        ``1 - 2 M / lockstep_time()``."""
        return 1 - 2 * self.microbatches / self.lockstep_time()


def theory_bubble(stages: int, microbatches: int) -> float:
    """``(S - 1) / (M + S - 1)``: the bubble of GPipe and of 1F1B."""
    return (stages - 1) / (microbatches + stages - 1)


def _ticks(name: str, S: int, M: int) -> dict:
    """``{(kind, i, s): tick}`` of every operation."""
    if name == "1f1b":
        return {**{("F", i, s): i + s for i in range(M) for s in range(S)},
                **{("B", i, s): i + 2 * (S - 1) - s for i in range(M) for s in range(S)}}
    # GPipe: all forwards (the fill), then all backwards (the drain) from the last stage.
    return {**{("F", i, s): i + s for i in range(M) for s in range(S)},
            **{("B", i, s): (M + S - 1) + i + (S - 1 - s) for i in range(M)
               for s in range(S)}}


def build(name: str, stages: int, microbatches: int) -> Schedule:
    """The table of schedule ``name`` for ``stages`` stages and ``microbatches``."""
    if name not in SCHEDULES:
        raise ArgumentError(f"pipeline schedule {name!r} is not one of {SCHEDULES}")
    for what, v in (("stages", stages), ("microbatches", microbatches)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ArgumentError(f"pipeline schedule: {what}={v!r} must be an integer >= 1")
    S, M = stages, microbatches
    done = _ticks(name, S, M)
    T = max(done.values()) + 1
    ticks = [[() for _ in range(S)] for _ in range(T)]
    for (kind, i, s), t in sorted(done.items(), key=lambda kv: (kv[1], kv[0][0] == "B")):
        ticks[t][s] = ticks[t][s] + ((kind, i),)  # a tick's forward runs before its backward
    for (kind, i, s), t in done.items():  # every dependency holds (tested too)
        if kind == "F":
            assert s == 0 or done[("F", i, s - 1)] < t, (name, S, M, i, s)
        else:
            assert done[("F", i, s)] <= t and (s == S - 1 or done[("B", i, s + 1)] < t)
    inputs, cts = [], []
    for s in range(S):
        # An input is held from its arrival (the tick after the previous stage's
        # forward) until this stage's backward of it; stage 0 reads its own in place.
        if s == 0:
            inputs.append(0)
        else:
            arrive = [done[("F", i, s - 1)] + 1 for i in range(M)]
            inputs.append(max(sum(arrive[i] <= u <= done[("B", i, s)] for i in range(M))
                              for u in range(T)))
        if s == S - 1:
            cts.append(1)
            continue
        came = [done[("B", i, s + 1)] + 1 for i in range(M)]
        cts.append(max(sum(came[i] <= u <= done[("B", i, s)] for i in range(M))
                       for u in range(T)))
    return Schedule(name, S, M, ticks, inputs, cts)

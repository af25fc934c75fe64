"""Pipeline schedules as tables: which stage does what at each tick.

A tick is the time of one stage's forward or backward of one microbatch (taken as
equal).  A stage works through its queue of operations in order, each as soon as its
inputs have arrived: a forward needs the previous stage's forward of that microbatch
(a tick earlier or before); a backward needs this stage's forward of it and the next
stage's backward of it (the last stage: its own forward, then the loss).

- ``gpipe``: every forward, then every backward.  A stage holds the inputs of all
  ``M`` microbatches before its first backward.
- ``1f1b`` (PipeDream-flush): stage ``s`` does ``S - s`` forwards, then alternates one
  backward and one forward, then the remaining backwards.  A stage holds at most ``S``
  microbatches' inputs.

Both take ``2 (M + S - 1)`` ticks, so their bubble (the idle share of the stage-ticks)
is ``(S - 1) / (M + S - 1)``.  :func:`build` simulates the queues and returns the
table, the bubble it has and the buffers each stage needs.

>>> build("1f1b", 2, 3).ticks[:3]
[[('F', 0), None], [('F', 1), ('F', 0)], [None, ('B', 0)]]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from spmd.errors import ArgumentError

SCHEDULES = ("gpipe", "1f1b")


class Schedule(NamedTuple):
    """``ticks[t][s]``: ``("F", i)``, ``("B", i)`` or None (idle) for stage ``s``."""

    name: str
    stages: int
    microbatches: int
    ticks: list
    # Per stage: the most microbatch inputs held at once (arrived or forwarded, not yet
    # backwarded), and the most cotangents waiting for their backward.
    inputs_held: list
    cotangents_held: list

    def arrays(self):
        """The table as ``(T, S)`` int32 arrays, one row per tick, for a program to
        index by stage: each stage's operation (0 idle, 1 forward, 2 backward) and
        microbatch; which microbatch's input arrives at the tick's start (from the stage
        before; stage 0 reads its own when it forwards it; -1: none) and which
        cotangent (from the stage after); and the tick of stage 0's backward of each
        microbatch, ``(M,)``."""
        T, S, M = len(self.ticks), self.stages, self.microbatches
        kinds, mbs, f_in, b_in = (np.zeros((T, S), np.int32) for _ in range(4))
        f_in -= 1
        b_in -= 1
        first_bwd = np.zeros(M, np.int64)
        for t, row in enumerate(self.ticks):
            for s, op in enumerate(row):
                if op is None:
                    continue
                kind, i = op
                kinds[t, s], mbs[t, s] = (1 if kind == "F" else 2), i
                if kind == "F" and s == 0:
                    f_in[t, 0] = i
                if kind == "F" and s + 1 < S and t + 1 < T:
                    f_in[t + 1, s + 1] = i
                if kind == "B" and s > 0 and t + 1 < T:
                    b_in[t + 1, s - 1] = i
                if kind == "B" and s == 0:
                    first_bwd[i] = t
        return kinds, mbs, f_in, b_in, first_bwd

    @property
    def bubble(self) -> float:
        """The idle share of the ``stages * len(ticks)`` stage-ticks."""
        idle = sum(op is None for row in self.ticks for op in row)
        return idle / (self.stages * len(self.ticks))


def theory_bubble(stages: int, microbatches: int) -> float:
    """``(S - 1) / (M + S - 1)``: the bubble of GPipe and of 1F1B."""
    return (stages - 1) / (microbatches + stages - 1)


def _queue(name: str, s: int, stages: int, m: int) -> list:
    if name == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(stages - s, m)
    ops = [("F", i) for i in range(warm)]
    for k in range(m):
        ops.append(("B", k))
        if warm + k < m:
            ops.append(("F", warm + k))
    return ops


def build(name: str, stages: int, microbatches: int) -> Schedule:
    """The table of schedule ``name`` for ``stages`` stages and ``microbatches``."""
    if name not in SCHEDULES:
        raise ArgumentError(f"pipeline schedule {name!r} is not one of {SCHEDULES}")
    for what, v in (("stages", stages), ("microbatches", microbatches)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ArgumentError(f"pipeline schedule: {what}={v!r} must be an integer >= 1")
    S, M = stages, microbatches
    queues = [_queue(name, s, S, M) for s in range(S)]
    done = {}  # (kind, i, s) -> tick
    ticks = []
    t = 0
    while any(queues):
        row = []
        for s in range(S):
            op = queues[s][0] if queues[s] else None
            if op is not None:
                kind, i = op
                if kind == "F":
                    ready = s == 0 or done.get(("F", i, s - 1), t) < t
                else:
                    ready = done.get(("F", i, s), t) < t and (
                        s == S - 1 or done.get(("B", i, s + 1), t) < t)
                if not ready:
                    op = None
            row.append(op)
        for s, op in enumerate(row):
            if op is not None:
                done[(op[0], op[1], s)] = t
                queues[s].pop(0)
        ticks.append(row)
        t += 1
        if t > 4 * (M + S) + 8:  # the queues above always drain; never loop forever
            raise AssertionError(f"schedule {name} for S={S}, M={M} does not drain")
    inputs, cts = [], []
    for s in range(S):
        # An input is held from its arrival (the tick after the previous stage's
        # forward; stage 0: its own forward) until this stage's backward of it.
        arrive = [(done[("F", i, s - 1)] + 1) if s else done[("F", i, s)] for i in range(M)]
        inputs.append(max(sum(arrive[i] <= u <= done[("B", i, s)] for i in range(M))
                          for u in range(len(ticks))))
        if s == S - 1:
            cts.append(1)
            continue
        came = [done[("B", i, s + 1)] + 1 for i in range(M)]
        cts.append(max(sum(came[i] <= u <= done[("B", i, s)] for i in range(M))
                       for u in range(len(ticks))))
    return Schedule(name, S, M, ticks, inputs, cts)

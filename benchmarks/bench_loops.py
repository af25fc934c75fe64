"""Loops that update an array row by row: the cost of a carry's update.

``jit(lambda a: lax.fori_loop(0, n, lambda i, a: a.at[i].set(row(i)), a))`` on an
``(n, 1000)`` float32 array, against the numpy a user writes instead (a Python loop
of ``a[i] = ...`` on a copy of the array).  With the carry updated in place (donated
to the loop body: ``docs/architecture.md``, "Updates in place") the loop is linear in
``n``; a whole-buffer copy per iteration made it quadratic.  The goal is that
linearity: ``n = 2000`` at most 2.5x ``n = 1000`` (a copy per iteration gave 4.5x).

Run it alone with ``python benchmarks/run.py loops``.
"""

from __future__ import annotations

import numpy as np

from common import interleave, row

import spmd
import spmd.numpy as snp
from spmd import lax

D = 1000
SIZES = (500, 1000, 2000)


def _spmd_loop(n):
    body = lambda i, a: a.at[i].set(snp.full((D,), i, np.float32))  # noqa: E731
    return spmd.jit(lambda a: lax.fori_loop(0, n, body, a))


def _numpy_loop(a):
    a = a.copy()
    for i in range(a.shape[0]):
        a[i] = np.float32(i)
    return a


def run(quick: bool = False) -> list[dict]:
    cases = {}
    for n in SIZES:
        a = np.zeros((n, D), np.float32)
        f = _spmd_loop(n)
        np.testing.assert_array_equal(np.asarray(f(a)), _numpy_loop(a))  # the check
        assert not a.any()  # the caller's array is left as it was
        cases[f"spmd {n}"] = (lambda f=f, a=a: f(a))
        cases[f"numpy {n}"] = (lambda a=a: _numpy_loop(a))
    times = interleave(cases, repeats=3 if quick else 10, warmup=1, target_s=0.0)
    rows = []
    for n in SIZES:
        bench = f"fori_loop row writes[{n} x {D}]"
        rows.append(row(bench, "numpy", times[f"numpy {n}"], unit="ms",
                        note="a Python loop of a[i] = i on a copy"))
        rows.append(row(bench, "spmd", times[f"spmd {n}"], baseline="numpy", unit="ms",
                        note="jit(fori_loop(a.at[i].set(...)))"))
    scaling = "fori_loop row writes, spmd, by n"
    rows.append(row(scaling, f"n = {SIZES[1]}", times[f"spmd {SIZES[1]}"], unit="ms"))
    rows.append(row(scaling, f"n = {SIZES[2]}", times[f"spmd {SIZES[2]}"],
                    baseline=f"n = {SIZES[1]}", goal_ratio=2.5, unit="ms",
                    note="linear in n: 2x; a copy of the carry per iteration: about 4.5x"))
    return rows


if __name__ == "__main__":
    import sys

    from common import summarize, table

    print(table(summarize(run(quick="--quick" in sys.argv))))

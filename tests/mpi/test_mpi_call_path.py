"""The length of the one placed-call path, pinned (issue 24; ``docs/architecture.md``).

For each call users make on placed values, the Python calls from the user's call to
its return are counted (``sys.setprofile``, steady state: the call's plan exists) and
must stay within the goal, so the path cannot grow again unnoticed.  A psum is
checked to make exactly one collective per call (the backend's count).  Times live in
``benchmarks/bench_call_path.py``; counts are exact, so they are tested here.

Runs on 2 and 4 ranks (``make test``).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
from spmd import NamedSharding, P, lax  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _profile(fn) -> int:
    """The Python calls made by ``fn()``'s third call, below ``fn`` itself."""
    calls = [0]

    def prof(frame, event, arg):
        if event == "call":
            calls[0] += 1

    fn()
    fn()  # steady state: plans built, communicators made
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls[0] - 1  # (the lambda around the call)


@pytest.fixture
def placed():
    n = spmd.process_count()
    mesh = spmd.make_mesh((n,), ("d",))
    s = NamedSharding(mesh, P("d"))
    x = spmd.device_put(np.arange(n * 1024, dtype=np.float32), s)
    return mesh, s, x


def test_a_jitted_psum_reaches_allreduce_within_20_python_calls(placed):
    mesh, _, x = placed
    f = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "d"), mesh=mesh, in_specs=P("d"),
                                out_specs=P()))
    from spmd.collectives.mpi import control as mpi_control

    done = mpi_control.collective_time()[0]
    calls = _profile(lambda: f(x))
    assert calls <= 20, calls
    assert mpi_control.collective_time()[0] == done + 3  # one collective per call
    n = spmd.process_count()
    np.testing.assert_array_equal(np.asarray(f(x)), np.arange(n * 1024.0).reshape(n, -1).sum(0))


def test_a_jitted_elementwise_call_on_a_placed_array_within_15_python_calls(placed):
    _, s, x = placed
    f = spmd.jit(lambda v: v * 2 + 1)
    calls = _profile(lambda: f(x))
    assert calls <= 15, calls
    assert f(x).sharding == s


def test_a_jit_with_in_and_out_shardings_within_15_python_calls(placed):
    _, s, x = placed
    f = spmd.jit(lambda v: v * 2 + 1, in_shardings=s, out_shardings=s)
    calls = _profile(lambda: f(x))
    assert calls <= 15, calls
    assert f(x).sharding == s


def test_two_eager_operations_on_a_placed_array_within_40_python_calls(placed):
    _, s, x = placed
    calls = _profile(lambda: x * 2 + 1)
    assert calls <= 40, calls
    y = x * 2 + 1
    assert y.sharding == s
    np.testing.assert_array_equal(np.asarray(spmd.process_allgather(y, tiled=True)),
                                  np.arange(spmd.process_count() * 1024.0) * 2 + 1)

"""Collectives issued from several Python threads (spmd.collectives.mpi.control).

Single-process tests that launch 2-rank jobs under a time limit.  Before, four
threads issuing collectives at once aborted MPICH ("Message truncated") or could
pair one thread's data with another's; now a process's collectives over one group
run one at a time, and one from a non-main thread is first checked with the
other ranks: same thread name, same equation, or CollectiveThreadError on all.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import run_mpi  # noqa: E402

_HEADER = textwrap.dedent("""
    import threading
    import numpy as np
    import spmd
    from spmd import P, lax
    from spmd.collectives.mpi.control import CollectiveThreadError, CollectiveTimeoutError

    me = spmd.process_index()
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    f = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                                out_specs=P()))
    f(np.ones(n, np.float32))  # agreed and compiled once, in the main thread

    def work(k, calls):
        for _ in range(calls):
            try:
                got = float(np.asarray(f(np.full(n, k + 1, np.float32)))[0])
            except (CollectiveThreadError, CollectiveTimeoutError) as e:
                print(f"rank {me} thread {k}: {type(e).__name__}: {e}", flush=True)
                return
            if got != n * (k + 1):
                print(f"rank {me} thread {k}: WRONG {got}", flush=True)
                return
        print(f"rank {me} thread {k}: all right", flush=True)
""")


@pytest.mark.timeout(150)
def test_threads_that_take_turns_in_the_same_order_get_their_own_results(tmp_path):
    script = _HEADER + textwrap.dedent("""
        for k in range(3):   # one after the other, the same order on every rank
            t = threading.Thread(target=work, args=(k, 5), name=f"worker-{k}")
            t.start()
            t.join()
    """)
    status, out, seconds = run_mpi(script, 2, tmp_path, timeout=90,
                                   env={"SPMD_COLLECTIVE_TIMEOUT": "10"})
    assert status == 0, out
    assert out.count("all right") == 6 and "WRONG" not in out, out


@pytest.mark.timeout(150)
def test_threads_issuing_collectives_in_another_order_on_another_rank_raise(tmp_path):
    script = _HEADER + textwrap.dedent("""
        order = ["A", "B"] if me == 0 else ["B", "A"]
        for name in order:   # rank 0 runs A then B, rank 1 runs B then A
            t = threading.Thread(target=work, args=("AB".index(name), 1), name=name)
            t.start()
            t.join()
    """)
    status, out, seconds = run_mpi(script, 2, tmp_path, timeout=90,
                                   env={"SPMD_COLLECTIVE_TIMEOUT": "10"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert "WRONG" not in out and "all right" not in out, out
    # All four calls are refused before any data moves: the job even ends cleanly.
    assert out.count("CollectiveThreadError") == 4, out
    assert "rank 0: thread 'A' issues psum in program jit(<lambda>)" in out, out
    assert "rank 1: thread 'B' issues psum in program jit(<lambda>)" in out, out
    assert status == 0 and seconds < 60, out


@pytest.mark.timeout(150)
def test_threads_issuing_collectives_at_once_never_get_another_threads_data(tmp_path):
    script = _HEADER + textwrap.dedent("""
        threads = [threading.Thread(target=work, args=(k, 20), name=f"worker-{k}")
                   for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"rank {me}: threads joined", flush=True)
    """)
    status, out, seconds = run_mpi(script, 2, tmp_path, timeout=120,
                                   env={"SPMD_COLLECTIVE_TIMEOUT": "5"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    # Each thread either got its own sums or a clear error; MPICH never aborts on
    # mismatched messages.  Threads refused on one rank may leave a partner waiting:
    # then the deadline report ends the job.
    assert "WRONG" not in out and "truncated" not in out.lower(), out
    if out.count("threads joined") < 2:
        assert status != 0 and "CollectiveTimeoutError: rank" in out, out
        return
    for rank in (0, 1):
        for k in range(4):
            outcome = (f"rank {rank} thread {k}: "
                       "(all right|CollectiveThreadError|CollectiveTimeoutError)")
            assert re.search(outcome, out), out

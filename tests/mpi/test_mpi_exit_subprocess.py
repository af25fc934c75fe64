"""Started all-reduces never waited for leave no pending MPI request at exit: their
ranks complete them before MPI finalises (MPICH otherwise prints "Builtin
communicator ... has pending N references").  Each case launches its own 2-rank
job (single-process suite: not marked ``mpi``)."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import mpiexec_or_skip, run_command  # noqa: E402

_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from spmd.collectives import mpi
    ranks = (0, 1)
    reqs = [mpi.iallreduce(np.ones(n, np.float32), ranks, "sum") for n in {sizes}]
    print("rank done", flush=True)
    {drop}
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path,sizes", [("mpi", [100, 1 << 20]),          # Iallreduce, split
                                        ("window", [20000, 30000, 40000])])  # shared memory
@pytest.mark.parametrize("drop", ["del reqs", "sys.exit(0)"])
def test_started_sums_never_waited_for_end_cleanly(tmp_path, path, sizes, drop):
    exe = mpiexec_or_skip()
    script = tmp_path / "never_waited.py"
    script.write_text(_SCRIPT.format(sizes=sizes, drop=drop))
    status, out, seconds = run_command([exe, "-n", "2", sys.executable, str(script)],
                                       timeout=100)
    assert status == 0, out[-4000:]
    assert out.count("rank done") == 2, out[-4000:]
    assert "pending" not in out, out[-4000:]

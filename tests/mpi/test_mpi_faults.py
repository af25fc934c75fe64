"""Faults across processes end in errors that name the culprits, never in a hang.

The tests marked ``mpi`` run on 4 ranks (``make test``): ranks that
trace different programs get :class:`ProgramMismatchError` on every rank.  The
others are single-process tests that launch 2-rank jobs themselves (an MPI job
cannot be started from inside one): a rank that never arrives in a collective
(``SPMD_COLLECTIVE_TIMEOUT``), and a rank that dies under ``spmd-run``.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import make_mesh, mpiexec_or_skip, run_command, run_mpi  # noqa: E402

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import P, lax  # noqa: E402
from spmd.shard.call.fingerprint import ProgramMismatchError  # noqa: E402


def _psum_map(mesh):
    return spmd.shard_map(lambda b: lax.psum(snp.sum(b), "i"), mesh=mesh, in_specs=P("i"),
                          out_specs=P())


# ------------------------------------------------------------ program mismatch

@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_differently_shaped_inputs_raise_on_every_rank(jit):
    mesh = make_mesh("1d")
    n = mesh.size
    f = _psum_map(mesh)
    if jit:
        f = spmd.jit(f)
    rows = 2 * n if spmd.process_index() == 0 else 3 * n
    with pytest.raises(ProgramMismatchError) as info:
        f(np.ones(rows, np.float32))
    text = str(info.value)
    assert "ranks [0]" in text and f"ranks {list(range(1, spmd.process_count()))}" in text
    assert f"f32[{2 * n}]" in text and f"f32[{3 * n}]" in text
    # Nothing is left half-agreed: the next call with matching shapes runs.
    assert float(f(np.ones(2 * n, np.float32))) == 2 * n


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(120)
def test_rank_dependent_control_flow_names_the_first_differing_equation():
    mesh = make_mesh("1d")
    odd = spmd.process_index() % 2 == 1

    def body(b):
        y = snp.sin(b) if odd else snp.cos(b)  # Python control flow on the rank
        return lax.psum(snp.sum(y), "i")

    f = spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P())
    with pytest.raises(ProgramMismatchError) as info:
        f(np.ones(mesh.size, np.float32))
    text = str(info.value)
    assert "sin" in text and "cos" in text
    assert "ranks [0, 2]" in text and "ranks [1, 3]" in text


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(120)
def test_mismatched_dtypes_raise_on_every_rank():
    mesh = make_mesh("1d")
    dtype = np.int32 if spmd.process_index() == 2 else np.float32
    with pytest.raises(ProgramMismatchError, match="i32"):
        _psum_map(mesh)(np.ones(mesh.size, dtype))


def _mesh_body(collective, n):
    if collective == "psum":
        return lambda b: lax.psum(b, "i"), P()
    if collective == "all_gather":
        return lambda b: lax.all_gather(b, "i", tiled=True), P("i")
    return lambda b: lax.ppermute(b, "i", [(j, (j + 1) % n) for j in range(n)]), P("i")


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective", ["psum", "all_gather", "ppermute"])
def test_meshes_listing_the_devices_in_another_order_raise_before_data_moves(collective):
    devices = list(spmd.devices())
    n = len(devices)
    if spmd.process_index() == 0:
        devices = devices[::-1]  # rank 0 lists the same devices in the other order
    mesh = spmd.Mesh(np.array(devices, dtype=object), ("i",))
    body, out_spec = _mesh_body(collective, n)
    f = spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=out_spec))
    with pytest.raises(ProgramMismatchError) as info:
        f(np.arange(n, dtype=np.float32))
    text = str(info.value)
    others = list(range(1, spmd.process_count()))
    assert "ranks [0]" in text and f"ranks {others}" in text, text
    ids = [d.id for d in spmd.devices()]
    assert f"devices {ids[::-1]}" in text and f"devices {ids}" in text, text


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(120)
def test_meshes_with_other_axis_sizes_raise_before_data_moves():
    n = spmd.device_count()
    # The same devices in the same order, the same per-device program: only the axis
    # sizes differ (rank 2 has (n, 1), the others (2, n // 2)).
    shape = (n, 1) if spmd.process_index() == 2 else (2, n // 2)
    mesh = spmd.make_mesh(shape, ("a", "b"))
    f = spmd.shard_map(lambda b: lax.psum(b, ("a", "b")), mesh=mesh, in_specs=P(("a", "b")),
                       out_specs=P())
    with pytest.raises(ProgramMismatchError) as info:
        f(np.arange(n, dtype=np.float32))
    text = str(info.value)
    assert "ranks [2]" in text and f"mesh: a={n} b=1" in text, text
    assert f"mesh: a=2 b={n // 2}" in text, text


# ------------------------------------------------- jobs launched by the tests

_PSUM_TWICE = textwrap.dedent("""
    import sys, time
    import numpy as np
    import spmd
    from spmd import P, lax

    mesh = spmd.make_mesh((2,), ("i",))
    f = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                                out_specs=P()))
    x = np.ones(2, np.float32)
    f(x)  # both ranks: the programs agree and one psum completes
    print(f"rank {spmd.process_index()}: first psum done", flush=True)
    if spmd.process_index() == 1:
        {rank1}
    f(x)
    print("second psum done", flush=True)
""")


@pytest.mark.timeout(120)
def test_a_rank_skipping_a_collective_ends_the_job_naming_it(tmp_path):
    script = _PSUM_TWICE.replace("{rank1}", "time.sleep(100)  # never reaches the psum")
    status, out, seconds = run_mpi(script, 2, tmp_path, timeout=60,
                                   env={"SPMD_COLLECTIVE_TIMEOUT": "2"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status != 0, out
    assert out.count("first psum done") == 2, out
    assert "second psum done" not in out
    assert "psum" in out and "SPMD_COLLECTIVE_TIMEOUT=2" in out and "rank 0" in out, out
    assert seconds < 40, f"took {seconds:.0f}s to end:\n{out}"


@pytest.mark.timeout(120)
def test_a_rank_that_dies_ends_the_job_under_spmd_run(tmp_path):
    launcher = Path(sys.executable).parent / "spmd-run"
    if not launcher.exists():
        pytest.skip(f"no spmd-run next to {sys.executable} (pip install -e . installs it)")
    script = _PSUM_TWICE.replace("{rank1}", "raise RuntimeError('rank 1 gives up')")
    mpiexec_or_skip()
    path = tmp_path / "job.py"
    path.write_text(script)
    status, out, seconds = run_command([launcher, "-n", "2", path], timeout=60)
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status != 0, out
    assert "rank 1 gives up" in out and "rank 1" in out, out

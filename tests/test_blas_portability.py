"""The suite passes whichever kernel OpenBLAS picks: the tests that once compared BLAS
results bit for bit across split or differently shaped calls (now within the scale of
their summed terms, tests/tolerance.py) run in two inner pytest runs, one with
``OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512`` (on an AVX-512 CPU OpenBLAS then
uses another kernel, and other blocking, than its own choice) and one with both
unset; both must pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

BLAS_SENSITIVE = [
    "tests/compiler/test_engine_threads.py::test_a_batch_of_small_products_is_shared",
    "tests/compiler/test_engine_threads.py::"
    "test_large_products_are_split_with_blas_held_to_one_thread",
    "tests/compiler/test_engine_threads.py::test_concurrent_callers_share_the_pool",
    "tests/shard/test_explicit.py::test_explicit_axes_on_an_automatic_mesh",
]

HASWELL = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}

_BLAS_INFO = """
import json, numpy
try:
    from threadpoolctl import threadpool_info
    info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
except ImportError:
    info = None
names = []
try:
    names = [numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]]
except Exception:
    pass
print(json.dumps({"threadpoolctl": info, "build": names}))
"""


def _env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in HASWELL}
    # The inner run holds no multi-process test and makes no file in /dev/shm: the
    # whole suite's checks of those (`make test` sets the first) are not for it.
    env.pop("SPMD_REQUIRE_MPI_TESTS", None)
    env["SPMD_TEST_SHM_CHECK"] = "0"
    env.update(extra)
    return env


def _blas(extra: dict) -> dict:
    """What numpy's BLAS is in a process started with ``extra`` set."""
    done = subprocess.run([sys.executable, "-c", _BLAS_INFO], env=_env(extra),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _skip_unless_openblas_can_run_haswell() -> dict:
    """numpy's BLAS here (:func:`_blas`); skips where the Haswell setting cannot apply."""
    info = _blas({})
    names = [i.get("internal_api", "") for i in info["threadpoolctl"] or []] or info["build"]
    if not any("openblas" in n.lower() for n in names):
        pytest.skip(f"numpy's BLAS is not OpenBLAS ({names or 'unknown'}): "
                    "OPENBLAS_CORETYPE does not choose its kernel")
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        flags = []
    if not {"avx2", "fma"} <= set(flags):
        pytest.skip("the CPU cannot run OpenBLAS's Haswell kernel (needs AVX2 and FMA, "
                    "read from /proc/cpuinfo)")
    return info


@pytest.mark.parametrize("settings", [HASWELL, {}], ids=["haswell-kernel", "own-choice"])
def test_blas_sensitive_tests_pass_whichever_kernel_openblas_picks(settings):
    here = _skip_unless_openblas_can_run_haswell()
    if settings and here["threadpoolctl"]:
        # The setting takes: OpenBLAS reports the kernel it was told to use.
        arch = [i.get("architecture") for i in _blas(settings)["threadpoolctl"]]
        assert arch == ["Haswell"], arch
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *BLAS_SENSITIVE],
        cwd=REPO_ROOT, env=_env(settings), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"with {settings or 'no OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE'}:\n"
        f"{done.stdout[-6000:]}{done.stderr[-3000:]}")
    assert f"{len(BLAS_SENSITIVE)} passed" in done.stdout, done.stdout[-2000:]

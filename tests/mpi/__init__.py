"""The multi-process test suite and its helpers.

The tests marked ``@pytest.mark.mpi`` run on 4 ranks, one device per rank: in a
plain ``pytest`` run (``make test``) each through a pool of rank workers
(``tests/conftest.py``, docs/testing.md), and under ``mpiexec -n 4 python -m pytest
--with-mpi -m mpi tests`` (``make test-mpi``) on every rank of that job, each rank
the same tests in the same order; the others
(``test_hybrid_subprocess.py``, the timeout test) are single-process tests that
launch small MPI jobs themselves.  The oracle is numpy on the global arrays:
:class:`RefMesh` computes with loops over mesh coordinates what every device
of a mesh should hold, and results are read back with ``spmd.process_allgather``.

Test modules import these helpers with ``from tests.mpi import ...`` after
putting the repository root on ``sys.path`` (:data:`REPO_ROOT`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------ ranks and nodes

def world():
    """MPI's world communicator (mpi4py imported only where a test runs on ranks)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def all_ranks() -> tuple:
    """Every world rank, in order."""
    return tuple(range(world().Get_size()))


def on_one_node(ranks) -> bool:
    """Whether ``ranks`` share a node, so that the shared-memory paths serve them
    (``spmd.collectives.mpi.shm``, ``mpi_p2p``): always on one machine, unless
    ``SPMD_SIMULATE_NODES`` puts them on different simulated nodes."""
    from spmd.launch import nodes

    k = nodes.simulated()
    return k is None or len({nodes.node_of(r, world().Get_size(), k) for r in ranks}) == 1


# ------------------------------------------------------------------ meshes

MESH_KINDS = ("1d", "2d", "2dT")


def make_mesh(kind: str):
    """A mesh of every device of the job: ``"1d"`` is ``(n,)`` named ``('i',)``;
    ``"2d"`` is ``(2, n // 2)`` named ``('a', 'b')`` in device order; ``"2dT"`` the
    same shape filled column by column, so that consecutive devices (those of one
    process, on a hybrid job) differ along ``'a'``.  With 4 devices: ``(4,)``,
    ``[[0, 1], [2, 3]]`` and ``[[0, 2], [1, 3]]``."""
    import spmd

    n = spmd.device_count()
    if kind == "1d":
        return spmd.make_mesh((n,), ("i",))
    if kind == "2d":
        return spmd.make_mesh((2, n // 2), ("a", "b"))
    devices = np.array(spmd.devices(), dtype=object).reshape(n // 2, 2).T
    return spmd.Mesh(devices, ("a", "b"))


# The collective axes to test on each kind of mesh (single names and tuples).
_AXES_2D = ["a", "b", ("a", "b"), ("b", "a")]
AXES = {"1d": ["i", ("i",)], "2d": _AXES_2D, "2dT": _AXES_2D}
MESH_AXES = [(kind, axes) for kind in MESH_KINDS for axes in AXES[kind]]


def axes_id(axes) -> str:
    return axes if isinstance(axes, str) else "+".join(axes)


@contextlib.contextmanager
def x64_if(dtype):
    """64-bit mode on while the body runs, when ``dtype`` is a 64-bit type."""
    import spmd

    if np.dtype(dtype).itemsize < 8:
        yield
        return
    prev = spmd.config.enable_x64
    spmd.config.update("enable_x64", True)
    try:
        yield
    finally:
        spmd.config.update("enable_x64", prev)


def values(shape, dtype, seed=0):
    """Small integers in ``dtype`` (sums of a few stay exact even in float16)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(-8, 9, shape).astype(dtype)


# ------------------------------------------------------------------ oracle

def _axes(axes) -> tuple[str, ...]:
    return (axes,) if isinstance(axes, str) else tuple(axes)


def _wide(a):
    """float64 (complex128 for complex values) for an exact oracle sum."""
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)


def data_movements(axes, n: int) -> list[tuple]:
    """``(per-device function, its RefMesh reference, block shape)`` of the data
    movements each dtype's tests check over ``axes`` (of ``n`` devices): a tiled
    all_gather, a ring ppermute, a tiled all_to_all."""
    from spmd import lax

    perm = [(i, (i + 1) % n) for i in range(n)]
    return [(lambda b: lax.all_gather(b, axes, axis=1, tiled=True),
             lambda ref, blocks, c: ref.all_gather(blocks, c, axes, 1, True), (2, 3)),
            (lambda b: lax.ppermute(b, axes, perm),
             lambda ref, blocks, c: ref.ppermute(blocks, c, axes, perm), (2, 3)),
            (lambda b: lax.all_to_all(b, axes, 0, 1, tiled=True),
             lambda ref, blocks, c: ref.all_to_all(blocks, c, axes, 0, 1, True), (2 * n, 3))]


class RefMesh:
    """What each device of a mesh holds, computed with numpy and loops over coordinates.

    A device is its coordinate tuple; ``blocks`` maps each device to its block.
    """

    def __init__(self, sizes, names):
        self.sizes, self.names = tuple(sizes), tuple(names)
        self.shape = dict(zip(self.names, self.sizes))

    @classmethod
    def of(cls, mesh) -> "RefMesh":
        return cls(mesh.axis_sizes, mesh.axis_names)

    def coords(self) -> list[tuple]:
        return list(itertools.product(*[range(s) for s in self.sizes]))

    def size(self, axes) -> int:
        return int(np.prod([self.shape[a] for a in _axes(axes)], dtype=np.int64))

    def index(self, c, axes) -> int:
        """The position of device ``c`` along ``axes`` (row-major in the tuple's order)."""
        k = 0
        for a in _axes(axes):
            k = k * self.shape[a] + c[self.names.index(a)]
        return k

    def group(self, c, axes) -> list[tuple]:
        """The devices sharing ``c``'s other coordinates, ordered by their index."""
        axes = _axes(axes)
        out = []
        for idx in itertools.product(*[range(self.shape[a]) for a in axes]):
            d = list(c)
            for a, i in zip(axes, idx):
                d[self.names.index(a)] = i
            out.append(tuple(d))
        return out

    def split_rows(self, x) -> dict:
        """Device ``c`` gets the ``c``-th row block of ``x`` (row-major over the mesh), as
        with the spec ``P(mesh.axis_names)``."""
        n = len(self.coords())
        b = x.shape[0] // n
        return {c: x[f * b:(f + 1) * b] for f, c in enumerate(self.coords())}

    def stack(self, per_device: dict) -> np.ndarray:
        """The devices' values as one array of shape ``sizes + value shape``."""
        first = np.asarray(per_device[self.coords()[0]])
        out = np.empty(self.sizes + first.shape, first.dtype)
        for c in self.coords():
            out[c] = per_device[c]
        return out

    # ---- the collectives: what device ``c`` holds afterwards
    def psum(self, blocks, c, axes):
        g = [blocks[d] for d in self.group(c, axes)]
        if g[0].dtype == np.bool_:
            raise ValueError("psum of bool is not tested")
        return np.sum(_wide(np.stack(g)), axis=0).astype(g[0].dtype)

    def pmean(self, blocks, c, axes):
        g = [blocks[d] for d in self.group(c, axes)]
        return (np.sum(_wide(np.stack(g)), axis=0) / len(g)).astype(g[0].dtype)

    def pmax(self, blocks, c, axes):
        return np.max(np.stack([blocks[d] for d in self.group(c, axes)]), axis=0)

    def pmin(self, blocks, c, axes):
        return np.min(np.stack([blocks[d] for d in self.group(c, axes)]), axis=0)

    def all_gather(self, blocks, c, axes, axis=0, tiled=False):
        g = [blocks[d] for d in self.group(c, axes)]
        return np.concatenate(g, axis=axis) if tiled else np.stack(g, axis=axis)

    def psum_scatter(self, blocks, c, axes, scatter_dimension=0, tiled=False):
        total = self.psum(blocks, c, axes)
        n = self.size(axes)
        chunk = np.split(total, n, axis=scatter_dimension)[self.index(c, axes)]
        return chunk if tiled else np.squeeze(chunk, axis=scatter_dimension)

    def all_to_all(self, blocks, c, axes, split_axis, concat_axis, tiled=False):
        me = self.index(c, axes)
        n = self.size(axes)
        srcs = [blocks[d] for d in self.group(c, axes)]
        if tiled:
            return np.concatenate([np.split(s, n, axis=split_axis)[me] for s in srcs],
                                  axis=concat_axis)
        return np.stack([np.take(s, me, axis=split_axis) for s in srcs], axis=concat_axis)

    def ppermute(self, blocks, c, axes, perm):
        me = self.index(c, axes)
        group = self.group(c, axes)
        src = [s for s, d in perm if d == me]
        return blocks[group[src[0]]].copy() if src else np.zeros_like(blocks[c])

    def axis_index(self, blocks, c, axes):
        return np.int32(self.index(c, axes))


def run_per_device(mesh, body, *global_args, check_vma=True):
    """Run ``body`` on each device's row block of every argument (split along dim 0
    over all mesh axes) with an eager ``shard_map``; the devices' results come back
    (via ``spmd.process_allgather``) as one numpy array of shape
    ``mesh.axis_sizes + result shape``."""
    import spmd
    import spmd.numpy as snp
    from spmd import P

    names = mesh.axis_names
    k = len(names)

    def f(*blocks):
        y = snp.asarray(body(*blocks))
        return snp.reshape(y, (1,) * k + y.shape)

    out = spmd.shard_map(f, mesh=mesh, in_specs=(P(names),) * len(global_args),
                         out_specs=P(*names), check_vma=check_vma)(*global_args)
    return spmd.process_allgather(out)


def assert_local_blocks(array, expected, sharding):
    """``array`` is placed by ``sharding`` and each of this process's blocks of it
    (its addressable shards) equals that block of ``expected``."""
    assert array.sharding == sharding, (array.sharding, sharding)
    shards = array.addressable_shards
    assert [s.device for s in shards] == sharding.mesh.local_devices
    for s in shards:
        np.testing.assert_allclose(np.asarray(s.data), expected[s.index], rtol=1e-5,
                                   atol=1e-5, err_msg=f"block of {s.device} at {s.index}")


# ------------------------------------------------------- launching MPI jobs

def mpiexec_or_skip() -> Path:
    """The ``mpiexec`` next to this interpreter; skips the test when it or mpi4py is
    missing (the single-process suite may run under an interpreter without MPI)."""
    import pytest

    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip(f"mpi4py is not installed for {sys.executable}; run `make venv` and use "
                    ".venv/bin/python")
    exe = Path(sys.executable).parent / "mpiexec"
    if not exe.exists():
        pytest.skip(f"no mpiexec next to {sys.executable} (the venv's mpich wheel provides "
                    "one; run `make venv`)")
    return exe


# Variables that would make a launched rank believe it belongs to an outer MPI job.
_LAUNCH_VARS = ("PMI_", "PMIX_", "OMPI_", "MV2_", "HYDRA_", "MPIR_", "SLURM_")


def run_mpi(script: str, n: int, tmp_path: Path, *, env: dict | None = None,
            timeout: float = 120) -> tuple[int | None, str, float]:
    """Run the Python ``script`` (source text) on ``n`` ranks under the venv's mpiexec.

    Returns ``(exit status, stdout + stderr, seconds)``; the status is None when the
    job ran past ``timeout`` (its whole process group is then killed).
    """
    exe = mpiexec_or_skip()
    path = tmp_path / "job.py"
    path.write_text(script)
    return run_command([str(exe), "-n", str(n), sys.executable, str(path)], env=env,
                       timeout=timeout)


def run_spmd_run(script: str, n: int, tmp_path: Path, *, env: dict | None = None,
                 timeout: float = 90) -> tuple[int | None, str, float]:
    """Run the Python ``script`` on ``n`` ranks under ``spmd-run`` (``python -m
    spmd.launch``), so that its summary of failed, stranded or killed ranks is in the
    output; ``(exit status or None on timeout, output, seconds)``."""
    mpiexec_or_skip()
    path = tmp_path / "job.py"
    path.write_text(script)
    return run_command([sys.executable, "-m", "spmd.launch", "-n", str(n), str(path)],
                       env=env, timeout=timeout)


# The start of a fault-test job: `me`, a mesh of every device and `step`, a jitted
# psum over it; each test appends what its ranks do next.
PSUM_JOB = """\
import os, signal, sys, time
import numpy as np
import spmd
from spmd import P, lax

me = spmd.process_index()
mesh = spmd.make_mesh((spmd.device_count(),), ("i",))

def step(b):
    return lax.psum(b, "i")

step = spmd.jit(spmd.shard_map(step, mesh=mesh, in_specs=P("i"), out_specs=P()))
"""


def run_command(argv: list, *, env: dict | None = None,
                timeout: float = 120) -> tuple[int | None, str, float]:
    """Run ``argv`` (a launcher) in the repository root, in its own process group, with
    one BLAS thread, this checkout on ``PYTHONPATH`` and no trace of an enclosing MPI
    job in the environment; ``(status or None on timeout, output, seconds)``."""
    import time

    full_env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
    full_env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                    PYTHONPATH=os.pathsep.join([str(REPO_ROOT)] + [
                        p for p in [os.environ.get("PYTHONPATH")] if p]))
    full_env.pop("SPMD_NUM_DEVICES", None)
    full_env.update(env or {})
    start = time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], cwd=str(REPO_ROOT), env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    with _segments_of(proc):
        try:
            out, _ = proc.communicate(timeout=timeout)
            return proc.returncode, out, time.monotonic() - start
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the ranks it started
            out, _ = proc.communicate()
            return None, out, time.monotonic() - start


@contextlib.contextmanager
def _segments_of(proc):
    """While the body runs, note the /dev/shm files that ``proc``'s processes map;
    afterwards remove those left behind.  A job started by plain ``mpiexec`` that
    does not end in ``MPI_Finalize`` (the fault tests' jobs) leaves MPICH's segment
    of 2-4 MB there; ``spmd-run`` removes its own, this does it for the others
    (:mod:`spmd.launch.cleanup`: only files no live process uses)."""
    import threading
    import time

    from spmd.launch.cleanup import Segments, mapped_files

    segments = Segments()
    done = threading.Event()
    seen: set[int] = set()

    def watch():
        while not done.is_set():
            for pid in _descendants(proc.pid):
                seen.add(pid)
                segments.add(mapped_files(pid, segments.dir))
            done.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=5)
        deadline = time.monotonic() + 2.0  # ranks ended with mpiexec may still be dying
        while any(map(_alive, seen)) and time.monotonic() < deadline:
            time.sleep(0.05)
        segments.remove()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _descendants(pid: int) -> list[int]:
    """The live processes under ``pid`` (a launcher: its proxies and ranks)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # a zombie holds no memory
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found

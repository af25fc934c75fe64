"""Platform selection and the GPU code paths, checked on the CPU.

- the decision (SPMD_PLATFORM, auto-detection, SPMD_GPU_BACKEND, GPU per local
  rank) and its errors, with CuPy absent or pretended absent;
- cupy is never imported on the CPU path;
- the GPU paths (values in device memory, eager, jit, shard_map on a simulated
  mesh, grad, the partitioner, device_put, the nccl backend's calls) on
  :mod:`tests.gpu.fake_cupy`, a strict CPU stand-in for CuPy: it fails where a
  numpy array would reach a device function or a device array would be read
  implicitly on the host.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax
from spmd.compiler.core import array_module
from spmd.launch import platform

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RNG = np.random.default_rng(0)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------ the decision

def test_xp_for_cpu_is_numpy():
    assert platform.xp_for("cpu") is np
    with pytest.raises(platform.PlatformError, match="unknown platform 'tpu'"):
        platform.xp_for("tpu")


def test_importing_spmd_does_not_import_cupy():
    code = ("import sys, spmd, spmd.numpy as snp, spmd.collectives.nccl, spmd.launch.platform\n"
            "assert 'cupy' not in sys.modules, 'import'\n"
            "import numpy as np\n"
            "spmd.jit(lambda x: snp.tanh(x) * 2)(np.ones(3, np.float32))\n"
            "spmd.make_mesh((2,), ('i',))\n"
            "assert spmd.devices()[0].platform == 'cpu'\n"
            "assert 'cupy' not in sys.modules, 'cpu run'\n")
    env = dict(os.environ, SPMD_PLATFORM="cpu", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_gpu_without_cupy_is_a_clear_error(runtime_env, monkeypatch):
    monkeypatch.setattr(platform, "_cupy_installed", lambda: False)
    runtime_env(SPMD_PLATFORM="gpu")
    with pytest.raises(platform.PlatformError,
                       match="needs CuPy, which is not installed.*cupy-cuda12x.*cupy-cuda13x"):
        spmd.devices()
    with pytest.raises(platform.PlatformError, match="needs CuPy"):
        spmd.jit(lambda x: x + 1)(np.ones(2, np.float32))


def test_gpu_without_a_gpu_is_a_clear_error(runtime_env, monkeypatch):
    monkeypatch.setattr(platform, "_cupy_installed", lambda: True)
    monkeypatch.setattr(platform, "gpu_count", lambda: (True, 0, "CUDARuntimeError: no driver"))
    runtime_env(SPMD_PLATFORM="gpu")
    with pytest.raises(platform.PlatformError, match="sees no GPU.*no driver.*nvidia-smi"):
        platform.current()


def test_auto_detection(runtime_env, monkeypatch):
    runtime_env(SPMD_PLATFORM=None)
    monkeypatch.setattr(platform, "_cupy_installed", lambda: False)
    assert platform.current() == "cpu"
    platform.reset()
    monkeypatch.setattr(platform, "_cupy_installed", lambda: True)
    monkeypatch.setattr(platform, "gpu_count", lambda: (True, 0, "no driver"))
    assert platform.current() == "cpu"  # CuPy without a GPU: CPU, silently
    platform.reset()
    monkeypatch.setattr(platform, "gpu_count", lambda: (True, 2, ""))
    assert platform.current() == "gpu"
    platform.reset()
    runtime_env(SPMD_PLATFORM="cpu")  # asked for: CuPy is not even looked at
    monkeypatch.setattr(platform, "gpu_count", lambda: pytest.fail("looked for GPUs"))
    assert platform.current() == "cpu" and array_module.current() is np


def test_bad_settings(runtime_env):
    runtime_env(SPMD_PLATFORM="tpu")
    with pytest.raises(platform.PlatformError, match="SPMD_PLATFORM='tpu' is not one of"):
        platform.current()
    runtime_env(SPMD_PLATFORM="cpu", SPMD_GPU_BACKEND="gloo")
    with pytest.raises(platform.PlatformError, match="SPMD_GPU_BACKEND='gloo'"):
        platform.gpu_backend()


def test_gpu_backend_choice(runtime_env, monkeypatch):
    runtime_env(SPMD_GPU_BACKEND="mpi")
    assert platform.gpu_backend() == "mpi"
    runtime_env(SPMD_GPU_BACKEND=None)
    monkeypatch.setattr(platform, "nccl_available", lambda: False)
    assert platform.gpu_backend() == "mpi"  # no NCCL: staged through host memory
    runtime_env(SPMD_GPU_BACKEND="nccl")
    with pytest.raises(platform.PlatformError, match="cannot load NCCL.*SPMD_GPU_BACKEND=mpi"):
        platform.gpu_backend()
    monkeypatch.setattr(platform, "nccl_available", lambda: True)
    runtime_env(SPMD_GPU_BACKEND=None)
    assert platform.gpu_backend() == "nccl"


def test_gpu_per_local_rank():
    assert [platform.gpu_for_rank(r, 4, 4, "nccl") for r in range(4)] == [0, 1, 2, 3]
    assert [platform.gpu_for_rank(r, 4, 2, "mpi") for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(platform.PlatformError,
                       match="4 ranks on this node but only 2 GPU.*SPMD_GPU_BACKEND=mpi"):
        platform.gpu_for_rank(0, 4, 2, "nccl")
    with pytest.raises(platform.PlatformError, match="at least 3 ranks on this node but only 2"):
        platform.gpu_for_rank(2, None, 2, "nccl")
    # Each rank bound to its own GPU by CUDA_VISIBLE_DEVICES sees one: accepted here,
    # checked by PCI bus id when the ranks first meet (tests/gpu/test_nccl_processes.py).
    assert [platform.gpu_for_rank(r, 4, 1, "nccl", bound=True) for r in range(4)] == [0] * 4


def test_local_rank_variables(runtime_env):
    runtime_env(PMI_SIZE="2", MPI_LOCALRANKID="1", SLURM_LOCALID=None,
                OMPI_COMM_WORLD_LOCAL_RANK=None, MV2_COMM_WORLD_LOCAL_RANK=None)
    assert platform.local_rank() == 1
    runtime_env(PMI_SIZE=None, OMPI_COMM_WORLD_SIZE=None, MV2_COMM_WORLD_SIZE=None,
                SLURM_NTASKS=None)
    assert platform.local_rank() == 0  # not an MPI rank: its own GPU 0


# ------------------------------------------------- GPU paths on fake CuPy

def test_values_live_on_the_device(fake_gpu):
    assert array_module.current() is fake_gpu
    assert spmd.devices()[0].platform == "gpu"
    x = snp.arange(6.0).reshape(2, 3)
    assert type(x.value) is fake_gpu.ndarray
    np.testing.assert_array_equal(np.asarray(x), np.arange(6.0).reshape(2, 3))
    assert float(x.sum()) == 15.0 and x[1, 2].item() == 5.0 and "5." in repr(x)
    y = spmd.device_put(np.ones(4, np.float32))
    assert type(y.value) is fake_gpu.ndarray
    z = spmd.device_put(fake_gpu.asarray(np.ones(3)))  # a device array in: canonical dtype
    assert z.dtype == np.float32 and type(z.value) is fake_gpu.ndarray


def test_a_device_array_first(fake_gpu):
    """A cupy array may be the first value spmd sees (its type is learnt then)."""
    array_module.device_types.discard(fake_gpu.ndarray)
    array_module.set_current(None)
    x = fake_gpu.asarray(np.arange(4, dtype=np.float32))
    got = spmd.jit(lambda v: v * 2)(x)
    assert type(got.value) is fake_gpu.ndarray
    np.testing.assert_array_equal(np.asarray(got), [0, 2, 4, 6])


def test_eager_and_jit(fake_gpu):
    a, b = _x(4, 3), _x(3, 5)

    def f(a, b):
        return snp.tanh(a @ b) * 2.0 + snp.max(a)

    want = np.tanh(a @ b) * 2.0 + a.max()
    eager = f(snp.asarray(a), snp.asarray(b))
    jitted = spmd.jit(f)(a, b)
    again = spmd.jit(f)(jitted.value[:, :3].copy(), fake_gpu.asarray(b))  # device args
    for got in (eager, jitted):
        assert type(got.value) is fake_gpu.ndarray
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert type(again.value) is fake_gpu.ndarray


def test_shard_map_on_a_simulated_mesh(fake_gpu):
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    a, b = _x(8, 6), _x(6, 4)

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P("i", "j"), P("j", None)),
                       out_specs=P("i", None))
    def matmul(x, y):
        return lax.psum(x @ y, "j")

    got = matmul(a, b)
    assert type(got.value) is fake_gpu.ndarray
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=1e-5, atol=1e-5)
    g = spmd.grad(lambda x, y: snp.sum(matmul(x, y) ** 2), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(np.asarray(g[0]), 2 * (a @ b) @ b.T, rtol=1e-4, atol=1e-4)


def test_partitioner(fake_gpu):
    mesh = spmd.make_mesh((4, 2), ("data", "model"))
    x, w = _x(8, 6), _x(6, 4)
    f = spmd.jit(lambda x, w: snp.tanh(x @ w), in_shardings=(
        NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P(None, "model"))),
        out_shardings=NamedSharding(mesh, P("data", "model")))
    got = f(x, w)
    assert type(got.value) is fake_gpu.ndarray
    np.testing.assert_allclose(np.asarray(got), np.tanh(x @ w), rtol=1e-5, atol=1e-5)


def test_nccl_calls_on_one_member(fake_gpu, monkeypatch):
    """The nccl backend's pointers, counts and datatypes, on a 1-member communicator
    of the fake NCCL (which copies the bytes the calls name)."""
    from spmd.collectives import nccl

    monkeypatch.setenv("FAKE_CUPY_NCCL", "1")
    fake_gpu.install()  # again, now with NCCL
    cp = fake_gpu
    for dtype in (np.float32, np.float16, np.int32, np.int16, np.bool_, np.complex64):
        host = (RNG.standard_normal((3, 4)) * 4).astype(dtype)
        x = cp.asarray(host)
        for op in ("sum", "max", "min"):
            if dtype is np.complex64 and op != "sum":
                with pytest.raises(nccl.NCCLError, match="complex"):
                    nccl.allreduce(x, (0,), op, what="pmax")
                continue
            got = nccl.allreduce(x, (0,), op)
            assert type(got) is cp.ndarray and got.dtype == dtype
            np.testing.assert_array_equal(cp.asnumpy(got), host)
        np.testing.assert_array_equal(cp.asnumpy(nccl.allgather(x, (0,))), host[None])
        np.testing.assert_array_equal(cp.asnumpy(nccl.reduce_scatter(x[None], (0,))), host)
        np.testing.assert_array_equal(cp.asnumpy(nccl.alltoall(x[None], (0,))), host[None])
        np.testing.assert_array_equal(cp.asnumpy(nccl.sendrecv(x.T, (0,), 0, 0)), host.T)
        np.testing.assert_array_equal(cp.asnumpy(nccl.sendrecv(x, (0,), None, None)),
                                      np.zeros_like(host))
    # Bools: NCCL gets uint8 0/1 and, for a sum, max ("any"; a uint8 sum wraps at 256).
    from tests.gpu import fake_nccl

    flags = cp.asarray(np.array([True, False, True]))
    for op, want in (("sum", fake_nccl.MAX), ("max", fake_nccl.MAX), ("min", fake_nccl.MIN)):
        fake_nccl.calls.clear()
        got = nccl.allreduce(flags, (0,), op)
        assert got.dtype == np.bool_ and cp.asnumpy(got).tolist() == [True, False, True]
        assert fake_nccl.calls == [("allReduce", 3, fake_nccl.UINT8, want)], op
    fake_nccl.calls.clear()
    nccl.reduce_scatter(flags[None], (0,), "sum")
    assert fake_nccl.calls == [("reduceScatter", 3, fake_nccl.UINT8, fake_nccl.MAX)]
    # (The stand-in's check: a pointer its GPU does not hold is an error, as in NCCL.)
    with pytest.raises(fake_nccl.NcclError, match="sendbuff 0x3039.*not inside a live device"):
        nccl.communicator((0,)).allReduce(12345, 67890, 3, fake_nccl.FLOAT32,
                                          fake_nccl.SUM, 0)
    # release() destroys the communicators (at exit); the next call makes a new one.
    first = nccl.communicator((0,))
    nccl.release()
    assert first._destroyed and nccl.communicator((0,)) is not first
    # Through the primitive, in a jitted program (as ProcessGroup binds it).
    from spmd.collectives.process_group import ProcessGroup

    pg = ProcessGroup(("i",), (1,), ("i",), (0,), (0,), 0)
    assert pg.comm is nccl
    f = spmd.jit(lambda v: pg.all_reduce(v, "sum")[0] * 2.0)
    assert "nccl[kind='allreduce'" in f.lower(np.ones((1, 4), np.float32)).as_text()
    np.testing.assert_array_equal(np.asarray(f(np.ones((1, 4), np.float32))), 2.0)


def test_more_ranks_than_gpus_with_nccl_is_an_error(fake_gpu, runtime_env):
    """A rank checks, when it picks its GPU, that NCCL gets one GPU per rank."""
    runtime_env(FAKE_CUPY_NCCL="1", PMI_SIZE="2", MPI_LOCALRANKID="1", MPI_LOCALNRANKS="2",
                SPMD_GPU_BACKEND=None)
    fake_gpu.install()  # with NCCL
    with pytest.raises(platform.PlatformError,
                       match="2 ranks on this node but only 1 GPU.*SPMD_GPU_BACKEND=mpi"):
        array_module.current()
    runtime_env(SPMD_GPU_BACKEND="mpi")  # host-staged: the two ranks share GPU 0
    assert array_module.current() is fake_gpu and fake_gpu.cuda.runtime.getDevice() == 0


def test_gpus_are_numbered_per_simulated_node(fake_gpu, runtime_env, monkeypatch):
    """``SPMD_SIMULATE_NODES=2`` on 4 ranks of a machine with 2 GPUs: each simulated
    node numbers its GPUs from 0 (ranks 2, 3 take GPUs 0, 1 as ranks 0, 1 do), and
    NCCL's one-GPU-per-rank check counts the node's 2 ranks, not the machine's 4."""
    from spmd.launch import nodes

    monkeypatch.setattr(nodes, "_mpi_started", lambda: False)  # the job is the variables'
    runtime_env(FAKE_CUPY_NCCL="1", FAKE_CUPY_GPUS="2", PMI_SIZE="4", MPI_LOCALNRANKS="4",
                SPMD_GPU_BACKEND=None, SPMD_SIMULATE_NODES="2", CUDA_VISIBLE_DEVICES=None)
    fake_gpu.install()  # with NCCL
    for rank, gpu in ((0, 0), (1, 1), (2, 0), (3, 1)):
        runtime_env(PMI_RANK=str(rank), MPI_LOCALRANKID=str(rank))
        assert platform.gpu_backend() == "nccl"
        assert array_module.current() is fake_gpu and array_module.device_id[0] == gpu
        assert platform.local_rank() == gpu
    runtime_env(SPMD_SIMULATE_NODES=None)  # one node: 4 ranks on 2 GPUs
    with pytest.raises(platform.PlatformError, match="4 ranks on this node but only 2 GPU"):
        array_module.current()


class _Gathered:
    """A communicator's ``allgather`` as member ``me`` sees it: the others' entries
    as given, its own as it sends it."""

    def __init__(self, entries, me):
        self.entries, self.me = entries, me

    def allgather(self, mine):
        return [mine if i == self.me else e for i, e in enumerate(self.entries)]


def test_the_nccl_gpu_check_compares_simulated_nodes(fake_gpu, runtime_env, monkeypatch):
    """Each rank bound to GPU 0 (``CUDA_VISIBLE_DEVICES=0``), 3 ranks on 2 simulated
    nodes (0-1, 2): ranks 0 and 1 share their node's GPU and are refused, naming the
    simulated node; ranks 0 and 2 are on different nodes and are accepted."""
    import socket

    from spmd.collectives import nccl
    from spmd.errors import ArgumentError
    from spmd.launch import nodes

    monkeypatch.setattr(nodes, "_mpi_started", lambda: False)  # the job is the variables'

    def entries(simulate):
        out = []
        for r in range(3):
            runtime_env(PMI_RANK=str(r), PMI_SIZE="3", CUDA_VISIBLE_DEVICES="0",
                        SPMD_SIMULATE_NODES=simulate)
            out.append((nodes.reading(), nodes.node_name(), fake_gpu.cuda.Device().pci_bus_id))
        return out

    sim = entries("2")
    host = socket.gethostname()
    assert [e[1] for e in sim] == [f"{host}/node0", f"{host}/node0", f"{host}/node1"]
    with pytest.raises(nccl.NCCLError, match=f"world ranks 0 and 1 both use GPU 0000:10:00.0 "
                                             f"on host {host}/node0"):
        nccl._check_distinct_gpus(fake_gpu, _Gathered(sim, 2), (0, 1, 2))
    nccl._check_distinct_gpus(fake_gpu, _Gathered([sim[0], sim[2]], 1), (0, 2))
    one = entries(None)  # without the setting: one host, the same GPU
    with pytest.raises(nccl.NCCLError, match=f"world ranks 0 and 2 both use GPU 0000:10:00.0 "
                                             f"on host {host}:"):
        nccl._check_distinct_gpus(fake_gpu, _Gathered([one[0], one[2]], 1), (0, 2))
    # Members that read different settings are stopped, every one alike.
    with pytest.raises(ArgumentError, match=r"ranks \[0\]: SPMD_SIMULATE_NODES unset"):
        nccl._check_distinct_gpus(fake_gpu, _Gathered([one[0], sim[2]], 0), (0, 2))


def test_without_nccl_gpu_arrays_take_the_mpi_backend(fake_gpu):
    from spmd.collectives import mpi
    from spmd.collectives.process_group import ProcessGroup

    assert platform.gpu_backend() == "mpi"
    assert ProcessGroup(("i",), (1,), ("i",), (0,), (0,), 0).comm is mpi


@pytest.mark.parametrize("nccl_backend", [False, True])
def test_bool_sums_reach_either_backend_as_max(fake_gpu, runtime_env, nccl_backend):
    """A bool sum is cast back to bool ("any"); both backends reduce bools as uint8,
    whose sum wraps to False at 256 members: the process group sends a max."""
    from spmd.collectives.process_group import ProcessGroup

    if nccl_backend:
        runtime_env(FAKE_CUPY_NCCL="1")
        fake_gpu.install()
    pg = ProcessGroup(("i",), (1,), ("i",), (0,), (0,), 0)
    assert pg.comm.__name__.endswith("nccl" if nccl_backend else "mpi")
    flags = np.array([[True, False]])
    text = spmd.jit(lambda v: pg.all_reduce(v, "sum")[0]).lower(flags).as_text()
    assert "kind='allreduce'" in text and "op='max'" in text, text
    text = spmd.jit(lambda v: pg.reduce_scatter(v, 0, True)[0]).lower(flags).as_text()
    assert "kind='reduce_scatter'" in text and "op='max'" in text, text
    ints = spmd.jit(lambda v: pg.all_reduce(v, "sum")[0]).lower(np.ones((1, 2), np.int32))
    assert "op='sum'" in ints.as_text()
    np.testing.assert_array_equal(
        np.asarray(spmd.jit(lambda v: pg.all_reduce(v, "sum")[0])(flags)), flags)


def test_required_gpu_tests_fail_instead_of_skipping(monkeypatch):
    """On the GPU machine (SPMD_REQUIRE_GPU_TESTS=1, set by gpu_check.sh) a missing
    CuPy, GPU or NCCL must fail the GPU tests: a skip would read as a pass."""
    from tests.gpu.conftest import missing

    monkeypatch.delenv("SPMD_REQUIRE_GPU_TESTS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no NCCL"):
        missing("no NCCL")
    monkeypatch.setenv("SPMD_REQUIRE_GPU_TESTS", "1")
    with pytest.raises(pytest.fail.Exception, match="no NCCL.*must run"):
        missing("no NCCL")

"""One rank of a multi-process job on the CuPy and NCCL stand-ins (run by
``tests/gpu/test_nccl_processes.py`` under ``mpiexec``; not a test module itself).

    mpiexec -n 4 python tests/gpu/nccl_job.py collectives
    mpiexec -n 2 python tests/gpu/nccl_job.py bound        # CUDA_VISIBLE_DEVICES=<rank>
    mpiexec -n 2 python tests/gpu/nccl_job.py shared-gpu   # CUDA_VISIBLE_DEVICES=0 on both
    mpiexec -n 2 python tests/gpu/nccl_job.py host-staged  # SPMD_GPU_BACKEND=mpi
    mpiexec -n 4 python tests/gpu/nccl_job.py simulated    # SPMD_SIMULATE_NODES=2, 2 GPUs

Each rank prints ``RANK <r> OK`` at the end, or the error it expected.
"""

from __future__ import annotations

import os
import sys

SCENARIO = sys.argv[1]
RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
os.environ.update(SPMD_PLATFORM="gpu", FAKE_CUPY_NCCL="1")
os.environ.pop("SPMD_GPU_BACKEND", None)
if SCENARIO == "host-staged":  # GPU arrays, collectives through host memory and MPI
    os.environ["SPMD_GPU_BACKEND"] = "mpi"
if SCENARIO == "bound":  # a launcher that binds each rank to its own GPU
    os.environ["CUDA_VISIBLE_DEVICES"] = str(RANK)
elif SCENARIO == "shared-gpu":  # a wrong binding: both ranks on physical GPU 0
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
else:  # every rank sees the node's GPUs and takes the one of its local rank
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ["FAKE_CUPY_GPUS"] = os.environ.get("FAKE_CUPY_GPUS", "4")
if SCENARIO == "simulated":  # 2 nodes of 2 ranks, each node with 2 GPUs of its own
    os.environ.update(SPMD_SIMULATE_NODES="2", FAKE_CUPY_GPUS="2")
else:
    os.environ.pop("SPMD_SIMULATE_NODES", None)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.gpu import fake_cupy  # noqa: E402

fake_cupy.install()

import numpy as np  # noqa: E402

import spmd  # noqa: E402
from spmd import P, lax  # noqa: E402
from spmd.collectives import nccl  # noqa: E402
from spmd.compiler.core import array_module  # noqa: E402
from spmd.launch import platform  # noqa: E402
from tests.gpu import fake_nccl  # noqa: E402

cp = fake_cupy
n = spmd.process_count()
assert platform.gpu_backend() == ("mpi" if SCENARIO == "host-staged" else "nccl")


def check_group_collectives():
    """psum, pmax, all_gather, psum_scatter, ppermute and all_to_all along each axis
    of a 2 x 2 mesh of 4 processes: 2-member NCCL communicators (sub-groups)."""
    mesh = spmd.make_mesh((2, 2), ("a", "b"))
    x = np.arange(4 * 6 * 4, dtype=np.float32).reshape(4 * 6, 4) - 40.0
    spec = P(("a", "b"))
    arr = spmd.device_put(x, spmd.NamedSharding(mesh, spec))
    assert type(arr.addressable_shards[0].data.value) is cp.ndarray
    blocks = x.reshape(2, 2, 6, 4)  # [a, b] -> the block of device (a, b)

    def run(body, out_spec):
        f = spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=spec, out_specs=out_spec,
                                    check_vma=False))
        return spmd.process_allgather(f(arr))

    coords = [(a, b) for a in range(2) for b in range(2)]  # device order of spec

    def members(c, axis):  # the group of c along axis, in axis order; c's position
        group = [(k, c[1]) for k in range(2)] if axis == "a" else [(c[0], k) for k in range(2)]
        return group, group.index(c)

    def expect(per_device):
        return np.concatenate([per_device(c, *members(c, axis)) for c in coords])

    for axis in ("a", "b"):
        np.testing.assert_array_equal(run(lambda v: lax.psum(v, axis), spec), expect(
            lambda c, g, p: sum(blocks[m] for m in g)))
        np.testing.assert_array_equal(run(lambda v: lax.pmax(v, axis), spec), expect(
            lambda c, g, p: np.maximum(*[blocks[m] for m in g])))
        np.testing.assert_array_equal(
            run(lambda v: lax.all_gather(v, axis, tiled=True), spec),
            expect(lambda c, g, p: np.concatenate([blocks[m] for m in g])))
        np.testing.assert_array_equal(
            run(lambda v: lax.psum_scatter(v, axis, tiled=True), spec),
            expect(lambda c, g, p: sum(blocks[m] for m in g)[3 * p:3 * p + 3]))
        np.testing.assert_array_equal(
            run(lambda v: lax.all_to_all(v, axis, 0, 0, tiled=True), spec),
            expect(lambda c, g, p: np.concatenate([blocks[m][3 * p:3 * p + 3] for m in g])))
        np.testing.assert_array_equal(
            run(lambda v: lax.ppermute(v, axis, [(0, 1), (1, 0)]), spec),
            expect(lambda c, g, p: blocks[g[1 - p]]))
    made = sorted(nccl._communicators)  # sub-groups, not only the world
    assert len(made) == 2 and all(len(g) == 2 and RANK in g for g in made), made


def check_bool_sum():
    """A bool sum reaches NCCL as a uint8 max: "any", which a uint8 sum would lose
    at 256 members (it wraps to 0)."""
    ranks = tuple(range(n))
    x = cp.asarray(np.array([RANK == 0, False, True]))
    fake_nccl.calls.clear()
    got = nccl.allreduce(x, ranks, "sum")
    assert got.dtype == np.bool_ and cp.asnumpy(got).tolist() == [True, False, True]
    assert fake_nccl.calls == [("allReduce", 3, fake_nccl.UINT8, fake_nccl.MAX)], fake_nccl.calls


def check_psum():
    mesh = spmd.make_mesh((n,), ("i",))
    f = spmd.jit(spmd.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"),
                                out_specs=P()))
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    got = f(spmd.device_put(x, spmd.NamedSharding(mesh, P("i"))))
    np.testing.assert_array_equal(np.asarray(got), x.sum(0, keepdims=True))


def check_arrays_spread_over_processes():
    """Arrays made from each process's data, a jitted step on them (partitioned over
    the processes), a scalar result: every buffer on the GPU, values as numpy's."""
    mesh = spmd.make_mesh((n,), ("i",))
    sharding = spmd.NamedSharding(mesh, P("i"))
    x = np.arange(n * 4 * 3, dtype=np.float32).reshape(n * 4, 3) / 10
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    xs = spmd.make_array_from_process_local_data(sharding, x[4 * RANK:4 * RANK + 4])
    for shard in xs.addressable_shards:
        assert type(shard.data.value) is cp.ndarray
    loss, grad = spmd.jit(spmd.value_and_grad(
        lambda w, x: spmd.numpy.sum(spmd.numpy.tanh(x @ w) ** 2)))(w, xs)
    t = np.tanh(x @ w)
    np.testing.assert_allclose(float(loss), (t ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), x.T @ (2 * t * (1 - t * t)), rtol=1e-4,
                               atol=1e-5)
    y = spmd.jit(lambda v: v * 2 + 1)(xs)
    np.testing.assert_allclose(spmd.process_allgather(y), x * 2 + 1, rtol=1e-6)
    check_psum()


def check_combined():
    """Independent psums of one program run as one NCCL all-reduce over a flat buffer
    (spmd.compiler.passes.combine), with the results of separate ones."""
    mesh = spmd.make_mesh((n,), ("i",))
    f = spmd.jit(spmd.shard_map(lambda a, b: (lax.psum(a, "i"), lax.psum(b * 2, "i")),
                                mesh=mesh, in_specs=(P("i"), P("i")), out_specs=(P(), P())))
    a = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    b = np.arange(n * 5, dtype=np.float32).reshape(n, 5) - 7
    fake_nccl.calls.clear()
    sa, sb = f(a, b)
    assert [c[0] for c in fake_nccl.calls].count("allReduce") == 1, fake_nccl.calls
    np.testing.assert_array_equal(np.asarray(sa), a.sum(0, keepdims=True))
    np.testing.assert_array_equal(np.asarray(sb), (2 * b).sum(0, keepdims=True))


if SCENARIO == "collectives":
    assert array_module.device_id[0] == RANK  # the GPU of its local rank
    check_group_collectives()
    check_bool_sum()
    check_combined()
elif SCENARIO == "bound":
    assert cp.cuda.runtime.getDeviceCount() == 1 and array_module.device_id[0] == 0
    assert cp.cuda.Device(0).pci_bus_id != "0000:10:00.0" or RANK == 0
    check_psum()
    check_bool_sum()
elif SCENARIO == "shared-gpu":
    try:
        check_psum()
    except nccl.NCCLError as e:
        assert "world ranks 0 and 1 both use GPU 0000:10:00.0" in str(e), e
        print(f"RANK {RANK} REFUSED: {e}", flush=True)
    else:
        raise AssertionError("two ranks on one GPU were not refused")
elif SCENARIO == "host-staged":
    check_arrays_spread_over_processes()
elif SCENARIO == "simulated":
    # Node-local numbering: ranks 0, 2 on GPU 0 and 1, 3 on GPU 1 of their node (the
    # same bus ids on both nodes, as on two real machines); NCCL's check compares
    # (node, bus id), so the ranks are accepted, and the 2 x 2 mesh runs along "b"
    # within a node and along "a" across the nodes.
    from spmd.launch import nodes

    assert array_module.device_id[0] == RANK % 2, array_module.device_id
    assert nodes.node_name().endswith(f"/node{RANK // 2}") and platform.local_rank() == RANK % 2
    check_group_collectives()
    check_bool_sum()
    check_combined()
else:
    raise SystemExit(f"unknown scenario {SCENARIO!r}")
print(f"RANK {RANK} OK", flush=True)

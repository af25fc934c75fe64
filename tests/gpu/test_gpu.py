"""spmd on a real GPU: CuPy arrays, a simulated mesh on one GPU, NCCL.

Every test here needs CuPy and a GPU and is skipped, with the reason, where
either is missing (``benchmarks/gpu_check.sh`` runs them on a GPU machine).  The
same code paths are checked on the CPU with a stand-in for CuPy in
``test_platform.py``; these tests check what the stand-in cannot: CuPy's own
functions, kernels, streams and NCCL.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax
from spmd.compiler.core import array_module
from tests.gpu.conftest import missing

RNG = np.random.default_rng(0)


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _close(got, want, tol=1e-5):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


def _on_gpu(cupy, arr):
    assert isinstance(arr, spmd.Array) and type(arr.value) is cupy.ndarray, type(arr.value)
    return arr


def test_platform_and_devices(gpu):
    assert array_module.current() is gpu
    assert all(d.platform == "gpu" for d in spmd.devices())
    x = _on_gpu(gpu, snp.ones((2, 3)))
    assert np.asarray(x).sum() == 6.0 and type(np.asarray(x)) is np.ndarray


def test_eager_ops(gpu):
    a, b = _x(4, 3), _x(3, 5)
    x, y = snp.asarray(a), snp.asarray(b)
    _close(_on_gpu(gpu, snp.tanh(x @ y) + 1.0), np.tanh(a @ b) + 1.0)
    _close(_on_gpu(gpu, snp.sum(x, axis=0)), a.sum(0))
    _close(_on_gpu(gpu, x.T[::-1]), a.T[::-1])
    _close(_on_gpu(gpu, snp.where(x > 0, x, 0.0)), np.where(a > 0, a, 0))
    _close(_on_gpu(gpu, (x > 0).astype(np.int32) * 3), (a > 0).astype(np.int32) * 3)
    _close(_on_gpu(gpu, snp.sort(x, axis=1)), np.sort(a, axis=1))
    want = a.copy()
    want[1, 2] += 5.0
    _close(_on_gpu(gpu, x.at[1, 2].add(5.0)), want)
    _close(_on_gpu(gpu, snp.argmax(x, axis=1)), a.argmax(1))
    _close(_on_gpu(gpu, snp.arange(10) % 3), np.arange(10) % 3)
    assert float(x[0, 0]) == float(a[0, 0])


def test_jit(gpu):
    def f(w, x):
        h = snp.tanh(x @ w[0] + w[1])
        return (h > 0).astype(np.float32) * h, snp.max(h, axis=-1)

    w = (_x(8, 16), _x(16))
    x = _x(32, 8)
    jf = spmd.jit(f)
    h = np.tanh(x @ w[0] + w[1])
    for args in ((w, x), (spmd.device_put(w), gpu.asarray(x))):  # host or device inputs
        out, mx = jf(*args)
        _close(_on_gpu(gpu, out), (h > 0) * h)
        _close(_on_gpu(gpu, mx), h.max(-1))
    assert jf._cache_size() == 1  # a cupy argument shares the trace of a numpy one


def test_control_flow(gpu):
    out = spmd.jit(lambda x: lax.fori_loop(0, 5, lambda i, c: c * 2.0 + i, x))(np.ones(3))
    _close(_on_gpu(gpu, out), np.full(3, 32.0 + 26.0))
    cond = spmd.jit(lambda p, x: lax.cond(p > 0, lambda v: v + 1, lambda v: v - 1, x))
    _close(cond(np.float32(1), np.zeros(2, np.float32)), np.ones(2))
    _close(cond(np.float32(-1), np.zeros(2, np.float32)), -np.ones(2))
    cums = spmd.jit(lambda x: lax.scan(lambda c, v: (c + v, c * v), 0.0, x))(np.arange(4.0))
    _close(_on_gpu(gpu, cums[0]), 6.0)
    _close(cums[1], [0.0, 0.0, 2.0, 9.0])


def test_grad(gpu):
    x, w = _x(16, 8), _x(8, 4)

    def loss(w, x):
        return snp.sum(snp.tanh(x @ w) ** 2)

    g = spmd.jit(spmd.grad(loss))(w, x)
    t = np.tanh(x @ w)
    _close(_on_gpu(gpu, g), x.T @ (2 * t * (1 - t ** 2)), tol=1e-4)


def test_shard_map_on_eight_devices_of_one_gpu(gpu):
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    a, b = _x(8, 6), _x(6, 4)

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P("i", "j"), P("j", None)),
                       out_specs=P("i", None))
    def matmul(x, y):
        return lax.psum(x @ y, "j")

    _close(_on_gpu(gpu, matmul(a, b)), a @ b, tol=1e-4)
    ga, gb = spmd.grad(lambda x, y: snp.sum(matmul(x, y) ** 2), argnums=(0, 1))(a, b)
    _close(ga, 2 * (a @ b) @ b.T, tol=1e-4)
    _close(gb, a.T @ (2 * (a @ b)), tol=1e-4)

    x = _x(8, 4)
    one = functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i"), check_vma=False)
    _close(one(lambda v: lax.all_gather(v, "i", tiled=True), out_specs=P())(x), x)
    _close(one(lambda v: lax.psum_scatter(v, "i", tiled=True), out_specs=P("i"))(
        np.tile(x, (4, 1))), 4 * x)
    shift = one(lambda v: lax.ppermute(v, "i", [(k, (k + 1) % 4) for k in range(4)]),
                out_specs=P("i"))
    _close(shift(x), np.roll(x, 2, axis=0))
    _close(one(lambda v: lax.pmax(v, "i"), out_specs=P())(x),
           x.reshape(4, 2, 4).max(0))
    idx = one(lambda v: v * 0 + lax.axis_index("i"), out_specs=P("i"))(x)
    _close(idx, np.repeat(np.arange(4.0), 2)[:, None] * np.ones((1, 4)))
    # Device k gets column block k of every device's rows: the global value is unchanged.
    a2a = spmd.shard_map(lambda v: lax.all_to_all(v, "i", 1, 0, tiled=True), mesh=mesh,
                         in_specs=P("i", None), out_specs=P(None, "i"), check_vma=False)
    x8 = _x(8, 8)
    _close(a2a(x8), x8)


def test_partitioner(gpu):
    mesh = spmd.make_mesh((4, 2), ("data", "model"))
    x, w1, w2 = _x(16, 8), _x(8, 12), _x(12, 4)
    f = spmd.jit(lambda x, w1, w2: snp.tanh(x @ w1) @ w2, in_shardings=(
        NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P(None, "model")),
        NamedSharding(mesh, P("model", None))),
        out_shardings=NamedSharding(mesh, P("data", None)))
    _close(_on_gpu(gpu, f(x, w1, w2)), np.tanh(x @ w1) @ w2, tol=1e-4)
    y = spmd.device_put(x, NamedSharding(mesh, P("data", "model")))
    _on_gpu(gpu, y)
    _close(_on_gpu(gpu, snp.sin(y) * 2), np.sin(x) * 2)


# ------------------------------------------------------------------- NCCL

@pytest.fixture
def nccl_module(gpu):
    from spmd.collectives import nccl
    from spmd.launch import platform

    if not platform.nccl_available():
        missing("CuPy cannot load NCCL (it comes from the nvidia-nccl-cu12 / -cu13 wheel)")
    return nccl


def _dtypes(cupy):
    out = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8,
           np.int16, np.bool_, np.complex64]
    try:
        import ml_dtypes

        cupy.asarray(np.zeros(2, ml_dtypes.bfloat16)) + 1  # CuPy >= 14 with ml_dtypes
        out.append(ml_dtypes.bfloat16)
    except Exception:  # noqa: BLE001 - this CuPy has no bfloat16
        pass
    return out


def test_nccl_one_rank_communicator(gpu, nccl_module):
    nccl = nccl_module
    for dtype in _dtypes(gpu):
        host = (RNG.standard_normal((3, 5)) * 4).astype(dtype)
        x = gpu.asarray(host)
        for op in ("sum", "max", "min"):
            if np.dtype(dtype).kind == "c" and op != "sum":
                continue
            got = nccl.allreduce(x, (0,), op, what="psum")
            assert type(got) is gpu.ndarray and got.dtype == host.dtype
            np.testing.assert_array_equal(gpu.asnumpy(got), host)
        np.testing.assert_array_equal(gpu.asnumpy(nccl.allgather(x, (0,))), host[None])
        np.testing.assert_array_equal(gpu.asnumpy(nccl.reduce_scatter(x[None], (0,))), host)
        np.testing.assert_array_equal(gpu.asnumpy(nccl.alltoall(x[None], (0,))), host[None])
        np.testing.assert_array_equal(gpu.asnumpy(nccl.sendrecv(x.T, (0,), 0, 0)), host.T)
    assert nccl.communicator((0,)) is nccl.communicator((0,))  # made once


def test_nccl_psum_through_a_process_group(gpu, nccl_module):
    from spmd.collectives.process_group import ProcessGroup

    pg = ProcessGroup(("i",), (1,), ("i",), (0,), (0,), 0)
    assert pg.comm is nccl_module
    f = spmd.jit(lambda v: pg.all_reduce(v, "sum")[0] + 1.0)
    assert "nccl[kind='allreduce'" in f.lower(np.ones((1, 4), np.float32)).as_text()
    x = _x(1, 1024)
    _close(_on_gpu(gpu, f(x)), x + 1.0)
    g = spmd.jit(lambda v: pg.all_gather(v, 0, True)[0])
    _close(g(x), x.reshape(1, 1024))


def test_attention_kernel(gpu):
    """spmd.nn.dot_product_attention's kernel on CuPy arrays (its tiles in turn: sharing
    them among threads is numpy's), forward and backward, equal to the same maths in
    ordinary operations on the same device."""
    q, k, v = _x(2, 16, 4, 8), _x(2, 16, 2, 8), _x(2, 16, 2, 8)
    w = _x(2, 16, 4, 8)

    def loss(impl):
        return lambda q, k, v: snp.sum(spmd.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation=impl) * w)

    got = spmd.jit(spmd.value_and_grad(loss(None), argnums=(0, 1, 2)))(q, k, v)
    want = spmd.jit(spmd.value_and_grad(loss("xla"), argnums=(0, 1, 2)))(q, k, v)
    _close(got[0], np.asarray(want[0]), tol=1e-4)
    for g, x in zip(got[1], want[1]):
        _close(_on_gpu(gpu, g), np.asarray(x), tol=1e-4)

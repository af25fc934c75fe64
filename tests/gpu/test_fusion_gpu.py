"""Fused elementwise groups on the GPU backend: one CuPy ``ElementwiseKernel`` per
group (spmd.compiler.engine.fusion_gpu.c_operation), checked on the CuPy stand-in (its
``ElementwiseKernel`` reads the C subset and evaluates it with numpy) and, where a
GPU is lent, on CuPy itself."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.engine import fusion_gpu

RNG = np.random.default_rng(3)


def _gelu(x):
    return spmd.nn.gelu(x) * 2.0 + 1.0


def _mixed(x, y):
    z = snp.exp(-snp.abs(x)) + snp.log1p(x * x) - snp.expm1(y / 4) + x ** 3
    return snp.where(x > y, snp.tanh(z), snp.sin(z) * snp.cos(y)) + lax.rsqrt(y * y + 1.0)


CASES = [(_gelu, [(128, 160)]), (_mixed, [(40, 512), (40, 512)])]


@pytest.mark.parametrize("fn,shapes", CASES, ids=["gelu", "mixed"])
def test_groups_are_one_kernel_each_on_the_stand_in(fake_gpu, fn, shapes):
    args = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    want = np.asarray(spmd.jit(fn)(*args))  # (on the stand-in too: unfused CuPy calls)
    before = len(fake_gpu.kernels_built)
    f = spmd.jit(fn)
    text = f.lower(*args).as_text(executed=True)
    assert "fused_elementwise" in text
    got = f(*args)
    assert type(got.value) is fake_gpu.ndarray
    built = fake_gpu.kernels_built[before:]
    assert built and all(name.startswith("spmd_fused_") for name, _ in built)
    assert all(op.split("; ")[-1].startswith("out = ") for _, op in built)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=2e-6)


def test_the_c_operation_of_a_group(fake_gpu):
    x = np.ones((128, 160), np.float32)
    f = spmd.jit(lambda x: snp.where(x > 0.5, snp.tanh(x * 2.0), x ** 2))
    f(x)
    _, op = fake_gpu.kernels_built[-1]
    assert op == "out = ((x0 > ((float)0.5)) ? tanh((x0 * ((float)2.0))) : (x0 * x0))"


def test_a_group_with_shared_values_and_two_results(fake_gpu):
    """Shared values are C locals, each result one assignment: GELU's value and its
    derivative under grad are one launch."""
    x = np.ones((128, 160), np.float32)
    f = spmd.jit(lambda x, y: (lambda t: (t * y, 1.0 - t * t))(snp.tanh(x)))
    a, b = f(x, 2 * x)
    _, op = fake_gpu.kernels_built[-1]
    assert op == "float t0 = tanh(x0); out0 = (t0 * x1); out1 = (((float)1.0) - (t0 * t0))"
    np.testing.assert_allclose(np.asarray(a), np.tanh(1.0) * 2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(b), 1 - np.tanh(1.0) ** 2, rtol=1e-6)

    xs = RNG.standard_normal((128, 160)).astype(np.float32)
    g = spmd.jit(spmd.value_and_grad(lambda x: snp.sum(spmd.nn.gelu(x) ** 2)))
    before = len(fake_gpu.kernels_built)
    value, grad = g(xs)
    gelu_ops = [op for _, op in fake_gpu.kernels_built[before:] if "tanh" in op]
    assert len(gelu_ops) == 1 and "out0 = " in gelu_ops[0] and "out1 = " in gelu_ops[0]
    spmd.config.update("fuse_elementwise", False)
    try:
        want_value, want_grad = spmd.jit(
            spmd.value_and_grad(lambda x: snp.sum(spmd.nn.gelu(x) ** 2)))(xs)
    finally:
        spmd.config.update("fuse_elementwise", True)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=2e-5, atol=1e-6)


def test_the_stand_in_refuses_bad_kernels(fake_gpu):
    with pytest.raises(NameError, match="'y'"):
        fake_gpu.ElementwiseKernel("float32 x", "float32 out", "out = x + y", "k")
    with pytest.raises(SyntaxError):
        fake_gpu.ElementwiseKernel("float32 x", "float32 out", "out = x +", "k")
    with pytest.raises(ValueError, match="assign each of"):
        fake_gpu.ElementwiseKernel("float32 x", "float32 o0, float32 o1", "o0 = x", "k")
    with pytest.raises(ValueError, match="neither declares a local"):
        fake_gpu.ElementwiseKernel("float32 x", "float32 out", "t = x; out = t", "k")
    with pytest.raises(NameError, match="'t'"):
        fake_gpu.ElementwiseKernel("float32 x", "float32 out", "out = t; float t = x", "k")
    k = fake_gpu.ElementwiseKernel("float32 x", "float32 out", "out = x * x", "k")
    with pytest.raises(TypeError, match="float32 device array"):
        k(np.ones(3, np.float32), fake_gpu.empty(3, np.float32))


def test_on_a_gpu(gpu):
    x = RNG.standard_normal((128, 160)).astype(np.float32)
    f = spmd.jit(_gelu)
    assert "fused_elementwise" in f.lower(x).as_text(executed=True)
    spmd.config.update("fuse_elementwise", False)
    try:
        want = np.asarray(spmd.jit(_gelu)(x))
    finally:
        spmd.config.update("fuse_elementwise", True)
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=2e-6, atol=2e-6)
    assert fusion_gpu.c_operation  # the kernels CuPy compiled came from this renderer

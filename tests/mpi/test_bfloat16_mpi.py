"""bfloat16 and the 8-bit floats in collectives across processes.

MPI has no reduction over these types: a sum is widened to float32 on every rank,
reduced by MPI in float32 and rounded once at the end (``spmd/collectives/mpi/
buffers.py``); data movement copies bytes.  The oracle is numpy on the global
arrays (:class:`tests.mpi.RefMesh`, its sums in float64 and rounded once: exact
here, as sums of a few bfloat16 values are exact in float32).  Runs on 4 ranks, one
device each (``make test``).
"""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import (MESH_AXES, RefMesh, axes_id, data_movements, make_mesh,  # noqa: E402
                       run_per_device)

import spmd  # noqa: E402
from spmd import P, lax  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

BF16 = np.dtype(ml_dtypes.bfloat16)
NARROW = [BF16, np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]
IDS = ["bf16", "e4m3fn", "e5m2"]
MA_IDS = [f"{k}-{axes_id(a)}" for k, a in MESH_AXES]


def narrow_values(shape, dtype, seed=0):
    """Values of ``dtype`` with fractions (not the small integers of tests.mpi.values),
    so that a sum rounded at every step differs from one rounded once."""
    rng = np.random.default_rng(seed)
    return rng.uniform(-3, 3, shape).astype(np.float32).astype(dtype)


def _bits(a):
    return np.atleast_1d(np.asarray(a)).view(np.uint8)


def _run(kind, body, ref_fn, block_shape, dtype):
    mesh = make_mesh(kind)
    ref = RefMesh.of(mesh)
    x = narrow_values((mesh.size * block_shape[0],) + tuple(block_shape[1:]), dtype)
    got = run_per_device(mesh, body, x)
    blocks = ref.split_rows(x)
    want = ref.stack({c: ref_fn(ref, blocks, c) for c in ref.coords()})
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("op", ["psum", "pmean", "pmax", "pmin"])
def test_reductions_of_bfloat16(kind, axes, op):
    _run(kind, lambda b: getattr(lax, op)(b, axes),
         lambda ref, blocks, c: getattr(ref, op)(blocks, c, axes), (2, 3), BF16)


@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_psum_of_narrow_floats_rounds_once(dtype):
    for kind in ("1d", "2d"):
        axes = make_mesh(kind).axis_names
        _run(kind, lambda b: lax.psum(b, axes),
             lambda ref, blocks, c: ref.psum(blocks, c, axes), (4, 5), dtype)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_psum_is_not_a_bfloat16_running_sum(jit):
    """Rank 0 holds 1, the others 2**-8 (half a bfloat16 ulp at 1): added in bfloat16
    rank by rank, 1 + 2**-8 rounds back to 1 (ties to even) every time; summed in
    float32 and rounded once, 1 + 3 * 2**-8 (on 4 ranks) rounds up to 1 + 2**-6."""
    mesh = make_mesh("1d")
    n = mesh.size
    assert n >= 3  # (with 2, once and step by step agree: 1 + 2**-8 is a tie either way)
    x = np.full((n, 1), 2.0 ** -8, np.float32)
    x[0] = 1.0
    x = x.astype(BF16)
    f = spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                       out_specs=P())
    got = np.asarray(spmd.process_allgather((spmd.jit(f) if jit else f)(x)))
    want = np.float32(1 + (n - 1) * 2.0 ** -8).astype(BF16)
    assert got.dtype == BF16
    np.testing.assert_array_equal(_bits(got.reshape(-1)[:1]), _bits(want))


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_data_movement_keeps_the_bits(kind, axes, dtype):
    n = RefMesh.of(make_mesh(kind)).size(axes)
    for fn, ref_fn, shape in data_movements(axes, n):
        _run(kind, fn, ref_fn, shape, dtype)


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
def test_psum_scatter_of_bfloat16(kind, axes):
    n = RefMesh.of(make_mesh(kind)).size(axes)
    _run(kind, lambda b: lax.psum_scatter(b, axes, tiled=True),
         lambda ref, blocks, c: ref.psum_scatter(blocks, c, axes, 0, True), (2 * n, 3), BF16)


def test_mixed_precision_gradients_are_averaged_in_float32():
    """bfloat16 compute, float32 master weights: each rank's gradient is the float32
    value of a bfloat16 one, and the average over the ranks is their float32 mean
    (not rounded to bfloat16)."""
    import spmd.numpy as snp
    import spmd.optim as optim

    mesh = make_mesh("1d")
    n = mesh.size
    rng = np.random.default_rng(5)
    params = {"w": rng.normal(size=(3, 2)).astype(np.float32)}
    x = rng.normal(size=(4 * n, 3)).astype(np.float32)
    y = rng.normal(size=(4 * n, 2)).astype(np.float32)

    def loss_fn(p, a, b):
        return snp.mean((a.astype(p["w"].dtype) @ p["w"] - b.astype(p["w"].dtype)) ** 2)

    reduced = optim.mixed_precision.value_and_grad(loss_fn, axis_name="i")
    own = optim.mixed_precision.value_and_grad(loss_fn)

    def local(p, a, b):
        mine = own(lax.pvary(p, "i"), a, b)[1]["w"]
        return reduced(p, a, b)[1]["w"], mine[None]

    sm = spmd.shard_map(local, mesh=mesh, in_specs=(P(), P("i"), P("i")),
                        out_specs=(P(), P("i")))
    g, parts = spmd.jit(sm)(params, x, y)
    g = np.asarray(spmd.process_allgather(g))
    parts = np.asarray(spmd.process_allgather(parts))
    assert g.dtype == np.float32 and parts.shape == (n, 3, 2)
    np.testing.assert_array_equal(parts, parts.astype(BF16).astype(np.float32))
    np.testing.assert_allclose(g, parts.astype(np.float64).mean(0), rtol=1e-6, atol=1e-7)
    assert not np.array_equal(g, g.astype(BF16).astype(np.float32))

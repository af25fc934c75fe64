"""Complex collectives across processes against numpy on the global arrays.

complex64 and complex128 through psum, pmean, all_gather, psum_scatter,
all_to_all and ppermute (MPI reduces complex buffers with MPI_SUM on its complex
datatypes; data movement copies bytes), a gradient through psum, and pmax/pmin
ordering complex values lexicographically.  Runs on 4 ranks, one device each (``make test``).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import (MESH_AXES, RefMesh, axes_id, data_movements, make_mesh,  # noqa: E402
                       run_per_device, values, x64_if)

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import P, lax  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

CDTYPES = [np.complex64, np.complex128]
CIDS = ["c64", "c128"]
MA_IDS = [f"{k}-{axes_id(a)}" for k, a in MESH_AXES]


def cvalues(shape, dtype, seed=0):
    """Small Gaussian integers: sums stay exact, both parts differ between ranks."""
    return (values(shape, np.float64, seed) + 1j * values(shape, np.float64, seed + 7)
            ).astype(dtype)


def _run(kind, body, ref_fn, block_shape, dtype):
    mesh = make_mesh(kind)
    ref = RefMesh.of(mesh)
    x = cvalues((mesh.size * block_shape[0],) + tuple(block_shape[1:]), dtype)
    with x64_if(dtype):
        got = run_per_device(mesh, body, x)
    blocks = ref.split_rows(x)
    want = ref.stack({c: ref_fn(ref, blocks, c) for c in ref.coords()})
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("op", ["psum", "pmean"])
@pytest.mark.parametrize("dtype", CDTYPES, ids=CIDS)
def test_reductions(kind, axes, op, dtype):
    _run(kind, lambda b: getattr(lax, op)(b, axes),
         lambda ref, blocks, c: getattr(ref, op)(blocks, c, axes), (2, 3), dtype)


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("dtype", CDTYPES, ids=CIDS)
def test_data_movement(kind, axes, dtype):
    n = RefMesh.of(make_mesh(kind)).size(axes)
    for fn, ref_fn, shape in data_movements(axes, n):
        _run(kind, fn, ref_fn, shape, dtype)
    _run(kind, lambda b: lax.psum_scatter(b, axes, tiled=True),
         lambda ref, blocks, c: ref.psum_scatter(blocks, c, axes, 0, True), (2 * n, 3), dtype)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_grad_through_psum(jit):
    """grad of sum |psum(z * z)| follows JAX's convention: 2 z conj(s) / |s| per element
    (s the row sums), the same on every process."""
    mesh = make_mesh("1d")
    names = mesh.axis_names
    z = cvalues((mesh.size * 2, 3), np.complex64, seed=3)
    sm = spmd.shard_map(lambda b: lax.psum(b * b, names), mesh=mesh, in_specs=P(names),
                        out_specs=P())
    f = lambda v: snp.sum(snp.abs(sm(v)))  # noqa: E731
    g = (spmd.jit(spmd.grad(f)) if jit else spmd.grad(f))(z)
    blocks = z.reshape(mesh.size, 2, 3).astype(np.complex128)
    s = (blocks * blocks).sum(0)
    want = (2 * blocks * np.conj(s / np.abs(s))).reshape(z.shape)
    np.testing.assert_allclose(spmd.process_allgather(g), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["pmax", "pmin"])
def test_pmax_pmin_of_complex_are_lexicographic(op):
    """Real part first, then imaginary part (numpy's order): small integer parts, so
    real parts tie between ranks and the imaginary parts decide."""
    for kind in ("1d", "2d"):
        mesh = make_mesh(kind)
        z = cvalues((mesh.size, 4), np.complex64, seed=3)
        # Column 0: one real part on every rank, so the imaginary parts decide.
        z[:, 0] = 2.0 + 1j * np.arange(mesh.size)[::-1]
        got = run_per_device(mesh, lambda b: getattr(lax, op)(b, mesh.axis_names), z)
        want = getattr(np, op[1:])(z.reshape(mesh.size, 1, 4), axis=0)
        for block in got.reshape(mesh.size, 1, 4):
            np.testing.assert_array_equal(block, want)

"""Complex arrays through the collectives on simulated devices (one process),
against numpy on the global array: psum/pmean reduce both parts, data movement
keeps them, gradients follow JAX's convention, pmax/pmin order lexicographically
(real part, then imaginary part), as snp.max does."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.errors import DTypeError

N = 4


def crand(shape, seed=0, dtype=np.complex64):
    r = np.random.default_rng(seed)
    return (r.standard_normal(shape) + 1j * r.standard_normal(shape)).astype(dtype)


def _mesh():
    return spmd.make_mesh((N,), ("i",))


def _smap(body, out_specs):
    return spmd.shard_map(body, mesh=_mesh(), in_specs=P("i"), out_specs=out_specs)


def _blocks(z):
    return z.reshape((N, -1) + z.shape[1:])


CASES = {
    "psum": (lambda b: lax.psum(b, "i"), P(), lambda z: _blocks(z).sum(0)),
    "pmean": (lambda b: lax.pmean(b, "i"), P(), lambda z: _blocks(z).mean(0)),
    "all_gather": (lambda b: lax.all_gather(b, "i", axis=1, tiled=True), P("i"),
                   lambda z: np.concatenate([np.concatenate(list(_blocks(z)), 1)] * N)),
    "ppermute": (lambda b: lax.ppermute(b, "i", [(k, (k + 1) % N) for k in range(N)]),
                 P("i"), lambda z: np.roll(z, z.shape[0] // N, axis=0)),
    "psum_scatter": (lambda b: lax.psum_scatter(b, "i", tiled=True), P("i"),
                     lambda z: _blocks(z).sum(0)),
    "all_to_all": (lambda b: lax.all_to_all(b, "i", 0, 1, tiled=True), P("i"),
                   lambda z: np.concatenate(
                       [np.concatenate([blk[k:k + 1] for blk in _blocks(z)], 1)
                        for k in range(N)])),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=["c64", "c128"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_collective(name, dtype, jit):
    body, out_specs, ref = CASES[name]
    z = crand((N * N, 3), seed=1, dtype=dtype)
    f = _smap(body, out_specs)
    try:
        if dtype == np.complex128:
            spmd.config.update("enable_x64", True)
        got = (spmd.jit(f) if jit else f)(z)
    finally:
        spmd.config.update("enable_x64", False)
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got), ref(z.astype(np.complex128)), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_grad_through_psum_and_ppermute(jit):
    sm = _smap(lambda b: lax.psum(b * lax.ppermute(b, "i", [(k, (k + 1) % N)
                                                           for k in range(N)]), "i"), P())
    f = lambda v: snp.sum(snp.abs(sm(v)) ** 2)  # noqa: E731
    z = crand((N * 2, 3), seed=2)
    g = (spmd.jit(spmd.grad(f)) if jit else spmd.grad(f))(z)
    # Oracle: JAX's convention df/dx - i df/dy by central differences in float64.
    zz = z.astype(np.complex128)

    def f64(v):
        b = _blocks(v)
        s = (b * np.roll(b, 1, axis=0)).sum(0)
        return np.sum(np.abs(s) ** 2)

    want = np.zeros_like(zz)
    h = 1e-6
    for idx in np.ndindex(zz.shape):
        e = np.zeros_like(zz)
        e[idx] = h
        dx = (f64(zz + e) - f64(zz - e)) / (2 * h)
        dy = (f64(zz + 1j * e) - f64(zz - 1j * e)) / (2 * h)
        want[idx] = dx - 1j * dy
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("op", ["pmax", "pmin"])
def test_pmax_pmin_of_complex_are_lexicographic(op, jit):
    z = crand((N, 3), 5)
    z[1, 0] = z[2, 0].real + 1j * (z[2, 0].imag + 1)  # a tie in the real parts
    z[3, 0] = z[2, 0].real + 1j * (z[2, 0].imag - 1)
    f = _smap(lambda b: getattr(lax, op)(b, "i"), P())
    f = spmd.jit(f) if jit else f
    want = getattr(np, op[1:])(_blocks(z), axis=0)  # numpy orders complex the same way
    np.testing.assert_array_equal(np.asarray(f(z)), want)
    # Away from ties the gradient flows to the chosen device's entries only (JAX's
    # convention: d Re(m c) / dz = c there).
    z = crand((N, 3), 7)
    want = getattr(np, op[1:])(_blocks(z), axis=0)
    c = crand((1, 3), 6)
    g = spmd.grad(lambda v: snp.real(snp.sum(f(v) * c)))(z)
    chosen = _blocks(z) == want[None]
    np.testing.assert_allclose(np.asarray(g), np.where(chosen[:, 0], c, 0), rtol=1e-6)


@pytest.mark.parametrize("op", ["pmax", "pmin"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_pmax_pmin_of_complex_with_nan_follow_numpy(op, jit):
    """An element with a NaN in either part wins, the first device's when several do
    (numpy's rule, as snp.max); a NaN imaginary part was ignored and a NaN real part
    gave -inf as the imaginary part."""
    nan, inf = np.nan, np.inf
    cols = [[1 + 0j, complex(1, nan), 2 + 0j, 0j],            # NaN imaginary part
            [complex(nan, 0), 1 + 0j, 2 + 0j, 0j],            # NaN real part
            [1 + 1j, complex(2, nan), complex(nan, 5), 0j],  # two: the first device's
            [1 + 1j, 1 + 3j, 1 + 3j, -1 + 0j],               # no NaN: a tie
            [complex(-inf, 1), complex(-inf, 2), complex(inf, 0), 0j]]
    z = np.array(cols, np.complex64).T.copy()  # (devices, columns)
    f = _smap(lambda b: getattr(lax, op)(b, "i"), P())
    got = np.asarray((spmd.jit(f) if jit else f)(z))[0]
    want = getattr(np, op[1:])(z, axis=0)
    for g, w in zip(got, want):  # part by part, NaN where numpy has NaN
        np.testing.assert_array_equal([g.real, g.imag], [w.real, w.imag])


def test_direct_pmax_primitive_still_refuses_complex():
    """lax.pmax orders complex values by parts; the primitive itself has no order."""
    from spmd.collectives.primitives import pmax_p
    from spmd.compiler.core.avals import ShapedArray

    with pytest.raises(DTypeError, match="pmax: operand dtype complex64 is complex"):
        pmax_p.abstract_eval(ShapedArray((2,), np.complex64), axes=("i",))

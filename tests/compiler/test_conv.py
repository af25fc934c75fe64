"""conv_general_dilated: values against a direct loop over the definition (and
scipy.signal for the plain case), derivatives against finite differences,
vmap against a loop, layouts, padding strings, errors."""

import numpy as np
import pytest

import spmd
from spmd import lax
from spmd.errors import ArgumentError, ShapeError
from spmd.test_util import check_grads

RNG = np.random.default_rng(0)


def reference(x, w, strides, pads, ld, rd, G=1, B=1):
    """The definition, one output element at a time (NC.../OI.../NC..., float64)."""
    N, C = x.shape[:2]
    O, I = w.shape[:2]
    dil = tuple((n - 1) * d + 1 for n, d in zip(x.shape[2:], ld))
    xd = np.zeros((N, C) + dil)
    xd[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in ld)] = x
    for i, (lo, hi) in enumerate(pads):
        ax = 2 + i
        xd = np.take(xd, range(max(-lo, 0), xd.shape[ax] - max(-hi, 0)), axis=ax)
        width = [(0, 0)] * xd.ndim
        width[ax] = (max(lo, 0), max(hi, 0))
        xd = np.pad(xd, width)
    ks = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], rd)]
    out_sp = [max((n - k) // s + 1, 0) for n, k, s in zip(xd.shape[2:], ks, strides)]
    nb, og = N // B, O // (G * B)
    out = np.zeros((nb, O) + tuple(out_sp))
    for n, o in np.ndindex(nb, O):
        grp = o // og
        b, g = (grp if B > 1 else 0), (grp if G > 1 else 0)
        for pos in np.ndindex(*out_sp):
            acc = 0.0
            for ci in range(I):
                for kk in np.ndindex(*w.shape[2:]):
                    idx = tuple(p * s + k * d for p, s, k, d in zip(pos, strides, kk, rd))
                    acc += xd[(b * nb + n, g * I + ci) + idx] * w[(o, ci) + kk]
            out[(n, o) + pos] = acc
    return out


# (lhs shape, rhs shape, strides, padding, lhs_dilation, rhs_dilation, G, B)
CASES = [
    ((2, 3, 7), (4, 3, 3), (1,), [(0, 0)], (1,), (1,), 1, 1),
    ((2, 4, 7, 6), (6, 2, 3, 2), (2, 1), [(1, 2), (0, 1)], (1, 1), (1, 2), 2, 1),
    ((4, 3, 5), (6, 3, 2), (1,), [(1, -1)], (2,), (1,), 1, 2),
    ((1, 2, 6, 5), (2, 2, 3, 3), (2, 2), [(2, 1), (1, 1)], (2, 1), (2, 1), 1, 1),
    ((2, 4, 6), (4, 1, 3), (3,), [(1, 1)], (1,), (2,), 4, 1),  # depthwise
]


def _args(case, seed=0):
    xs, ws, *_ = case
    rng = np.random.default_rng(seed)
    return rng.standard_normal(xs), rng.standard_normal(ws)


def _f(case):
    _, _, st, pd, ld, rd, G, B = case
    return lambda x, w: lax.conv_general_dilated(x, w, st, pd, ld, rd, feature_group_count=G,
                                                 batch_group_count=B)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("jit", [False, True])
def test_matches_the_definition(case, jit):
    x, w = _args(case)
    f = _f(case)
    got = (spmd.jit(f) if jit else f)(x.astype(np.float32), w.astype(np.float32))
    want = reference(x, w, *case[2:])
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_plain_case_matches_scipy():
    signal = pytest.importorskip("scipy.signal")
    x, w = RNG.standard_normal((1, 1, 9, 8)), RNG.standard_normal((1, 1, 3, 4))
    got = lax.conv_general_dilated(x, w, (1, 1), "VALID")
    np.testing.assert_allclose(np.asarray(got)[0, 0], signal.correlate(x[0, 0], w[0, 0],
                                                                       "valid"), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_derivatives_match_finite_differences(case):
    check_grads(_f(case), _args(case), order=2, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_vmap_matches_a_loop(case):
    f = _f(case)
    xs, ws = zip(*[_args(case, seed) for seed in range(3)])
    xs, ws = np.stack(xs).astype(np.float32), np.stack(ws).astype(np.float32)
    want = np.stack([np.asarray(f(x, w)) for x, w in zip(xs, ws)])
    np.testing.assert_allclose(np.asarray(spmd.vmap(f)(xs, ws)), want, rtol=1e-4, atol=1e-4)
    want_x = np.stack([np.asarray(f(x, ws[0])) for x in xs])
    np.testing.assert_allclose(np.asarray(spmd.vmap(f, in_axes=(0, None))(xs, ws[0])), want_x,
                               rtol=1e-4, atol=1e-4)
    want_w = np.stack([np.asarray(f(xs[0], w)) for w in ws])
    np.testing.assert_allclose(np.asarray(spmd.vmap(f, in_axes=(None, 0))(xs[0], ws)), want_w,
                               rtol=1e-4, atol=1e-4)
    # vmap of the gradient (its transposes use batch groups for grouped convolutions)
    g = spmd.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1))
    got = spmd.vmap(g)(xs, ws)
    for i in range(3):
        want = g(xs[i], ws[i])
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a)[i], np.asarray(b), rtol=1e-3, atol=1e-3)


def test_layouts_and_padding_strings():
    x = RNG.standard_normal((2, 7, 6, 3)).astype(np.float32)    # NHWC
    w = RNG.standard_normal((3, 2, 3, 5)).astype(np.float32)    # HWIO
    for pad in ("SAME", "VALID", "SAME_LOWER"):
        got = lax.conv_general_dilated(x, w, (2, 1), pad, dimension_numbers=("NHWC", "HWIO",
                                                                             "NHWC"))
        xc, wc = x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)
        pads = lax.padtype_to_pads((7, 6), (3, 2), (2, 1), pad)
        want = reference(xc, wc, (2, 1), pads, (1, 1), (1, 1)).transpose(0, 2, 3, 1)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    assert lax.padtype_to_pads((7, 6), (3, 2), (2, 1), "SAME") == [(1, 1), (0, 1)]
    assert lax.padtype_to_pads((7, 6), (3, 2), (2, 1), "SAME_LOWER") == [(1, 1), (1, 0)]
    assert lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=(
        "NHWC", "HWIO", "NHWC")).shape == (2, 7, 6, 5)
    # spatial dimensions pair by letter, ordered as in the rhs spec
    dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NWHC", "HWIO", "NCWH"))
    assert dn == lax.ConvDimensionNumbers((0, 3, 2, 1), (3, 2, 0, 1), (0, 1, 3, 2))
    y = lax.conv_general_dilated(x.transpose(0, 2, 1, 3), w, (1, 1), "VALID",
                                 dimension_numbers=("NWHC", "HWIO", "NCWH"))
    base = lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=(
        "NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(np.asarray(y), np.asarray(base).transpose(0, 3, 2, 1),
                               rtol=1e-5)
    np.testing.assert_allclose(np.asarray(lax.conv(x.transpose(0, 3, 1, 2),
                                                   w.transpose(3, 2, 0, 1), (1, 1), "VALID")),
                               np.asarray(base).transpose(0, 3, 1, 2), rtol=1e-5)


def test_integer_operands_and_empty_output():
    x = np.arange(10, dtype=np.int32).reshape(1, 1, 10)
    w = np.array([[[1, 2]]], np.int32)
    got = lax.conv_general_dilated(x, w, (1,), "VALID")
    assert got.dtype == np.int32 and got[0, 0].tolist() == [i + 2 * (i + 1) for i in range(9)]
    assert lax.conv_general_dilated(x, np.ones((1, 1, 11), np.int32), (1,), "VALID").shape == \
        (1, 1, 0)


def test_errors():
    x, w = np.ones((1, 4, 5), np.float32), np.ones((2, 3, 2), np.float32)
    with pytest.raises(ShapeError, match="4 features"):
        lax.conv_general_dilated(x, w, (1,), "VALID")
    with pytest.raises(ShapeError, match="divide"):
        lax.conv_general_dilated(x, np.ones((3, 2, 2), np.float32), (1,), "VALID",
                                 feature_group_count=2)
    with pytest.raises(ArgumentError, match="padding='FULL'"):
        lax.conv_general_dilated(x, np.ones((2, 4, 2), np.float32), (1,), "FULL")
    with pytest.raises(ArgumentError, match="window_strides"):
        lax.conv_general_dilated(x, np.ones((2, 4, 2), np.float32), (1, 1), "VALID")
    with pytest.raises(ArgumentError, match="must be positive"):
        lax.conv_general_dilated(x, np.ones((2, 4, 2), np.float32), (0,), "VALID")
    with pytest.raises(ArgumentError, match="spec"):
        lax.conv_general_dilated(x, np.ones((2, 4, 2), np.float32), (1,), "VALID",
                                 dimension_numbers=("NCH", "OIW", "NCH"))
    with pytest.raises(ArgumentError, match="one of them 1"):
        lax.conv_general_dilated(np.ones((2, 4, 5)), np.ones((4, 2, 2)), (1,), "VALID",
                                 feature_group_count=2, batch_group_count=2)

"""spmd.compiler.passes.pads: zero pads added together become a concatenation (the gradient
of ``q, k, v = qkv[0], qkv[1], qkv[2]``), a transposition of it moves onto the pieces;
values against numpy, the printed programs, and the cases left alone."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.passes.pads import concat_zero_pads
from spmd.compiler.passes.pipeline import dce

RNG = np.random.default_rng(5)


def _names(closed):
    return [e.primitive.name for e in closed.program.eqns]


def _optimized(f, *args):
    return dce(concat_zero_pads(spmd.make_jaxpr(f)(*args)))


def test_the_gradient_of_three_slices_is_one_concatenation():
    x = RNG.standard_normal((3, 2, 4, 5)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 4, 5)).astype(np.float32)

    def f(x):
        q, k, v = x[0], x[1], x[2]
        return snp.sum(q * w[0] + snp.sin(k) * w[1] + v * v * w[2])

    closed = _optimized(spmd.grad(f), x)
    names = _names(closed)
    assert "pad" not in names and names.count("concatenate") == 1
    want = np.stack([w[0], np.cos(x[1]) * w[1], 2 * x[2] * w[2]])
    np.testing.assert_allclose(np.asarray(spmd.jit(spmd.grad(f))(x)), want, rtol=1e-6)


def test_a_transposed_reader_gets_the_pieces_transposed():
    qkv = RNG.standard_normal((2, 3, 4, 6)).astype(np.float32)  # (b, t, c*h, k) style
    wt = RNG.standard_normal((3, 2, 6)).astype(np.float32)

    def f(qkv):
        x = snp.transpose(qkv, (2, 0, 1, 3))   # (4, 2, 3, 6): c first
        a, b = x[:2], x[2:]
        return snp.sum(snp.einsum("cbtk,tbk->", a, wt)) + snp.sum(snp.tanh(b))

    g = spmd.grad(f)
    closed = _optimized(g, qkv)
    names = _names(closed)
    assert "pad" not in names
    # The concatenation is made in the layout its reader wants (no transpose after it).
    cat = next(e for e in closed.program.eqns if e.primitive.name == "concatenate")
    readers = [e for e in closed.program.eqns if cat.outputs[0] in e.inputs]
    assert all(e.primitive.name != "transpose" for e in readers)
    eps = 1e-3
    num = np.zeros_like(qkv, dtype=np.float64)
    f64 = lambda z: float(np.asarray(f(z.astype(np.float32))))  # noqa: E731
    for idx in np.ndindex(*qkv.shape):
        d = np.zeros_like(qkv)
        d[idx] = eps
        num[idx] = (f64(qkv + d) - f64(qkv - d)) / (2 * eps)
    np.testing.assert_allclose(np.asarray(spmd.jit(g)(qkv)), num, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(np.asarray(spmd.jit(g)(qkv)), np.asarray(g(qkv)), rtol=1e-6)


def test_pads_with_a_gap_or_a_nonzero_value_or_other_readers_stay():
    x = RNG.standard_normal((2, 3)).astype(np.float32)

    def gap(x):  # windows [0, 2) and [3, 5): a zero row between them
        return lax.pad(x, 0.0, ((0, 3, 0), (0, 0, 0))) + lax.pad(x, 0.0, ((3, 0, 0), (0, 0, 0)))

    def ones(x):
        return lax.pad(x, 1.0, ((0, 2, 0), (0, 0, 0))) + lax.pad(x, 1.0, ((2, 0, 0), (0, 0, 0)))

    def shared(x):  # the first pad is read again
        p = lax.pad(x, 0.0, ((0, 2, 0), (0, 0, 0)))
        return p + lax.pad(x, 0.0, ((2, 0, 0), (0, 0, 0))), p

    for f in (gap, ones, shared):
        closed = _optimized(f, x)
        assert "concatenate" not in _names(closed), f.__name__
    for f, want in ((gap, np.concatenate([x, np.zeros((1, 3), np.float32), x])),
                    (ones, np.concatenate([x, x]) + 1)):
        np.testing.assert_array_equal(np.asarray(spmd.jit(f)(x)), want)


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
def test_adjacent_pads_in_any_order_sum_to_the_concatenation(order):
    parts = [RNG.standard_normal((n, 4)).astype(np.float32) for n in (1, 2, 3)]
    starts = [0, 1, 3]

    def f(a, b, c):
        xs = (a, b, c)
        total = None
        for i in order:
            lo = starts[i]
            p = lax.pad(xs[i], 0.0, ((lo, 6 - lo - xs[i].shape[0], 0), (0, 0, 0)))
            total = p if total is None else total + p
        return total

    closed = _optimized(f, *parts)
    assert _names(closed) == ["concatenate"]
    np.testing.assert_array_equal(np.asarray(spmd.jit(f)(*parts)), np.concatenate(parts))


def test_a_concatenation_of_transposed_pieces_is_c_contiguous():
    """numpy lays a concatenation out as its operands are; the pieces the rewrite
    transposes must come back in C order, or the reader would copy them again."""
    from spmd.compiler.ops.slicing import concatenate_p

    pieces = [RNG.standard_normal((1, 4, 3, 5)).astype(np.float32).transpose(0, 2, 1, 3)
              for _ in range(3)]
    out = concatenate_p.impl(np, *pieces, dimension=0)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, np.concatenate(pieces, axis=0))
    f = spmd.jit(lambda a, b: snp.concatenate([a.T, b.T], axis=0))
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(f(a, a)), np.concatenate([a.T, a.T]))

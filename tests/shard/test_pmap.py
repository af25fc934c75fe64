"""``pmap`` (built on jit(shard_map)) against numpy: in_axes, out_axes, static
arguments, collectives, gradients and composition with jit/vmap/grad."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.errors import ArgumentError
from spmd.shard.maps.pmap import PmapError


def _x(*shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1


def test_jax_docstring_example():
    y = spmd.pmap(lambda x: x / lax.psum(x, "i"), axis_name="i")(np.arange(4.0))
    np.testing.assert_allclose(np.asarray(y), np.arange(4.0) / 6, rtol=1e-6)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_collectives_over_the_mapped_axis(n):
    x = _x(n, 5)

    def body(v):
        assert v.shape == (5,)  # rank-reducing: each device sees one slice
        i = lax.axis_index("i")
        return (lax.psum(v, "i"), lax.pmax(v, "i"), lax.all_gather(v, "i"),
                i, lax.ppermute(v, "i", [(k, (k + 1) % n) for k in range(n)]),
                lax.axis_size("i"))

    s, m, g, i, p, size = spmd.pmap(body, axis_name="i")(x)
    np.testing.assert_allclose(np.asarray(s), np.broadcast_to(x.sum(0), x.shape))
    np.testing.assert_allclose(np.asarray(m), np.broadcast_to(x.max(0), x.shape))
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(x, (n, n, 5)))
    np.testing.assert_array_equal(np.asarray(i), np.arange(n))
    np.testing.assert_allclose(np.asarray(p), np.roll(x, 1, axis=0))
    np.testing.assert_array_equal(np.asarray(size), np.full(n, n))


def test_in_axes_out_axes_and_pytrees():
    x, y = _x(3, 4), _x(3)
    f = spmd.pmap(lambda a, b: ({"m": a * b["w"], "s": lax.psum(a, "i")}, b["w"]),
                  axis_name="i", in_axes=(1, {"w": None}), out_axes=({"m": 1, "s": None}, 0))
    out, w = f(x, {"w": y})
    np.testing.assert_allclose(np.asarray(out["m"]), x * y[:, None])
    np.testing.assert_allclose(np.asarray(out["s"]), x.sum(1))
    np.testing.assert_allclose(np.asarray(w), np.broadcast_to(y, (4, 3)))
    # Negative axes, and out_axes=None for a replicated result (JAX's migration example).
    f = functools.partial(spmd.pmap, in_axes=(0, None), out_axes=None)(lambda a, b: a * 0 + b)
    np.testing.assert_allclose(np.asarray(f(_x(8, 3), y)), y)
    f = spmd.pmap(lambda a: a * 2, in_axes=-1, out_axes=-1)
    np.testing.assert_allclose(np.asarray(f(_x(2, 3, 4))), 2 * _x(2, 3, 4))


def test_static_broadcasted_argnums_and_axis_size():
    x = _x(4)
    f = spmd.pmap(lambda a, n, shape: a * n + snp.zeros(shape), static_broadcasted_argnums=(1, 2))
    np.testing.assert_allclose(np.asarray(f(x, 3, ())), 3 * x)
    np.testing.assert_allclose(np.asarray(f(x, 5, ())), 5 * x)
    f = spmd.pmap(lambda a: a + lax.axis_index("i"), axis_name="i", in_axes=None, axis_size=3)
    np.testing.assert_allclose(np.asarray(f(np.float32(1.0))), [1, 2, 3])


def test_transformations():
    x = _x(4, 2)
    f = spmd.pmap(lambda v: lax.psum(v * v, "i"), axis_name="i")
    # grad: psum transposes to psum under pmap, as in JAX (4 copies of each sum).
    g = spmd.grad(lambda x: snp.sum(f(x)))(x)
    np.testing.assert_allclose(np.asarray(g), 2 * 4 * x)
    np.testing.assert_allclose(np.asarray(spmd.jit(f)(x)), np.asarray(f(x)))
    xs = np.stack([x, 2 * x])
    np.testing.assert_allclose(np.asarray(spmd.vmap(f)(xs)),
                               np.stack([np.asarray(f(x)), np.asarray(f(2 * x))]))
    # pmap of grad: a data-parallel gradient, averaged with pmean.
    w = np.float32(0.5)
    step = spmd.pmap(lambda w, xb: lax.pmean(spmd.grad(lambda w: snp.sum((w * xb) ** 2))(w),
                                             "i"),
                     axis_name="i", in_axes=(None, 0))
    want = np.mean([2 * w * np.sum(r ** 2) for r in x])
    np.testing.assert_allclose(np.asarray(step(w, x)), np.full(4, want), rtol=1e-6)


def test_devices_argument():
    devs = spmd.devices()[4:6]
    f = spmd.pmap(lambda v: lax.psum(v, "i"), axis_name="i", devices=devs)
    np.testing.assert_allclose(np.asarray(f(_x(2))), [3, 3])
    with pytest.raises(PmapError, match="2 devices were given for a mapped axis of size 3"):
        f(_x(3))


def test_errors():
    with pytest.raises(PmapError, match="size 9, but there are only 8 devices"):
        spmd.pmap(lambda v: v)(_x(9))
    with pytest.raises(PmapError, match="different sizes: 4 and 3"):
        spmd.pmap(lambda a, b: a + b)(_x(4), _x(3))
    with pytest.raises(PmapError, match="no argument is mapped"):
        spmd.pmap(lambda a: a, in_axes=None)(_x(4))
    with pytest.raises(PmapError, match="in_axes=2 is out of range for an argument of rank 2"):
        spmd.pmap(lambda a: a, in_axes=2)(_x(4, 2))
    with pytest.raises(PmapError, match="out_axes=3 is out of range"):
        spmd.pmap(lambda a: a, out_axes=3)(_x(4, 2))
    with pytest.raises(ArgumentError, match="in_axes has 1 entries but the function was called "
                                            "with 2"):
        spmd.pmap(lambda a, b: a, in_axes=(0,))(_x(4), _x(4))
    with pytest.raises(ArgumentError, match="static_broadcasted_argnums=\\(3,\\) names argument"):
        spmd.pmap(lambda a: a, static_broadcasted_argnums=3)(_x(4))
    with pytest.raises(ArgumentError, match="axis_name must be a string"):
        spmd.pmap(lambda a: a, axis_name=3)
    with pytest.raises(ArgumentError, match="pass the arguments positionally"):
        spmd.pmap(lambda a: a)(a=_x(4))
    from spmd.collectives.primitives import CollectiveAxisError
    with pytest.raises(CollectiveAxisError, match="'j' is not in scope"):
        spmd.pmap(lambda a: lax.psum(a, "j"), axis_name="i")(_x(4))

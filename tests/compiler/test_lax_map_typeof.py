"""``lax.map`` (a scan without a carry; ``batch_size`` maps ``vmap(f)`` over batches),
``spmd.typeof`` and ``spmd.effects_barrier``, as in JAX.  Oracle: numpy over the
slices."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.errors import ArgumentError, DTypeError


def _f(t):
    x, y = t["x"], t["y"]
    return {"s": snp.sin(x) * y[0], "n": snp.sum(x ** 2) + y}


def _ref(x, y):
    return {"s": np.sin(x) * y[:, :1], "n": np.sum(x ** 2, axis=1, keepdims=True) + y}


@pytest.mark.parametrize("batch_size", [None, 1, 2, 3, 7, 10], ids=lambda b: f"batch{b}")
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_map_equals_the_slices_results(batch_size, jit):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 4)).astype(np.float32)
    y = rng.normal(size=(7, 1)).astype(np.float32)
    run = lambda x, y: lax.map(_f, {"x": x, "y": y}, batch_size=batch_size)  # noqa: E731
    got = (spmd.jit(run) if jit else run)(x, y)
    want = _ref(x, y)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("batch_size", [None, 3])
def test_map_gradient(batch_size):
    x = np.linspace(-1, 1, 10, dtype=np.float32).reshape(5, 2)
    g = spmd.grad(lambda x: snp.sum(lax.map(lambda r: snp.tanh(r) * r, x,
                                            batch_size=batch_size)))(x)
    np.testing.assert_allclose(np.asarray(g), np.tanh(x) + x * (1 - np.tanh(x) ** 2),
                               rtol=1e-5)


def test_map_inside_shard_map():
    mesh = spmd.make_mesh((4,), ("i",))
    x = np.arange(16.0, dtype=np.float32).reshape(8, 2)
    out = spmd.jit(spmd.shard_map(lambda b: lax.map(lambda r: lax.psum(r, "i"), b, batch_size=2),
                                  mesh=mesh, in_specs=P("i"), out_specs=P()))(x)
    np.testing.assert_array_equal(np.asarray(out), x.reshape(4, 2, 2).sum(0))


def test_map_errors_name_the_argument():
    x = np.ones((3, 2), np.float32)
    with pytest.raises(ArgumentError, match=r"map: batch_size=0 must be a positive int"):
        lax.map(lambda r: r, x, batch_size=0)
    with pytest.raises(ArgumentError, match=r"map: batch_size=2.0 must be a positive int"):
        lax.map(lambda r: r, x, batch_size=2.0)
    with pytest.raises(ArgumentError, match=r"map: f must be callable, got int"):
        lax.map(3, x)


def test_typeof_gives_shape_dtype_and_varying_axes():
    assert str(spmd.typeof(np.ones((2, 3), np.float32))) == "f32[2,3]"
    assert spmd.typeof(2.0).weak_type and spmd.typeof(2.0).shape == ()
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    seen = {}

    def body(b):
        seen["in"] = spmd.typeof(b).vma
        seen["psum"] = spmd.typeof(lax.psum(b, "i")).vma
        seen["gather"] = spmd.typeof(lax.all_gather_invariant(b, "i")).vma
        return b

    spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=P("i", "j"), out_specs=P("i", "j")))(
        np.ones((8, 2), np.float32))
    assert seen == {"in": frozenset({"i", "j"}), "psum": frozenset({"j"}),
                    "gather": frozenset({"j"})}


def test_typeof_of_a_non_array_is_named():
    with pytest.raises(DTypeError, match=r"a value of type str \('a'\) is not an array"):
        spmd.typeof("a")


def test_effects_barrier_after_prints(capsys):
    f = spmd.jit(lambda x: spmd.debug.print("x = {}", x) or x + 1)
    f(np.float32(2.0))
    assert spmd.effects_barrier() is None
    assert "x = 2.0" in capsys.readouterr().out  # already printed when f returned

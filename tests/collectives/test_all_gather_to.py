"""``all_gather(..., to=...)`` (JAX's names for the result's type) and
``all_gather_invariant``: the data of ``all_gather``, typed invariant along the axes
(so the axes may be left out of ``out_specs``), and a transpose that keeps each
device's own block of the cotangent instead of ``psum_scatter``-ing it.  Oracles: the
per-device reference of ``test_collectives`` for values, numpy for gradients."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.errors import ArgumentError
from spmd.shard.maps.args import ShardMapError
from tests.collectives.test_collectives import MODES, _grid, _id, ref_all_gather, run_case


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("key,axes,spec,axis,tiled",
                         _grid([(0, False), (1, False), (0, True), (-1, True)]), ids=_id)
def test_values_equal_all_gathers(key, axes, spec, axis, tiled, jit):
    ax = (axes,) if isinstance(axes, str) else axes
    run_case(key, lambda b: lax.all_gather(b, axes, axis=axis, tiled=tiled, to="invarying"),
             lambda r, b, c: ref_all_gather(r, b, c, ax, axis % (2 + (not tiled)), tiled),
             (2, 3), spec, jit=jit)


def _gathered(x, fn, out_specs):
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    return spmd.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=out_specs)(x)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_the_result_is_invariant_along_the_axes(jit):
    x = np.arange(24.0, dtype=np.float32).reshape(8, 3)
    f = lambda v: _gathered(v, lambda b: lax.all_gather_invariant(b, "i", tiled=True),  # noqa: E731
                            P())
    out = (spmd.jit(f) if jit else f)(x)
    np.testing.assert_array_equal(np.asarray(out), x)
    text = str(spmd.make_jaxpr(f)(x))
    assert "invariant=True" in text
    # The plain all_gather's result varies along "i": P() cannot hold it, and the error
    # names the invariant gather as a fix.
    with pytest.raises(ShardMapError, match=r"lax.all_gather_invariant\(x, 'i'\)"):
        _gathered(x, lambda b: lax.all_gather(b, "i", tiled=True), P())


@pytest.mark.parametrize("tiled", [True, False], ids=["tiled", "stacked"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_gradient_keeps_each_devices_block(tiled, jit):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    w = rng.normal(size=(8, 3) if tiled else (4, 2, 3)).astype(np.float32)
    mesh = spmd.make_mesh((4, 2), ("i", "j"))

    def loss(v):
        body = lambda b, w: snp.sum(lax.all_gather_invariant(b, "i", tiled=tiled) * w)  # noqa: E731
        return spmd.shard_map(body, mesh=mesh, in_specs=(P("i"), P()), out_specs=P())(v, w)

    grad = spmd.grad(loss)
    got = np.asarray((spmd.jit(grad) if jit else grad)(x))
    np.testing.assert_allclose(got, w.reshape(8, 3), rtol=1e-6)
    np.testing.assert_allclose(float(loss(x)), float(np.sum(x.reshape(w.shape) * w)), rtol=1e-5)
    text = str(spmd.make_jaxpr(grad)(x))
    assert "psum_scatter" not in text and "dynamic_slice" in text  # no communication back


def test_to_varying_is_all_gather():
    x = np.arange(8.0, dtype=np.float32)
    a = _gathered(x, lambda b: lax.all_gather(b, "i", to="varying"), P("i"))
    b = _gathered(x, lambda b: lax.all_gather(b, "i"), P("i"))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_to_values_are_named():
    x = np.arange(8.0, dtype=np.float32)
    with pytest.raises(ArgumentError, match=r"all_gather: to='invariant'; the allowed values "
                                            r"are 'varying', 'invarying' and 'reduced'"):
        _gathered(x, lambda b: lax.all_gather(b, "i", to="invariant"), P("i"))
    # A reduced result is typed as the traced body types it, not in an eager body.
    with pytest.raises(NotImplementedError, match=r"all_gather makes an unreduced or reduced "
                                                  r"value .* in an eager shard_map body"):
        _gathered(x, lambda b: lax.all_gather(b, "i", to="reduced"), P("i"))
    with pytest.raises(ArgumentError, match=r"takes no axis_index_groups"):
        _gathered(x, lambda b: lax.all_gather(b, "i", to="invarying",
                                              axis_index_groups=[[0, 1], [2, 3]]), P("i"))

"""``smap``: shard_map over one axis of the current mesh, specs given as array axes
(``jax.smap``); smaps over different axes nest (each body is manual along its own axis
and the enclosing ones).  Oracles: numpy on the global arrays."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.errors import ArgumentError
from spmd.sharding import use_mesh

X = np.arange(32.0, dtype=np.float32).reshape(8, 4)


@pytest.fixture
def mesh():
    m = spmd.make_mesh((2, 4), ("i", "j"))
    with use_mesh(m):
        yield m


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_in_and_out_axes(mesh, jit):
    run = (lambda f: spmd.jit(f)) if jit else (lambda f: f)
    double = spmd.smap(lambda b: b * 2, in_axes=0, out_axes=0, axis_name="i")
    np.testing.assert_array_equal(np.asarray(run(double)(X)), 2 * X)
    # Split along dimension 1 over "i", summed over it, returned whole.
    total = spmd.smap(lambda b: lax.psum(b, "i"), in_axes=1, out_axes=None, axis_name="i")
    np.testing.assert_array_equal(np.asarray(run(total)(X)), X[:, :2] + X[:, 2:])
    # Per-argument axes (None: the whole argument on every device), a negative axis,
    # a dict prefix, and the output joined along another dimension.
    scale = spmd.smap(lambda a, s: a * s, in_axes=(-1, None), out_axes=1, axis_name="j")
    np.testing.assert_array_equal(np.asarray(run(scale)(X, np.float32(3))), 3 * X)
    tree = spmd.smap(lambda d: {"y": d["a"] + 1}, in_axes=({"a": 0},), out_axes={"y": 0},
                     axis_name="j")
    np.testing.assert_array_equal(np.asarray(run(tree)({"a": X})["y"]), X + 1)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_nested_smaps_are_manual_along_both_axes(mesh, jit):
    def inner_body(b):  # a (1, 4) block: row i*4 + j of X
        j = lax.axis_index("j").astype(np.float32)
        return b + j + 10 * lax.psum(snp.sum(b), ("i", "j"))

    inner = spmd.smap(inner_body, in_axes=0, out_axes=0, axis_name="j")
    outer = spmd.smap(lambda b: inner(b) * 2, in_axes=0, out_axes=0, axis_name="i")
    f = spmd.jit(outer) if jit else outer
    want = 2 * (X + (np.arange(8) % 4)[:, None] + 10 * X.sum())
    np.testing.assert_allclose(np.asarray(f(X)), want, rtol=1e-6)
    grad = spmd.grad(lambda v: snp.sum(outer(v)))(X)
    # d/dX of 2 * (X + 10 * sum(X)) summed over its 32 entries: 2 + 20 * 32.
    np.testing.assert_allclose(np.asarray(grad), np.full_like(X, 2 + 640), rtol=1e-6)


def test_errors_name_the_argument(mesh):
    with pytest.raises(ArgumentError, match=r"smap: axis_name must be one mesh axis name, "
                                            r"got \('i', 'j'\)"):
        spmd.smap(lambda b: b, in_axes=0, out_axes=0, axis_name=("i", "j"))
    with pytest.raises(ArgumentError, match=r"smap: in_axes must be an int, None, or a tuple"):
        spmd.smap(lambda b: b, in_axes=[0], out_axes=0, axis_name="i")
    with pytest.raises(ArgumentError, match=r"smap: out_axes must be an int, None, or a "
                                            r"container of them; got 'x'"):
        spmd.smap(lambda b: b, in_axes=0, out_axes="x", axis_name="i")
    with pytest.raises(ArgumentError, match=r"smap: out_axes=-1: give output axes as "
                                            r"non-negative numbers"):
        spmd.smap(lambda b: b, in_axes=0, out_axes=-1, axis_name="i")
    with pytest.raises(ArgumentError, match=r"smap: in_axes=2 is out of range for an argument "
                                            r"of rank 2"):
        spmd.smap(lambda b: b, in_axes=2, out_axes=0, axis_name="i")(X)
    with pytest.raises(ArgumentError, match=r"smap: in_axes has 2 entries for 1 positional"):
        spmd.smap(lambda b: b, in_axes=(0, 0), out_axes=0, axis_name="i")(X)


def test_in_axes_left_out_needs_an_explicit_axis(mesh):
    # As in JAX: on an automatic axis nothing types the arguments' placements.
    with use_mesh(mesh):
        with pytest.raises(TypeError, match=r"smap: in_axes was not specified, and axis 'i' "
                                            r"is not an Explicit axis"):
            spmd.smap(lambda b: b * 2, out_axes=0, axis_name="i")(X)
    explicit = spmd.make_mesh((2, 4), ("i", "j"), axis_types=(spmd.sharding.AxisType.Explicit,)
                              * 2)
    with use_mesh(explicit):
        x = spmd.device_put(X, P("i"))
        out = spmd.smap(lambda b: b * 2, out_axes=0, axis_name="i")(x)
        np.testing.assert_array_equal(np.asarray(out), 2 * X)


def test_without_a_mesh_the_error_says_how_to_set_one():
    from spmd.shard.explicit.mesh_context import MeshContextError

    with pytest.raises(MeshContextError, match=r"no mesh was given and none is set"):
        spmd.smap(lambda b: b, in_axes=0, out_axes=0, axis_name="i")(X)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_shard_map_over_axes_already_manual_raises(jit):
    # As in JAX: the inner one would run a second copy of "i" and "j", and its psum over
    # "i" would not reach the outer body's devices (it gave twice the block's sum).
    mesh = spmd.make_mesh((2, 4), ("i", "j"))
    inner = spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P(None, "j"),
                           out_specs=P(None, "j"))
    outer = spmd.shard_map(lambda b: inner(b), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    with pytest.raises(ValueError, match=r"shard_map\(<lambda>\): mesh axes \['i', 'j'\] are "
                                         r"already manual in the enclosing shard_map's body"):
        (spmd.jit(outer) if jit else outer)(X)
    # vmap's axis names are not mesh axes: a shard_map under vmap(axis_name="i") runs.
    f = spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
    np.testing.assert_array_equal(np.asarray(spmd.vmap(f, axis_name="i")(X.reshape(4, 8))),
                                  X.reshape(4, 2, 4).sum(1))

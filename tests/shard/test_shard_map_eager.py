"""Eager shard_map with Python control flow on values that are the same on every
device (JAX's eager shard_map), against numpy on the global arrays."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.errors import TracerBoolConversionError
from spmd.shard.shard_map import ShardMapError


@pytest.fixture
def mesh():
    return spmd.make_mesh((4, 2), ("i", "j"))


def _x():
    return np.arange(16, dtype=np.float32).reshape(8, 2)


def test_branch_and_loop_on_a_psum(mesh):
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i", "j"), out_specs=P("i", "j"))
    def f(b):
        total = lax.psum(snp.sum(b), ("i", "j"))
        if total > 100:  # the same on every device: a Python bool
            b = b * 2
        for _ in range(int(lax.psum(1, "i"))):  # 4 iterations
            b = b + 1
        return b

    x = _x()
    np.testing.assert_allclose(np.asarray(f(x)), 2 * x + 4)
    np.testing.assert_allclose(np.asarray(f(x / 100)), x / 100 + 4, rtol=1e-6)
    # Under jit the branch needs lax.cond, as in JAX.
    with pytest.raises(TracerBoolConversionError):
        spmd.jit(f)(x)


def test_values_that_differ_between_devices(mesh):
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i", "j"), out_specs=P("i", "j"))
    def f(b):
        return b if snp.sum(b) > 3 else -b

    with pytest.raises(TracerBoolConversionError, match="differs between devices \\(devices 0 "
                                                        "and 1 in mesh order disagree\\)"):
        f(_x())


def test_out_specs_checked_on_the_values(mesh):
    def body(b):
        if lax.psum(snp.sum(b), ("i", "j")) > 0:
            return b, lax.psum(b, "j")
        return b, b

    f = spmd.shard_map(body, mesh=mesh, in_specs=P("i", "j"), out_specs=(P("i", "j"), P("i")))
    a, s = f(_x())
    np.testing.assert_allclose(np.asarray(a), _x())
    np.testing.assert_allclose(np.asarray(s), _x().sum(1, keepdims=True))
    g = spmd.shard_map(body, mesh=mesh, in_specs=P("i", "j"), out_specs=(P("i", "j"), P()))
    with pytest.raises(ShardMapError, match=r"output\[1\] varies along mesh axis 'i'"):
        g(_x())
    # Unchecked, one device's block along the omitted axis is taken.
    h = spmd.shard_map(body, mesh=mesh, in_specs=P("i", "j"), out_specs=(P("i", "j"), P()),
                       check_vma=False)
    np.testing.assert_allclose(np.asarray(h(_x())[1]), _x()[:2].sum(1, keepdims=True))


def test_partial_manual_eager_branch(mesh):
    def body(b):
        t = lax.psum(snp.sum(b), "i")
        return b * 2 if t > 0 else b

    f = spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), axis_names={"i"})
    np.testing.assert_allclose(np.asarray(f(_x())), 2 * _x())

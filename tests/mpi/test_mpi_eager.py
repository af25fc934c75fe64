"""Eager operations and gradients on Arrays spread over processes run as SPMD
computations and match the single-process results (numpy on the global values).

Every rank makes the same calls; results are read back with
``spmd.process_allgather`` (or directly, when replicated).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import make_mesh  # noqa: E402

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding, P, lax  # noqa: E402
from spmd.errors import NotFullyAddressableError  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(180)]


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _whole(v):
    return np.asarray(v) if v._holds_value() else spmd.process_allgather(v)


def _put(x, mesh, *spec):
    return spmd.device_put(x, NamedSharding(mesh, P(*spec)))


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_eager_operations_match_numpy(kind):
    mesh = make_mesh(kind)
    rows = mesh.axis_names[0]
    x, w = _rand((8, 6), 0), _rand((6, 4), 1)
    a, b = _put(x, mesh, rows), _put(w, mesh)
    cases = {
        "sum": (lambda: snp.sum(a), x.sum()),
        "sum axis 0": (lambda: snp.sum(a, axis=0), x.sum(0)),
        "square": (lambda: a ** 2, x ** 2),
        "matmul": (lambda: a @ b, x @ w),
        "transpose": (lambda: a.T * 2.0, x.T * 2),
        "index": (lambda: a[3], x[3]),
        "mean of exp": (lambda: snp.mean(snp.exp(a), axis=1), np.exp(x).mean(1)),
        "where": (lambda: snp.where(a > 0, a, 0.0), np.where(x > 0, x, 0)),
    }
    for name, (op, want) in cases.items():
        np.testing.assert_allclose(_whole(op()), want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_grad_of_a_jitted_shard_map_matches_numpy():
    """The everyday pattern: grad of a loss over a jitted shard_map's result."""
    mesh = make_mesh("1d")
    x, y = _rand((8, 3), 2), _rand((8, 3), 3)
    a, b = _put(x, mesh, "i"), _put(y, mesh, "i")
    f = spmd.jit(spmd.shard_map(lambda u, v: u * v + u, mesh=mesh,
                                in_specs=(P("i"), P("i")), out_specs=P("i")))

    def loss(a, b):
        return snp.sum(f(a, b) ** 2)

    value, (ga, gb) = spmd.value_and_grad(loss, argnums=(0, 1))(a, b)
    z = x * y + x
    np.testing.assert_allclose(float(value), (z ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(_whole(ga), 2 * z * (y + 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_whole(gb), 2 * z * x, rtol=1e-5, atol=1e-5)
    assert ga.sharding == a.sharding and gb.sharding == b.sharding


def test_grad_and_vjp_of_eager_operations():
    mesh = make_mesh("1d")
    x, w = _rand((8, 5), 4), _rand((5, 2), 5)
    a, b = _put(x, mesh, "i"), _put(w, mesh)

    def loss(a, b):
        return snp.mean(snp.tanh(a @ b) ** 2)

    ga, gb = spmd.grad(loss, argnums=(0, 1))(a, b)
    t = np.tanh(x @ w)
    d = 2 * t * (1 - t * t) / t.size
    np.testing.assert_allclose(_whole(ga), d @ w.T, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(_whole(gb), x.T @ d, rtol=1e-4, atol=1e-6)
    out, pull = spmd.vjp(lambda a: snp.sin(a) * 3.0, a)
    (ct,) = pull(out)  # the cotangent is the output itself: 3 sin(x) * 3 cos(x)
    np.testing.assert_allclose(_whole(ct), 3 * np.sin(x) * 3 * np.cos(x), rtol=1e-5, atol=1e-5)


def test_jit_of_spread_arrays_propagates_shardings():
    mesh = make_mesh("2d")
    x = _rand((8, 4), 6)
    a = _put(x, mesh, "a", "b")
    y = spmd.jit(lambda v: snp.exp(v) * 2.0)(a)
    assert y.sharding == a.sharding
    np.testing.assert_allclose(_whole(y), np.exp(x) * 2, rtol=1e-6)
    z = spmd.jit(lambda v: lax.with_sharding_constraint(v + 1.0, NamedSharding(mesh, P("a"))))(a)
    assert z.sharding == NamedSharding(mesh, P("a"))
    np.testing.assert_allclose(_whole(z), x + 1, rtol=1e-6)


def test_printing_a_spread_result_still_names_process_allgather():
    mesh = make_mesh("1d")
    a = _put(_rand((8, 2), 7), mesh, "i")
    with pytest.raises(NotFullyAddressableError, match="process_allgather"):
        np.asarray(a * 2.0)
    with pytest.raises(NotFullyAddressableError, match="process_allgather"):
        print(a + 1.0)


@pytest.mark.parametrize("kind", ["1d", "2dT"])
def test_eager_shard_map_body_values_are_real_on_every_process(kind, capsys):
    """print in an eager body shows this process's devices' blocks (JAX's format); a
    Python branch on a psum agrees on every process; values match numpy."""
    from spmd.errors import TracerBoolConversionError

    mesh = make_mesh(kind)
    rows = mesh.axis_names[0]
    x = np.arange(16, dtype=np.float32).reshape(8, 2)

    def body(b):
        print(b)
        if lax.psum(snp.sum(b), mesh.axis_names) > 100:  # 120: the same everywhere
            b = b * 2
        return b

    f = spmd.shard_map(body, mesh=mesh, in_specs=P(rows), out_specs=P(rows))
    np.testing.assert_allclose(_whole(f(x)), 2 * x)
    me = spmd.process_index()
    names = "(" + ", ".join(mesh.axis_names) + ",)"
    blocks = x.reshape(mesh.shape[rows], -1, 2)
    want = []
    for k, d in enumerate(mesh.devices.flat):
        if d.process_index == me:
            coords = tuple(int(i) for i in np.unravel_index(k, mesh.devices.shape))
            want.append(f"On {d!r} at mesh coordinates {names} = {coords}:\n"
                        f"{blocks[coords[0]]}\n")
    assert capsys.readouterr().out == "\n".join(want) + "\n"
    # A value that differs between devices: every process raises (none waits).
    g = spmd.shard_map(lambda b: b if snp.sum(b) > 50 else -b, mesh=mesh, in_specs=P(rows),
                       out_specs=P(rows))
    with pytest.raises(TracerBoolConversionError, match="differs between devices"):
        g(x)

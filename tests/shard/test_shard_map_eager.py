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
from spmd.shard.maps.shard_map import ShardMapError


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


# ------------------------------------------------------------ printing values

def _jax_text(mesh, blocks):
    """What JAX prints for a body value: each device's block with its coordinates."""
    names = "(" + ", ".join(mesh.axis_names) + ",)"
    flat = list(mesh.devices.flat)
    return "\n".join(
        f"On {flat[k]!r} at mesh coordinates {names} = "
        f"{tuple(int(i) for i in np.unravel_index(k, mesh.devices.shape))}:\n{b}\n"
        for k, b in enumerate(blocks))


def test_print_in_the_body_shows_each_devices_block(mesh, capsys):
    seen = []

    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i", "j"), out_specs=P("i", "j"))
    def f(b):
        print(b)
        seen.append(repr(b))
        total = lax.psum(snp.sum(b), ("i", "j"))
        print(total)  # the same on every device: still printed per device
        print(f"{snp.sum(b):.1f}")
        return b * 2

    x = _x()
    out = f(x)
    np.testing.assert_allclose(np.asarray(out), 2 * x)
    blocks = [x[2 * r:2 * r + 2, c:c + 1] for r in range(4) for c in range(2)]
    want = (_jax_text(mesh, blocks) + "\n" + _jax_text(mesh, [np.float32(x.sum())] * 8) +
            "\n" + _jax_text(mesh, [f"{b.sum():.1f}" for b in blocks]) + "\n")
    assert capsys.readouterr().out == want
    assert seen == [_jax_text(mesh, blocks)]  # repr is the same text (as in JAX)
    assert "On CPUDevice(id=0) at mesh coordinates (i, j,) = (0, 0):\n[[0.]\n [2.]]\n" in want


def test_jitted_shard_map_traces_once_and_prints_a_tracer(mesh, capsys):
    calls = []

    def body(b):
        calls.append(1)
        print(b)
        return lax.psum(b, "j")

    f = spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=P("i", "j"), out_specs=P("i")))
    x = _x()
    for scale in (1.0, 2.0, 3.0):
        np.testing.assert_allclose(np.asarray(f(scale * x)), scale * x.sum(1, keepdims=True))
    assert len(calls) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("Traced<") and "mesh coordinates" not in printed


def test_eager_values_match_jit_and_numpy(mesh):
    """A body with collectives, a loop, a gradient (JEP 17111: the gradient of an
    invariant input sums over devices) and a pvary, eagerly and under jit."""
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)

    def body(w, b):
        g = spmd.grad(lambda w: snp.sum(snp.tanh(b @ w)))(w)
        c = lax.fori_loop(0, 3, lambda k, c: c + lax.ppermute(
            b, "i", [(k, (k + 1) % 4) for k in range(4)]), snp.zeros_like(b))
        return g, c, lax.psum(b, "i")

    f = spmd.shard_map(body, mesh=mesh, in_specs=(P(), P("i", None)),
                       out_specs=(P(), P("i", None), P()))
    x = np.arange(16, dtype=np.float32).reshape(8, 2) / 16
    got, jitted = f(w, x), spmd.jit(f)(w, x)
    t = np.tanh(x @ w)
    want_g = x.T @ (1 - t ** 2)  # the sum over every device's rows
    blocks = x.reshape(4, 2, 2)
    want_c = 3 * np.roll(blocks, 1, axis=0).reshape(8, 2)
    for a, b in zip(got, jitted):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[0]), want_g, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), want_c, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[2]), blocks.sum(0), rtol=1e-6)


def test_out_specs_are_checked_on_types_eagerly_too(mesh):
    """Eagerly, as under jit, an output whose type varies along an axis its spec omits
    is an error even when the blocks happen to be equal (JAX's typed check)."""
    f = spmd.shard_map(lambda b: b * 0, mesh=mesh, in_specs=P("i"), out_specs=P())
    with pytest.raises(ShardMapError, match="varies along mesh axis 'i'"):
        f(_x())
    g = spmd.shard_map(lambda b: b * 0, mesh=mesh, in_specs=P("i"), out_specs=P(),
                       check_vma=False)
    np.testing.assert_allclose(np.asarray(g(_x())), np.zeros((2, 2)))


def test_format_spec_of_a_block_that_is_not_a_scalar(mesh):
    f = spmd.shard_map(lambda b: print(f"{b:.2f}") or b, mesh=mesh, in_specs=P("i"),
                       out_specs=P("i"))
    with pytest.raises(TypeError, match="format"):
        f(_x())


@pytest.mark.parametrize("jit", [False, True])
def test_where_on_the_axis_index_with_scalar_cases(mesh, jit):
    # A per-device scalar predicate picking between two Python scalars.
    f = spmd.shard_map(lambda b: snp.where(lax.axis_index("i") == 0, 1.0, 2.0)[None],
                       mesh=mesh, in_specs=P("i", "j"), out_specs=P("i"), check_vma=False)
    np.testing.assert_array_equal(np.asarray((spmd.jit(f) if jit else f)(_x())), [1, 2, 2, 2])


def test_device_put_to_one_device_in_an_eager_body_is_refused():
    from spmd.shard.explicit.mesh_context import EagerBodyDeviceError

    mesh = spmd.make_mesh((4,), ("i",))
    x = np.arange(8.0)
    ok = spmd.shard_map(lambda b: b + spmd.device_put(1.0), mesh=mesh, in_specs=P("i"),
                        out_specs=P("i"))
    np.testing.assert_array_equal(np.asarray(ok(x)), x + 1)
    g = spmd.shard_map(lambda b: b + spmd.device_put(1.0, spmd.devices()[0]), mesh=mesh,
                       in_specs=P("i"), out_specs=P("i"))
    with pytest.raises(EagerBodyDeviceError, match="got device .*leave the device out"):
        g(x)
    assert issubclass(EagerBodyDeviceError, ValueError)
    # Traced (jit), a device_put is only a value, as in JAX.
    np.testing.assert_array_equal(np.asarray(spmd.jit(g)(x)), x + 1)
    # After the error, nothing is left in context: an eager body runs again.
    np.testing.assert_array_equal(np.asarray(ok(x)), x + 1)

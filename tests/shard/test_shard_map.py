"""shard_map: values against numpy on the global arrays, specs, pytrees, jit, typing, errors."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.collectives.primitives import CollectiveAxisError
from spmd.mesh.devices import DeviceError
from spmd.shard.maps.shard_map import ShardMapError

RNG = np.random.default_rng(0)


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.fixture(scope="module")
def mesh42():
    return spmd.make_mesh((4, 2), ("i", "j"))


@pytest.fixture(scope="module")
def mesh222():
    return spmd.make_mesh((2, 2, 2), ("i", "j", "k"))


def _close(got, want, tol=1e-5):
    got = np.asarray(got)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ------------------------------------------------------------ values

@pytest.mark.parametrize("jit", [False, True])
def test_design_matmul(mesh42, jit):
    @functools.partial(spmd.shard_map, mesh=mesh42, in_specs=(P("i", "j"), P("j", None)),
                       out_specs=P("i", None))
    def matmul(a_block, b_block):
        return lax.psum(snp.dot(a_block, b_block), "j")

    a, b = _x(8, 6), _x(6, 5)
    _close((spmd.jit(matmul) if jit else matmul)(a, b), a @ b, 1e-4)


@pytest.mark.parametrize("spec", [P(), P("i"), P("j"), P("i", "j"), P("j", "i"), P(("i", "j")),
                                  P(("j", "i")), P(None, ("j", "i")), P(None, "i")])
def test_identity_roundtrip(mesh42, spec):
    x = _x(8, 8)
    f = spmd.shard_map(lambda b: b, mesh=mesh42, in_specs=spec, out_specs=spec)
    _close(f(x), x)
    _close(spmd.jit(f)(x), x)


@pytest.mark.parametrize("spec,block", [(P("i", "j"), (2, 4)), (P(("j", "i")), (1, 8)),
                                        (P(None, ("i", "j")), (8, 1)), (P(), (8, 8))])
def test_block_shapes_and_placement(mesh42, spec, block):
    # Each device's block is the slice NamedSharding assigns it (checked via axis_index).
    x = np.arange(64, dtype=np.float32).reshape(8, 8)

    def body(b):
        assert b.shape == block
        return b

    _close(spmd.shard_map(body, mesh=mesh42, in_specs=spec, out_specs=spec)(x), x)
    sh = spmd.NamedSharding(mesh42, spec)
    coords = spmd.shard_map(
        lambda b: snp.reshape(snp.stack([lax.axis_index("i"), lax.axis_index("j")]), (1, 2)),
        mesh=mesh42, in_specs=P(), out_specs=P(("i", "j")))(x)
    first = spmd.shard_map(lambda b: snp.reshape(b[0, 0], (1,)), mesh=mesh42, in_specs=spec,
                           out_specs=P(("i", "j")))(x)
    for d, (ci, cj), v in zip(mesh42.devices.flat, np.asarray(coords), np.asarray(first)):
        assert mesh42.coords(d) == (ci, cj)
        assert v == x[sh.device_index(d, x.shape)][0, 0]


def test_replicated_input_tiled_output(mesh42):
    # An invariant value under out_specs P('i') is tiled: one copy per index of i.
    x = _x(3)
    _close(spmd.shard_map(lambda b: b, mesh=mesh42, in_specs=P(), out_specs=P("i"))(x),
           np.tile(x, 4))
    _close(spmd.shard_map(lambda b: b * 2, mesh=mesh42, in_specs=P(),
                          out_specs=P(("j", "i")))(x), np.tile(2 * x, 8))


def test_output_spec_differs_from_input(mesh42):
    x = _x(8, 4)
    # Blocks along i, reassembled along dim 1 instead of dim 0.
    got = spmd.shard_map(lambda b: b, mesh=mesh42, in_specs=P("i"), out_specs=P(None, "i"))(x)
    _close(got, np.concatenate(np.split(x, 4, 0), 1))


def test_axis_index_assembles_in_mesh_order(mesh222):
    f = spmd.shard_map(lambda: None, mesh=mesh222, in_specs=(), out_specs=P())
    assert f() is None
    g = spmd.shard_map(
        lambda b: snp.reshape(lax.axis_index(("k", "i")) + 0 * b[0].astype(snp.int32), (1,)),
        mesh=mesh222, in_specs=P(("i", "j", "k")), out_specs=P(("i", "j", "k")))
    coords = np.indices((2, 2, 2)).reshape(3, -1)
    _close(g(np.zeros(8, np.int32)), (coords[2] * 2 + coords[0]).astype(np.int32))


def test_scalar_and_python_arguments(mesh42):
    x = _x(8)
    f = spmd.shard_map(lambda a, b: a * b, mesh=mesh42, in_specs=(P(), P("i")),
                       out_specs=P("i"))
    _close(f(2.0, x), 2 * x)
    _close(f(np.float32(3.0), x), 3 * x)
    assert np.asarray(f(2.0, x)).dtype == np.float32  # weak Python scalar


def test_closure_constants(mesh42):
    c = _x(2)
    arr = snp.asarray(_x(2))
    f = spmd.shard_map(lambda b: b * c + arr, mesh=mesh42, in_specs=P("i"), out_specs=P("i"))
    x = _x(8)
    want = x * np.tile(c, 4) + np.tile(np.asarray(arr), 4)
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)


def test_pytree_arguments_and_outputs(mesh42):
    x, y, z = _x(8, 2), _x(4), _x(3)

    def body(d, t):
        return {"s": lax.psum(d["a"], "i"), "p": (d["b"] * t[0], t[1])}

    f = spmd.shard_map(body, mesh=mesh42, in_specs=({"a": P("i"), "b": P("j")}, P()),
                       out_specs={"s": P(), "p": (P("j"), P())})
    out = f({"a": x, "b": y}, (z[0], z))
    _close(out["s"], x.reshape(4, 2, 2).sum(0))
    _close(out["p"][0], y * z[0])
    _close(out["p"][1], z)


def test_in_specs_prefix(mesh42):
    # One spec for a whole tuple argument; a bare spec for a single argument.
    x, y = _x(8), _x(8)
    f = spmd.shard_map(lambda t: t[0] + t[1], mesh=mesh42, in_specs=(P("i"),),
                       out_specs=P("i"))
    _close(f((x, y)), x + y)
    g = spmd.shard_map(lambda b: b * 2, mesh=mesh42, in_specs=P("i"), out_specs=P("i"))
    _close(g(x), 2 * x)
    h = spmd.shard_map(lambda a, b: (a, b), mesh=mesh42, in_specs=[P("i"), P()],
                       out_specs=P("i"))  # a list of specs works like a tuple
    out = h(x, y)
    _close(out[0], x)
    _close(out[1], np.tile(y, 4))


def test_result_is_array_with_sharding(mesh42):
    x = _x(8, 2)
    out = spmd.shard_map(lambda b: b, mesh=mesh42, in_specs=P("i", "j"),
                         out_specs=P("i", "j"))(x)
    assert isinstance(out, spmd.Array)
    assert out.sharding == spmd.NamedSharding(mesh42, P("i", "j"))


@pytest.mark.parametrize("shape,names", [((1,), ("i",)), ((2,), ("x",)), ((2, 2), ("a", "b")),
                                         ((8,), ("d",))])
def test_meshes_of_several_sizes(shape, names):
    mesh = spmd.make_mesh(shape, names)
    n = int(np.prod(shape))
    x = _x(n * 2)
    f = spmd.shard_map(lambda b: lax.psum(b, names), mesh=mesh, in_specs=P(names),
                       out_specs=P())
    _close(f(x), x.reshape(n, 2).sum(0))


def test_mesh_from_explicit_devices():
    devs = spmd.devices()[::-1][:4]
    mesh = spmd.make_mesh((2, 2), ("a", "b"), devices=devs)
    assert list(mesh.devices.flat) == devs
    x = _x(4, 4)
    _close(spmd.shard_map(lambda b: b + 1, mesh=mesh, in_specs=P("a", "b"),
                          out_specs=P("a", "b"))(x), x + 1)
    mesh2 = spmd.Mesh(np.array(spmd.devices()[:8]).reshape(2, 4), ("r", "c"))
    _close(spmd.shard_map(lambda b: lax.pmax(b, "c"), mesh=mesh2, in_specs=P(None, "c"),
                          out_specs=P())(x), x.max(1, keepdims=True))


def test_jit_traces_once(mesh42):
    count = [0]

    def body(b):
        count[0] += 1
        return lax.psum(b, "i")

    f = spmd.jit(spmd.shard_map(body, mesh=mesh42, in_specs=P("i"), out_specs=P()))
    x = _x(8)
    for _ in range(3):
        _close(f(x), x.reshape(4, 2).sum(0))
    assert count[0] == 1
    f(_x(16))  # a new shape retraces
    assert count[0] == 2


def test_shard_map_inside_jit_with_other_ops(mesh42):
    sm = spmd.shard_map(lambda b: lax.pmean(snp.sin(b), "j"), mesh=mesh42,
                        in_specs=P("i", "j"), out_specs=P("i"))

    @spmd.jit
    def f(x):
        return snp.sum(sm(x * 2.0) ** 2) + 1.0

    x = _x(8, 4)
    want = np.sum(np.sin(2 * x).reshape(8, 2, 2).mean(1) ** 2) + 1
    _close(f(x), want, 1e-4)


def test_two_shard_maps_compose(mesh42):
    a = spmd.shard_map(lambda b: b * lax.axis_index("i").astype(snp.float32), mesh=mesh42,
                       in_specs=P("i"), out_specs=P("i"))
    b = spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh42, in_specs=P("i"),
                       out_specs=P())
    x = _x(8)
    want = (x.reshape(4, 2) * np.arange(4)[:, None]).sum(0)
    _close(b(a(x)), want)
    _close(spmd.jit(lambda x: b(a(x)))(x), want)


def test_check_vma_false_values(mesh42):
    # Untyped bodies may return values the specs do not describe; blocks that agree are fine.
    x = _x(8)
    f = spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh42, in_specs=P("i"),
                       out_specs=P(), check_vma=False)
    _close(f(x), x.reshape(4, 2).sum(0))
    g = spmd.shard_map(lambda b: b, mesh=mesh42, in_specs=P("i"), out_specs=P(),
                       check_vma=False)  # the first block along i
    _close(g(x), x[:2])
    h = spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh42, in_specs=P("i"),
                       out_specs=P(), check_rep=False)  # JAX's older name
    _close(h(x), x.reshape(4, 2).sum(0))


def test_control_flow_in_body_values(mesh42):
    ring = [(k, (k + 1) % 4) for k in range(4)]
    x = _x(8)

    def body(b):
        y = lax.fori_loop(0, 3, lambda k, c: lax.ppermute(c, "i", ring), b)
        z = lax.cond(lax.axis_index("i") % 2 == 0, lambda v: v * 2, lambda v: -v, b)
        w = lax.while_loop(lambda c: c[0] < 2,
                           lambda c: (c[0] + 1, lax.ppermute(c[1], "i", ring)), (0, b))[1]
        s = lax.scan(lambda c, t: (c + t, lax.psum(t, "i")), snp.zeros((), b.dtype), b)[1]
        return y, z, w, s

    f = spmd.shard_map(body, mesh=mesh42, in_specs=P("i"), out_specs=(P("i"),) * 4)
    blocks = x.reshape(4, 2)
    for out in (f(x), spmd.jit(f)(x)):
        _close(out[0], np.roll(blocks, 3, 0).ravel())
        _close(out[1], (blocks * np.where(np.arange(4) % 2 == 0, 2, -1)[:, None]).ravel())
        _close(out[2], np.roll(blocks, 2, 0).ravel())
        _close(out[3], np.tile(blocks.sum(0), 4))


@pytest.mark.parametrize("kind", ["scan", "cond", "checkpoint"])
def test_higher_order_outputs_keep_body_types(mesh42, kind):
    def body(b):
        if kind == "scan":
            return lax.scan(lambda c, t: (c, lax.psum(t, "i")), 0.0, b)[1]
        if kind == "cond":
            return lax.cond(True, lambda v: lax.psum(v, "i"), lambda v: lax.psum(-v, "i"), b)
        return spmd.checkpoint(lambda v: lax.psum(v, "i"))(b)

    f = spmd.shard_map(body, mesh=mesh42, in_specs=P("i"), out_specs=P())
    x = _x(8)
    _close(f(x), x.reshape(4, 2).sum(0))


def test_loop_carry_becoming_varying():
    # Carry starts invariant (zeros) and becomes varying: psum of it must sum, not scale.
    mesh = spmd.make_mesh((4,), ("i",))
    x = np.arange(8, dtype=np.float32)
    f = spmd.shard_map(lambda b: lax.fori_loop(0, 2, lambda k, c: lax.psum(c, "i") + b,
                                               snp.zeros_like(b)),
                       mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    blocks = x.reshape(4, 2)
    _close(f(x), (blocks.sum(0)[None] + blocks).ravel())


@pytest.mark.parametrize("check_vma", [True, False])
def test_collective_in_loop_on_replicated_operands(check_vma):
    mesh = spmd.make_mesh((4,), ("i",))
    x = np.arange(3, dtype=np.float32)
    f = spmd.shard_map(lambda b: lax.fori_loop(0, 2, lambda k, c: lax.psum(c, "i") * 0.5, b),
                       mesh=mesh, in_specs=P(), out_specs=P("i"), check_vma=check_vma)
    _close(f(x), np.tile(4 * x, 4))
    g = spmd.shard_map(lambda b: lax.cond(True, lambda v: v * lax.axis_index("i"),
                                          lambda v: v, b),
                       mesh=mesh, in_specs=P(), out_specs=P("i"), check_vma=check_vma)
    _close(g(x), np.concatenate([k * x for k in range(4)]))


# ------------------------------------------------------------ typing

def _text(f, *args):
    return str(spmd.make_jaxpr(f)(*args))


def test_body_avals_carry_vma(mesh222):
    f = spmd.shard_map(lambda a, b: (a, b), mesh=mesh222, in_specs=(P("k", ("i", "j")), P()),
                       out_specs=(P("k", ("i", "j")), P()))
    text = _text(f, np.zeros((4, 8), np.float32), np.zeros(3, np.float32))
    assert "f32[2,2]{i,j,k}" in text and "f32[3]." in text, text


def test_out_specs_may_mention_invariant_axes(mesh42):
    f = spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh42, in_specs=P("i"),
                       out_specs=P(("i", "j")))
    x = _x(8)
    _close(f(x), np.tile(x.reshape(4, 2).sum(0), 8))


def test_shard_map_program_printed(mesh42):
    f = spmd.shard_map(lambda b: lax.psum(b, "j"), mesh=mesh42, in_specs=P("i", "j"),
                       out_specs=P("i"))
    text = _text(spmd.jit(f), np.zeros((8, 4), np.float32))
    assert "shard_map[" in text and "psum[axes=('j',)]" in text
    assert "f32[2,2]{i,j}" in text and "f32[2,2]{i} = psum" in text, text


# ------------------------------------------------------------ errors

def _sm(mesh, in_specs, out_specs=P(), body=lambda *a: a[0], **kw):
    return spmd.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kw)


def test_error_axis_not_in_mesh(mesh42):
    with pytest.raises(ShardMapError, match=r"in_specs\[0\].*names axis 'k'.*not in the mesh "
                                            r"\(axes \('i', 'j'\)\)"):
        _sm(mesh42, (P("k"),))(_x(8))
    with pytest.raises(ShardMapError, match=r"out_specs.*names axis 'z'"):
        _sm(mesh42, (P("i"),), P("z"))(_x(8))


def test_error_not_divisible(mesh42):
    with pytest.raises(ShardMapError, match=r"dimension 1 of size 3 is not divisible by 8.*"
                                            r"mesh axes \('i', 'j'\)"):
        _sm(mesh42, (P(None, ("i", "j")),))(_x(2, 3))
    with pytest.raises(ShardMapError, match=r"dimension 0 of size 6 is not divisible by 4.*'i'"):
        _sm(mesh42, (P("i"),))(_x(6))


def test_error_spec_longer_than_rank(mesh42):
    with pytest.raises(ShardMapError, match=r"has 2 entries but the array has rank 1"):
        _sm(mesh42, (P("i", None),))(_x(8))
    with pytest.raises(ShardMapError, match=r"out_specs.*2 entries.*rank 1 \(shape \(8,\)\)"):
        _sm(mesh42, (P("i"),), P("i", None))(_x(8))


def test_error_axis_used_twice(mesh42):
    with pytest.raises(ShardMapError, match=r"uses mesh axis 'i' twice"):
        _sm(mesh42, (P("i", "i"),))(_x(8, 8))
    with pytest.raises(ShardMapError, match=r"uses mesh axis 'j' twice"):
        _sm(mesh42, (P(("j", "j")),))(_x(8))


def test_error_in_specs_not_a_prefix(mesh42):
    x = _x(8)
    with pytest.raises(ShardMapError, match=r"not a pytree prefix.*tuple of length 1.*length 2"):
        _sm(mesh42, (P(),), body=lambda a, b: a)(x, x)
    with pytest.raises(ShardMapError, match=r"dict with keys \['a', 'c'\].*\['a', 'b'\]"):
        _sm(mesh42, ({"a": P(), "c": P()},), body=lambda d: d["a"])({"a": x, "b": x})
    # (A None in in_specs passes an argument through: tests/shard/test_shard_map_api.py.)
    with pytest.raises(ShardMapError, match=r"out_specs\[1\] is None; use P\(\)"):
        _sm(mesh42, (P(), P()), (P(), None), body=lambda a, b: (a, b))(x, x)
    with pytest.raises(ShardMapError, match=r"not a pytree prefix"):
        _sm(mesh42, ((P(), P()),), body=lambda a: a)(x)


def test_error_out_specs_not_a_prefix(mesh42):
    with pytest.raises(ShardMapError, match=r"out_specs is not a pytree prefix of the outputs"):
        _sm(mesh42, (P("i"),), (P("i"),), body=lambda b: (b, b))(_x(8))


def test_error_out_specs_omit_varying_axis(mesh42):
    body = lambda b: {"w": (b, lax.psum(b, "i"))}  # noqa: E731
    with pytest.raises(ShardMapError) as e:
        _sm(mesh42, (P("i", "j"),), {"w": (P("i"), P())}, body=body)(_x(8, 4))
    msg = str(e.value)
    for piece in ["output['w'][0]", "'j'", "out_specs['w'][0]", "lax.psum(x, 'j')",
                  "lax.all_gather_invariant(x, 'j')", "check_vma=False"]:
        assert piece in msg, (piece, msg)
    with pytest.raises(ShardMapError, match=r"output\['w'\]\[1\] varies along mesh axis 'j'"):
        _sm(mesh42, (P("i", "j"),), {"w": (P("i", "j"), P())}, body=body)(_x(8, 4))
    # check_vma=False accepts it.
    _sm(mesh42, (P("i", "j"),), {"w": (P("i"), P())}, body=body, check_vma=False)(_x(8, 4))


def test_error_collective_over_axis_not_in_mesh(mesh42):
    with pytest.raises(CollectiveAxisError, match=r"axis 'k' is not in scope; axes in scope: "
                                                  r"\['i', 'j'\]"):
        _sm(mesh42, (P("i"),), body=lambda b: lax.psum(b, "k"))(_x(8))


def test_error_collective_outside_shard_map():
    with pytest.raises(CollectiveAxisError, match="no axis is in scope.*shard_map"):
        lax.psum(snp.ones(2), "i")


def test_error_mesh_too_big():
    with pytest.raises(DeviceError, match=r"needs 16 devices but only 8 exist; set "
                                          r"SPMD_NUM_DEVICES=16"):
        spmd.make_mesh((4, 4), ("i", "j"))


def test_error_bad_mesh_and_arguments(mesh42):
    with pytest.raises(DeviceError, match="2 axis sizes"):
        spmd.make_mesh((4, 2), ("i",))
    with pytest.raises(DeviceError, match="repeat a name"):
        spmd.Mesh(np.array(spmd.devices()[:4]).reshape(2, 2), ("i", "i"))
    with pytest.raises(ShardMapError, match="mesh must be a spmd.Mesh"):
        spmd.shard_map(lambda b: b, mesh=(4, 2), in_specs=P(), out_specs=P())
    from spmd.errors import DTypeError
    with pytest.raises(DTypeError, match="str is not an array"):
        _sm(mesh42, (P(),))("abc")


@pytest.mark.parametrize("check_vma", [True, False])
def test_jit_inside_body(mesh42, check_vma):
    f = spmd.shard_map(spmd.jit(lambda b: lax.psum(b, "i")), mesh=mesh42, in_specs=P("i"),
                       out_specs=P(), check_vma=check_vma)
    x = _x(8)
    _close(f(x), x.reshape(4, 2).sum(0))


def test_jit_inside_body_untyped(mesh42):
    f = spmd.shard_map(spmd.jit(lambda b: snp.sin(b) * 2.0), mesh=mesh42, in_specs=P("i"),
                       out_specs=P("i"))
    x = _x(8)
    _close(f(x), np.sin(x) * 2)

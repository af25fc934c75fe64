"""Collectives with ``axis_index_groups``, ``lax.axis_size``, ``lax.pcast`` and
``vmap(spmd_axis_name=...)``, against per-device numpy oracles.

The oracle splits the global input into one block per device (loops over mesh
coordinates, :class:`RefMesh`), computes each device's result over the members
of its group with numpy, and assembles the global output.
"""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax
from spmd.errors import ArgumentError, ShapeError
from spmd.shard.maps.shard_map import ShardMapError
from tests.collectives.test_collectives import RefMesh

MESH = ((4, 2), ("i", "j"))
FLAT = P(("i", "j"))  # device k (row-major) holds block k of dimension 0

# (axes, groups): groups of indices along the axis (or the row-major tuple of axes).
CASES = [
    ("i", [[0, 2], [1, 3]]),
    ("i", [[3, 0, 1, 2]]),
    ("i", [[0], [1], [2], [3]]),
    (("i", "j"), [[0, 1, 4, 5], [2, 3, 6, 7]]),
    (("j", "i"), [[7, 0], [1, 6], [2, 5], [3, 4]]),
]


def _id(case):
    axes, groups = case
    return f"{axes}-{groups}"


def _members(ref, c, axes, groups):
    """The devices of ``c``'s group, in group order, and ``c``'s position in it."""
    everyone = ref.group(c, axes)
    k = ref.index(c, axes)
    row = next(g for g in groups if k in g)
    return [everyone[i] for i in row], row.index(k)


def _run(body, x, check_vma=True, jit=False):
    mesh = spmd.make_mesh(*MESH)
    f = spmd.shard_map(body, mesh=mesh, in_specs=FLAT, out_specs=FLAT, check_vma=check_vma)
    return np.asarray((spmd.jit(f) if jit else f)(x))


def _ref(x, per_device):
    ref = RefMesh(*MESH)
    blocks = ref.split(x, FLAT)
    return ref.assemble({c: per_device(ref, blocks, c) for c in ref.coords()}, FLAT)


def _x(rows_per_device=2, cols=3, dtype=np.float32):
    rng = np.random.default_rng(0)
    return rng.standard_normal((8 * rows_per_device, cols)).astype(dtype)


@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("jit", [False, True])
def test_psum_pmean_pmax_pmin(case, check_vma, jit):
    axes, groups = case
    x = _x()

    def reduce(op):
        def dev(ref, blocks, c):
            members, _ = _members(ref, c, axes, groups)
            return op(np.stack([blocks[d] for d in members]), axis=0)
        return dev

    for f, op in [(lax.psum, np.sum), (lax.pmean, np.mean), (lax.pmax, np.max),
                  (lax.pmin, np.min)]:
        got = _run(lambda b: f(b, axes, axis_index_groups=groups), x, check_vma, jit)
        np.testing.assert_allclose(got, _ref(x, reduce(op)), rtol=1e-6, err_msg=f.__name__)


def test_psum_of_ints_and_invariant_values():
    x = np.arange(16, dtype=np.int32).reshape(16, 1)
    groups = [[0, 1], [2, 3]]
    got = _run(lambda b: lax.psum(b, "i", axis_index_groups=groups), x)

    def dev(ref, blocks, c):
        members, _ = _members(ref, c, "i", groups)
        return sum(blocks[d] for d in members)
    np.testing.assert_array_equal(got, _ref(x, dev))
    # An invariant operand: each group sums its size's copies, with no communication.
    mesh = spmd.make_mesh(*MESH)
    f = spmd.shard_map(lambda w: lax.psum(w, "i", axis_index_groups=groups), mesh=mesh,
                       in_specs=P(), out_specs=P("i"))
    np.testing.assert_allclose(np.asarray(f(np.ones(3, np.float32))), np.full(12, 2.0))
    assert "all_gather" not in str(spmd.make_jaxpr(f)(np.ones(3, np.float32)))
    # A Python constant: concrete, as psum(1, 'i') is the axis size.
    seen = []
    spmd.shard_map(lambda b: seen.append(lax.psum(1, "i", axis_index_groups=groups)) or b,
                   mesh=mesh, in_specs=P("i"), out_specs=P("i"))(np.ones(4, np.float32))
    assert seen == [2]


@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("axis", [0, 1])
def test_all_gather(case, tiled, axis):
    axes, groups = case
    x = _x()

    def dev(ref, blocks, c):
        parts = [blocks[d] for d in _members(ref, c, axes, groups)[0]]
        return np.concatenate(parts, axis) if tiled else np.stack(parts, axis)

    mesh = spmd.make_mesh(*MESH)
    ref_out = {c: dev(RefMesh(*MESH), RefMesh(*MESH).split(x, FLAT), c)
               for c in RefMesh(*MESH).coords()}
    # Each device's gathered block, side by side: out_specs splits a new leading dim.
    f = spmd.shard_map(lambda b: lax.all_gather(b, axes, axis_index_groups=groups, axis=axis,
                                                tiled=tiled)[None],
                       mesh=mesh, in_specs=FLAT, out_specs=FLAT)
    got = np.asarray(f(x))
    ref = RefMesh(*MESH)
    for c in ref.coords():
        np.testing.assert_allclose(got[ref.index(c, ("i", "j"))], ref_out[c])


@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("tiled", [False, True])
def test_psum_scatter(case, tiled):
    axes, groups = case
    k = len(groups[0])
    x = _x(rows_per_device=k * 2 if tiled else k, cols=2)

    def dev(ref, blocks, c):
        members, pos = _members(ref, c, axes, groups)
        s = sum(blocks[d] for d in members)
        return np.split(s, k, axis=0)[pos] if tiled else s[pos][None]

    body = (lambda b: lax.psum_scatter(b, axes, axis_index_groups=groups, tiled=True)) \
        if tiled else (lambda b: lax.psum_scatter(b, axes, axis_index_groups=groups)[None])
    np.testing.assert_allclose(_run(body, x), _ref(x, dev), rtol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("tiled", [False, True])
def test_all_to_all(case, tiled):
    axes, groups = case
    k = len(groups[0])
    x = _x(rows_per_device=2, cols=3 * k)

    def dev(ref, blocks, c):
        members, pos = _members(ref, c, axes, groups)
        if tiled:  # split columns, concatenate rows
            return np.concatenate([np.split(blocks[d], k, axis=1)[pos] for d in members], 0)
        return np.stack([np.split(blocks[d], k, axis=1)[pos] for d in members], 0)

    def body(b):
        if tiled:
            return lax.all_to_all(b, axes, 1, 0, axis_index_groups=groups, tiled=True)
        y = lax.all_to_all(b.reshape(2, k, 3), axes, 1, 0, axis_index_groups=groups)
        return y.reshape(k * 2, 3)

    got = _run(body, x)
    want = _ref(x, lambda ref, blocks, c: dev(ref, blocks, c).reshape(-1, 3))
    np.testing.assert_allclose(got, want)


def test_grouped_grad_matches_finite_differences_and_vmap():
    groups = [[0, 3], [1, 2]]
    mesh = spmd.make_mesh(*MESH)
    x = _x()

    def loss(x):
        f = spmd.shard_map(
            lambda b: lax.pmax(lax.psum(b * b, "i", axis_index_groups=groups), "i",
                               axis_index_groups=groups)
            + lax.all_gather(b, "i", axis_index_groups=groups, tiled=True)[:4] ** 3,
            mesh=mesh, in_specs=P("i"), out_specs=P("i"))
        return snp.sum(f(x) * snp.arange(x.size).reshape(x.shape))

    from spmd.test_util import check_grads
    check_grads(loss, (x,), order=1, modes=("fwd", "rev"))
    # Batched over a leading axis, the grouped collectives still act per group.
    xs = np.stack([x, 2 * x])
    f = spmd.shard_map(lambda b: lax.psum(b, "i", axis_index_groups=groups), mesh=mesh,
                       in_specs=P("i"), out_specs=P("i"))
    np.testing.assert_allclose(np.asarray(spmd.vmap(f)(xs)),
                               np.stack([np.asarray(f(x)), np.asarray(f(2 * x))]), rtol=1e-6)


@pytest.mark.parametrize("groups,msg", [
    ([[0, 1], [1, 2]], "exactly once"),
    ([[0, 1], [2]], "exactly once"),
    ([[0, 1, 2], [3]], "same size"),
    ([[0, 1], [2, 3], []], "empty"),
    ("01", "list of lists"),
    ([[0.0, 1], [2, 3]], "list of lists"),
])
def test_bad_groups(groups, msg):
    with pytest.raises(ArgumentError, match=msg):
        _run(lambda b: lax.psum(b, "i", axis_index_groups=groups), _x())


def test_scatter_size_uses_group_size():
    with pytest.raises(ShapeError, match="must be equal to 2, the size of each "
                                         "axis_index_groups group of axes"):
        _run(lambda b: lax.psum_scatter(b, "i", axis_index_groups=[[0, 1], [2, 3]]),
             _x(rows_per_device=4))


# ------------------------------------------------------------ axis_size, pcast

def test_axis_size():
    mesh = spmd.make_mesh(*MESH)
    seen = []

    def body(b):
        seen.append((lax.axis_size("i"), lax.axis_size("j"), lax.axis_size(("i", "j"))))
        return b

    spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(np.ones(4))
    assert seen == [(4, 2, 8)]
    assert spmd.vmap(lambda v: v * lax.axis_size("b"), axis_name="b")(np.ones(5)).tolist() \
        == [5.0] * 5
    from spmd.collectives.primitives import CollectiveAxisError
    with pytest.raises(CollectiveAxisError, match="'k' is not in scope"):
        spmd.shard_map(lambda b: b * lax.axis_size("k"), mesh=mesh, in_specs=P("i"),
                       out_specs=P("i"))(np.ones(4))


def test_pcast_to_varying_is_pvary():
    mesh = spmd.make_mesh(*MESH)

    def body(w, b):
        return lax.pcast(w, "i", to="varying") * b

    f = spmd.shard_map(body, mesh=mesh, in_specs=(P(), P("i")), out_specs=P("i"))
    w, x = np.float32(3.0), np.arange(8, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(f(w, x)), 3 * x)
    assert "pvary[axes=('i',)]" in str(spmd.make_jaxpr(f)(w, x))
    # Its transpose is psum: the gradient of w sums over the devices.
    g = spmd.grad(lambda w: snp.sum(f(w, x)))(w)
    np.testing.assert_allclose(np.asarray(g), x.sum())
    with pytest.raises(ArgumentError, match="to='invariant'; the allowed values are"):
        spmd.shard_map(lambda b: lax.pcast(b, "i", to="invariant"), mesh=mesh,
                       in_specs=P("i"), out_specs=P("i"))(x)


# ------------------------------------------------------ vmap(spmd_axis_name=...)

def _inner(mesh):
    return spmd.shard_map(lambda b: lax.psum(b * b, "j"), mesh=mesh, in_specs=P("j"),
                          out_specs=P())


@pytest.mark.parametrize("name", ["i", ("i",)])
def test_vmap_spmd_axis_name_splits_the_batch(name):
    mesh = spmd.make_mesh(*MESH)
    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    f = spmd.vmap(_inner(mesh), spmd_axis_name=name)
    want = (x * x).reshape(8, 2, 3).sum(1)
    np.testing.assert_allclose(np.asarray(f(x)), want)
    np.testing.assert_allclose(np.asarray(spmd.jit(f)(x)), want)
    text = str(spmd.make_jaxpr(f)(x))
    # Each device maps over its 2 of the 8 rows: the body's block is f32[2,3].
    assert "f32[2,3]{i,j}" in text and "PartitionSpec('i', 'j')" in text, text
    g = spmd.grad(lambda x: snp.sum(f(x)))(x)
    np.testing.assert_allclose(np.asarray(g), 2 * x)
    # Without spmd_axis_name the batch stays whole on each device.
    assert "f32[8,3]{j}" in str(spmd.make_jaxpr(spmd.vmap(_inner(mesh)))(x))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_vmap_of_grad_of_an_untyped_body_over_spmd_axis_name(jit):
    # JAX's test_vmap_of_grad_spmd_axis_name: a check_vma=False body differentiated
    # inside vmap(spmd_axis_name='x'). Its residuals are per device along the other
    # axes only, and its transpose neither shares nor sums cotangents along 'x' (the
    # devices there hold different batch elements, not copies). Before, the residuals'
    # spec named 'x' and vmap refused it; with only the residuals fixed the gradient
    # was silently wrong (summed across batch elements).
    mesh = spmd.make_mesh((2, 2), ("x", "y"))
    f = spmd.shard_map(lambda x: snp.sin(snp.sum(x)), mesh=mesh, in_specs=P("y"),
                       out_specs=P(), check_vma=False)
    x = np.arange(16, dtype=np.float32).reshape(4, 4) / 4
    px = spmd.device_put(x, NamedSharding(mesh, P("x", "y")))
    wrap = spmd.jit if jit else (lambda g: g)
    plain = wrap(spmd.vmap(spmd.grad(f)))(px)
    split = wrap(spmd.vmap(spmd.grad(f), spmd_axis_name="x"))(px)
    np.testing.assert_array_equal(np.asarray(split), np.asarray(plain))
    # Untyped, each device's output (sin of its half of the row) stands for the one
    # unmapped result: the devices holding it share its cotangent evenly, so each half
    # of a row gets half of cos of its sum.
    want = np.repeat(np.cos(x.reshape(4, 2, 2).sum(2)) / 2, 2, axis=1)
    np.testing.assert_allclose(np.asarray(split), want, rtol=1e-6)


def test_vmap_spmd_axis_name_constrains_sharding():
    mesh = spmd.make_mesh(*MESH)
    f = spmd.vmap(lambda r: lax.with_sharding_constraint(r * 2, NamedSharding(mesh, P("j"))),
                  spmd_axis_name="i")
    x = np.ones((8, 6), np.float32)
    assert "spec=PartitionSpec('i', 'j')" in str(spmd.make_jaxpr(f)(x))
    np.testing.assert_allclose(np.asarray(spmd.jit(f)(x)), 2 * x)


def test_vmap_spmd_axis_name_errors():
    mesh = spmd.make_mesh(*MESH)
    x = np.ones((8, 6), np.float32)
    with pytest.raises(ShardMapError, match="cannot appear in the shard_map's in_specs"):
        spmd.vmap(_inner(mesh), spmd_axis_name="j")(x)
    with pytest.raises(ShardMapError, match="not divisible by 4"):
        spmd.vmap(_inner(mesh), spmd_axis_name="i")(np.ones((6, 6), np.float32))
    with pytest.raises(ShardMapError, match="'k', which is not an axis"):
        spmd.vmap(_inner(mesh), spmd_axis_name="k")(x)
    with pytest.raises(ArgumentError, match="spmd_axis_name must be a mesh axis name"):
        spmd.vmap(_inner(mesh), spmd_axis_name=3)
    # Out specs naming the mapped axis: JAX's error (its blocks would be split twice).
    out_i = spmd.shard_map(lambda b: b * 2, mesh=mesh, in_specs=P("j"),
                           out_specs=P(("j", "i")))
    with pytest.raises(ShardMapError, match="cannot appear in the shard_map's out_specs"):
        spmd.vmap(out_i, spmd_axis_name="i")(x)


def test_vmap_spmd_axis_name_of_a_gradient():
    # vmap(grad) of a typed body equals the gradient mapped without spmd_axis_name.
    mesh = spmd.make_mesh(*MESH)
    f = spmd.shard_map(lambda b: snp.sin(lax.psum(snp.sum(b), "j")), mesh=mesh,
                       in_specs=P("j"), out_specs=P())
    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6) / 10
    put = spmd.device_put(x, NamedSharding(mesh, P("i", "j")))
    want = np.cos(x.sum(1, keepdims=True)) * np.ones_like(x)
    for g in (spmd.vmap(spmd.grad(f)), spmd.vmap(spmd.grad(f), spmd_axis_name="i")):
        np.testing.assert_allclose(np.asarray(g(put)), want, rtol=1e-5)
    # Untyped (check_vma=False), as in JAX: the 4 devices holding the output share its
    # cotangent, and the 2 copies of each input block along 'i' sum theirs:
    # cos(block sum) / 2; mapped over 'i', the same (its residuals are kept per device
    # along 'j' only, and 'i' holds batch elements, not copies).
    u = spmd.shard_map(lambda b: snp.sin(snp.sum(b)), mesh=mesh, in_specs=P("j"),
                       out_specs=P(), check_vma=False)
    for g in (spmd.vmap(spmd.grad(u)), spmd.vmap(spmd.grad(u), spmd_axis_name="i")):
        np.testing.assert_allclose(np.asarray(g(put)),
                                   np.cos(x.reshape(8, 2, 3).sum(2)).repeat(3, 1) / 2,
                                   rtol=1e-5)


@pytest.mark.parametrize("op", ["psum", "all_gather", "axis_index", "pcast"])
def test_a_set_of_axis_names_is_refused(op):
    # A set has no order, and its iteration order differs between processes: JAX's
    # TypeError, naming the ordered tuple to give instead.
    mesh = spmd.make_mesh(*MESH)
    calls = {"psum": lambda b: lax.psum(b, {"i", "j"}),
             "all_gather": lambda b: lax.all_gather(b, {"i", "j"}, tiled=True),
             "axis_index": lambda b: b + lax.axis_index({"i"}),
             "pcast": lambda b: lax.pcast(b, {"i"}, to="varying")}
    f = spmd.shard_map(calls[op], mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
    with pytest.raises(TypeError, match=r"axis_name must be a tuple or a str, got the set"):
        f(np.ones((8, 6), np.float32))

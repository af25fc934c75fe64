"""Each partition rule checked by brute force.

For a primitive applied to global values, draw random placements of its inputs on a
small simulated mesh (split dimensions over random axes in random order, and pending
sums: each device of a group holds an uneven random summand, so a rule that wrongly
keeps or drops a sum cannot match by chance), build every device's block, run the
partitioner's per-device code for that one equation (the rule, the reshards it asks
for, the local primitive) inside a shard_map, reassemble the global result from the
blocks and the output placement (checking that replicas agree) and compare it with
the primitive applied to the global values.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import spmd
from spmd import lax
from spmd.compiler.ops import threefry
from spmd.compiler.core.trace import get_aval, trace_to_program
from spmd.shard.partition.partitioner import Evaluator
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.reshard import Context, reshard
from spmd.shard.arrays.spec import PartitionSpec as P

MESHES = [((4,), ("i",)), ((2, 2), ("i", "j")), ((2, 2, 2), ("i", "j", "k"))]


def _mesh(shape, names):
    return spmd.make_mesh(shape, names, devices=spmd.devices()[:math.prod(shape)])


# ------------------------------------------------------------------ blocks

def random_placement(rng, aval, mesh, partial=True) -> Placement:
    dims = [[] for _ in aval.shape]
    summed = set()
    for a in rng.permutation(mesh.axis_names):
        a = str(a)
        c = int(rng.integers(0, len(aval.shape) + 2))
        if c < len(aval.shape):
            n = mesh.axis_size(tuple(dims[c]) + (a,))
            if aval.shape[c] % n == 0:
                dims[c].append(a)
        elif c == len(aval.shape) + 1 and partial and aval.dtype.kind in "iuf":
            summed.add(a)
    return Placement(tuple(tuple(d) for d in dims), frozenset(summed))


def _coords(mesh):
    return [dict(zip(mesh.axis_names, c)) for c in np.ndindex(*mesh.axis_sizes)]


def _index(pl, c, local, mesh):
    idx = []
    for d, axes in enumerate(pl.dims):
        k = 0
        for a in axes:
            k = k * mesh.shape[a] + c[a]
        idx.append(slice(k * local[d], (k + 1) * local[d]))
    return tuple(idx)


def _summands(rng, x, n):
    if n == 1:
        return [x]
    if x.dtype.kind == "f":
        parts = [rng.standard_normal(x.shape).astype(x.dtype) * (1 + k) for k in range(n - 1)]
    else:
        parts = [rng.integers(-7, 8, x.shape).astype(x.dtype) for _ in range(n - 1)]
    return parts + [x - sum(parts)]


def device_blocks(rng, x, pl, mesh):
    """Every device's block of ``x`` placed as ``pl``, stacked in mesh order."""
    local = pl.local_shape(x.shape, mesh)
    summed = [a for a in mesh.axis_names if a in pl.partial]
    parts = _summands(rng, x, mesh.axis_size(tuple(summed)) if summed else 1)
    out = []
    for c in _coords(mesh):
        k = 0
        for a in summed:
            k = k * mesh.shape[a] + c[a]
        out.append(parts[k][_index(pl, c, local, mesh)])
    return np.stack(out)


def assemble(blocks, pl, shape, dtype, mesh):
    """The global value from stacked blocks; replicas must agree."""
    blocks = np.asarray(blocks)
    local = pl.local_shape(shape, mesh)
    out = np.zeros(shape, dtype)
    free = [a for a in mesh.axis_names if a not in pl.axes and a not in pl.partial]
    coords = _coords(mesh)
    first = {}
    for flat, c in enumerate(coords):
        key = tuple(c[a] for a in mesh.axis_names if a not in free)
        if key in first:
            np.testing.assert_array_equal(blocks[flat], blocks[first[key]],
                                          err_msg=f"replicas disagree under {pl}")
            continue
        first[key] = flat
        idx = _index(pl, c, local, mesh)
        if pl.partial:
            out[idx] += blocks[flat]
        else:
            out[idx] = blocks[flat]
    return out


# ------------------------------------------------------------------ running

def _one_eqn(fn, xs):
    def flat(*a):
        out = fn(*a)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    closed = trace_to_program(flat, [get_aval(x) for x in xs])
    eqns = closed.program.eqns
    assert len(eqns) == 1, closed
    return eqns[0]


def check(fn, xs, mesh, rng, pls=None):
    eqn = _one_eqn(fn, xs)
    pls = pls or [random_placement(rng, get_aval(x), mesh) for x in xs]
    names = tuple(mesh.axis_names)
    box = []

    def body(*blocks):
        ev = Evaluator(mesh, Context(mesh))
        vals = [lax.reshape(b, np.shape(b)[1:]) for b in blocks]
        outs = ev.apply(eqn, vals, pls)
        box[:] = [p for _, p in outs]
        return [lax.reshape(o, (1,) + np.shape(o)) for o, _ in outs]

    stacked = [device_blocks(rng, np.asarray(x), p, mesh) for x, p in zip(xs, pls)]
    f = spmd.shard_map(body, mesh=mesh, in_specs=tuple(P(names) for _ in xs),
                       out_specs=tuple(P(names) for _ in eqn.outputs), check_vma=False)
    got = f(*stacked)
    want = fn(*xs)
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    for g, w, pl, o in zip(got, want, box, eqn.outputs):
        w = np.asarray(w)
        g = assemble(g, pl, w.shape, w.dtype, mesh)
        msg = f"inputs {[str(p) for p in pls]} -> {pl} on {mesh}"
        if w.dtype.kind == "f":
            # Summands of a half-precision input are rounded: looser there.
            tol = 1e-2 if any(np.asarray(x).dtype.itemsize == 2 for x in xs) else 2e-4
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=msg)
        else:
            np.testing.assert_array_equal(g, w, err_msg=msg)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def i32(rng, *shape, lo=-5, hi=6):
    return rng.integers(lo, hi, shape).astype(np.int32)


# ------------------------------------------------------------------ the cases

def _cases():
    c = {}
    c["neg"] = (lax.neg, lambda r: [f32(r, 8, 4)])
    c["exp"] = (lax.exp, lambda r: [f32(r, 4, 8)])
    c["tanh"] = (lax.tanh, lambda r: [f32(r, 8)])
    c["convert_i2f"] = (lambda x: lax.convert_element_type(x, np.float32),
                        lambda r: [i32(r, 8, 4)])
    c["convert_f2i"] = (lambda x: lax.convert_element_type(x, np.int32),
                        lambda r: [f32(r, 8, 4) * 3])
    c["convert_narrow"] = (lambda x: lax.convert_element_type(x, np.float16),
                           lambda r: [f32(r, 8, 4)])
    c["convert_widen"] = (lambda x: lax.convert_element_type(x, np.float32),
                          lambda r: [f32(r, 8, 4).astype(np.float16)])
    c["add"] = (lax.add, lambda r: [f32(r, 8, 4), f32(r, 8, 4)])
    c["add_scalar"] = (lax.add, lambda r: [f32(r, 8, 4), np.float32(1.5)])
    c["sub_scalar_first"] = (lax.sub, lambda r: [np.float32(2.0), f32(r, 4, 8)])
    c["sub"] = (lax.sub, lambda r: [f32(r, 4, 8), f32(r, 4, 8)])
    c["mul"] = (lax.mul, lambda r: [f32(r, 8, 4), f32(r, 8, 4)])
    c["mul_scalar"] = (lax.mul, lambda r: [f32(r, 8, 4), np.float32(-3.0)])
    c["mul_int"] = (lax.mul, lambda r: [i32(r, 8, 4), i32(r, 8, 4)])
    c["div"] = (lax.div, lambda r: [f32(r, 8, 4), np.abs(f32(r, 8, 4)) + 1])
    c["max"] = (lax.max, lambda r: [f32(r, 8, 4), f32(r, 8, 4)])
    c["eq"] = (lax.eq, lambda r: [i32(r, 8, 4, lo=0, hi=2), i32(r, 8, 4, lo=0, hi=2)])
    c["select_n"] = (lambda p, a, b: lax.select_n(p, a, b),
                     lambda r: [r.random((8, 4)) < 0.5, f32(r, 8, 4), f32(r, 8, 4)])
    c["integer_pow"] = (lambda x: lax.integer_pow(x, 2), lambda r: [f32(r, 4, 8)])
    c["broadcast_new_dims"] = (lambda x: lax.broadcast_in_dim(x, (4, 8, 4), (1,)),
                               lambda r: [f32(r, 8)])
    c["broadcast_size1"] = (lambda x: lax.broadcast_in_dim(x, (8, 4), (0, 1)),
                            lambda r: [f32(r, 8, 1)])
    for name, (shape, new) in {"reshape_merge": ((8, 4), (32,)),
                               "reshape_split": ((4, 8), (2, 2, 8)),
                               "reshape_merge_inner": ((2, 4, 4), (8, 4)),
                               "reshape_square": ((16,), (4, 4)),
                               "reshape_regroup": ((8, 4), (4, 8)),
                               "reshape_unit": ((8,), (1, 8))}.items():
        c[name] = (lambda x, new=new: lax.reshape(x, new), lambda r, s=shape: [f32(r, *s)])
    c["transpose"] = (lambda x: lax.transpose(x, (2, 0, 1)), lambda r: [f32(r, 4, 2, 8)])
    c["reduce_sum"] = (lambda x: lax.reduce_sum(x, (1,)), lambda r: [f32(r, 8, 4)])
    c["reduce_sum_all"] = (lambda x: lax.reduce_sum(x, (0, 1)), lambda r: [f32(r, 4, 8)])
    c["reduce_sum_int"] = (lambda x: lax.reduce_sum(x, (0,)), lambda r: [i32(r, 8, 4)])
    c["reduce_max"] = (lambda x: lax.reduce_max(x, (0,)), lambda r: [f32(r, 8, 4)])
    c["reduce_min"] = (lambda x: lax.reduce_min(x, (0, 1)), lambda r: [f32(r, 4, 8)])
    c["reduce_prod"] = (lambda x: lax.reduce_prod(x, (1,)),
                        lambda r: [np.float32(1) + f32(r, 8, 4) / 8])
    c["argmax"] = (lambda x: lax.argmax(x, 1), lambda r: [f32(r, 8, 4)])
    c["argmin"] = (lambda x: lax.argmin(x, 0), lambda r: [f32(r, 8, 4)])
    c["reduce_and"] = (lambda x: lax.reduce_and(x, (0,)), lambda r: [r.random((8, 4)) < 0.8])
    c["reduce_or"] = (lambda x: lax.reduce_or(x, (1,)), lambda r: [r.random((8, 4)) < 0.2])
    mm = (((1,), (0,)), ((), ()))
    c["matmul"] = (lambda a, b: lax.dot_general(a, b, mm), lambda r: [f32(r, 8, 4), f32(r, 4, 8)])
    c["matmul_tn"] = (lambda a, b: lax.dot_general(a, b, (((0,), (0,)), ((), ()))),
                      lambda r: [f32(r, 8, 4), f32(r, 8, 4)])
    c["dot_batch"] = (lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))),
                      lambda r: [f32(r, 4, 8, 4), f32(r, 4, 4, 8)])
    c["dot_outer"] = (lambda a, b: lax.dot_general(a, b, (((), ()), ((), ()))),
                      lambda r: [f32(r, 4), f32(r, 8)])
    c["dot_two_contractions"] = (
        lambda a, b: lax.dot_general(a, b, (((0, 1), (1, 0)), ((), ()))),
        lambda r: [f32(r, 4, 8), f32(r, 8, 4)])
    c["squeeze"] = (lambda x: lax.squeeze(x, (1,)), lambda r: [f32(r, 4, 1, 8)])
    c["slice"] = (lambda x: lax.slice(x, (0, 1), (8, 3)), lambda r: [f32(r, 8, 4)])
    c["slice_strided"] = (lambda x: lax.slice(x, (1, 0), (8, 4), (2, 1)),
                          lambda r: [f32(r, 8, 4)])
    c["pad"] = (lambda x, v: lax.pad(x, v, ((1, 2, 0), (0, 0, 0))),
                lambda r: [f32(r, 4, 8), np.float32(0.5)])
    c["pad_interior"] = (lambda x, v: lax.pad(x, v, ((0, 0, 0), (-1, 1, 1))),
                         lambda r: [f32(r, 8, 4), np.float32(-1.0)])
    c["concatenate"] = (lambda a, b, d: lax.concatenate([a, b, d], 1),
                        lambda r: [f32(r, 8, 4), f32(r, 8, 8), f32(r, 8, 4)])
    c["concatenate0"] = (lambda a, b: lax.concatenate([a, b], 0),
                         lambda r: [f32(r, 4, 8), f32(r, 4, 8)])
    c["sort"] = (lambda x: lax.sort(x, 1), lambda r: [f32(r, 8, 4)])
    c["sort_key_val"] = (lambda k, v: lax.sort((k, v), 0, True, 1),
                         lambda r: [i32(r, 8, 4), f32(r, 8, 4)])
    c["dynamic_slice"] = (lambda x, i, j: lax.dynamic_slice(x, (i, j), (8, 2)),
                          lambda r: [f32(r, 8, 4), np.int32(3), np.int32(1)])
    c["dynamic_slice_rows"] = (lambda x, i, j: lax.dynamic_slice(x, (i, j), (3, 8)),
                               lambda r: [f32(r, 8, 8), np.int32(2), np.int32(5)])
    c["dynamic_update_slice"] = (lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, j)),
                                 lambda r: [f32(r, 8, 4), f32(r, 8, 2), np.int32(0),
                                            np.int32(1)])
    c["dynamic_update_slice_rows"] = (
        lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, j)),
        lambda r: [f32(r, 8, 4), f32(r, 2, 4), np.int32(5), np.int32(0)])
    c["gather"] = (lambda x, i: lax.gather(x, [i], (0,)),
                   lambda r: [f32(r, 8, 4), i32(r, 4, lo=0, hi=8)])
    c["gather_2d_index"] = (lambda x, i: lax.gather(x, [i], (1,)),
                            lambda r: [f32(r, 4, 8), i32(r, 4, 4, lo=-2, hi=10)])
    c["gather_fill"] = (lambda x, i: lax.gather(x, [i], (0,), "fill", 7.0),
                        lambda r: [f32(r, 8, 4), i32(r, 8, lo=-2, hi=10)])
    c["scatter_add"] = (lambda x, u, i: lax.scatter(x, u, [i], (0,), "add"),
                        lambda r: [f32(r, 8, 4), f32(r, 8, 4), i32(r, 8, lo=0, hi=8)])
    c["scatter_set"] = (lambda x, u, i: lax.scatter(x, u, [i], (1,), "set"),
                        lambda r: [f32(r, 4, 8), f32(r, 4, 4),
                                   r.permutation(8)[:4].astype(np.int32)])
    c["scatter_max"] = (lambda x, u, i: lax.scatter(x, u, [i], (0,), "max"),
                        lambda r: [f32(r, 8, 4), f32(r, 4, 4), i32(r, 4, lo=0, hi=8)])
    c["cumsum"] = (lambda x: lax.cumsum(x, 1), lambda r: [f32(r, 8, 4)])
    c["cumprod"] = (lambda x: lax.cumprod(x, 0), lambda r: [np.float32(1) + f32(r, 8, 4) / 8])
    c["cummin"] = (lambda x: lax.cummin(x, 1), lambda r: [f32(r, 8, 4)])
    c["cummax"] = (lambda x: lax.cummax(x, 0, reverse=True), lambda r: [f32(r, 8, 4)])
    c["rev"] = (lambda x: lax.rev(x, (0,)), lambda r: [f32(r, 8, 4)])
    # A batch of keys: the output's batch dimension follows the keys' split.
    c["random_bits"] = (lambda k: threefry.random_bits(k, (4, 2)),
                        lambda r: [r.integers(0, 2**32, (8, 2), dtype=np.uint32)])
    from spmd.compiler.ops import linalg_decomp as ld

    def spd(r):  # symmetric positive definite matrices in a batch
        a = f32(r, 8, 3, 3)
        return (a @ a.swapaxes(-1, -2) + 3 * np.eye(3, dtype=np.float32)).astype(np.float32)

    c["cholesky"] = (ld.cholesky, lambda r: [spd(r)])
    c["linalg_solve"] = (ld.solve, lambda r: [spd(r), f32(r, 8, 3, 2)])
    c["slogdet"] = (ld.slogdet, lambda r: [spd(r)])
    c["qr"] = (ld.qr, lambda r: [f32(r, 8, 4, 3)])
    c["eigh"] = (ld.eigh, lambda r: [spd(r)])
    c["svd"] = (lambda a: ld.svd(a, full_matrices=False), lambda r: [f32(r, 8, 4, 3)])
    from spmd.compiler.ops.conv import conv
    from spmd.compiler.transforms.remat import checkpoint_name
    c["name"] = (lambda x: checkpoint_name(x, "a"), lambda r: [f32(r, 8, 4)])
    c["conv"] = (lambda x, w: conv(x, w, (1,), [(1, 1)]),
                 lambda r: [f32(r, 8, 4, 6), f32(r, 4, 4, 3)])
    c["conv_grouped"] = (lambda x, w: conv(x, w, (2,), [(0, 1)], feature_group_count=2),
                         lambda r: [f32(r, 8, 4, 6), f32(r, 8, 2, 3)])
    _attention_cases(c)
    return c


def _attention_cases(c):
    """The attention kernel's three primitives; out and lse (and the bias's batch and
    head dimensions of 1) as the forward makes them, so the derivatives are read on
    consistent residuals."""
    from spmd.compiler.ops import attention as at
    from spmd.compiler.ops.attention_forward import forward
    from spmd.compiler.core.trace import bind

    kw = dict(scale=0.5, is_causal=True, window=None)

    def qkv(r, K=2):
        return [f32(r, 4, 4, 4, 2), f32(r, 4, 4, K, 2), f32(r, 4, 4, K, 2)]

    def with_residuals(r, K=2, bias=None):
        q, k, v = qkv(r, K)
        out, lse = forward(np, q, k, v, bias, None, **kw)
        return q, k, v, out, lse

    c["attention"] = (lambda q, k, v: at.attention(q, k, v, **{**kw, "window": None}),
                      lambda r: qkv(r))
    c["attention_bias_mask"] = (
        lambda q, k, v, b, m: at.attention(q, k, v, b, m, scale=0.5),
        lambda r: qkv(r, 1) + [f32(r, 1, 4, 4, 4), r.random((4, 1, 4, 4)) < 0.7])
    params = dict(kw, has_bias=False, has_mask=False)
    c["attention_tangent"] = (
        lambda q, k, v, o, l, tq, tk, tv: bind(at.attention_tangent_p, q, k, v, o, l, tq, tk,
                                               tv, tangents=(True, True, True, False), **params),
        lambda r: list(with_residuals(r)) + qkv(r))

    def grad_case(r, K):
        q, k, v = qkv(r, K)
        bias = f32(r, 1, 4, 1, 4)
        out, lse = forward(np, q, k, v, bias, None, **kw)
        return [q, k, v, bias, out, lse, f32(r, 4, 4, 4, 2)]

    for K in (2, 1):
        c[f"attention_grad_k{K}"] = (
            lambda q, k, v, b, o, l, ct: bind(at.attention_grad_p, q, k, v, b, o, l, ct,
                                              wants=(True, True, True, True),
                                              has_ct_lse=False,
                                              **dict(params, has_bias=True)),
            lambda r, K=K: grad_case(r, K))


CASES = _cases()


@pytest.mark.parametrize("mesh_shape,names", MESHES, ids=["4", "2x2", "2x2x2"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_global(case, mesh_shape, names):
    fn, make = CASES[case]
    mesh = _mesh(mesh_shape, names)
    # A seed fixed per case (hash() of a str changes with every interpreter).
    rng = np.random.default_rng(zlib.crc32(repr((case, mesh_shape)).encode()))
    for _ in range(6):
        check(fn, make(rng), mesh, rng)


def test_every_specific_rule_is_covered():
    """Each primitive with a rule has a case here; the elementwise primitives share one
    rule per way pending sums pass, and each of those ways has a case."""
    from spmd.compiler.core.primitives import PRIMITIVES
    from spmd.shard.partition import rules
    from spmd.shard.partition.registry import DECISIONS, Propagate

    covered = set()
    rng = np.random.default_rng(0)
    for fn, make in CASES.values():
        covered.add(_one_eqn(fn, make(rng)).primitive)
    shared = {r: k for k, r in rules._ELEMENTWISE_RULES.items()}
    specific = {p for p in PRIMITIVES.values() if type(DECISIONS.get(p)) is Propagate
                and DECISIONS[p].rule not in shared and p.name != "iota"}
    missing = sorted(p.name for p in specific - covered)
    assert not missing, f"rules without a brute-force case: {missing}"
    kinds = {shared[DECISIONS[p].rule] for p in covered if DECISIONS[p].rule in shared}
    # "linear" is exercised by neg; every way sums pass has a case.
    assert kinds == set(rules._SUMS), f"elementwise sums kinds without a case: " \
        f"{sorted(set(rules._SUMS) - kinds)}"


@pytest.mark.parametrize("mesh_shape,names", MESHES, ids=["4", "2x2", "2x2x2"])
def test_reshard_any_to_any(mesh_shape, names):
    """Random source and destination placements (pending sums on both sides)."""
    mesh = _mesh(mesh_shape, names)
    rng = np.random.default_rng(len(mesh_shape))
    for t in range(25):
        shape = [(8, 4), (4, 8, 2), (16,), (8, 8)][t % 4]
        x = f32(rng, *shape)
        aval = get_aval(x)
        src = random_placement(rng, aval, mesh)
        dst = random_placement(rng, aval, mesh)
        box = []

        def body(b, src=src, dst=dst):
            ctx = Context(mesh)
            y = reshard(lax.reshape(b, np.shape(b)[1:]), src, dst, ctx)
            box[:] = [ctx.notes]
            return lax.reshape(y, (1,) + np.shape(y))

        names_t = tuple(mesh.axis_names)
        f = spmd.shard_map(body, mesh=mesh, in_specs=P(names_t), out_specs=P(names_t),
                           check_vma=False)
        got = f(device_blocks(rng, x, src, mesh))
        np.testing.assert_allclose(assemble(got, dst, x.shape, x.dtype, mesh), x, rtol=1e-4,
                                   atol=1e-4, err_msg=f"{src} -> {dst} on {mesh}")

"""Collectives inside ``shard_map`` against a reference simulator of the mesh.

The oracle (:class:`RefMesh`) splits the global input into per-device blocks
with explicit loops over mesh coordinates, computes what each device should
hold with numpy, and assembles the global output the way ``out_specs`` says.
Semantics follow JAX's ``jax.lax`` collectives.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.collectives.primitives import CollectiveAxisError
from spmd.errors import ArgumentError, ShapeError

MESHES = {"8": ((8,), ("i",)), "4x2": ((4, 2), ("i", "j")), "2x2x2": ((2, 2, 2), ("i", "j", "k"))}

# Per mesh: single axes, and tuples of axes in both orders.
AXES = {
    "8": ["i", ("i",)],
    "4x2": ["i", "j", ("i", "j"), ("j", "i")],
    "2x2x2": ["j", ("i", "k"), ("k", "i"), ("i", "j", "k"), ("k", "j", "i")],
}

CASES = [(m, a) for m in MESHES for a in AXES[m]]


def _id(v):
    if isinstance(v, tuple):
        return "(" + ",".join(map(str, v)) + ")"
    return v if isinstance(v, str) else str(v)


# ------------------------------------------------------------ the reference

class RefMesh:
    """What each device of a mesh holds, computed with loops over coordinates."""

    def __init__(self, sizes, names):
        self.sizes, self.names = tuple(sizes), tuple(names)
        self.shape = dict(zip(names, sizes))

    def coords(self):
        return list(itertools.product(*[range(s) for s in self.sizes]))

    def _size(self, axes):
        return int(np.prod([self.shape[a] for a in axes], dtype=np.int64))

    def index(self, c, axes):
        """Position of device ``c`` along ``axes`` (row-major over the tuple's order)."""
        k = 0
        for a in axes:
            k = k * self.shape[a] + c[self.names.index(a)]
        return k

    def group(self, c, axes):
        """The devices sharing ``c``'s other coordinates, ordered by their index."""
        out = []
        for idx in itertools.product(*[range(self.shape[a]) for a in axes]):
            d = list(c)
            for a, i in zip(axes, idx):
                d[self.names.index(a)] = i
            out.append(tuple(d))
        return out

    def split(self, x, spec):
        blocks = {}
        for c in self.coords():
            sl = []
            for d, n in enumerate(x.shape):
                axes = _spec_axes(spec, d)
                if not axes:
                    sl.append(slice(None))
                    continue
                m = self._size(axes)
                k = self.index(c, axes)
                sl.append(slice(k * n // m, (k + 1) * n // m))
            blocks[c] = np.array(x[tuple(sl)])
        return blocks

    def assemble(self, blocks, spec):
        """The global array; devices that the spec says hold the same block must agree."""
        some = next(iter(blocks.values()))
        shape = [n * (self._size(_spec_axes(spec, d)) or 1) for d, n in enumerate(some.shape)]
        out = np.zeros(shape, some.dtype)
        for c, b in blocks.items():
            sl = []
            for d, n in enumerate(b.shape):
                axes = _spec_axes(spec, d)
                k = self.index(c, axes) if axes else 0
                sl.append(slice(k * n, (k + 1) * n))
            out[tuple(sl)] = b
        return out


def _spec_axes(spec, d):
    if d >= len(spec) or spec[d] is None:
        return ()
    return (spec[d],) if isinstance(spec[d], str) else tuple(spec[d])


# ---- the collectives, per device

def ref_psum(ref, blocks, c, axes):
    return sum(blocks[d] for d in ref.group(c, axes))


def ref_pmax(ref, blocks, c, axes):
    return np.max(np.stack([blocks[d] for d in ref.group(c, axes)]), axis=0)


def ref_pmin(ref, blocks, c, axes):
    return np.min(np.stack([blocks[d] for d in ref.group(c, axes)]), axis=0)


def ref_all_gather(ref, blocks, c, axes, axis, tiled):
    parts = [blocks[d] for d in ref.group(c, axes)]
    return np.concatenate(parts, axis) if tiled else np.stack(parts, axis)


def ref_psum_scatter(ref, blocks, c, axes, dim, tiled):
    s = ref_psum(ref, blocks, c, axes)
    k, n = ref.index(c, axes), ref._size(axes)
    if not tiled:
        return np.take(s, k, axis=dim)
    return np.split(s, n, axis=dim)[k]


def ref_all_to_all(ref, blocks, c, axes, split, concat, tiled):
    k, n = ref.index(c, axes), ref._size(axes)
    members = ref.group(c, axes)
    if tiled:
        return np.concatenate([np.split(blocks[d], n, axis=split)[k] for d in members], concat)
    # Untiled (JAX): the split axis is removed and a new axis appears at concat_axis.
    return np.stack([np.take(blocks[d], k, axis=split) for d in members], concat)


def ref_ppermute(ref, blocks, c, axes, perm):
    k = ref.index(c, axes)
    src = {d: s for s, d in perm}
    if k not in src:
        return np.zeros_like(blocks[c])
    return blocks[ref.group(c, axes)[src[k]]]


# ------------------------------------------------------------ the harness

def _mesh(key):
    return spmd.make_mesh(*MESHES[key])


def _all(names):
    return P(tuple(names))


def _global_shape(block, spec, ref):
    return tuple(n * (ref._size(_spec_axes(spec, d)) or 1) for d, n in enumerate(block))


def _data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-20, 20, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def run_case(key, body, ref_body, block, in_spec="all", dtype=np.float32, jit=False,
             check_vma=True, out_spec=None):
    """Run ``body`` under shard_map and ``ref_body(ref, blocks, coords)`` per device; compare.

    ``in_spec``: ``"rep"`` (P()), ``"all"`` (dim 0 split over every mesh axis), ``"rev"``
    (dim 0 split over the axes in reverse order), ``"mixed"`` (dim 0 over the first axis,
    dim 1 over the rest), or a PartitionSpec.  By default the output is assembled by
    splitting its dim 0 over every mesh axis, so each device's block is checked.
    """
    sizes, names = MESHES[key]
    ref = RefMesh(sizes, names)
    spec = {"rep": P(), "all": _all(names), "rev": _all(names[::-1]),
            "mixed": P(names[0], tuple(names[1:]) or None)}.get(in_spec, in_spec)
    x = _data(_global_shape(block, spec, ref), dtype)
    blocks = ref.split(x, spec)
    out_blocks = {c: np.asarray(ref_body(ref, blocks, c)) for c in ref.coords()}
    ospec = _all(names) if out_spec is None else out_spec
    want = ref.assemble({c: np.atleast_1d(b) if ospec == _all(names) else b
                         for c, b in out_blocks.items()}, ospec)

    def wrapped(b):
        out = body(b)
        return snp.reshape(out, (1,) + out.shape[1:]) if out.ndim == 0 else out

    f = spmd.shard_map(wrapped if out_spec is None else body, mesh=_mesh(key),
                       in_specs=(spec,), out_specs=ospec, check_vma=check_vma)
    got = np.asarray((spmd.jit(f) if jit else f)(x))
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype or dtype == np.bool_, (got.dtype, want.dtype)
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)
    return got


SPECS = ["rep", "all", "rev", "mixed"]
MODES = [pytest.param(False, id="eager"), pytest.param(True, id="jit")]


def _specs_for(key):
    return ["rep", "all"] if key == "8" else SPECS


def _grid(extra=((),)):
    return [(k, a, s, *e) for k, a in CASES for s in _specs_for(k) for e in extra]


# ------------------------------------------------------------ value tests

@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("key,axes,spec", _grid(), ids=_id)
@pytest.mark.parametrize("name", ["psum", "pmax", "pmin", "pmean"])
def test_reductions(name, key, axes, spec, jit):
    refs = {"psum": ref_psum, "pmax": ref_pmax, "pmin": ref_pmin,
            "pmean": lambda r, b, c, a: ref_psum(r, b, c, a) / np.float32(r._size(a))}
    ax = (axes,) if isinstance(axes, str) else axes
    run_case(key, lambda b: getattr(lax, name)(b, axes), lambda r, b, c: refs[name](r, b, c, ax),
             (2, 3), spec, jit=jit)


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
@pytest.mark.parametrize("name", ["psum", "pmax", "pmin"])
@pytest.mark.parametrize("key,axes", [("4x2", ("j", "i")), ("2x2x2", ("k", "i"))], ids=_id)
def test_reductions_dtypes(name, key, axes, dtype):
    refs = {"psum": ref_psum, "pmax": ref_pmax, "pmin": ref_pmin}
    got = run_case(key, lambda b: getattr(lax, name)(b, axes),
                   lambda r, b, c: refs[name](r, b, c, axes).astype(dtype), (3,), "all",
                   dtype=dtype, jit=True)
    assert got.dtype == dtype


def test_psum_bool_counts_as_int32():
    # JAX converts bool operands of psum to int32 (a count of the True values).
    run_case("4x2", lambda b: lax.psum(b, "i"),
             lambda r, b, c: ref_psum(r, {k: v.astype(np.int32) for k, v in b.items()}, c, ("i",)),
             (3,), dtype=np.bool_)


@pytest.mark.parametrize("name,op", [("pmax", np.logical_or), ("pmin", np.logical_and)])
def test_pmax_pmin_bool(name, op):
    def ref_body(r, b, c):
        return op.reduce(np.stack([b[d] for d in r.group(c, ("j",))]), axis=0)

    run_case("4x2", lambda b: getattr(lax, name)(b, "j"), ref_body, (4,), dtype=np.bool_)


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("key,axes,spec,axis,tiled",
                         _grid([(0, False), (1, False), (2, False), (0, True), (1, True),
                                (-1, True)]), ids=_id)
def test_all_gather(key, axes, spec, axis, tiled, jit):
    ax = (axes,) if isinstance(axes, str) else axes
    run_case(key, lambda b: lax.all_gather(b, axes, axis=axis, tiled=tiled),
             lambda r, b, c: ref_all_gather(r, b, c, ax, axis % (2 + (not tiled)), tiled),
             (2, 3), spec, jit=jit)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_all_gather_dtypes(dtype):
    run_case("4x2", lambda b: lax.all_gather(b, ("j", "i"), axis=1),
             lambda r, b, c: ref_all_gather(r, b, c, ("j", "i"), 1, False), (2, 3), dtype=dtype)


def _scatter_block(key, axes, dim, tiled):
    n = int(np.prod([MESHES[key][0][MESHES[key][1].index(a)] for a in
                     ((axes,) if isinstance(axes, str) else axes)]))
    block = [2, 3]
    block.insert(dim, n) if not tiled else block.insert(dim, 2 * n)
    return tuple(block)


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("key,axes,spec,dim,tiled",
                         _grid([(0, False), (1, False), (2, True), (0, True), (-1, False)]),
                         ids=_id)
def test_psum_scatter(key, axes, spec, dim, tiled, jit):
    ax = (axes,) if isinstance(axes, str) else axes
    block = _scatter_block(key, axes, dim % 3, tiled)
    run_case(key, lambda b: lax.psum_scatter(b, axes, scatter_dimension=dim, tiled=tiled),
             lambda r, b, c: ref_psum_scatter(r, b, c, ax, dim % 3, tiled), block, spec, jit=jit)


def test_psum_scatter_int32():
    block = _scatter_block("4x2", ("i", "j"), 1, True)
    run_case("4x2", lambda b: lax.psum_scatter(b, ("i", "j"), scatter_dimension=1, tiled=True),
             lambda r, b, c: ref_psum_scatter(r, b, c, ("i", "j"), 1, True), block,
             dtype=np.int32)


A2A = [(0, 0, False), (0, 1, False), (1, 0, False), (2, 0, False), (0, 2, False),
       (1, 2, False), (0, 0, True), (0, 1, True), (1, 0, True), (2, 1, True)]


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("key,axes,spec,split,concat,tiled", _grid(A2A), ids=_id)
def test_all_to_all(key, axes, spec, split, concat, tiled, jit):
    ax = (axes,) if isinstance(axes, str) else axes
    block = _scatter_block(key, axes, split, tiled)
    run_case(key, lambda b: lax.all_to_all(b, axes, split, concat, tiled=tiled),
             lambda r, b, c: ref_all_to_all(r, b, c, ax, split, concat, tiled), block, spec,
             jit=jit)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_all_to_all_dtypes(dtype):
    block = _scatter_block("2x2x2", ("k", "i"), 1, False)
    run_case("2x2x2", lambda b: lax.all_to_all(b, ("k", "i"), 1, 0),
             lambda r, b, c: ref_all_to_all(r, b, c, ("k", "i"), 1, 0, False), block,
             dtype=dtype)


def _perms(n):
    shift = tuple((s, (s + 1) % n) for s in range(n))
    partial = ((0, n - 1), (n - 1, 0)) if n > 1 else ((0, 0),)
    rev = tuple((s, n - 1 - s) for s in range(n))
    return {"shift": shift, "swap_ends": partial, "reverse": rev}


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("key,axes,spec,kind",
                         _grid([("shift",), ("swap_ends",), ("reverse",)]), ids=_id)
def test_ppermute(key, axes, spec, kind, jit):
    ax = (axes,) if isinstance(axes, str) else axes
    n = RefMesh(*MESHES[key])._size(ax)
    perm = _perms(n)[kind]
    run_case(key, lambda b: lax.ppermute(b, axes, perm),
             lambda r, b, c: ref_ppermute(r, b, c, ax, perm), (2, 3), spec, jit=jit)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_ppermute_dtypes_and_partial_perm(dtype):
    perm = ((0, 2), (2, 3))  # devices 0 and 1 receive nothing: zeros (False)
    run_case("4x2", lambda b: lax.ppermute(b, "i", perm),
             lambda r, b, c: ref_ppermute(r, b, c, ("i",), perm), (3,), dtype=dtype)


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("key,axes", CASES, ids=_id)
def test_axis_index(key, axes, jit):
    ax = (axes,) if isinstance(axes, str) else axes
    got = run_case(key, lambda b: lax.axis_index(axes) + snp.zeros((), snp.int32),
                   lambda r, b, c: np.int32(r.index(c, ax)), (1,), "all", jit=jit)
    assert got.dtype == np.int32


@pytest.mark.parametrize("name", ["psum", "all_gather", "ppermute", "all_to_all",
                                  "psum_scatter", "pmax"])
def test_check_vma_false(name):
    axes = ("j", "i")
    calls = {
        "psum": (lambda b: lax.psum(b, axes), lambda r, b, c: ref_psum(r, b, c, axes), (8,)),
        "pmax": (lambda b: lax.pmax(b, axes), lambda r, b, c: ref_pmax(r, b, c, axes), (8,)),
        "all_gather": (lambda b: lax.all_gather(b, axes, axis=1, tiled=True),
                       lambda r, b, c: ref_all_gather(r, b, c, axes, 1, True), (2, 2)),
        "ppermute": (lambda b: lax.ppermute(b, axes, _perms(8)["shift"]),
                     lambda r, b, c: ref_ppermute(r, b, c, axes, _perms(8)["shift"]), (3,)),
        "all_to_all": (lambda b: lax.all_to_all(b, axes, 0, 1),
                       lambda r, b, c: ref_all_to_all(r, b, c, axes, 0, 1, False), (8, 2)),
        "psum_scatter": (lambda b: lax.psum_scatter(b, axes, scatter_dimension=0, tiled=True),
                         lambda r, b, c: ref_psum_scatter(r, b, c, axes, 0, True), (16,)),
    }
    body, ref_body, block = calls[name]
    for spec in ("rep", "rev"):
        for jit in (False, True):
            run_case("4x2", body, ref_body, block, spec, jit=jit, check_vma=False)


def test_replicated_out_specs_after_psum():
    # After psum over every axis the blocks agree: out_specs=P() gives one copy.
    run_case("2x2x2", lambda b: lax.psum(b, ("i", "j", "k")),
             lambda r, b, c: ref_psum(r, b, c, ("i", "j", "k")), (3, 2), "mixed", out_spec=P())
    run_case("4x2", lambda b: lax.pmean(b, "j"),
             lambda r, b, c: ref_psum(r, b, c, ("j",)) / np.float32(2), (4,), "all",
             out_spec=P("i"), jit=True)


def test_pytree_operands():
    mesh = _mesh("4x2")
    x = np.arange(16.0, dtype=np.float32).reshape(8, 2)

    @spmd.jit
    def f(x):
        def body(b):
            out = lax.psum({"a": b, "b": (b * 2, b.sum(axis=0))}, "i")
            return out["a"], out["b"][0], out["b"][1]
        return spmd.shard_map(body, mesh=mesh, in_specs=P("i", "j"),
                              out_specs=(P(None, "j"), P(None, "j"), P("j")))(x)

    a, b, s = f(x)
    np.testing.assert_allclose(np.asarray(a), x.reshape(4, 2, 2).sum(0))
    np.testing.assert_allclose(np.asarray(b), 2 * x.reshape(4, 2, 2).sum(0))
    np.testing.assert_allclose(np.asarray(s), x.reshape(4, 2, 2).sum((0, 1)))


# ------------------------------------------------------------ typing

def _program(f, *args):
    return str(spmd.make_jaxpr(f)(*args))


def test_printed_vma_annotations():
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda b: lax.psum(b * 2.0, "i"), mesh=mesh, in_specs=P("i", "j"),
                       out_specs=P(None, "j"))
    text = _program(f, np.zeros((8, 4), np.float32))
    assert "f32[2,2]{i,j}" in text
    assert "psum[axes=('i',)]" in text
    assert "f32[2,2]{j} = psum" in text


def test_implicit_pvary_when_invariant_meets_varying():
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda a, b: a + b, mesh=mesh, in_specs=(P(), P("i")),
                       out_specs=P("i"))
    x, y = np.ones(3, np.float32), np.arange(12, dtype=np.float32)
    text = _program(f, x, y)
    assert "pvary[axes=('i',)]" in text, text
    np.testing.assert_allclose(np.asarray(f(x, y)), y + 1)


def test_psum_of_invariant_is_multiplication():
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda a: lax.psum(a, ("i", "j")), mesh=mesh, in_specs=P(),
                       out_specs=P())
    x = np.arange(3, dtype=np.float32)
    text = _program(f, x)
    assert "psum" not in text and "mul" in text, text
    np.testing.assert_allclose(np.asarray(f(x)), 8 * x)
    np.testing.assert_allclose(np.asarray(spmd.jit(f)(x)), 8 * x)


def test_psum_partly_invariant():
    # Varying along i, invariant along j: one psum over i, the j part a multiplication.
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda a: lax.psum(a, ("i", "j")), mesh=mesh, in_specs=P("i"),
                       out_specs=P())
    x = np.arange(8, dtype=np.float32)
    text = _program(f, x)
    assert "psum[axes=('i',)]" in text and "mul" in text, text
    np.testing.assert_allclose(np.asarray(f(x)), 2 * x.reshape(4, 2).sum(0))


def test_pmax_of_invariant_is_identity():
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda a: lax.pmax(a, "i"), mesh=mesh, in_specs=P(), out_specs=P())
    x = np.arange(3, dtype=np.float32)
    assert "pmax" not in _program(f, x)
    np.testing.assert_allclose(np.asarray(f(x)), x)


def test_collective_output_types():
    mesh = _mesh("2x2x2")
    x = np.zeros((8, 8), np.float32)

    def body(b):  # b: f32[2,8]{i,j}
        g = lax.all_gather(b, "k", axis=0, tiled=True)
        s = lax.psum_scatter(b, "k", scatter_dimension=1, tiled=True)
        t = lax.all_to_all(b, "k", 1, 0, tiled=True)
        p = lax.ppermute(b, "k", ((0, 1), (1, 0)))
        i = lax.axis_index(("i", "k"))
        return g, s, t, p, snp.reshape(i, (1,))

    f = spmd.shard_map(body, mesh=mesh, in_specs=P(("i", "j")), out_specs=P(("i", "j", "k")))
    text = _program(f, x)
    for piece in ["f32[2,8]{i,j}", "f32[4,8]{i,j,k} = all_gather", "f32[2,4]{i,j,k} = psum_scatter",
                  "f32[4,4]{i,j,k} = all_to_all", "f32[2,8]{i,j,k} = ppermute",
                  "i32[]{i,k} = axis_index"]:
        assert piece in text, (piece, text)


def test_untyped_body_has_no_vma():
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                       out_specs=P(), check_vma=False)
    text = _program(f, np.zeros(8, np.float32))
    assert "{" not in text.split("program=")[1].split("mesh=")[0].replace("{ lambda", ""), text


# ------------------------------------------------------------ errors

def test_collective_outside_shard_map():
    x = snp.ones(3)
    for call in (lambda: lax.psum(x, "i"), lambda: lax.all_gather(x, "i"),
                 lambda: lax.axis_index("i"), lambda: lax.ppermute(x, "i", [(0, 1)])):
        with pytest.raises(CollectiveAxisError, match="not in scope"):
            call()
    with pytest.raises(CollectiveAxisError):
        spmd.jit(lambda v: lax.psum(v, "i"))(x)


def test_collective_over_axis_not_in_scope():
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda b: lax.psum(b, "k"), mesh=mesh, in_specs=P("i"), out_specs=P())
    with pytest.raises(CollectiveAxisError, match=r"'k' is not in scope.*axes in scope"):
        f(np.zeros(8, np.float32))


@pytest.mark.parametrize("perm,why", [([(0, 1), (1, 1)], "appears twice"),
                                      ([(0, 4)], "outside 0..3"),
                                      ([(0, 1), (0, 2)], "appears twice"),
                                      ([(-1, 0)], "outside"),
                                      ([0, 1], "pairs")])
def test_ppermute_not_a_permutation(perm, why):
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda b: lax.ppermute(b, "i", perm), mesh=mesh, in_specs=P("i"),
                       out_specs=P("i"))
    with pytest.raises(ArgumentError, match=why):
        f(np.zeros(8, np.float32))


@pytest.mark.parametrize("tiled,size", [(False, 3), (True, 6), (False, 8)])
def test_psum_scatter_bad_dimension(tiled, size):
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda b: lax.psum_scatter(b, "i", scatter_dimension=1, tiled=tiled),
                       mesh=mesh, in_specs=P(), out_specs=P())
    with pytest.raises(ShapeError, match=rf"dimension 1.*size {size}.*axes \('i',\)"):
        f(np.zeros((2, size), np.float32))


@pytest.mark.parametrize("tiled,size", [(False, 3), (True, 6)])
def test_all_to_all_bad_split(tiled, size):
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda b: lax.all_to_all(b, "i", 1, 0, tiled=tiled), mesh=mesh,
                       in_specs=P(), out_specs=P())
    with pytest.raises(ShapeError, match=rf"split_axis 1.*size {size}"):
        f(np.zeros((2, size), np.float32))


def test_all_gather_bad_axis():
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda b: lax.all_gather(b, "i", axis=3), mesh=mesh, in_specs=P(),
                       out_specs=P())
    with pytest.raises(ArgumentError, match="axis=3"):
        f(np.zeros((2, 2), np.float32))


def test_repeated_axis_in_collective():
    mesh = _mesh("4x2")
    f = spmd.shard_map(lambda b: lax.psum(b, ("i", "i")), mesh=mesh, in_specs=P(),
                       out_specs=P())
    with pytest.raises(ArgumentError, match="repeats"):
        f(np.zeros(2, np.float32))


# ------------------------------------------------------------ vmap with axis names

def _vmap_case(body, ref_body, x, sizes, names, jit=False):
    """vmap ``body`` over the leading len(sizes) axes of ``x`` (outermost first), named."""
    ref = RefMesh(sizes, names)
    blocks = {c: x[c] for c in ref.coords()}
    want = np.stack([np.asarray(ref_body(ref, blocks, c)) for c in ref.coords()])
    want = want.reshape(tuple(sizes) + want.shape[1:])
    f = body
    for name in reversed(names):
        f = spmd.vmap(f, axis_name=name)
    got = np.asarray((spmd.jit(f) if jit else f)(x))
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


VMAP_OPS = {
    "psum": (lambda ax: lambda v: lax.psum(v, ax), lambda ax: lambda r, b, c: ref_psum(r, b, c, ax)),
    "pmax": (lambda ax: lambda v: lax.pmax(v, ax), lambda ax: lambda r, b, c: ref_pmax(r, b, c, ax)),
    "pmin": (lambda ax: lambda v: lax.pmin(v, ax), lambda ax: lambda r, b, c: ref_pmin(r, b, c, ax)),
    "pmean": (lambda ax: lambda v: lax.pmean(v, ax),
              lambda ax: lambda r, b, c: ref_psum(r, b, c, ax) / r._size(ax)),
    "all_gather": (lambda ax: lambda v: lax.all_gather(v, ax, axis=1),
                   lambda ax: lambda r, b, c: ref_all_gather(r, b, c, ax, 1, False)),
    "all_gather_tiled": (lambda ax: lambda v: lax.all_gather(v, ax, axis=0, tiled=True),
                         lambda ax: lambda r, b, c: ref_all_gather(r, b, c, ax, 0, True)),
    "psum_scatter": (lambda ax: lambda v: lax.psum_scatter(v, ax, scatter_dimension=0, tiled=True),
                     lambda ax: lambda r, b, c: ref_psum_scatter(r, b, c, ax, 0, True)),
    "all_to_all": (lambda ax: lambda v: lax.all_to_all(v, ax, 0, 1, tiled=True),
                   lambda ax: lambda r, b, c: ref_all_to_all(r, b, c, ax, 0, 1, True)),
    "ppermute": (lambda ax: lambda v: lax.ppermute(v, ax, ((0, 1), (1, 2), (2, 3), (3, 0))),
                 lambda ax: lambda r, b, c: ref_ppermute(r, b, c, ax,
                                                         ((0, 1), (1, 2), (2, 3), (3, 0)))),
    "axis_index": (lambda ax: lambda v: v[0, 0] * 0 + lax.axis_index(ax).astype(snp.float32),
                   lambda ax: lambda r, b, c: np.float32(r.index(c, ax))),
}


@pytest.mark.parametrize("jit", MODES)
@pytest.mark.parametrize("name", list(VMAP_OPS))
def test_vmap_axis_name(name, jit):
    x = _data((4, 4, 3), np.float32)
    body, ref_body = VMAP_OPS[name]
    _vmap_case(body("b"), ref_body(("b",)), x, (4,), ("b",), jit=jit)


@pytest.mark.parametrize("axes", [("a", "b"), ("b", "a")], ids=_id)
@pytest.mark.parametrize("name", ["psum", "pmax", "pmin", "pmean", "axis_index"])
def test_nested_vmap_two_axis_names(name, axes):
    x = _data((2, 2, 4, 3), np.float32)
    body, ref_body = VMAP_OPS[name]
    _vmap_case(body(axes), ref_body(axes), x, (2, 2), ("a", "b"))


@pytest.mark.parametrize("axis", ["a", "b"])
@pytest.mark.parametrize("name", ["all_gather", "psum_scatter", "all_to_all", "psum"])
def test_nested_vmap_one_axis(name, axis):
    x = _data((2, 2, 4, 3), np.float32)
    body, ref_body = VMAP_OPS[name]
    if name in ("psum_scatter", "all_to_all"):  # a two-member group: chunk dim 0 in 2
        body = {"psum_scatter": lambda ax: lambda v: lax.psum_scatter(
                    v, ax, scatter_dimension=0, tiled=True),
                "all_to_all": lambda ax: lambda v: lax.all_to_all(v, ax, 0, 1, tiled=True)}[name]
    _vmap_case(body(axis), ref_body((axis,)), x, (2, 2), ("a", "b"), jit=True)


@pytest.mark.parametrize("name", ["all_gather", "ppermute", "all_to_all"])
def test_nested_vmap_tuple_axes_non_reduction(name):
    # JAX supports these over several vmap axes; here each is checked or must raise cleanly.
    x = _data((2, 2, 4, 3), np.float32)
    body, ref_body = VMAP_OPS[name]
    try:
        _vmap_case(body(("a", "b")), ref_body(("a", "b")), x, (2, 2), ("a", "b"))
    except NotImplementedError as e:
        assert "not supported" in str(e)


def test_vmap_in_shard_map_body_mixed_axes():
    # psum over a mesh axis and a vmap axis at once; axis_index over both.
    mesh = _mesh("4x2")
    x = _data((8, 3, 2), np.float32)

    def body(b):  # b: (2, 3, 2) block along i; vmap over its dim 1 as 'v'
        def inner(r):  # r: (2, 2)
            s = lax.psum(r, ("i", "v"))
            k = lax.axis_index(("i", "v")).astype(snp.float32)
            return s, k + 0 * r[0, 0]
        return spmd.vmap(inner, in_axes=1, out_axes=1, axis_name="v")(b)

    f = spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=(P(), P("i")))
    s, k = f(x)
    np.testing.assert_allclose(np.asarray(s), np.broadcast_to(
        x.reshape(4, 2, 3, 2).sum((0, 2))[:, None, :], (2, 3, 2)), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(k).reshape(4, 3),
                                  np.arange(12).reshape(4, 3))


def test_vmap_collective_unknown_axis():
    with pytest.raises(CollectiveAxisError, match="'c' is not in scope.*'b'"):
        spmd.vmap(lambda v: lax.psum(v, "c"), axis_name="b")(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("name", ["psum", "ppermute", "axis_index"])
def test_vmap_of_jit_with_collectives(name):
    x = _data((4, 4, 3), np.float32)
    body, ref_body = VMAP_OPS[name]
    _vmap_case(spmd.jit(body("b")), ref_body(("b",)), x, (4,), ("b",))


def test_which_collectives_communicate():
    # A process may skip a branch holding pvary or axis_index (local), never one holding
    # a collective that moves data (its partners would wait for it): rules["communicates"].
    import spmd
    import spmd.collectives.mpi  # noqa: F401
    import spmd.collectives.nccl  # noqa: F401
    from spmd import P
    from spmd.compiler.transforms.batching import communicates
    from spmd.compiler.core.primitives import PRIMITIVES

    moving = {p.name for p in PRIMITIVES.values() if p.rules.communicates}
    assert moving == {"psum", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all",
                      "ppermute", "mpi", "nccl"}
    mesh = spmd.make_mesh((2,), ("i",), devices=spmd.devices()[:2])

    def body_of(f):
        closed = spmd.make_jaxpr(spmd.shard_map(f, mesh=mesh, in_specs=P("i"),
                                                out_specs=P("i")))(np.ones(2, np.float32))
        return next(e for e in closed.eqns if e.primitive.name == "shard_map").params

    local = body_of(lambda x: x + spmd.lax.axis_index("i").astype(np.float32))
    assert not communicates(local)
    assert communicates(body_of(lambda x: spmd.lax.psum(x, "i") * x))

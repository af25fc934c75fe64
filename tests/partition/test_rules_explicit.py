"""A primitive's sharding rule is written once: its partition decision
(spmd/shard/partition/registry.py) declares both how the partitioner propagates its
placements and its explicit-mode types (spmd.shard.explicit.rules derives them).

Checked here: every primitive has exactly one explicit declaration; and, by brute
force over random small meshes, shapes and operand types, the two agree: where
propagation keeps the operands as they are placed, the explicit type of the result is
the placement propagation gives it (a pending sum aside: a type is whole there)."""

from __future__ import annotations

import importlib
import itertools
import pkgutil

import numpy as np
import pytest

import spmd
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.primitives import PRIMITIVES
from spmd.compiler.core.trace import abstract_eval
from spmd.errors import ShardingTypeError
from spmd.mesh.mesh import AbstractMesh
from spmd.shard.explicit import rules as er
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import DECISIONS, Propagate, Replicate, Structural


def _import_every_module():
    for m in pkgutil.walk_packages(spmd.__path__, "spmd."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)


def test_every_primitive_has_exactly_one_explicit_declaration():
    """Its partition decision's (an ``explicit`` extension, or derived from the decision),
    or, where the decision cannot say it, one declared by ``register``: never both."""
    _import_every_module()
    twice = sorted(p.name for p in er.RULES if er.declares(DECISIONS.get(p)))
    assert twice == [], f"declared by the partition decision and by register: {twice}"
    for p in er.RULES:
        d = DECISIONS.get(p)
        assert d is None or isinstance(d, (Replicate, Structural)), p.name
    missing = sorted(p.name for p in PRIMITIVES.values() if er.rule_for(p) is None)
    assert missing == []


def test_register_refuses_a_second_declaration():
    from spmd.compiler.ops.elementwise import add_p
    from spmd.compiler.ops.structural import transpose_p

    for p in (add_p, transpose_p):  # an extension; a rule derived from propagation
        with pytest.raises(ValueError, match="partition decision already declares"):
            er.register(p, er.untyped)
        assert p not in er.RULES


# ------------------------------------------------------------------ brute force

MESHES = [((2,), ("i",)), ((2, 2), ("i", "j")), ((4, 2), ("i", "j")), ((2, 3), ("i", "j")),
          ((2, 2, 2), ("i", "j", "k"))]
SIZES = [1, 2, 3, 4, 6, 8, 12]


def _placement(rng, shape, mesh) -> Placement:
    """Random axes (in random order) on random dimensions that they divide."""
    dims = [[] for _ in shape]
    for a in rng.permutation(mesh.axis_names):
        c = int(rng.integers(0, len(shape) + 1))
        if c < len(shape) and shape[c] % mesh.axis_size(tuple(dims[c]) + (str(a),)) == 0:
            dims[c].append(str(a))
    return Placement(tuple(tuple(d) for d in dims))


def _shape(rng, nd):
    return tuple(int(rng.choice(SIZES)) for _ in range(nd))


def _f32(*shapes):
    return [ShapedArray(s, np.float32) for s in shapes]


def _elementwise(name):
    def case(rng):
        s = _shape(rng, int(rng.integers(0, 4)))
        return name, _f32(s, s), {}
    return case


def _select(rng):
    s = _shape(rng, int(rng.integers(1, 4)))
    return "select_n", [ShapedArray(s, np.bool_)] + _f32(s, s), {}


def _reduction(name):
    def case(rng):
        s = _shape(rng, int(rng.integers(1, 4)))
        axes = tuple(d for d in range(len(s)) if rng.integers(2))
        params = {"axes": axes}
        if name.startswith("arg"):
            params = {"axes": axes[:1] or (0,), "index_dtype": np.dtype(np.int32)}
        return name, _f32(s), params
    return case


def _transpose(rng):
    s = _shape(rng, int(rng.integers(1, 4)))
    return "transpose", _f32(s), {"permutation": tuple(int(d) for d in rng.permutation(len(s)))}


def _broadcast_in_dim(rng):
    s = _shape(rng, int(rng.integers(1, 3)))
    out = list(_shape(rng, len(s) + int(rng.integers(0, 2))))
    bd = tuple(sorted(int(d) for d in rng.choice(len(out), len(s), replace=False)))
    for k, d in enumerate(bd):
        out[d] = s[k] if rng.integers(3) else out[d]
    operand = tuple(s[k] if out[d] == s[k] else 1 for k, d in enumerate(bd))
    return "broadcast_in_dim", _f32(operand), {"shape": tuple(out), "broadcast_dimensions": bd}


def _squeeze(rng):
    s = tuple(1 if rng.integers(3) == 0 else n for n in _shape(rng, int(rng.integers(1, 4))))
    return "squeeze", _f32(s), {"dimensions": tuple(d for d, n in enumerate(s) if n == 1)}


def _dot_general(rng):
    b, m, k, n = (int(rng.choice(SIZES)) for _ in range(4))
    if rng.integers(2):
        return "dot_general", _f32((b, m, k), (b, k, n)), \
            {"dimension_numbers": (((2,), (1,)), ((0,), (0,)))}
    return "dot_general", _f32((m, k), (n, k)), {"dimension_numbers": (((1,), (1,)), ((), ()))}


def _reshape(rng):
    a, b, c = (int(rng.choice([1, 2, 3, 4])) for _ in range(3))
    shape, new = [((a * b, c), (a, b, c)), ((a, b, c), (a * b, c)), ((a, b * c), (a * b, c)),
                  ((a, b, c), (a, b * c)), ((a * b * c,), (a, b, c))][int(rng.integers(5))]
    return "reshape", _f32(shape), {"new_sizes": new}


def _slice(rng):
    s = _shape(rng, int(rng.integers(1, 3)))
    start = tuple(int(rng.integers(0, n)) if rng.integers(2) else 0 for n in s)
    limit = tuple(n if rng.integers(2) else int(rng.integers(st + 1, n + 1))
                  for st, n in zip(start, s))
    return "slice", _f32(s), {"start_indices": start, "limit_indices": limit, "strides": None}


def _cumsum(rng):
    s = _shape(rng, int(rng.integers(1, 3)))
    return "cumsum", _f32(s), {"axis": int(rng.integers(len(s))), "reverse": False}


def _concatenate(rng):
    s = _shape(rng, 2)
    d = int(rng.integers(2))
    t = tuple(int(rng.choice(SIZES)) if k == d else n for k, n in enumerate(s))
    return "concatenate", _f32(s, t), {"dimension": d}


def _gather(rng):
    s, b = _shape(rng, 2), _shape(rng, int(rng.integers(1, 3)))
    axis = int(rng.integers(2))
    return "gather", _f32(s) + [ShapedArray(b, np.int32)], \
        {"axes": (axis,), "mode": "clip", "fill_value": None}


CASES = {
    "elementwise": [_elementwise("add"), _elementwise("mul"), _elementwise("max"),
                    _elementwise("tanh"), _select],
    "reduction": [_reduction(n) for n in ("reduce_sum", "reduce_max", "reduce_prod",
                                          "argmax")],
    "layout": [_transpose, _broadcast_in_dim, _squeeze],
    "dot_general": [_dot_general],
    "reshape": [_reshape],
    "slicing": [_slice, _cumsum, _concatenate],
    "gather": [_gather],
}


def _types(rng, avals, mesh):
    return [_placement(rng, a.shape, mesh) for a in avals]


@pytest.mark.parametrize("family", sorted(CASES))
def test_explicit_types_agree_with_propagation(family):
    rng = np.random.default_rng(sum(map(ord, family)))
    meshes = [AbstractMesh(*m) for m in MESHES]
    compared = 0
    for (case, mesh), _ in itertools.product(
            itertools.product(CASES[family], meshes), range(60)):
        name, avals, params = case(rng)
        prim = PRIMITIVES[name]
        if name == "tanh":
            avals = avals[:1]
        types = _types(rng, avals, mesh)
        avals_out = abstract_eval(prim, avals, params)
        try:
            explicit = er.out_types(prim, avals, types, params, mesh, avals_out=avals_out)
        except ShardingTypeError:
            continue  # explicit mode refuses it (propagation would move an operand)
        d = DECISIONS[prim]
        assert isinstance(d, Propagate), name
        wanted, outs = d.rule(types, avals, avals_out, mesh, **params)[:2]
        if [w.dims for w in wanted] != [t.dims for t in types]:
            continue  # propagation moves an operand: no type to compare with
        compared += 1
        assert explicit == [Placement(o.dims) for o in outs], \
            (name, [a.shape for a in avals], params, types, mesh.shape)
    assert compared > 20

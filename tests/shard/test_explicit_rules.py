"""The explicit-sharding rules (spmd.shard.explicit.rules): every primitive has one; the
rules give JAX's types; and, checked by brute force over operand specs, every program
they accept runs to numpy's values with its results placed as their types say."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.primitives import PRIMITIVES
from spmd.errors import MissingExplicitRuleError, ShardingTypeError
from spmd.shard.explicit import rules as er
from spmd.shard.partition.placement import Placement
from spmd.sharding import AxisType, NamedSharding, P

import spmd.debug  # noqa: F401  (its primitive is declared there)
import spmd.lax  # noqa: F401
import spmd.random  # noqa: F401


@pytest.fixture(scope="module")
def mesh():
    return spmd.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)


def test_every_primitive_has_a_rule():
    missing = sorted(p.name for p in PRIMITIVES.values() if er.rule_for(p) is None)
    assert missing == []


def test_a_primitive_without_a_rule_is_named():
    from spmd.compiler.core.primitives import Primitive

    lonely = Primitive("lonely_for_test", traits=())
    lonely.def_abstract_eval(lambda x: x)
    try:
        with pytest.raises(MissingExplicitRuleError, match=r"primitive 'lonely_for_test' has no "
                                                           r"explicit-sharding rule"):
            er.out_types(lonely, [ShapedArray((4,), np.float32)], [Placement((("x",),))], {},
                         None)
    finally:
        del PRIMITIVES["lonely_for_test"]


def _t(*dims):
    return Placement(tuple(() if d is None else (d,) if isinstance(d, str) else tuple(d)
                           for d in dims))


def _out(prim_name, shapes, types, mesh, **params):
    prim = PRIMITIVES[prim_name]
    avals = [ShapedArray(s, np.float32) for s in shapes]
    return er.out_types(prim, avals, types, params, mesh)


def test_rules_give_jaxs_types(mesh):
    # Elementwise: the splits the operands agree on; an unsplit operand has no say.
    assert _out("add", [(8, 4), (8, 4)], [_t("x", None), _t(None, "y")], mesh) == \
        [_t("x", "y")]
    assert _out("mul", [(8, 4), ()], [_t("x", "y"), _t()], mesh) == [_t("x", "y")]
    # Reductions drop the reduced dimensions' axes.
    assert _out("reduce_sum", [(8, 4)], [_t("x", "y")], mesh, axes=(0,)) == [_t("y")]
    assert _out("argmax", [(8, 4)], [_t("x", "y")], mesh, axes=(1,),
                index_dtype=np.dtype(np.int32)) == [_t("x")]
    # dot_general: batch, lhs free, rhs free; a one-sided contraction split is fine.
    dn = (((1,), (0,)), ((), ()))
    assert _out("dot_general", [(8, 4), (4, 6)], [_t("x", "y"), _t(None, None)], mesh,
                dimension_numbers=dn) == [_t("x", None)]
    dnb = (((2,), (1,)), ((0,), (0,)))
    assert _out("dot_general", [(2, 8, 4), (2, 4, 6)], [_t("y", "x", None), _t(None, None, None)],
                mesh, dimension_numbers=dnb) == [_t("y", "x", None)]
    with pytest.raises(ShardingTypeError, match="lhs batch dimensions and rhs batch dimensions"):
        _out("dot_general", [(2, 8, 4), (2, 4, 6)], [_t("y", None, None), _t("x", None, None)],
             mesh, dimension_numbers=dnb)
    # Transpose and broadcast follow their dimensions.
    assert _out("transpose", [(8, 4)], [_t("x", "y")], mesh, permutation=(1, 0)) == \
        [_t("y", "x")]
    assert _out("broadcast_in_dim", [(8, 1)], [_t("x", None)], mesh, shape=(3, 8, 5),
                broadcast_dimensions=(1, 2)) == [_t(None, "x", None)]
    # Slicing: the operand's type while the axes divide the new size.
    assert _out("slice", [(8, 4)], [_t("x", None)], mesh, start_indices=(0, 1),
                limit_indices=(4, 3), strides=None) == [_t("x", None)]
    with pytest.raises(ShardingTypeError, match=r"slicing|on dimension 0, split over \('x',\), "
                                                r"to size 2"):
        _out("slice", [(8, 4)], [_t("x", None)], mesh, start_indices=(0, 0),
             limit_indices=(2, 4), strides=None)


@pytest.mark.parametrize("shape,new,typ,want", [
    ((16, 4), (4, 4, 4), ("x", None), ("x", None, None)),  # split: the major part keeps x
    ((8, 4), (4, 2, 4), ("x", None), ("x", None, None)),
    ((8, 4), (32,), ("x", None), ("x",)),                   # merge: the major dim is split
    ((8, 4), (8, 1, 4), ("x", "y"), ("x", None, "y")),      # a size-1 dimension added
    ((8, 4, 1), (8, 4), ("x", "y", None), ("x", "y")),
    ((16,), (8, 2), (("x", "y"),), (("x", "y"), None)),    # both axes in the major dim
    ((16,), (4, 4), (("x", "y"),), ("x", "y")),             # two axes spread over two dims
])
def test_reshape_keeps_a_split_that_moves_nothing(mesh, shape, new, typ, want):
    assert _out("reshape", [shape], [_t(*typ)], mesh, new_sizes=new) == [_t(*want)]


@pytest.mark.parametrize("shape,new,typ", [
    ((8, 4), (32,), ("x", "y")),       # a minor dimension of the merge is split
    ((8, 4), (32,), (None, "y")),
    ((8, 4), (2, 4, 4), ("x", None)),  # x's 4 blocks of 2 rows are not blocks of (2, 4, 4)
])
def test_reshape_refuses_a_split_that_moves_data(mesh, shape, new, typ):
    with pytest.raises(ShardingTypeError, match=r"reshape of .* reshard the operand first"):
        _out("reshape", [shape], [_t(*typ)], mesh, new_sizes=new)


# ----------------------------------------------------------------- brute force

SPECS_2D = [P(), P("x"), P("y"), P(None, "x"), P(None, "y"), P("x", "y"), P("y", "x"),
            P(("x", "y")), P(None, ("x", "y"))]

OPS = {
    "add": (lambda a, b: a + b, 2),
    "mul_broadcast_row": (lambda a, b: a * b[:1], 2),
    "select": (lambda a, b: snp.where(a > 0, a, b), 2),
    "matmul_t": (lambda a, b: a @ b.T, 2),
    "sum0": (lambda a, b: a.sum(axis=0), 1),
    "max1": (lambda a, b: a.max(axis=1), 1),
    "transpose": (lambda a, b: a.T * 2, 1),
    "reshape_split": (lambda a, b: a.reshape(4, 2, 8), 1),
    "reshape_merge": (lambda a, b: a.reshape(64), 1),
    "concat": (lambda a, b: snp.concatenate([a, b], axis=1), 2),
    "slice": (lambda a, b: a[:4, 2:6], 1),
    "cumsum": (lambda a, b: snp.cumsum(a, axis=1), 1),
}


def _numpy(name, a, b):
    return {"add": lambda: a + b, "mul_broadcast_row": lambda: a * b[:1],
            "select": lambda: np.where(a > 0, a, b), "matmul_t": lambda: a @ b.T,
            "sum0": lambda: a.sum(0), "max1": lambda: a.max(1), "transpose": lambda: a.T * 2,
            "reshape_split": lambda: a.reshape(4, 2, 8), "reshape_merge": lambda: a.reshape(64),
            "concat": lambda: np.concatenate([a, b], 1), "slice": lambda: a[:4, 2:6],
            "cumsum": lambda: np.cumsum(a, 1)}[name]()


def accepted_programs(mesh, name):
    """For each pair of operand specs of ``OPS[name]`` on ``mesh``: the program refused
    with a ShardingTypeError (eagerly too), or yield ``(specs, jitted result, the type
    read inside the trace, operands, numpy's values)`` after checking the values."""
    fn, arity = OPS[name]
    rng = np.random.default_rng(0)
    an = rng.normal(size=(8, 8)).astype(np.float32)
    bn = rng.normal(size=(8, 8)).astype(np.float32)
    want = _numpy(name, an.astype(np.float64), bn.astype(np.float64))
    for sa, sb in itertools.product(SPECS_2D, SPECS_2D if arity == 2 else [P()]):
        a = spmd.device_put(an, NamedSharding(mesh, sa))
        b = spmd.device_put(bn, NamedSharding(mesh, sb))
        typed = []

        def traced(a, b):
            out = fn(a, b)
            typed.append(spmd.typeof(out).sharding)
            return out

        try:
            with warnings.catch_warnings():
                # A partitioner fallback (whole values) would hide a type it cannot honour.
                warnings.simplefilter("error")
                out = spmd.jit(traced)(a, b)
        except ShardingTypeError:
            with pytest.raises(ShardingTypeError):
                fn(a, b)  # eagerly refused as well
            continue
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=2e-5,
                                   err_msg=f"{name} {sa} {sb}")
        yield (sa, sb), out, typed[0], (a, b), want


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_accepted_program_runs_as_its_types_say(mesh, name):
    """Every program the rules accept runs to numpy's values with its result placed as
    its type, jitted and eagerly alike."""
    accepted = 0
    for specs, out, typed, args, want in accepted_programs(mesh, name):
        accepted += 1
        assert out.sharding == typed, (name, specs)
        eager = OPS[name][0](*args)
        assert eager.sharding == typed, (name, specs)
        np.testing.assert_allclose(np.asarray(eager), want, rtol=2e-5, atol=2e-5)
    assert accepted > 0

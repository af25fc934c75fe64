"""The recipes of docs/architecture.md, followed step by step with toy examples.

Each test adds what a recipe adds (with the same calls, in the same order), checks
that the registries accept it, and that it works through every layer that should
reach it.  The toys are removed from the registries afterwards, so the other tests
see only the real primitives.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax
from spmd.compiler.core.primitives import PRIMITIVES
from spmd.shard.partition import registry


@pytest.fixture
def cleanup():
    """Forget the primitives a test defines (names listed by the test)."""
    names: list = []
    yield names
    for n in names:
        p = PRIMITIVES.pop(n, None)
        registry.DECISIONS.pop(p, None)


def _missing_rules(prim) -> list:
    """What tests/compiler/test_registry.py and tests/partition/test_registry.py ask."""
    need = ["impl", "abstract_eval", "jvp", "batch"] + (["transpose"] if prim.linear else [])
    out = [r for r in need if not callable(getattr(prim, r))]
    return out + (["partition decision"] if registry.missing([prim]) else [])


# ------------------------------------------------------------ add a primitive

def _define_softsign():
    """Steps 1-3 of "Add a primitive": softsign(x) = x / (1 + |x|)."""
    from spmd.compiler.core.avals import ShapedArray
    from spmd.compiler.transforms.ad_util import Zero
    from spmd.compiler.ops.elementwise import add, div, mul, abs as lax_abs
    from spmd.compiler.core.primitives import Primitive
    from spmd.compiler.core.trace import bind

    # 1. The primitive and its rules, beside each other.
    softsign_p = Primitive("toy_softsign", traits=())
    softsign_p.def_impl(lambda xp, x: x / (1 + xp.abs(x)))
    softsign_p.def_emit(lambda ins: f"({ins[0]} / (1 + xp.abs({ins[0]})))")

    @softsign_p.def_abstract_eval
    def _aval(x):
        return ShapedArray(x.shape, x.dtype, x.weak_type)

    @softsign_p.def_jvp
    def _jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        y = bind(softsign_p, x)
        if isinstance(t, Zero):
            return y, Zero(t.aval)
        one = np.ones((), np.dtype(x.dtype))
        d = add(one, lax_abs(x))
        return y, div(t, mul(d, d))

    @softsign_p.def_batch
    def _batch(args, dims):
        return bind(softsign_p, args[0]), dims[0]

    # 2. The binder (exported from spmd.lax / spmd.numpy where it belongs).
    def softsign(x):
        return bind(softsign_p, x)

    # 3. The partition decision, in the table of its family
    #    (spmd/shard/partition/rules.py: TABLE).
    from spmd.shard.partition.registry import Propagate, register
    from spmd.shard.partition.rules import elementwise_rule

    register(softsign_p, Propagate(elementwise_rule("none"), specs_flow_back=True))
    return softsign_p, softsign


def test_recipe_add_a_primitive(cleanup):
    cleanup.append("toy_softsign")
    prim, softsign = _define_softsign()
    # 4. The registry tests accept it.
    assert _missing_rules(prim) == []

    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(8, 2)
    want = x / (1 + np.abs(x))
    np.testing.assert_allclose(np.asarray(softsign(x)), want, rtol=1e-6)       # eager
    np.testing.assert_allclose(np.asarray(spmd.jit(softsign)(x)), want, rtol=1e-6)
    spmd.test_util.check_grads(lambda v: snp.sum(softsign(v)), (x.astype(np.float64),))
    np.testing.assert_allclose(np.asarray(spmd.vmap(softsign)(x)), want, rtol=1e-6)
    # The partitioner keeps the split (an elementwise rule): no collective.
    mesh = spmd.make_mesh((4,), ("i",), devices=spmd.devices()[:4])
    f = spmd.jit(softsign, in_shardings=NamedSharding(mesh, P("i")),
                 out_shardings=NamedSharding(mesh, P("i")))
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-6)
    assert f.lower(x).collectives() == []
    # And inside a shard_map body.
    g = spmd.shard_map(softsign, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    np.testing.assert_allclose(np.asarray(g(x)), want, rtol=1e-6)


def test_recipe_primitive_without_a_step_is_reported(cleanup):
    """Skipping step 3 leaves the primitive usable but not partitionable, and the
    registry check names it."""
    from spmd.compiler.core.primitives import Primitive

    cleanup.append("toy_no_step3")
    p = Primitive("toy_no_step3", traits=())
    p.def_impl(lambda xp, x: x)
    p.def_abstract_eval(lambda x: x)
    assert _missing_rules(p) == ["jvp", "batch", "partition decision"]
    assert registry.missing(PRIMITIVES.values()) == ["toy_no_step3"]


# ------------------------------------------------------------ add a collective

def _define_toy_pmean():
    """Steps 1-3 of "Add a collective" (one built from the group operations): the
    mean over mesh axes as its own primitive."""
    from spmd import tree_util
    from spmd.collectives.primitives import (_axes, _batch, _front, _linear_jvp, _no_impl,
                                             _same, _size, _tracked, psum_p, pvary_p)
    from spmd.compiler.transforms.ad_util import Zero
    from spmd.compiler.ops.elementwise import div
    from spmd.compiler.core.primitives import Primitive
    from spmd.compiler.core.trace import bind, get_aval

    # 1. The primitive (spmd/collectives/primitives.py): type, varying axes, jvp,
    #    transpose, and the batching rule that calls the group operations.
    toy_pmean_p = _linear_jvp(Primitive("toy_pmean", traits=()))
    toy_pmean_p.def_impl(_no_impl("toy_pmean"))
    toy_pmean_p.def_abstract_eval(lambda x, *, axes: x)
    toy_pmean_p.def_vma(lambda x, *, axes: [x.vma - set(axes)])

    def local(group, x, d, params):
        if d is None:  # the same on every device: its own mean
            return x, None
        out, d = group.all_reduce(_front(x, d), "sum")
        return div(out, np.array(group.na, get_aval(out).dtype)[()]), d

    _batch(toy_pmean_p, local, _same)

    @toy_pmean_p.def_transpose
    def _transpose(ct, x, *, axes):
        if isinstance(ct, Zero):
            return [Zero(x.aval)]
        tracked = _tracked(axes)
        untracked = tuple(a for a in axes if a not in tracked)
        if untracked:  # an untyped cotangent may differ between devices
            ct = bind(psum_p, ct, axes=untracked)
        typed = tuple(a for a in axes if a in tracked)
        ct = bind(pvary_p, ct, axes=typed) if typed else ct
        return [div(ct, np.array(_size(axes), x.aval.dtype)[()])]

    # 2. The user function (spmd/collectives/api.py, exported from spmd.lax).
    def toy_pmean(x, axis_name):
        axes = _axes(axis_name, "toy_pmean")
        return tree_util.tree_map(lambda v: bind(toy_pmean_p, v, axes=axes), x)

    # 3. The partition decision (spmd/shard/partition/rules_collectives.py).
    from spmd.shard.partition.registry import Unreachable, register

    register(toy_pmean_p, Unreachable("a collective is only traced inside a shard_map body"))
    return toy_pmean_p, toy_pmean


def test_recipe_add_a_collective(cleanup):
    cleanup.append("toy_pmean")
    prim, toy_pmean = _define_toy_pmean()
    assert _missing_rules(prim) == []
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    x = np.arange(32, dtype=np.float32).reshape(8, 4)

    def body(mean):
        return functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i", "j"),
                                 out_specs=P(None, "j"))(lambda b: mean(b, "i"))

    got, want = body(toy_pmean)(x), body(lax.pmean)(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    text = str(spmd.make_jaxpr(body(toy_pmean))(x))
    assert "toy_pmean[axes=('i',)]" in text
    # Reverse mode through the transpose rule, against pmean's.
    loss = lambda mean: lambda v: snp.sum(body(mean)(v) ** 2)  # noqa: E731
    np.testing.assert_allclose(np.asarray(spmd.grad(loss(toy_pmean))(x)),
                               np.asarray(spmd.grad(loss(lax.pmean))(x)), rtol=1e-5)
    # vmap with an axis name runs the same batching rule.
    v = spmd.vmap(lambda r: toy_pmean(r, "b"), axis_name="b")(x)
    np.testing.assert_allclose(np.asarray(v), np.broadcast_to(x.mean(0), x.shape), rtol=1e-6)


# ------------------------------------------------------------ add a backend

def _define_loopback_transport():
    """Steps 1-2 of "Add a backend": a transport module.  The toy is a loopback: every
    process is taken to hold what this one holds (so it runs in one process)."""
    import types

    from spmd.collectives.backend import run
    from spmd.collectives.transport import define_rules
    from spmd.compiler.core.primitives import Primitive
    from spmd.compiler.core.trace import bind

    # 1. The module: the five operations of spmd.collectives.backend.KINDS, and an
    #    effectful primitive whose impl dispatches through the table.
    mod = types.ModuleType("toy_loopback")
    mod.allreduce = lambda x, ranks, op, what=None: \
        x * len(ranks) if op == "sum" else x
    mod.allgather = lambda x, ranks, what=None: np.stack([x] * len(ranks))
    mod.reduce_scatter = lambda x, ranks, op="sum", what=None: x[0] * len(ranks)
    mod.alltoall = lambda x, ranks, what=None: x
    mod.sendrecv = lambda x, ranks, dst, src, what=None: x
    mod.loopback_p = Primitive("toy_loopback", traits=(), effectful=True)
    mod.loopback_p.def_impl(lambda xp, x, *, kind, ranks, op=None, dst=None, src=None,
                            what=None: run(mod, kind, np.asarray(x), ranks,
                                           {"op": op, "dst": dst, "src": src, "what": what}))
    define_rules(mod.loopback_p, "toy_loopback")
    mod.call = lambda kind, x, ranks, **params: bind(
        mod.loopback_p, x, kind=kind, ranks=tuple(ranks), **params)

    # 2. The transport primitive's partition decision
    #    (spmd/shard/partition/rules_collectives.py).
    from spmd.shard.partition.registry import Unreachable, register

    register(mod.loopback_p, Unreachable("a transport primitive runs after partitioning"))
    return mod


def test_recipe_add_a_backend(cleanup):
    from spmd.collectives.backend import Transport
    from spmd.collectives.process_group import ProcessGroup

    cleanup.append("toy_loopback")
    mod = _define_loopback_transport()
    assert isinstance(mod, Transport) and _missing_rules(mod.loopback_p) == []
    # 3. Choose it for the devices it serves (process_group.backend()); here, a group of
    #    2 processes along 'i' as process 0 sees it.
    g = ProcessGroup(("i",), (2,), ("i",), (0,), (0, 1), 0)
    g.comm = mod
    x = np.arange(3, dtype=np.float32).reshape(1, 3)  # this process's stacked block
    out, d = g.all_reduce(x, "sum")
    np.testing.assert_array_equal(np.asarray(out), 2 * x)
    out, d = g.all_gather(x, 0, True)
    np.testing.assert_array_equal(np.asarray(out), np.concatenate([x, x], 1))
    text = str(spmd.make_jaxpr(lambda v: g.all_reduce(v, "sum")[0])(x))
    assert "toy_loopback[kind='allreduce', ranks=(0, 1), op='sum'" in text

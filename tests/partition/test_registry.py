"""Every primitive has a partition decision, declared in a table keyed by the primitive
(spmd/shard/partition/registry.py), and the partitioner never replicates silently:
a primitive without a decision is an error naming it and the fix."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest

import spmd
from spmd import NamedSharding, P, lax
from spmd.compiler.core.primitives import PRIMITIVES, Primitive
from spmd.compiler.core.trace import extend_axis_env, get_aval, trace_to_program
from spmd.shard.partition import partition
from spmd.shard.partition.registry import (DECISIONS, MissingPartitionRuleError,
                                           PartitionError, Propagate, Replicate, Structural,
                                           Unreachable, decision, missing, register)


def _import_every_module():
    """Modules that define primitives but are imported lazily (the backends) count too."""
    for m in pkgutil.walk_packages(spmd.__path__, "spmd."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)


def test_every_primitive_has_a_partition_decision():
    _import_every_module()
    names = missing(PRIMITIVES.values())
    if names:
        pytest.fail(f"{len(names)} primitive(s) have no partition decision: {', '.join(names)}."
                    "\nRegister one beside the rules of its family (spmd/shard/partition/"
                    "rules*.py): registry.register(prim, Propagate(rule)) or "
                    "Replicate('why it is computed whole'); see docs/architecture.md.",
                    pytrace=False)


def test_decisions_are_declared_with_reasons():
    kinds = {type(d) for d in DECISIONS.values()}
    assert kinds == {Propagate, Replicate, Structural, Unreachable}
    for p, d in DECISIONS.items():
        if isinstance(d, (Replicate, Unreachable)):
            assert len(d.reason) > 20, f"{p.name}: the reason {d.reason!r} says too little"


@pytest.fixture
def toy_p():
    """A primitive with every rule but a partition decision; removed afterwards so that
    the registry checks see only the real primitives."""
    p = Primitive("toy_twice_no_decision")
    p.def_impl(lambda xp, x: x * 2)
    p.def_abstract_eval(lambda x: x)
    yield p
    del PRIMITIVES[p.name]
    DECISIONS.pop(p, None)


def test_jit_with_shardings_raises_on_a_primitive_without_decision(toy_p):
    mesh = spmd.make_mesh((4,), ("i",), devices=spmd.devices()[:4])
    f = spmd.jit(lambda x: toy_p.bind(x) + 1.0, in_shardings=NamedSharding(mesh, P("i")))
    with pytest.raises(MissingPartitionRuleError,
                       match=r"'toy_twice_no_decision' has no partition decision.*register\("):
        f(np.ones((8, 2), np.float32))
    assert issubclass(MissingPartitionRuleError, PartitionError)
    with pytest.raises(MissingPartitionRuleError):
        decision(toy_p)


def test_eager_op_on_sharded_array_raises_on_a_primitive_without_decision(toy_p):
    mesh = spmd.make_mesh((4,), ("i",), devices=spmd.devices()[:4])
    x = spmd.device_put(np.ones((8, 2), np.float32), NamedSharding(mesh, P("i")))
    with pytest.raises(MissingPartitionRuleError, match="toy_twice_no_decision"):
        toy_p.bind(x)


def test_a_plain_jit_on_sharded_arrays_raises_on_a_primitive_without_decision(toy_p):
    """In one process too: the call's results would be placed by propagation, which
    cannot run; the jit raises (it used to leave the results unplaced, silently)."""
    mesh = spmd.make_mesh((4,), ("i",), devices=spmd.devices()[:4])
    f = spmd.jit(lambda x: toy_p.bind(x) + 1.0)
    x = spmd.device_put(np.ones((8, 2), np.float32), NamedSharding(mesh, P("i")))
    for _ in range(2):  # nothing is cached: the same error again
        with pytest.raises(MissingPartitionRuleError, match="toy_twice_no_decision"):
            f(x)
    # Unplaced values need no partitioning.
    np.testing.assert_array_equal(np.asarray(f(np.ones((8, 2), np.float32))), 3.0)


def test_a_replicate_decision_computes_whole(toy_p):
    register(toy_p, Replicate("a test primitive: computed whole on every device"))
    mesh = spmd.make_mesh((4,), ("i",), devices=spmd.devices()[:4])
    f = spmd.jit(lambda x: toy_p.bind(x), in_shardings=NamedSharding(mesh, P("i")),
                 out_shardings=NamedSharding(mesh, P("i")))
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(f(x)), 2 * x)
    text = f.lower(x).as_text()
    assert "all_gather" in text  # the split input is gathered: replication is explicit


def test_an_unreachable_primitive_is_an_internal_error():
    """A collective in a global program (possible only by building one by hand)."""
    mesh = spmd.make_mesh((4,), ("i",), devices=spmd.devices()[:4])
    with extend_axis_env({"i": 4}):
        closed = trace_to_program(lambda x: [lax.psum(x, "i")],
                                  [get_aval(np.ones(8, np.float32))])
    with pytest.raises(PartitionError, match=r"internal: psum.*only traced inside a shard_map"):
        partition(closed, mesh, [P("i")], [None])


def test_register_rejects_bad_declarations(toy_p):
    with pytest.raises(TypeError, match="must be a Primitive"):
        register("toy", Replicate("a reason long enough"))
    with pytest.raises(TypeError, match="must be Propagate, Replicate"):
        register(toy_p, lambda *a: a)
    with pytest.raises(ValueError, match="needs a reason"):
        register(toy_p, Replicate(""))
    register(toy_p, Replicate("computed whole: a test primitive"))
    register(toy_p, Replicate("computed whole: a test primitive"))  # the same: accepted
    with pytest.raises(ValueError, match="already has a partition decision"):
        register(toy_p, Unreachable("a different decision for the same primitive"))


"""The compiler's extension points (spmd/compiler/extensions.py): declared with a name,
a signature, a purpose and a default; filled only by spmd._install."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P
from spmd.compiler import extensions
from spmd.compiler.extensions import ExtensionNotInstalledError, ExtensionPoint


def test_every_point_is_declared_and_installed_by_spmd():
    assert [p.name for p in extensions.POINTS] == [
        "pvary", "preduced", "summands", "context_key", "plain_sharding", "plain_shards",
        "array_module", "eager_eval"]
    for p in extensions.POINTS:
        assert p.signature.startswith("(") and "->" in p.signature
        assert len(p.doc) > 40 and callable(p.default)
        # `from spmd import P` ran the installer; the function came from the named module.
        assert p.fn is not p.default
        assert p.installed_by == p.fn.__module__


def test_defaults_keep_the_compiler_working_alone():
    assert extensions.CONTEXT_KEY.default() is None
    assert extensions.ARRAY_MODULE.default() == (np, None)
    with pytest.raises(ExtensionNotInstalledError, match=r"needs pvary.*`import spmd.numpy`.*run_installer"):
        extensions.PVARY.default(np.ones(2), ("i",))


def test_eager_eval_default_names_the_primitive_and_the_array_type():
    """Without the installer, an eager primitive on an upper layer's array raises (it
    would otherwise compute on the whole value and lose the placement, silently)."""
    from spmd.compiler.core.array import Array
    from spmd.compiler.core.avals import ShapedArray
    from spmd.compiler.ops.elementwise import sin_p

    class Placed(Array):
        __slots__ = ()

    x = Placed(np.ones(2, np.float32), ShapedArray((2,), np.dtype(np.float32)))
    with pytest.raises(ExtensionNotInstalledError, match=r"sin has an array of an upper layer "
                       r"among its arguments \(Placed\).*run_installer"):
        extensions.EAGER_EVAL.default(sin_p, [x], {})


def test_eager_eval_default_leaves_the_compilers_own_values_to_it():
    """Alone, the compiler evaluates every primitive on its own Arrays itself (a
    higher-order one too): the default declines."""
    from spmd.compiler.core.array import Array
    from spmd.compiler.core.avals import ShapedArray
    from spmd.compiler.core.jit import jit_p
    from spmd.compiler.ops.elementwise import sin_p

    x = Array(np.ones(2, np.float32), ShapedArray((2,), np.dtype(np.float32)))
    assert extensions.EAGER_EVAL.default(sin_p, [x, np.ones(2)], {}) is None
    assert extensions.EAGER_EVAL.default(jit_p, [x], {"program": None, "name": "f"}) is None


def test_eager_primitives_on_placed_arrays_go_through_eager_eval():
    seen = []
    real = extensions.EAGER_EVAL.fn

    def spy(prim, args, params):
        seen.append(prim.name)
        return real(prim, args, params)

    mesh = spmd.make_mesh((2,), ("d",))
    x = spmd.device_put(np.arange(4.0, dtype=np.float32), spmd.NamedSharding(mesh, P("d")))
    restore = _swap(extensions.EAGER_EVAL, spy)
    try:
        y = snp.sin(x).sum()
    finally:
        restore()
    assert np.allclose(np.asarray(y), np.sin(np.arange(4.0)).sum(), rtol=1e-6)
    assert seen, "no eager primitive on the placed array reached EAGER_EVAL"


def test_eager_higher_order_primitives_are_offered_to_the_upper_layer_first():
    """An eager loop (and a jit equation bound eagerly) on plain values is offered to
    EAGER_EVAL, which declines it (no shard_map over processes inside): the compiler
    then runs it, and the result is numpy's."""
    from spmd import lax
    from spmd.compiler.core.jit import jit_p

    seen = []
    real = extensions.EAGER_EVAL.fn

    def spy(prim, args, params):
        out = real(prim, args, params)
        seen.append((prim.name, out is None))
        return out

    xs = np.arange(6.0, dtype=np.float32)
    traced = spmd.jit(lambda v: v * 3.0).trace(xs)
    restore = _swap(extensions.EAGER_EVAL, spy)
    try:
        carry, ys = lax.scan(lambda c, x: (c + x, c * x), np.float32(0), xs)
        (bound,) = jit_p.bind(xs, program=traced.jaxpr, name="f")
    finally:
        restore()
    assert ("scan", True) in seen and ("jit", True) in seen
    np.testing.assert_allclose(np.asarray(carry), xs.sum())
    np.testing.assert_allclose(np.asarray(ys), np.concatenate([[0], np.cumsum(xs)[:-1]]) * xs)
    np.testing.assert_allclose(np.asarray(bound), xs * 3)


def test_install_and_reset():
    p = ExtensionPoint("demo", "(x: int) -> int", "a demonstration point", lambda x: x)
    with pytest.raises(TypeError, match="demo: expected a function"):
        p.install(3, by="tests")
    p.install(lambda x: 2 * x, by="tests")
    assert (p.fn(4), p.installed_by) == (8, "tests")
    p.reset()
    assert (p.fn(4), p.installed_by) == (4, None)
    assert "demo" in repr(p)


def _swap(point, fn):
    old, who = point.fn, point.installed_by
    point.install(fn, by="tests")
    return lambda: point.install(old, by=who)


def test_shard_map_bodies_call_the_pvary_point():
    """An invariant operand meeting a varying one goes through PVARY in a traced body
    (an eager body only joins the types: its values need no pvary)."""
    mesh = spmd.make_mesh((4,), ("i",), devices=spmd.devices()[:4])
    calls = []
    real = extensions.PVARY.fn

    def counting(x, axes):
        calls.append(axes)
        return real(x, axes)

    restore = _swap(extensions.PVARY, counting)

    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))
    def f(x, b):
        return x + b

    try:
        out = spmd.jit(f)(np.arange(8.0, dtype=np.float32), np.float32(1.0))
    finally:
        restore()
    np.testing.assert_array_equal(np.asarray(out), np.arange(8.0) + 1)
    assert calls == [("i",)]


def test_jit_caches_key_on_the_context_key_point():
    """A function traced under one mesh context is retraced under another."""
    traces = []

    @spmd.jit
    def f(x):
        traces.append(1)
        return x * 2

    current = ["mesh-a"]
    restore = _swap(extensions.CONTEXT_KEY, lambda: current[0])
    try:
        for key in ("mesh-a", "mesh-a", "mesh-b", "mesh-b"):
            current[0] = key
            f(np.ones(2, np.float32))
    finally:
        restore()
    assert len(traces) == 2



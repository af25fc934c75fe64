"""``jit`` with shardings as JAX's ``jit`` is used: ``.trace``/``.lower``/
``eval_shape`` on arrays and ``ShapeDtypeStruct``s (with shardings), ``disable_jit``,
keyword and static arguments (``static_argnames``) and ``donate_argnums``; values
against numpy on the global arrays."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, ShapeDtypeStruct, lax
from spmd import NamedSharding as NS
from spmd.errors import DeletedArrayError, StaticArgumentError
from spmd.shard.partition import PartitionError


@pytest.fixture(scope="module")
def mesh():
    return spmd.make_mesh((2, 4), ("x", "y"))


A = np.arange(64, dtype=np.float32).reshape(8, 8) / 10
B = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)


def _matmul(mesh):
    return spmd.jit(lambda a, b: a @ b, in_shardings=(NS(mesh, P("x", "y")), NS(mesh, P("y"))),
                    out_shardings=NS(mesh, P("x", "y")))


def test_trace_gives_the_global_program_and_the_output_shardings(mesh):
    f = _matmul(mesh)
    t = f.trace(A, B)
    assert "dot_general" in str(t.jaxpr) and "f32[8,8]" in str(t.jaxpr)
    assert "psum_scatter" not in str(t.jaxpr)  # the global program: no collectives
    assert [str(a) for a in t.in_avals] == ["f32[8,8]", "f32[8,8]"]
    out = t.out_info
    assert isinstance(out, ShapeDtypeStruct)
    assert (out.shape, out.dtype, out.sharding) == ((8, 8), np.float32,
                                                    NS(mesh, P("x", "y")))
    # The lowered stage is the per-device program: blocks of (8/2, 8/4) and (8/4, 8).
    text = t.lower().as_text()
    assert "a:f32[4,2] b:f32[2,8]" in text and "psum_scatter" in text
    assert text == f.lower(A, B).as_text()


def test_abstract_arguments_trace_lower_and_eval_shape(mesh):
    f = _matmul(mesh)
    s = ShapeDtypeStruct((8, 8), np.float32)
    assert f.lower(s, s).as_text() == f.lower(A, B).as_text()
    for out in (f.eval_shape(s, B), spmd.eval_shape(f, s, s)):
        assert out.shape == (8, 8) and out.sharding == NS(mesh, P("x", "y"))
    # A pytree of outputs keeps its structure.
    g = spmd.jit(lambda a: {"s": snp.sum(a, 0), "t": a.T}, in_shardings=NS(mesh, P("x")))
    out = g.eval_shape(s)
    assert out["s"].shape == (8,) and out["t"].shape == (8, 8)
    assert out["t"].sharding.mesh == mesh
    with pytest.raises(TypeError, match=r"called with abstract arguments \(ShapeDtypeStruct\)"):
        f(s, B)


def test_shape_dtype_struct_sharding_counts_as_an_arrays(mesh):
    # in_shardings leaves the first argument open: its ShapeDtypeStruct's sharding
    # decides it, as an Array's would.
    f = spmd.jit(lambda a, b: snp.tanh(a) + b, in_shardings=(None, NS(mesh, P("x"))))
    s = ShapeDtypeStruct((8, 8), np.float32, sharding=NS(mesh, P(None, "y")))
    assert f.lower(s, B).in_specs[0] == P(None, "y")
    assert f.lower(ShapeDtypeStruct((8, 8), np.float32), B).in_specs[0] != P(None, "y")
    # The same placement given by a device_put Array: the same program.
    x = spmd.device_put(A, NS(mesh, P(None, "y")))
    assert f.lower(x, B).as_text() == f.lower(s, B).as_text()
    np.testing.assert_allclose(np.asarray(f(x, B)), np.tanh(A) + B, rtol=1e-6)
    # Only a ShapeDtypeStruct: the mesh comes from its sharding.
    g = spmd.jit(lambda a: a * 2, out_shardings=None, in_shardings=None,
                 forbid_gather_bytes=1 << 30)
    assert g.trace(s).out_info.sharding == NS(mesh, P(None, "y"))
    # A bare PartitionSpec as the sharding, resolved against the mesh context.
    with spmd.sharding.use_mesh(mesh):
        bare = ShapeDtypeStruct((8, 8), np.float32, sharding=P("x"))
        assert f.lower(bare, B).in_specs[0] == P("x")


def test_bad_shape_dtype_struct_shardings(mesh):
    f = spmd.jit(lambda a, b: a + b, in_shardings=(None, NS(mesh, P("x"))))
    with pytest.raises(PartitionError, match=r"argument leaf 0: ShapeDtypeStruct\(sharding="
                                             r"PartitionSpec\('x'\)\) is a bare PartitionSpec"):
        f.lower(ShapeDtypeStruct((8, 8), np.float32, sharding=P("x")), B)
    with pytest.raises(PartitionError, match=r"argument leaf 0: ShapeDtypeStruct\(sharding="
                                             r"'x'\) is not a sharding"):
        f.lower(ShapeDtypeStruct((8, 8), np.float32, sharding="x"), B)
    with pytest.raises(spmd.shard.arrays.spec.ShardingError, match="not divisible"):
        f.lower(ShapeDtypeStruct((6, 8), np.float32, sharding=NS(mesh, P("y"))), B[:6])


def test_disable_jit_runs_the_python_function(mesh):
    seen = []

    def f(a):
        seen.append(type(a))
        if float(snp.sum(a)) > 0:  # a Python branch on a value: only without jit
            return a * 2
        return a

    g = spmd.jit(f, in_shardings=NS(mesh, P("x")))
    with spmd.disable_jit():
        np.testing.assert_allclose(np.asarray(g(A)), 2 * A)
    assert seen == [np.ndarray]  # no tracer: the function ran on the value
    from spmd.errors import ConcretizationError

    with pytest.raises(ConcretizationError, match=r"float\(\) of a traced array"):
        g(A)  # jitted again once the block ends


def test_static_argnames_and_keyword_arguments(mesh):
    traces = []

    def f(a, b, *, power, scale=1.0):
        traces.append(power)
        return snp.sum(a ** power, 1) * scale + b

    g = spmd.jit(f, in_shardings=(NS(mesh, P("x")), NS(mesh, P("x"))), static_argnames="power")
    b = np.arange(8, dtype=np.float32)
    for p in (2, 3, 2):
        out = g(A, b, power=p, scale=np.float32(0.5))
        np.testing.assert_allclose(np.asarray(out), (A ** p).sum(1) * 0.5 + b, rtol=1e-5)
        assert out.sharding.spec == P("x")
    assert traces == [2, 3]  # one trace per static value
    # A keyword Array keeps its sharding (in_shardings covers positional arguments).
    s = spmd.device_put(np.float32(2.0), NS(mesh, P()))
    np.testing.assert_allclose(np.asarray(g(A, b, power=1, scale=s)), A.sum(1) * 2 + b,
                               rtol=1e-5)
    # static_argnames naming a positional parameter makes that position static.
    h = spmd.jit(lambda a, n: a[:, :n] * 2, in_shardings=NS(mesh, P("x")), static_argnames="n")
    np.testing.assert_allclose(np.asarray(h(A, 4)), A[:, :4] * 2)
    with pytest.raises(StaticArgumentError, match=r"static argument 'power' is an unhashable "
                                                  r"list"):
        g(A, b, power=[2])
    k = spmd.jit(lambda a, n: a * n, in_shardings=NS(mesh, P("x")), static_argnums=1)
    with pytest.raises(StaticArgumentError, match=r"static_argnums names argument 1 but the "
                                                  r"call passes 1 positional arguments"):
        k(A)


def test_donate_argnums_deletes_the_donated_arrays(mesh):
    f = spmd.jit(lambda p, g: p - 0.1 * g, in_shardings=NS(mesh, P("x", "y")),
                 donate_argnums=0)
    p = spmd.device_put(A, NS(mesh, P("x", "y")))
    g = spmd.device_put(B, NS(mesh, P("x", "y")))
    out = f(p, g)
    np.testing.assert_allclose(np.asarray(out), A - 0.1 * B, rtol=1e-6)
    assert p.is_deleted() and not g.is_deleted()
    with pytest.raises(DeletedArrayError):
        np.asarray(p)


def test_with_sharding_constraint_in_traced_program(mesh):
    f = spmd.jit(lambda a: lax.with_sharding_constraint(a * 2, NS(mesh, P(None, "y"))) + 1,
                 in_shardings=NS(mesh, P("x")))
    t = f.trace(ShapeDtypeStruct((8, 8), np.float32))
    assert t.out_info.sharding == NS(mesh, P(None, "y"))
    assert "sharding_constraint" in str(t.jaxpr)

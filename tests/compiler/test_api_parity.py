"""JAX APIs of issue 14 item 4: custom_jvp.defjvps and symbolic zeros,
custom_vjp.defvjp(optimize_remat), grad(allow_int), linear_transpose,
disable_jit, abstract inputs (ShapeDtypeStruct) and jit(f).trace."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.transforms.custom import CustomRuleError, SymbolicZero, zero_from_primal
from spmd.autodiff import GradientError
from spmd.linear_util import NotLinearError
from spmd.errors import ArgumentError

F32 = np.float32


# ------------------------------------------------------------ custom rules

def test_defjvps_gives_each_arguments_contribution():
    @spmd.custom_jvp
    def f(x, y):
        return snp.sin(x) * y

    f.defjvps(lambda t, ans, x, y: snp.cos(x) * t * y, lambda t, ans, x, y: snp.sin(x) * t)
    x, y = F32(0.5), F32(2.0)
    gx, gy = spmd.grad(f, argnums=(0, 1))(x, y)
    np.testing.assert_allclose([gx, gy], [np.cos(0.5) * 2, np.sin(0.5)], rtol=1e-6)
    _, t = spmd.jvp(f, (x, y), (F32(1.0), F32(0.0)))
    np.testing.assert_allclose(t, np.cos(0.5) * 2, rtol=1e-6)
    got = spmd.vmap(spmd.grad(f))(np.ones(3, F32), np.full(3, 2.0, F32))
    np.testing.assert_allclose(got, np.full(3, 2 * np.cos(1.0)), rtol=1e-6)


def test_defjvps_none_rule_means_no_contribution_and_wrong_count_raises():
    @spmd.custom_jvp
    def f(x, y):
        return x * y

    f.defjvps(None, lambda t, ans, x, y: x * t)
    assert float(spmd.grad(f)(F32(3.0), F32(4.0))) == 0.0
    assert float(spmd.grad(f, argnums=1)(F32(3.0), F32(4.0))) == 3.0

    @spmd.custom_jvp
    def g(x, y):
        return x * y

    g.defjvps(lambda t, ans, x, y: t * y)
    with pytest.raises(CustomRuleError, match="1 rule"):
        spmd.grad(g)(F32(1.0), F32(2.0))
    h = spmd.custom_jvp(lambda n, x: x * n, nondiff_argnums=(0,))
    with pytest.raises(CustomRuleError, match="nondiff_argnums"):
        h.defjvps(lambda t, ans, x: t)


def test_symbolic_zeros_reach_the_rule():
    seen = []

    @spmd.custom_jvp
    def f(x, y):
        return x * y

    def rule(primals, tangents):
        seen.append([isinstance(t, SymbolicZero) for t in tangents])
        (x, y), (tx, ty) = primals, tangents
        out = 0.0
        if not isinstance(tx, SymbolicZero):
            out = out + tx * y
        if not isinstance(ty, SymbolicZero):
            out = out + x * ty
        return x * y, out

    f.defjvp(rule, symbolic_zeros=True)
    assert float(spmd.grad(f)(F32(3.0), F32(4.0))) == 4.0
    assert seen[-1] == [False, True]
    assert float(spmd.grad(f, argnums=1)(F32(3.0), F32(4.0))) == 3.0
    assert seen[-1] == [True, False]
    z = zero_from_primal(np.ones((2, 3), F32))
    assert isinstance(z, SymbolicZero) and z.shape == (2, 3) and z.dtype == F32
    assert np.asarray(z.instantiate()).tolist() == [[0.0] * 3] * 2


def test_rule_may_return_a_symbolic_zero():
    @spmd.custom_jvp
    def f(x):
        return snp.floor(x)

    f.defjvp(lambda p, t: (f(p[0]), zero_from_primal(p[0])), symbolic_zeros=True)
    assert float(spmd.grad(f)(F32(2.5))) == 0.0


def test_defvjp_accepts_optimize_remat():
    @spmd.custom_vjp
    def f(x):
        return snp.sin(x)

    f.defvjp(lambda x: (snp.sin(x), snp.cos(x)), lambda c, g: (c * g,), optimize_remat=True)
    np.testing.assert_allclose(spmd.grad(spmd.checkpoint(f))(F32(0.5)), np.cos(0.5), rtol=1e-6)


# ------------------------------------------------------------ grad allow_int

def test_grad_allow_int_gives_float0():
    f = lambda x, n: (x * n).sum()  # noqa: E731
    gx, gn = spmd.grad(f, argnums=(0, 1), allow_int=True)(np.ones(3, F32), np.arange(3))
    assert np.asarray(gx).tolist() == [0.0, 1.0, 2.0]
    assert gn.dtype == spmd.compiler.core.dtypes.float0 and gn.shape == (3,)
    with pytest.raises(GradientError, match="allow_int=True"):
        spmd.grad(f, argnums=1)(np.ones(3, F32), np.arange(3))
    v, g = spmd.value_and_grad(f, argnums=1, allow_int=True)(np.ones(3, F32), np.arange(3))
    assert float(v) == 3.0 and g.shape == (3,)


# ------------------------------------------------------------ linear_transpose

def test_linear_transpose_is_the_matrix_transpose():
    a = np.random.default_rng(0).standard_normal((2, 3)).astype(F32)
    f_t = spmd.linear_transpose(lambda x: a @ x, np.zeros(3, F32))
    ct = np.array([1.0, -2.0], F32)
    (got,) = f_t(ct)
    np.testing.assert_allclose(got, a.T @ ct, rtol=1e-6)
    # structure: a dict output of two inputs, abstract primals
    f_t = spmd.linear_transpose(lambda x, y: {"a": a @ x, "b": 3.0 * x.sum() - y},
                                spmd.ShapeDtypeStruct((3,), F32), F32(0))
    gx, gy = f_t({"a": ct, "b": F32(2.0)})
    np.testing.assert_allclose(gx, a.T @ ct + 6.0, rtol=1e-6)
    assert float(gy) == -2.0 and isinstance(gy, spmd.Array)
    # an input the output does not use gets zeros
    (g0, g1) = spmd.linear_transpose(lambda x, y: 2 * x, np.zeros(2, F32), np.zeros(4, F32))(
        np.ones(2, F32))
    assert np.asarray(g1).tolist() == [0.0] * 4


def test_linear_transpose_errors():
    ones = np.ones(3, F32)
    with pytest.raises(NotLinearError, match="not linear"):
        spmd.linear_transpose(lambda x: x * x, ones)(ones)
    with pytest.raises(NotLinearError, match="sin"):
        spmd.linear_transpose(snp.sin, ones)(ones)
    with pytest.raises(ArgumentError, match="floating"):
        spmd.linear_transpose(lambda n: n * 2, np.arange(3))
    f_t = spmd.linear_transpose(lambda x: (x, x), ones)
    with pytest.raises(ArgumentError, match="structure"):
        f_t(ones)
    with pytest.raises(ArgumentError, match="type"):
        f_t((ones, np.ones(2, F32)))


# ------------------------------------------------------------ disable_jit

def test_disable_jit_runs_python_each_call():
    calls = []

    @spmd.jit
    def f(x):
        calls.append(type(x).__name__)
        return x * 2

    f(np.ones(2, F32))
    f(np.ones(2, F32))
    assert len(calls) == 1  # traced once
    with spmd.disable_jit():
        out = f(np.ones(2, F32))
        f(np.ones(2, F32))
    assert calls[1:] == ["ndarray", "ndarray"]  # concrete values, every call
    assert np.asarray(out).tolist() == [2.0, 2.0]
    f(np.ones(2, F32))
    assert len(calls) == 3  # compiled again afterwards
    assert not spmd.config.disable_jit


def test_disable_jit_control_flow_sees_concrete_values():
    seen = []

    def body(i, v):
        seen.append(int(i))  # int() of a traced value would raise
        return v + i

    with spmd.disable_jit():
        assert float(lax.fori_loop(0, 4, body, 0.0)) == 6.0
        assert float(lax.while_loop(lambda c: int(c) < 5, lambda c: c * 2, 1)) == 8
        c, ys = lax.scan(lambda c, x: (c + x, c * float(x)), 0.0, snp.arange(4.0))
        assert float(c) == 6.0 and np.asarray(ys).tolist() == [0.0, 0.0, 2.0, 9.0]
        c, ys = lax.scan(lambda c, x: (c + x, c), 0.0, snp.arange(3.0), reverse=True)
        assert np.asarray(ys).tolist() == [3.0, 2.0, 0.0]
        assert lax.cond(np.bool_(False), lambda: "a", lambda: "b") == "b"  # any Python value
        assert float(lax.switch(7, [lambda x: x, lambda x: -x], 2.0)) == -2.0
        # transformations still trace (their values are tracers)
        g = spmd.grad(lambda x: lax.fori_loop(0, 3, lambda i, v: v * x, 1.0))(F32(2.0))
        assert float(g) == 12.0
    assert seen == [0, 1, 2, 3]


# ----------------------------------------------- abstract inputs, trace

def test_shape_dtype_struct_like_and_update():
    s = spmd.ShapeDtypeStruct.like(np.ones((2, 3)))  # float64 canonicalised, as in JAX
    assert (s.shape, s.dtype, s.weak_type, s.sharding) == ((2, 3), F32, False, None)
    assert spmd.ShapeDtypeStruct.like(2.0).weak_type
    u = s.update(shape=(4, 3), dtype=np.int32)
    assert (u.shape, u.dtype, s.shape) == ((4, 3), np.int32, (2, 3))
    seen = []
    spmd.jit(lambda v: seen.append(spmd.ShapeDtypeStruct.like(v)) or v)(np.ones(3, F32))
    assert seen[0].shape == (3,) and seen[0].sharding is None  # a traced value has none
    # The manual-axes view of an abstract value (jax.typeof(x).mat).
    a = spmd.ShapedArray((2,), F32, vma={"i"})
    assert a.mat.varying == {"i"} and a.mat.unreduced == frozenset() == a.mat.reduced
    assert a.mat.invarying(spmd.sharding.AbstractMesh((2, 2), ("i", "j"), axis_types=(
        spmd.sharding.AxisType.Manual,) * 2)) == {"j"}


def test_eval_shape_and_lower_take_shape_dtype_structs():
    s = spmd.ShapeDtypeStruct((2, 3), F32)
    assert s.ndim == 2 and s.size == 6 and repr(s) == "ShapeDtypeStruct(shape=(2, 3), dtype=float32)"
    out = spmd.eval_shape(lambda x, y: {"z": x.sum(0) * y}, s, F32(1.0))
    assert out["z"].shape == (3,) and out["z"].dtype == F32
    # an eval_shape result feeds eval_shape again, as in JAX
    again = spmd.eval_shape(lambda z: z[None], out["z"])
    assert again.shape == (1, 3)
    text = spmd.jit(lambda x: x + 1).lower(spmd.ShapeDtypeStruct((2,), np.int32)).as_text()
    assert "i32[2]" in text and "add" in text
    with pytest.raises(TypeError, match="abstract arguments"):
        spmd.jit(lambda x: x + 1)(s)


def test_jit_trace():
    f = spmd.jit(lambda x, y: snp.sin(x) * y)
    t = f.trace(spmd.ShapeDtypeStruct((3,), F32), np.ones(3, F32))
    assert "sin" in str(t.jaxpr) and "mul" in str(t.jaxpr)
    assert t.out_info.shape == (3,) and t.out_info.dtype == F32
    compiled = t.lower().compile()
    x = np.array([0.1, 0.2, 0.3], F32)
    np.testing.assert_allclose(compiled(x, np.full(3, 2.0, F32)), 2 * np.sin(x), rtol=1e-6)
    assert t.fun_name == "<lambda>" and len(t.in_avals) == 2

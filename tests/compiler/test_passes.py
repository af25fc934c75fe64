"""Program passes (DCE, CSE, constant folding, inlining): what each removes, and that
results never change.  The oracle is ``eval_program`` of the unoptimised program
(the plain reference interpreter: one ``bind`` per equation)."""

import types

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.passes import pipeline as passes
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.check import check_program
from spmd.compiler.engine.codegen import compile_program
from spmd.compiler.core.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.core.primitives import Rules
from spmd.compiler.core.trace import eval_program, get_aval, trace_to_program

F32 = np.float32
RNG = np.random.default_rng(0)


def names(closed):
    return [e.primitive.name for e in closed.program.eqns]


def trace(fun, *args):
    """The program as traced, before any pass (``make_jaxpr`` already runs DCE)."""
    avals = [get_aval(a) for a in args]
    return trace_to_program(lambda *xs: spmd.tree_util.tree_leaves(fun(*xs)), avals)


def assert_same_results(before: ClosedProgram, after: ClosedProgram, *args):
    """The optimised program, interpreted and compiled, equals the original interpreted."""
    check_program(after)
    expected = [np.asarray(v) for v in eval_program(before, *args)]
    interpreted = [np.asarray(v) for v in eval_program(after, *args)]
    compiled = compile_program(after)(*args)
    assert len(expected) == len(interpreted) == len(compiled)
    for e, i, c in zip(expected, interpreted, compiled):
        np.testing.assert_allclose(i, e, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(c), e, rtol=1e-6, atol=1e-7)
        assert np.asarray(c).dtype == e.dtype and np.shape(c) == e.shape


# ----------------------------------------------------------------------- DCE

def test_dce_removes_unused_equations():
    def f(x):
        unused = snp.exp(x) * 3.0  # noqa: F841
        return snp.tanh(x)

    x = RNG.standard_normal(4).astype(F32)
    closed = trace(f, x)
    assert names(closed) == ["exp", "mul", "tanh"]
    out = passes.dce(closed)
    assert names(out) == ["tanh"]
    assert_same_results(closed, out, x)


def test_dce_drops_unused_constants_but_never_arguments():
    w = np.ones((3, 3), F32)

    def f(x, y):
        unused = snp.dot(x, w)  # noqa: F841
        return x + 1.0

    x = np.ones((2, 3), F32)
    closed = trace(f, x, x)
    assert len(closed.consts) == 1
    out = passes.dce(closed)
    assert out.consts == [] and names(out) == ["add"]
    assert len(out.program.in_vars) == 2  # y is unused but stays an argument
    assert_same_results(closed, out, x, x)


def test_dce_keeps_chains_feeding_outputs_and_effects():
    a = Var(ShapedArray((2,), F32))
    b, c = Var(ShapedArray((2,), F32)), Var(ShapedArray((2,), F32))
    effect = types.SimpleNamespace(name="effect", effectful=True, rules=Rules(),
                                   multiple_results=True)
    from spmd.compiler.ops.elementwise import tanh_p
    eqns = [Eqn(tanh_p, [a], [b], {}), Eqn(effect, [b], [], {}), Eqn(tanh_p, [a], [c], {})]
    program, used = passes.dce_program(Program([a], eqns, [a]))
    assert [e.primitive.name for e in program.eqns] == ["tanh", "effect"]  # its input too
    assert used == [True]


def test_dce_with_used_outputs_mask():
    closed = trace(lambda x: (snp.sin(x), snp.cos(x)), np.ones(2, F32))
    program, used = passes.dce_program(closed.program, used_outputs=[False, True])
    assert [e.primitive.name for e in program.eqns] == ["cos"]
    assert len(program.out_atoms) == 1


# ----------------------------------------------------------------------- CSE

def test_cse_merges_duplicate_equations():
    def f(x):
        return snp.tanh(x) * 2.0 + snp.tanh(x) * 2.0

    x = RNG.standard_normal(5).astype(F32)
    closed = trace(f, x)
    assert names(closed) == ["tanh", "mul", "tanh", "mul", "add"]
    out = passes.dce(passes.cse(closed))
    assert names(out) == ["tanh", "mul", "add"]
    add = out.program.eqns[-1]
    assert add.inputs[0] is add.inputs[1]
    assert_same_results(closed, out, x)


def test_cse_keeps_equations_that_differ():
    def f(x):
        return (snp.sum(x, axis=0), snp.sum(x, axis=1),   # params differ
                x * 2.0, x * 3.0,                          # literals differ
                snp.sin(x), snp.cos(x))                    # primitives differ

    x = RNG.standard_normal((3, 3)).astype(F32)
    closed = trace(f, x)
    out = passes.cse(closed)
    assert names(out) == names(closed)
    assert_same_results(closed, out, x)


def test_cse_does_not_merge_literals_of_different_dtype():
    def f(x, i):
        return x * 2.0, i * 2

    x, i = np.ones(2, F32), np.ones(2, np.int32)
    closed = trace(f, x, i)
    out = passes.cse(closed)
    assert len(out.program.eqns) == 2
    assert_same_results(closed, out, x, i)


def test_cse_merges_transitively():
    def f(x):
        return snp.exp(snp.tanh(x)) - snp.exp(snp.tanh(x))

    x = RNG.standard_normal(3).astype(F32)
    closed = trace(f, x)
    out = passes.dce(passes.cse(closed))
    assert names(out) == ["tanh", "exp", "sub"]
    assert_same_results(closed, out, x)


# ---------------------------------------------------------- constant folding

def test_constant_folding_evaluates_constant_subexpressions():
    c = np.arange(4, dtype=F32)

    def f(x):
        k = snp.sin(c) * 2.0 + 1.0  # all known at compile time
        return x * k

    x = RNG.standard_normal(4).astype(F32)
    closed = trace(f, x)
    assert names(closed) == ["sin", "mul", "add", "mul"]
    out = passes.dce(passes.fold_constants(closed))
    assert names(out) == ["mul"]
    assert len(out.consts) == 1
    np.testing.assert_allclose(out.consts[0], np.sin(c) * 2 + 1, rtol=1e-6)
    assert out.consts[0].dtype == F32
    assert_same_results(closed, out, x)


def test_constant_folding_makes_scalars_literals():
    def f(x):
        k = snp.exp(snp.asarray(1.0, dtype=F32)) * 2.0
        return x + k

    x = np.ones(3, F32)
    closed = trace(f, x)
    out = passes.dce(passes.fold_constants(closed))
    assert names(out) == ["add"]
    lit = out.program.eqns[0].inputs[1]
    assert isinstance(lit, Literal)
    np.testing.assert_allclose(lit.val, np.exp(np.float32(1)) * 2, rtol=1e-6)
    assert_same_results(closed, out, x)


def test_constant_folding_respects_the_size_limit(monkeypatch):
    c = np.arange(8, dtype=F32)

    def f(x):
        return x + snp.sin(c)

    x = np.ones(8, F32)
    closed = trace(f, x)
    monkeypatch.setattr(passes, "FOLD_LIMIT", 7)  # the result has 8 elements: too big
    out = passes.dce(passes.fold_constants(closed))
    assert names(out) == ["sin", "add"]
    assert_same_results(closed, out, x)
    monkeypatch.setattr(passes, "FOLD_LIMIT", 8)
    out = passes.dce(passes.fold_constants(closed))
    assert names(out) == ["add"]
    assert_same_results(closed, out, x)


def test_constant_folding_leaves_argument_chains_alone():
    def f(x):
        for _ in range(5):
            x = x + 1.0
        return x

    closed = trace(f, np.zeros(2, F32))
    assert passes.fold_constants(closed) is closed  # nothing to fold: unchanged


def test_constant_folding_default_limit_is_sane():
    assert 1 << 10 <= passes.FOLD_LIMIT <= 1 << 26


# ---------------------------------------------------------------- inlining

def test_inline_calls_and_optimize_remove_nested_jit():
    inner = spmd.jit(lambda y, w: snp.tanh(snp.dot(y, w)))
    w = RNG.standard_normal((3, 3)).astype(F32)

    def f(x):
        return inner(x, w) + inner(x, w)  # equal calls: CSE merges them after inlining

    x = RNG.standard_normal((2, 3)).astype(F32)
    closed = trace(f, x)
    assert names(closed) == ["jit", "jit", "add"]
    inlined = passes.inline_calls(closed)
    assert names(inlined) == ["dot_general", "tanh", "dot_general", "tanh", "add"]
    assert_same_results(closed, inlined, x)
    out = passes.optimize(closed)
    assert names(out) == ["dot_general", "tanh", "add"]
    assert_same_results(closed, out, x)


# ------------------------------------------------------- all passes together

CASES = [
    ("mlp", lambda x, w: snp.tanh(snp.dot(x, w) + 1.0) * 2.0,
     lambda: (RNG.standard_normal((4, 3)).astype(F32), RNG.standard_normal((3, 5)).astype(F32))),
    ("reductions", lambda x: (snp.sum(x, axis=1), snp.max(x), snp.mean(x * x)),
     lambda: (RNG.standard_normal((3, 4)).astype(F32),)),
    ("shapes", lambda x: snp.reshape(snp.transpose(x), (-1,))[1:5] * 2.0,
     lambda: (RNG.standard_normal((3, 4)).astype(F32),)),
    ("ints_and_bools", lambda i: (i * 3 + 1, i > 2, snp.where(i > 2, i, -i)),
     lambda: (np.arange(6, dtype=np.int32),)),
    ("constants", lambda x: x + snp.sum(np.arange(12, dtype=F32).reshape(3, 4), axis=0) * 0.5,
     lambda: (RNG.standard_normal(4).astype(F32),)),
    ("duplicates", lambda x: (snp.exp(x) + snp.exp(x), snp.exp(x)),
     lambda: (RNG.standard_normal(4).astype(F32),)),
    ("scalar", lambda x: snp.sin(x) * snp.cos(x) + 2.0,
     lambda: (np.float32(0.3),)),
    ("broadcasts", lambda x, b: (x + b, b * x, snp.maximum(x, b[None, :]) - b),
     lambda: (RNG.standard_normal((3, 4)).astype(F32), RNG.standard_normal(4).astype(F32))),
]


@pytest.mark.parametrize("name, fun, make_args", CASES, ids=[c[0] for c in CASES])
def test_optimize_preserves_results(name, fun, make_args):
    args = make_args()
    closed = trace(fun, *args)
    out = passes.optimize(closed)
    assert len(out.program.eqns) <= len(closed.program.eqns)
    assert_same_results(closed, out, *args)
    # The jitted function (optimised + generated code) agrees too.
    jitted = spmd.tree_util.tree_leaves(spmd.jit(fun)(*args))
    for j, e in zip(jitted, eval_program(closed, *args)):
        np.testing.assert_allclose(np.asarray(j), np.asarray(e), rtol=1e-6, atol=1e-7)

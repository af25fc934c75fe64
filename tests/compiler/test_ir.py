"""The IR: its printed form, the ``make_jaxpr`` object model and the type checker."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.check import check_program
from spmd.compiler.core.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.ops.elementwise import add_p, mul_p, tanh_p
from spmd.compiler.ops.linalg import dot_general_p
from spmd.errors import ProgramTypeError

F32 = np.float32


def f32(*shape):
    return np.ones(shape, F32)


# ------------------------------------------------------------------ printing

def test_dot_general_prints_in_jax_form():
    text = str(spmd.make_jaxpr(lambda a, b: snp.dot(a, b))(f32(4, 3), f32(3, 8)))
    assert text == (
        "{ lambda ; a:f32[4,3] b:f32[3,8]. let\n"
        "    c:f32[4,8] = dot_general[dimension_numbers=(((1,), (0,)), ((), ()))] a b\n"
        "  in (c) }")


def test_one_equation_per_line_with_literals():
    closed = spmd.make_jaxpr(lambda x: snp.sin(x) * 2.0 + x)(f32(3))
    lines = str(closed).splitlines()
    assert len(lines) == len(closed.jaxpr.eqns) + 2  # header, one line per equation, footer
    assert lines[1:-1] == ["    b:f32[3] = sin a", "    c:f32[3] = mul b 2.0",
                           "    d:f32[3] = add c a"]
    assert lines[-1] == "  in (d) }"


def test_scalar_and_several_outputs_print():
    text = str(spmd.make_jaxpr(lambda x: (x + 1.0, x * x))(np.float32(2.0)))
    assert text.splitlines()[0] == "{ lambda ; a:f32[]. let"
    assert text.endswith("in (b, c) }")


def test_constants_are_bound_before_the_semicolon():
    w = np.arange(6, dtype=F32).reshape(2, 3)
    closed = spmd.make_jaxpr(lambda x: snp.dot(x, w))(f32(4, 2))
    assert str(closed).splitlines()[0] == "{ lambda a:f32[2,3]; b:f32[4,2]. let"
    assert len(closed.consts) == 1
    np.testing.assert_array_equal(closed.consts[0], w)
    assert [a.shape for a in closed.in_avals] == [(4, 2)]  # the arguments only


def test_many_variables_get_distinct_names():
    def f(x):
        for _ in range(40):
            x = snp.tanh(x)
        return x

    lines = str(spmd.make_jaxpr(f)(f32(2))).splitlines()[1:-1]
    defined = [ln.split(":")[0].strip() for ln in lines]
    assert len(set(defined)) == 40
    assert "aa" in defined  # after z comes aa


def test_nested_program_is_printed_indented():
    inner = spmd.jit(lambda y: y * 3.0)
    text = str(spmd.make_jaxpr(lambda x: inner(x) + 1.0)(f32(2)))
    assert "jit[" in text
    assert "mul" in text
    body = [ln for ln in text.splitlines() if "mul" in ln][0]
    assert body.startswith(" " * 8)  # deeper than the outer equations


# ------------------------------------------------------------ object model

def test_make_jaxpr_object_model():
    closed = spmd.make_jaxpr(lambda a, b: snp.tanh(snp.dot(a, b)))(f32(4, 3), f32(3, 8))
    eqns = closed.jaxpr.eqns
    assert [e.primitive.name for e in eqns] == ["dot_general", "tanh"]
    assert eqns[0].params == {"dimension_numbers": (((1,), (0,)), ((), ()))}
    assert eqns[1].params == {}
    assert eqns[1].inputs == eqns[0].outputs  # SSA: the tanh reads the dot's result
    assert [v.aval for v in closed.jaxpr.invars] == [ShapedArray((4, 3), F32),
                                                      ShapedArray((3, 8), F32)]
    assert closed.out_avals == [ShapedArray((4, 8), F32)]
    assert closed.jaxpr.outvars == eqns[1].outputs


def test_params_are_hashable():
    closed = spmd.make_jaxpr(lambda x: snp.sum(snp.transpose(x), axis=0))(f32(2, 3))
    for eqn in closed.jaxpr.eqns:
        hash(tuple(sorted(eqn.params.items())))


def test_literals_carry_weak_avals():
    closed = spmd.make_jaxpr(lambda x: x * 2.0)(f32(3))
    lit = closed.jaxpr.eqns[0].inputs[1]
    assert isinstance(lit, Literal)
    assert lit.aval.dtype == F32 and lit.aval.shape == ()
    assert lit.val == 2.0


# ------------------------------------------------------------- type checker

@pytest.mark.parametrize("fun, args", [
    (lambda x: snp.tanh(x) * 2.0 + x, (f32(3),)),
    (lambda a, b: snp.dot(a, b) + 1.0, (f32(4, 3), f32(3, 8))),
    (lambda x: snp.sum(x * np.arange(6, dtype=F32).reshape(2, 3), axis=1), (f32(2, 3),)),
    (lambda x: (x.T, snp.reshape(x, (6,)), x[0]), (f32(2, 3),)),
    (lambda x: spmd.jit(lambda y: snp.exp(y))(x) - x, (f32(5),)),
    (lambda x: snp.where(x > 0, x, 0.0), (f32(4),)),
])
def test_checker_accepts_traced_programs(fun, args):
    closed = spmd.make_jaxpr(fun)(*args)
    check_program(closed)
    check_program(closed.jaxpr)


def test_checker_accepts_optimised_programs():
    w = np.ones((3, 3), F32)
    lowered = spmd.jit(lambda x: snp.dot(snp.tanh(x), w * 2.0) + snp.tanh(x)).lower(f32(2, 3))
    check_program(lowered.program)


def _program():
    """``a:f32[3] -> b = tanh a; c = mul b 2.0; d = add c a``, hand-built."""
    a = Var(ShapedArray((3,), F32))
    b, c, d = (Var(ShapedArray((3,), F32)) for _ in range(3))
    two = Literal(np.float32(2.0), ShapedArray((), F32, True))
    eqns = [Eqn(tanh_p, [a], [b], {}), Eqn(mul_p, [b, two], [c], {}), Eqn(add_p, [c, a], [d], {})]
    return a, eqns, d


def test_checker_accepts_hand_built_program():
    a, eqns, d = _program()
    check_program(Program([a], eqns, [d]))
    check_program(ClosedProgram(Program([a], eqns, [d]), []))


def test_checker_rejects_use_before_def():
    a, eqns, d = _program()
    eqns[0], eqns[1] = eqns[1], eqns[0]
    with pytest.raises(ProgramTypeError, match="used before it is defined"):
        check_program(Program([a], eqns, [d]))


def test_checker_rejects_undefined_output():
    a, eqns, d = _program()
    stray = Var(ShapedArray((3,), F32))
    with pytest.raises(ProgramTypeError, match="used before it is defined"):
        check_program(Program([a], eqns, [stray]))


def test_checker_rejects_duplicate_definition():
    a, eqns, d = _program()
    eqns[2] = Eqn(add_p, [eqns[1].outputs[0], a], [eqns[0].outputs[0]], {})  # redefines b
    with pytest.raises(ProgramTypeError, match="defined twice"):
        check_program(Program([a], eqns, [eqns[0].outputs[0]]))


def test_checker_rejects_input_defined_twice():
    a, eqns, d = _program()
    with pytest.raises(ProgramTypeError, match="defined twice"):
        check_program(Program([a, a], eqns, [d]))


@pytest.mark.parametrize("bad_aval", [ShapedArray((4,), F32), ShapedArray((3,), np.int32),
                                      ShapedArray((3, 1), F32)])
def test_checker_rejects_wrong_output_aval(bad_aval):
    a, eqns, d = _program()
    wrong = Var(bad_aval)
    eqns[2] = Eqn(add_p, [eqns[1].outputs[0], a], [wrong], {})
    with pytest.raises(ProgramTypeError, match="rule gives"):
        check_program(Program([a], eqns, [wrong]))


def test_checker_rejects_ill_typed_inputs():
    x = Var(ShapedArray((4, 3), F32))
    y = Var(ShapedArray((4, 3), F32))  # contracting 3 with 4: the rule rejects it
    out = Var(ShapedArray((4, 3), F32))
    eqn = Eqn(dot_general_p, [x, y], [out], {"dimension_numbers": (((1,), (0,)), ((), ()))})
    with pytest.raises(ProgramTypeError, match="dot_general"):
        check_program(Program([x, y], [eqn], [out]))


def test_checker_checks_nested_programs():
    a, eqns, d = _program()
    eqns[0], eqns[1] = eqns[1], eqns[0]
    broken = ClosedProgram(Program([a], eqns, [d]), [])
    outer_in = Var(ShapedArray((3,), F32))
    outer_out = Var(ShapedArray((3,), F32))
    from spmd.compiler.core.jit import jit_p
    call = Eqn(jit_p, [outer_in], [outer_out], {"program": broken, "name": "inner"})
    with pytest.raises(ProgramTypeError, match="used before it is defined"):
        check_program(Program([outer_in], [call], [outer_out]))


def test_checker_rejects_more_constants_than_inputs():
    a, eqns, d = _program()
    with pytest.raises(ProgramTypeError, match="constants"):
        check_program(ClosedProgram(Program([a], eqns, [d]), [np.ones(3, F32)] * 2))


def test_lax_level_program_prints_primitive_names():
    closed = spmd.make_jaxpr(lambda x: lax.reduce_sum(lax.tanh(x), (0,)))(f32(3))
    assert [e.primitive.name for e in closed.eqns] == ["tanh", "reduce_sum"]
    assert "reduce_sum[axes=(0,)] b" in str(closed)

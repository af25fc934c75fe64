"""The type checker: every program a transformation produces must pass it."""

from __future__ import annotations

from spmd.compiler.core.ir import ClosedProgram, Literal, Program, Var
from spmd.compiler.core.trace import abstract_eval
from spmd.errors import ProgramTypeError


def check_program(p: Program | ClosedProgram) -> None:
    """Raise :class:`ProgramTypeError` unless ``p`` is well-typed SSA.

    Checks: each variable is defined once before use; each equation's output
    avals equal its primitive's abstract evaluation of its input avals; nested
    programs (in parameters) are checked too.
    """
    if isinstance(p, ClosedProgram):
        if len(p.consts) > len(p.program.in_vars):
            raise ProgramTypeError("more constants than program inputs")
        p = p.program
    defined: set = set()

    def define(v, where):
        if not isinstance(v, Var):
            raise ProgramTypeError(f"{where}: binder {v!r} is not a Var")
        if v in defined:
            raise ProgramTypeError(f"{where}: variable {v!r} defined twice (not SSA)")
        defined.add(v)

    def use(a, where):
        if isinstance(a, Literal):
            return
        if a not in defined:
            raise ProgramTypeError(f"{where}: variable {a!r} used before it is defined")

    for v in p.in_vars:
        define(v, "program inputs")
    for i, eqn in enumerate(p.eqns):
        where = f"equation {i} ({eqn.primitive.name})"
        for a in eqn.inputs:
            use(a, where)
        try:
            expected = abstract_eval(eqn.primitive, [a.aval for a in eqn.inputs], eqn.params)
        except Exception as e:  # a rule rejecting its inputs is a type error here
            raise ProgramTypeError(f"{where}: {e}") from e
        got = [o.aval for o in eqn.outputs]
        if [(a.shape, a.dtype) for a in expected] != [(a.shape, a.dtype) for a in got]:
            raise ProgramTypeError(f"{where}: outputs typed {got}, rule gives {expected}")
        for o in eqn.outputs:
            define(o, where)
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(sub, (Program, ClosedProgram)):
                    check_program(sub)
    for a in p.out_atoms:
        use(a, "program outputs")

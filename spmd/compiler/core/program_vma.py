"""The varying axes (JEP 17111) of programs that primitives call.

The primitives that call a program -- ``jit``, ``remat``, ``custom_jvp`` /
``custom_vjp``, the loop and ``cond`` bodies -- type their outputs as the body's
outputs are typed, not as the union of the operands' varying axes.

>>> program_vma(body, [frozenset({"i"}), frozenset()])   # doctest: +SKIP
[frozenset({'i'})]
"""

from __future__ import annotations

from spmd.compiler.core.ir import ClosedProgram, Literal
from spmd.compiler.core.trace import abstract_eval


def program_vma(closed, in_vmas) -> list:
    """The varying axes of ``closed``'s outputs when its inputs vary along ``in_vmas``.

    The varying-axes rule of the primitives that call a program (jit, remat,
    custom_jvp/custom_vjp, the control-flow bodies): their outputs have the types
    of the body's outputs (JEP 17111), not the union of the operands'.  When the
    operands' types are those the body was traced with, that is the body's output
    types; otherwise (a body typed in a shard_map and run on global values, or
    given a more or less varying operand) the types are propagated through the
    body's equations with their rules.
    """
    prog = closed.program if isinstance(closed, ClosedProgram) else closed
    n_consts = len(closed.consts) if isinstance(closed, ClosedProgram) else 0
    args = prog.in_vars[n_consts:]
    in_vmas = [frozenset(v) for v in in_vmas]
    if all(v.aval.vma == m for v, m in zip(args, in_vmas)):
        return [a.aval.vma for a in prog.out_atoms]
    env = dict(zip(args, in_vmas))

    def read(a):
        if isinstance(a, Literal):
            return frozenset()
        return env.get(a, a.aval.vma)  # constants: as typed

    for eqn in prog.eqns:
        ins = [read(a) for a in eqn.inputs]
        rule = eqn.primitive.vma
        if rule is None:
            outs = [frozenset().union(*ins)] * len(eqn.outputs)
        else:
            avals = [a.aval.update(vma=m) for a, m in zip(eqn.inputs, ins)]
            outs = rule(*avals, **eqn.params)
        for o, m in zip(eqn.outputs, outs):
            env[o] = frozenset(m)
    return [read(a) for a in prog.out_atoms]


def call_vma(*avals, program, **_):
    """The varying-axes rule of a primitive that calls ``program`` on its operands."""
    return program_vma(program, [a.vma for a in avals])


def program_types(closed, in_avals) -> list:
    """The avals (with their manual-axes types: varying, unreduced, reduced) of
    ``closed``'s outputs when its inputs are typed as ``in_avals``: the body's own
    when those are the types it was traced with, else propagated through its
    equations by their rules."""
    prog = closed.program if isinstance(closed, ClosedProgram) else closed
    n_consts = len(closed.consts) if isinstance(closed, ClosedProgram) else 0
    args = prog.in_vars[n_consts:]

    def same(v, a):
        return (v.aval.vma, v.aval.unreduced, v.aval.reduced) == (a.vma, a.unreduced,
                                                                  a.reduced)
    if all(same(v, a) for v, a in zip(args, in_avals)):
        return [a.aval for a in prog.out_atoms]
    env = {v: v.aval.update(vma=a.vma, unreduced=a.unreduced, reduced=a.reduced)
           for v, a in zip(args, in_avals)}

    def read(a):
        return a.aval if isinstance(a, Literal) else env.get(a, a.aval)

    for eqn in prog.eqns:
        outs = abstract_eval(eqn.primitive, [read(a) for a in eqn.inputs], eqn.params)
        env.update(zip(eqn.outputs, outs))
    return [read(a) for a in prog.out_atoms]


def call_types(*avals, program, **_):
    """The unreduced and reduced rule of a primitive that calls ``program``."""
    prog = program.program if isinstance(program, ClosedProgram) else program
    outs = [a.aval for a in prog.out_atoms]
    if not any(a.unreduced or a.reduced for a in (*avals, *outs)):
        return [(frozenset(), frozenset())] * len(outs)  # (the common case: no marks)
    return [(a.unreduced, a.reduced) for a in program_types(program, avals)]

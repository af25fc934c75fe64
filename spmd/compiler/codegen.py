"""The executor: a program becomes one generated Python function.

Each equation becomes one line of straight-line code over the array module
``xp`` (numpy or cupy): either an inline expression from the primitive's
``emit`` rule (``c = xp.tanh(b)``) or a call of its ``impl`` with the static
parameters bound once at compile time.  Nothing is interpreted per call.

Example of generated code (``spmd.jit(f).lower(x).compile().source``)::

    def program(a, b):
        c = xp.matmul(a, b)
        d = xp.tanh(c)
        return [d]
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from spmd.compiler.ir import ClosedProgram, Literal, Program


class Executable:
    """A compiled program: call it with raw arrays, get a list of raw arrays."""

    __slots__ = ("fn", "source")

    def __init__(self, fn, source: str):
        self.fn = fn
        self.source = source

    def __call__(self, *args):
        return self.fn(*args)


def _names():
    for i in itertools.count():
        yield f"v{i}"


def compile_program(closed: ClosedProgram, xp=np, name: str = "program") -> Executable:
    """Generate and compile Python source for ``closed``; constants are bound in."""
    program = closed.program
    namespace: dict = {"xp": xp}
    lines: list[str] = []
    gen = _names()
    names: dict = {}
    const_ids = itertools.count()

    def const(val) -> str:
        key = f"_k{next(const_ids)}"
        namespace[key] = val
        return key

    def atom(a) -> str:
        if isinstance(a, Literal):
            return const(a.val)
        return names[a]

    n_consts = len(closed.consts)
    for v, val in zip(program.in_vars[:n_consts], closed.consts):
        names[v] = const(val)
    args = []
    for v in program.in_vars[n_consts:]:
        names[v] = next(gen)
        args.append(names[v])
    emit_eqns(program.eqns, xp, namespace, names, gen, const, atom, lines)
    # A constant returned as a result is copied: results must not alias the
    # buffers the compiled function keeps for its next call.
    const_names = {names[v] for v in program.in_vars[:n_consts]}
    outs = ", ".join(f"xp.array({n})" if n in const_names else n
                     for n in map(atom, program.out_atoms))
    src = f"def {name}({', '.join(args)}):\n" + "".join(f"    {ln}\n" for ln in lines)
    src += f"    return [{outs}]\n"
    exec(compile(src, f"<spmd:{name}>", "exec"), namespace)
    return Executable(namespace[name], src)


def emit_eqns(eqns, xp, namespace, names, gen, const, atom, lines) -> None:
    for i, eqn in enumerate(eqns):
        prim = eqn.primitive
        ins = [atom(a) for a in eqn.inputs]
        outs = []
        for v in eqn.outputs:
            names[v] = next(gen)
            outs.append(names[v])
        expr = prim.emit(ins, **eqn.params) if prim.emit is not None else None
        if expr is None:
            fn = functools.partial(prim.impl, xp, **eqn.params) if eqn.params else \
                functools.partial(prim.impl, xp)
            fname = f"_{prim.name}_{i}".replace("-", "_")
            namespace[fname] = fn
            expr = f"{fname}({', '.join(ins)})"
        if prim.multiple_results:
            lhs = (", ".join(outs) + ",") if outs else "_"
        else:
            lhs = outs[0]
        lines.append(f"{lhs} = {expr}")

"""A traced function cut in two by its outputs: the equations its first results need,
and the rest, with the values the rest reads from the first part passed between them.

A pipeline stage's backward gives two things: the cotangent of its input, which the
stage before is waiting for, and its parameters' gradient, which nobody waits for
inside the step.  Cut in two, the first part runs, its result goes to the neighbour,
and then the second part runs -- the neighbour starts its own backward a
weight-gradient's time sooner.  Nothing is computed twice: an equation the first
results need runs in the first part only, and every value of it the second part reads
is handed over (``carried``).

>>> first, rest = split(lambda w, x: (x @ w.T, x.T @ x), w, x)  # doctest: +SKIP
>>> y, carried = first(w, x)
>>> g = rest(carried)
"""

from __future__ import annotations

from typing import Callable

from spmd import tree_util
from spmd.compiler.core.ir import Program, Var
from spmd.compiler.core.jit import flatten_outputs
from spmd.compiler.passes.pipeline import has_effects
from spmd.compiler.core.trace import eval_program, get_aval, trace_to_program
from spmd.errors import OutputTypeError

__all__ = ["split"]


def split(fun: Callable, *args) -> tuple[Callable, Callable]:
    """Trace ``fun(*args)``, which returns a pair ``(first, rest)`` of pytrees, and cut
    it into ``first_part(*args) -> (first, carried)`` and ``rest_part(carried) -> rest``.

    ``first_part`` runs every equation ``first`` needs (and every effectful one, in
    order); ``rest_part`` runs the others that ``rest`` needs, reading ``carried`` (a
    tuple of arrays: the first part's values and the arguments the rest reads).  Call
    ``first_part`` with arguments of the types traced here (the same shapes, dtypes and
    varying axes), under any transformation; ``rest_part`` with what it returned.
    Values ``fun`` closes over are read as they were when it was traced.

    >>> first, rest = split(lambda a, b: (a * b, (a * b).sum() + b), a, b)  # doctest: +SKIP
    """
    leaves, in_tree = tree_util.tree_flatten(args)
    box: list = []

    def flat(*xs):
        pair = fun(*tree_util.tree_unflatten(in_tree, list(xs)))
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise OutputTypeError(f"split: the function must return a pair (first, rest), "
                                  f"got {type(pair).__name__}")
        first, f_tree = flatten_outputs(pair[0], "split's function (first)")
        rest, r_tree = flatten_outputs(pair[1], "split's function (rest)")
        box[:] = [f_tree, r_tree, len(first)]
        return first + rest

    closed = trace_to_program(flat, [get_aval(x) for x in leaves])
    f_tree, r_tree, n_first = box
    prog, consts = closed.program, closed.consts
    first_eqns, rest_eqns = _cut(prog.eqns, prog.out_atoms[:n_first], prog.out_atoms[n_first:])
    const_vars = prog.in_vars[:len(consts)]
    carried = _read_from_outside(rest_eqns, prog.out_atoms[n_first:], set(const_vars))
    first_prog = Program(prog.in_vars, first_eqns, prog.out_atoms[:n_first] + carried)
    rest_prog = Program(const_vars + carried, rest_eqns, prog.out_atoms[n_first:])

    def first_part(*call_args):
        outs = eval_program(first_prog, *tree_util.tree_leaves(call_args), consts=consts)
        return tree_util.tree_unflatten(f_tree, outs[:n_first]), tuple(outs[n_first:])

    def rest_part(carried_values):
        outs = eval_program(rest_prog, *carried_values, consts=consts)
        return tree_util.tree_unflatten(r_tree, outs)

    # The types of the first part's results, then of ``carried`` (a caller making
    # stand-ins of the same types: zeros where the part does not run).
    first_part.out_avals = [a.aval for a in first_prog.out_atoms]
    return first_part, rest_part


def _cut(eqns: list, first_outs: list, rest_outs: list) -> tuple[list, list]:
    """The equations ``first_outs`` need (and the effectful ones, with what they read),
    and those only ``rest_outs`` need, each in program order."""
    def needed(outs, effects):
        live = {a for a in outs if isinstance(a, Var)}
        keep = set()
        for k in range(len(eqns) - 1, -1, -1):
            eqn = eqns[k]
            if (effects and has_effects(eqn)) or any(o in live for o in eqn.outputs):
                keep.add(k)
                live.update(a for a in eqn.inputs if isinstance(a, Var))
        return keep

    first = needed(first_outs, effects=True)
    rest = needed(rest_outs, effects=False) - first
    return ([e for k, e in enumerate(eqns) if k in first],
            [e for k, e in enumerate(eqns) if k in rest])


def _read_from_outside(eqns: list, outs: list, consts: set) -> list:
    """The variables ``eqns`` and ``outs`` read that ``eqns`` do not define (nor are
    constants): what the first part hands over, each once, in first-read order."""
    defined = {o for e in eqns for o in e.outputs}
    seen: dict = {}
    for a in [a for e in eqns for a in e.inputs] + list(outs):
        if isinstance(a, Var) and a not in defined and a not in consts:
            seen.setdefault(a, None)
    return list(seen)

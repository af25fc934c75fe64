"""Program helpers shared by the control-flow primitives (``cond`` in
``control_cond.py``, ``scan`` in ``control_scan.py``, ``while`` in
``control_while.py``).

Their rules transform the sub-programs in their parameters as whole programs (the
jvp of a cond is a cond of the branches' jvps, and so on): these helpers trace,
differentiate, batch, transpose and prune such programs, and split a loop's operands
into their groups.

Sub-programs in the parameters of control-flow primitives hold only concrete
constants, never tracers: the ``spmd.lax`` wrappers turn the values a body
closes over into operands, and the rules only trace bodies whose inputs are all
program inputs.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler import extensions as _ext
from spmd.compiler.transforms.ad_util import Zero, instantiate, is_zero
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.core.manual_types import ct_aval
from spmd.compiler.core.trace import (Tracer, eval_program, full_raise, get_aval,
                                      trace_to_program)
from spmd.compiler.ops import elementwise, structural
from spmd.errors import ProgramTypeError
# A module, not names: batching imports spmd.compiler.ops, so importing it first loads
# this module while batching is half made.
from spmd.compiler.transforms import batching


# ---------------------------------------------------------------- programs

def trace_closed(fun, avals) -> ClosedProgram:
    """Trace a rule's body; its inputs are the only tracers it may see."""
    closed = trace_to_program(fun, avals)
    assert not any(isinstance(c, Tracer) for c in closed.consts), \
        "a control-flow rule captured a traced value as a constant"
    return closed


def cast_to(x, aval: ShapedArray):
    """``x`` converted to ``aval``'s dtype and weak type (a no-op when they agree), and
    typed reduced (unreduced) where ``aval`` is and ``x`` is not (a loop's tangent or
    cotangent carry made from zeros, or from a value of another type)."""
    av = get_aval(x)
    if av.dtype != aval.dtype or av.weak_type != aval.weak_type:
        x = elementwise.convert(x, aval.dtype, aval.weak_type)
        av = get_aval(x)
    reduced = aval.reduced - av.reduced - av.vma
    if reduced:
        x = _ext.PREDUCED.fn(x, tuple(sorted(reduced)))
    unreduced = aval.unreduced - get_aval(x).unreduced
    return _ext.SUMMANDS.fn(x, tuple(sorted(unreduced))) if unreduced else x


def is_float_aval(aval) -> bool:
    return dtypes.is_inexact(aval.dtype)


def has_tangent(t) -> bool:
    """A tangent that may be non-zero (float0 and symbolic zeros never are)."""
    return not is_zero(t) and dtypes.is_inexact(get_aval(t).dtype)


def zero_tangent(aval) -> Zero:
    return Zero(tangent_aval(aval))


def permute(closed: ClosedProgram, in_order, out_order) -> ClosedProgram:
    """The same program with its (non-constant) inputs and its outputs reordered."""
    prog = closed.program
    n = len(closed.consts)
    args = prog.in_vars[n:]
    new = Program(prog.in_vars[:n] + [args[i] for i in in_order], prog.eqns,
                  [prog.out_atoms[i] for i in out_order])
    return ClosedProgram(new, closed.consts)


def interleave_order(sizes, extra):
    """Order that turns ``[g0, g1, .., e0, e1, ..]`` into ``[g0, e0, g1, e1, ..]``.

    ``sizes[k]`` and ``extra[k]`` are the lengths of group k in the first and
    second half (primals then tangents -> primal/tangent pairs per group).
    """
    order, base, ebase = [], 0, sum(sizes)
    for s, e in zip(sizes, extra):
        order += list(range(base, base + s)) + list(range(ebase, ebase + e))
        base += s
        ebase += e
    return order


def jvp_program(closed: ClosedProgram, nonzero, instantiate_out):
    """The jvp of ``closed`` as a program: ``(primals, nonzero tangents) ->
    (primal outs, tangent outs that are non-zero)``.

    ``instantiate_out[k]`` forces output k's tangent to be materialised (when
    it is a float).  Returns ``(program, out_nonzero)``.
    """
    # (inner: transforms.ad imports the pass pipeline, which loads spmd.compiler.ops)
    from spmd.compiler.transforms.ad import jvp_flat

    avals = closed.in_avals
    t_avals = [tangent_aval(a) for a, nz in zip(avals, nonzero) if nz]
    out_avals = closed.out_avals
    out_nz: list = []

    def fun(*args):
        primals = list(args[:len(avals)])
        it = iter(args[len(avals):])
        tangents = [next(it) if nz else zero_tangent(a) for a, nz in zip(avals, nonzero)]
        outs, touts = jvp_flat(lambda *a: eval_program(closed, *a), primals, tangents)
        res = []
        for t, inst, aval in zip(touts, instantiate_out, out_avals):
            if not is_float_aval(aval):
                t = zero_tangent(aval)
            elif is_zero(t) and inst:
                t = instantiate(t)
            res.append(t)
        out_nz[:] = [not is_zero(t) for t in res]
        return [cast_to(o, a) for o, a in zip(outs, out_avals)] + [
            cast_to(t, tangent_aval(a)) for t, a in zip(res, out_avals) if not is_zero(t)]

    prog = trace_closed(fun, list(avals) + t_avals)
    return prog, list(out_nz)


def batch_eval(closed: ClosedProgram, args, batched, size, axis_name, force):
    """Evaluate ``closed`` batched (batched args have the batch axis at 0).

    Outputs that are batched, or forced (``force[k]``), come back with the batch
    axis at 0.  Returns ``(outs, out_batched)``.
    """
    # Under the level's own axis names: collectives in the body communicate.
    with batching.batch_level(axis_name, size) as trace:
        tracers = [batching.BatchTracer(trace, a, 0) if b else a for a, b in zip(args, batched)]
        outs = [full_raise(trace, o) for o in eval_program(closed, *tracers)]
        res, out_b = [], []
        for o, f in zip(outs, force):
            if o.bdim is None and not f:
                res.append(o.val)
                out_b.append(False)
            else:
                res.append(batching.broadcast_batch(o.val, o.bdim, size))
                out_b.append(True)
    return res, out_b


def batch_program(closed: ClosedProgram, batched, size, axis_name, force):
    """``closed`` batched as a program; returns ``(program, out_batched)``."""
    avals = [a.update(shape=(size,) + a.shape) if b else a
             for a, b in zip(closed.in_avals, batched)]
    box: list = []

    def fun(*args):
        outs, out_b = batch_eval(closed, args, batched, size, axis_name, force)
        box[:] = out_b
        return outs

    prog = trace_closed(fun, avals)
    return prog, list(box)


def transpose_program(closed: ClosedProgram, linear, ct_nonzero, extra_residuals=()):
    """The transpose of ``closed`` w.r.t. its inputs marked ``linear``.

    The result maps ``(non-linear inputs, non-zero output cotangents)`` to one
    (materialised) cotangent per linear input.
    """
    # (inner: transforms.ad imports the pass pipeline, which loads spmd.compiler.ops)
    from spmd.compiler.transforms.ad import backward_pass

    prog = closed.program
    n = len(closed.consts)
    args = prog.in_vars[n:]
    res_vars = [v for v, l in zip(args, linear) if not l]
    lin_vars = [v for v, l in zip(args, linear) if l]
    reordered = Program(prog.in_vars[:n] + res_vars + lin_vars, prog.eqns, prog.out_atoms)
    ct_avals = [ct_aval(a) for a, nz in zip(closed.out_avals, ct_nonzero) if nz]

    def fun(*a):
        res = list(closed.consts) + list(a[:len(res_vars)])
        it = iter(a[len(res_vars):])
        cts = [next(it) if nz else zero_tangent(av)
               for av, nz in zip(closed.out_avals, ct_nonzero)]
        cts_in = backward_pass(reordered, res, [v.aval for v in lin_vars], cts)
        return [cast_to(instantiate(c), ct_aval(v.aval)) for c, v in zip(cts_in, lin_vars)]

    return trace_closed(fun, [v.aval for v in res_vars] + ct_avals)


def zeros_eqn(aval: ShapedArray):
    """``(atom, eqns)`` computing zeros of ``aval`` inside a program being rewritten."""
    scalar = Literal(np.zeros((), aval.dtype)[()], ShapedArray((), aval.dtype, aval.weak_type))
    if aval.shape == ():
        return scalar, []
    out = Var(aval)
    return out, [Eqn(structural.broadcast_in_dim_p, [scalar], [out],
                     dict(shape=aval.shape, broadcast_dimensions=()))]


def dce_closed(closed: ClosedProgram, used_outputs):
    """DCE of a sub-program; returns ``(closed, used non-constant inputs)``."""
    # (inner: the pass pipeline loads spmd.compiler.ops, this module with it)
    from spmd.compiler.passes.pipeline import dce_program

    prog, used = dce_program(closed.program, used_outputs)
    return ClosedProgram(prog, closed.consts), used[len(closed.consts):]


def drop_inputs(closed: ClosedProgram, keep) -> ClosedProgram:
    """``closed`` without the (unused) non-constant inputs where ``keep`` is False."""
    prog = closed.program
    n = len(closed.consts)
    args = [v for v, k in zip(prog.in_vars[n:], keep) if k]
    return ClosedProgram(Program(prog.in_vars[:n] + args, prog.eqns, prog.out_atoms),
                         closed.consts)


def same_type(a: ShapedArray, b: ShapedArray) -> bool:
    """Equal shapes and dtypes (weak types and varying axes aside)."""
    return a.shape == b.shape and a.dtype == b.dtype


def check_avals(fname: str, what: str, got, want) -> None:
    """Internal invariant of the control-flow primitives: operand types fit the body."""
    if len(got) != len(want) or not all(same_type(g, w) for g, w in zip(got, want)):
        raise ProgramTypeError(f"{fname}: {what} have types {list(got)} but the body program "
                               f"expects {list(want)}")


# ---------------------------------------------------------- loop operands

def split_groups(xs, *sizes):
    """``xs`` cut into groups of ``sizes`` and the rest (a loop's operands into its
    constants, carries and the rest)."""
    out, i = [], 0
    for s in sizes:
        out.append(list(xs[i:i + s]))
        i += s
    out.append(list(xs[i:]))
    return out


def or_each(a, b):
    """Elementwise ``or`` of two lists of flags."""
    return [x or y for x, y in zip(a, b)]


def carry_fixpoint(vmas_of, init_vmas):
    """The carries' varying axes: the least types that the loop keeps (a carry
    varies where its initial value does or where the body makes it vary)."""
    carry = [frozenset(m) for m in init_vmas]
    while True:  # grows monotonically over a finite set of axes
        outs = vmas_of(carry)
        grown = [c | o for c, o in zip(carry, outs)]
        if grown == carry:
            return carry, outs
        carry = grown

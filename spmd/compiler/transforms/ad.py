"""Automatic differentiation: jvp, partial evaluation, transposition.

Reverse mode is JAX's design (no tape): trace the jvp of a function into a
program, split it by partial evaluation into a *known* part (the primal
computation, run now) and an *unknown* part that is linear in the tangents,
then transpose that linear part (``backward_pass``).  Because transposition
works on programs, a collective's transpose rule (JEP 17111) applies as is.
"""

from __future__ import annotations

import operator
from typing import Callable

import numpy as np

from spmd.compiler.transforms.ad_util import UndefinedPrimal, Zero, add_tangents, instantiate
from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import (bind, eval_program, full_lower, full_raise, get_aval, new_main,
                                 to_array_value, Trace, trace_to_program, Tracer, wrap_value)
from spmd.errors import SpmdError
from spmd import tree_util
from spmd.compiler.passes.pipeline import dce_program, inline_calls


# ---------------------------------------------------------------------- jvp

class JVPTracer(Tracer):
    __slots__ = ("primal", "tangent")

    def __init__(self, trace, primal, tangent):
        self._trace = trace
        self.primal = primal
        self.tangent = tangent

    @property
    def aval(self):
        return get_aval(self.primal)

    def full_lower(self):
        return self  # a tangent may be non-zero: never lower

    # Outside jit the primal is concrete, and Python may branch on it, as in JAX
    # (a traced primal raises its own error).  The derivative does not flow
    # through these conversions.
    def __bool__(self):
        return bool(self.primal)

    def __int__(self):
        return int(self.primal)

    def __float__(self):
        return float(self.primal)

    def __index__(self):
        return operator.index(self.primal)


class JVPTrace(Trace):
    def pure(self, val):
        return JVPTracer(self, val, Zero(tangent_aval(get_aval(val))))

    lift = pure

    def process_primitive(self, prim, tracers, params):
        if prim.jvp is None:
            raise NotImplementedError(f"differentiation of '{prim.name}' is not supported "
                                      "(it has no jvp rule)")
        primals = [t.primal for t in tracers]
        tangents = [t.tangent for t in tracers]
        out_p, out_t = prim.jvp(primals, tangents, **params)
        if not prim.multiple_results:
            out_p, out_t = [out_p], [out_t]
        return [JVPTracer(self, p, t) for p, t in zip(out_p, out_t)]


def as_array(x):
    """A concrete value as an Array (Python scalars and numpy values have no aval of
    their own for the jvp rules to read); Arrays and tracers as they are."""
    if isinstance(x, (Tracer, Array)):
        return x
    aval = get_aval(x)
    return wrap_value(to_array_value(x, aval), aval)


def jvp_flat(fun: Callable, primals, tangents):
    """Forward mode on flat lists; tangents may be :class:`Zero`. Returns flat lists."""
    primals = [as_array(p) for p in primals]
    with new_main(JVPTrace) as main:
        trace = JVPTrace(main)
        tracers = [JVPTracer(trace, p, t) for p, t in zip(primals, tangents)]
        outs = fun(*tracers)
        outs = [full_raise(trace, o) for o in outs]
        return [full_lower(o.primal) for o in outs], [
            o.tangent if isinstance(o.tangent, Zero) else full_lower(o.tangent) for o in outs]


# ------------------------------------------------------- partial evaluation

def partial_eval(closed: ClosedProgram, unknown_ins):
    """Split a program into the part computable from its known inputs and the rest.

    Returns ``(known, unknown, out_unknown, n_res)``: ``known`` maps the known
    inputs to the known outputs followed by ``n_res`` residuals; ``unknown``
    maps (residuals, unknown inputs) to the unknown outputs.  Equations of
    higher-order primitives may provide a ``partial_eval`` rule
    ``rule(eqn, in_unknown) -> (known_eqn or None, unknown_eqn, out_unknown)``
    that splits them in two (all outputs of ``unknown_eqn`` are unknown; the
    known equation defines the others); otherwise an equation with any unknown
    input is unknown.
    """
    closed = inline_calls(closed)
    program = closed.program
    n_consts = len(closed.consts)
    unknown = set(v for v, u in zip(program.in_vars[n_consts:], unknown_ins) if u)
    known_eqns, unknown_eqns = [], []
    for eqn in program.eqns:
        if not any(isinstance(a, Var) and a in unknown for a in eqn.inputs):
            known_eqns.append(eqn)
            continue
        rule = eqn.primitive.rules.partial_eval
        if rule is not None:
            in_unknown = [isinstance(a, Var) and a in unknown for a in eqn.inputs]
            eqn_known, eqn_unknown, out_unknown = rule(eqn, in_unknown)
            if eqn_known is not None:
                known_eqns.append(eqn_known)
            unknown_eqns.append(eqn_unknown)
            unknown.update(eqn_unknown.outputs)
            continue
        unknown_eqns.append(eqn)
        unknown.update(eqn.outputs)
    out_unknown = [isinstance(a, Var) and a in unknown for a in program.out_atoms]
    # Residuals: known variables that the unknown side reads.
    defined_unknown = set(unknown)
    for e in unknown_eqns:
        defined_unknown.update(e.outputs)
    residuals, seen = [], set()
    for e in unknown_eqns:
        for a in e.inputs:
            if isinstance(a, Var) and a not in defined_unknown and a not in seen:
                seen.add(a)
                residuals.append(a)
    for a, u in zip(program.out_atoms, out_unknown):
        if not u and isinstance(a, Var) and a not in seen:
            seen.add(a)
            residuals.append(a)
    known_in = program.in_vars[:n_consts] + [
        v for v, u in zip(program.in_vars[n_consts:], unknown_ins) if not u]
    known_outs = [a for a, u in zip(program.out_atoms, out_unknown) if not u]
    known = ClosedProgram(Program(known_in, known_eqns, known_outs + residuals), closed.consts)
    unknown_in = residuals + [v for v, u in zip(program.in_vars[n_consts:], unknown_ins) if u]
    unknown_prog = Program(unknown_in, unknown_eqns, list(program.out_atoms))
    return known, unknown_prog, out_unknown, len(residuals)


# ---------------------------------------------------------------- transpose

def backward_pass(program: Program, residuals, linear_avals, cts_out):
    """Transpose ``program`` (inputs: residuals then linear inputs) at ``cts_out``.

    Equations that read no linear variable are evaluated forward first (they
    recompute values the residuals did not carry); the rest are transposed in
    reverse order.  Returns one cotangent per linear input (``Zero`` where none).
    """
    n_res = len(residuals)
    env: dict = dict(zip(program.in_vars[:n_res], residuals))
    linear = set(program.in_vars[n_res:])
    lin_eqns = []
    for eqn in program.eqns:
        if any(isinstance(a, Var) and a in linear for a in eqn.inputs):
            linear.update(eqn.outputs)
            lin_eqns.append(eqn)
            continue
        outs = bind(eqn.primitive, *[_read(env, a) for a in eqn.inputs], **eqn.params)
        env.update(zip(eqn.outputs, outs if eqn.primitive.multiple_results else [outs]))

    ct_env: dict = {}

    def write_ct(v, ct):
        if isinstance(v, Var) and v in linear and ct is not None and not isinstance(ct, Zero):
            ct_env[v] = add_tangents(ct_env[v], ct) if v in ct_env else ct

    for a, ct in zip(program.out_atoms, cts_out):
        write_ct(a, ct)
    for eqn in reversed(lin_eqns):
        cts = [ct_env.pop(o, None) for o in eqn.outputs]
        if all(c is None for c in cts):
            continue
        cts = [Zero(tangent_aval(o.aval)) if c is None else c for o, c in zip(eqn.outputs, cts)]
        args = [UndefinedPrimal(a.aval) if isinstance(a, Var) and a in linear else _read(env, a)
                for a in eqn.inputs]
        rule = eqn.primitive.transpose
        if rule is None:
            raise NotImplementedError(f"reverse-mode differentiation of '{eqn.primitive.name}' "
                                      "is not supported (it has no transpose rule)")
        cts_in = rule(cts if eqn.primitive.multiple_results else cts[0], *args, **eqn.params)
        for a, ct in zip(eqn.inputs, cts_in):
            write_ct(a, ct)
    return [ct_env.get(v, Zero(tangent_aval(v.aval))) for v in program.in_vars[n_res:]]


def _read(env, a):
    return a.val if isinstance(a, Literal) else env[a]


# ---------------------------------------------------------------- linearize

class LinearFunction:
    """The linear part of a function at a point: residuals plus a linear program."""

    def __init__(self, program: Program, residuals, in_avals, out_avals, out_zero):
        self.program = program
        self.residuals = residuals
        self.in_avals = in_avals  # tangent avals of the differentiated inputs
        self.out_avals = out_avals  # tangent avals of all outputs
        self.out_zero = out_zero  # outputs whose tangent is symbolically zero

    def jvp(self, tangents):
        outs = eval_program(self.program, *self.residuals, *tangents)
        res = []
        it = iter(outs)
        for z, aval in zip(self.out_zero, self.out_avals):
            res.append(zeros_for(aval) if z else next(it))
        return res

    def transpose(self, cts):
        cts = [c for c, z in zip(cts, self.out_zero) if not z]
        return backward_pass(self.program, self.residuals, self.in_avals, cts)


def zeros_for(aval: ShapedArray):
    """A concrete (or traced) zero tangent of type ``aval``; float0 has no data."""
    if aval.dtype == np.dtype([("float0", np.void, 0)]):
        return np.zeros(aval.shape, aval.dtype)
    return instantiate(Zero(aval))


def linearize_flat(fun: Callable, primals, diff_mask, eager: bool = False):
    """Linearize ``fun`` (flat in, flat out) at ``primals`` w.r.t. the inputs in ``diff_mask``.

    Returns ``(primal_outs, LinearFunction)``.  With ``eager`` and concrete primals
    (not under jit), the primal computation runs on concrete values, so Python
    control flow on them works (``ad_concrete.py``).
    """
    # (ad_concrete is built on this module: it is read when asked for.)
    from spmd.compiler.transforms.ad_concrete import can_linearize_eagerly, linearize_eager

    if eager and can_linearize_eagerly(primals):
        return linearize_eager(fun, primals, diff_mask)
    avals = [get_aval(p) for p in primals]
    diff_avals = [tangent_aval(a) for a, d in zip(avals, diff_mask) if d]
    zero_mask: list = []

    def jvp_fun(*args):
        ps = list(args[:len(avals)])
        ts = iter(args[len(avals):])
        tangents = [next(ts) if d else Zero(tangent_aval(a)) for a, d in zip(avals, diff_mask)]
        out_p, out_t = jvp_flat(fun, ps, tangents)
        zero_mask[:] = [isinstance(t, Zero) for t in out_t]
        return out_p + [t for t in out_t if not isinstance(t, Zero)]

    closed = trace_to_program(jvp_fun, avals + diff_avals)
    n_out = len(zero_mask)
    unknown_ins = [False] * len(avals) + [True] * len(diff_avals)
    known, unknown, out_unknown, n_res = partial_eval(closed, unknown_ins)
    n_known_out = sum(not u for u in out_unknown)
    # The primal outputs must be known (they cannot depend on tangents).
    assert not any(out_unknown[:n_out]), "primal output depends on a tangent"
    outs = eval_program(known, *primals)
    primal_outs, residuals = outs[:n_out], outs[n_known_out:]
    # Tangent outputs that are known (do not depend on tangent inputs) are
    # constants of the linear program: feed them as residuals.
    lin_program = Program(unknown.in_vars, unknown.eqns, unknown.out_atoms[n_out:])
    lin_program, _ = dce_program(lin_program)
    out_avals = [tangent_aval(get_aval(p)) for p in primal_outs]
    return primal_outs, LinearFunction(lin_program, residuals, diff_avals, out_avals, zero_mask)


# ------------------------------------------------------------ stop_gradient

stop_gradient_p = Primitive("stop_gradient", traits=())
stop_gradient_p.unreduced = "keep"
stop_gradient_p.def_impl(lambda xp, x: x)
stop_gradient_p.def_abstract_eval(lambda x: x)
stop_gradient_p.def_emit(lambda ins: ins[0])
stop_gradient_p.def_batch(lambda args, dims: (stop_gradient_p.bind(args[0]), dims[0]))


@stop_gradient_p.def_jvp
def _stop_gradient_jvp(primals, tangents):
    out = stop_gradient_p.bind(primals[0])
    return out, Zero(tangent_aval(get_aval(out)))


def stop_gradient(x):
    """The identity whose derivative is zero (a pytree of arrays is accepted)."""
    return tree_util.tree_map(lambda a: stop_gradient_p.bind(a), x)

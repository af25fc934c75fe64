"""Linearize with concrete primal values: Python control flow under ``grad``.

Outside ``jit``, JAX evaluates the primal computation of ``grad``/``vjp``/
``linearize`` concretely, so ``if x < 3:`` works in a differentiated function
(the autodiff cookbook relies on it).  Here the function runs once under a jvp
trace whose primal values are concrete Arrays, evaluated operation by
operation as they come, while the tangents are tracers of a program trace that
is *not* dynamic: an operation on concrete values runs now, one that touches a
tangent is staged.  ``bool``/``int``/``float`` of a jvp tracer read its
concrete primal (``JVPTracer`` in ``ad.py``).

A higher-order primitive (``jit``, ``scan``, ``cond``, ``shard_map``, ...)
whose jvp mixes primal values and tangents in one equation is split on the
spot by partial evaluation (JAX's online partial evaluation): its known part
runs now, giving concrete primal results and residuals, and only its unknown
part is staged.  So a ``jit``-compiled helper inside a differentiated
function returns concrete values too.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from spmd.compiler.transforms.ad import JVPTracer, LinearFunction, jvp_flat, partial_eval
from spmd.compiler.transforms.ad_util import Zero
from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import tangent_aval
from spmd.compiler.core.ir import Program, Var
from spmd.compiler.core.trace import (bind, dynamic_trace, eval_program, full_raise, get_aval, new_main,
                                 ProgramBuilder, ProgramTrace, ProgramTracer, trace_to_program,
                                 Tracer)
from spmd.compiler.passes.pipeline import dce_program


def can_linearize_eagerly(primals) -> bool:
    """No staging transformation is active (not under jit) and the primal values are
    data: concrete, or the concrete-primal jvp tracers of an enclosing eager grad."""
    return dynamic_trace() is None and all(
        not isinstance(p, Tracer) or isinstance(p, JVPTracer) for p in primals)


def linearize_eager(fun: Callable, primals, diff_mask):
    """``linearize_flat`` for concrete primals: ``(primal_outs, LinearFunction)``."""
    avals = [get_aval(p) for p in primals]
    diff_avals = [tangent_aval(a) for a, d in zip(avals, diff_mask) if d]
    # numpy inputs are copied once: the residuals must not change if the caller
    # mutates them before calling the pullback.
    primals = [Array(np.array(p, copy=True), get_aval(p)) if isinstance(p, np.ndarray) else p
               for p in primals]
    builder = _EagerBuilder()
    with new_main(_OnlineTrace, builder, dynamic=False) as main:
        trace = _OnlineTrace(main)
        t_in = [trace.new_arg(a) for a in diff_avals]
        it = iter(t_in)
        tangents = [next(it) if d else Zero(tangent_aval(a)) for a, d in zip(avals, diff_mask)]
        out_p, out_t = jvp_flat(fun, list(primals), tangents)
        zero_mask = [isinstance(t, Zero) for t in out_t]
        # Primal outputs of staged higher-order primitives are tracers of this trace.
        staged = [i for i, p in enumerate(out_p) if _mine(p, main)]
        outs = [out_p[i] for i in staged] + [t for t in out_t if not isinstance(t, Zero)]
        closed = builder.build([t.var for t in t_in], [full_raise(trace, o) for o in outs])
    known, unknown, out_unknown, n_res = partial_eval(closed, [True] * len(diff_avals))
    if any(out_unknown[:len(staged)]):
        raise AssertionError("a primal output depends on a tangent")
    kouts = eval_program(known)
    n_known_out = sum(not u for u in out_unknown)
    primal_outs = list(out_p)
    for i, v in zip(staged, kouts[:len(staged)]):
        primal_outs[i] = v
    residuals = kouts[n_known_out:]
    lin_program, _ = dce_program(Program(unknown.in_vars, unknown.eqns,
                                         unknown.out_atoms[len(staged):]))
    out_avals = [tangent_aval(get_aval(p)) for p in primal_outs]
    return primal_outs, LinearFunction(lin_program, residuals, diff_avals, out_avals, zero_mask)


def _mine(x, main) -> bool:
    return isinstance(x, Tracer) and x._trace.main is main


class _EagerBuilder(ProgramBuilder):
    """Keeps concrete Arrays as they are: the values computed here are fresh buffers
    nobody else holds (a jit program's builder copies, as a cached program must)."""

    def new_const(self, trace, val):
        if not isinstance(val, Array):
            return super().new_const(trace, val)
        key = id(val)
        t = self._const_tracers.get(key)
        if t is None:
            self._keepalive.append(val)
            t = ProgramTracer(trace, val.aval, Var(val.aval))
            self.const_vars.append(t.var)
            self.const_vals.append(val)
            self._const_tracers[key] = t
        return t


class _OnlineTrace(ProgramTrace):
    """Stages tangent computations; a higher-order primitive with both known
    (constant) and unknown operands is partially evaluated now."""

    def process_primitive(self, prim, tracers, params):
        b = self.builder
        if not prim.higher_order or getattr(b, "staging_unknown", False):
            return super().process_primitive(prim, tracers, params)
        consts = dict(zip(b.const_vars, b.const_vals))
        known = [t.var in consts for t in tracers]
        if all(known) or not any(known):
            return super().process_primitive(prim, tracers, params)
        return self._split(prim, tracers, params, [consts.get(t.var) for t in tracers], known)

    def _split(self, prim, tracers, params, values, known):
        def one(*xs):
            out = bind(prim, *xs, **params)
            return list(out) if prim.multiple_results else [out]

        closed = trace_to_program(one, [t.aval for t in tracers])
        k_prog, u_prog, out_unknown, n_res = partial_eval(closed, [not k for k in known])
        k_outs = eval_program(k_prog, *[v for v, k in zip(values, known) if k])
        n_known = sum(not u for u in out_unknown)
        res = [self.pure(r) for r in k_outs[n_known:]]
        # The unknown part is staged as it is (splitting it again would not end).
        self.builder.staging_unknown = True
        try:
            u_outs = eval_program(u_prog, *res, *[t for t, k in zip(tracers, known) if not k])
        finally:
            self.builder.staging_unknown = False
        it = iter(k_outs[:n_known])
        # Known results are returned as values: the primal stays concrete.
        return [o if u else next(it) for o, u in zip(u_outs, out_unknown)]

"""Tracing: the trace stack, eager evaluation, ``bind`` and program building.

The tracers and the values they stand for (avals, buffers, abstract evaluation) are
:mod:`spmd.compiler.core.tracer`'s.

This is the Autodidax design: each transformation is a ``Trace`` whose tracers
box values; ``bind`` hands a primitive application to the highest-level trace
among its arguments (or to the dynamic trace, so that program building also
captures operations on constants).
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np

from spmd.compiler.core import array_module as _am
from spmd.compiler.core.communication import collective_axes
from spmd.compiler import extensions as _ext
from spmd.compiler.core import manual_types as _mt
from spmd.compiler.core.array import Array
from spmd.compiler.core.ir import ClosedProgram, Eqn, Literal, Program, SourceInfo, Var
from spmd.compiler.core.tracer import Tracer, abstract_eval, get_aval, to_array_value, wrap_value
from spmd.errors import SpmdError


# --------------------------------------------------------------- trace stack

class MainTrace:
    __slots__ = ("level", "trace_type", "global_data")

    def __init__(self, level, trace_type, global_data):
        self.level = level
        self.trace_type = trace_type
        self.global_data = global_data

    def __repr__(self):
        return f"MainTrace({self.level}, {self.trace_type.__name__})"


class Trace:
    def __init__(self, main: MainTrace):
        self.main = main

    def pure(self, val):
        raise NotImplementedError

    lift = pure

    def process_primitive(self, prim, tracers, params):
        raise NotImplementedError


class EvalTrace(Trace):
    """Applies primitives to concrete values right away."""

    def pure(self, val):
        return val

    lift = pure

    def process_primitive(self, prim, args, params):
        # An upper layer's array among the arguments (a placed ShardedArray), or a
        # higher-order primitive (its programs may hold equations the compiler cannot
        # run): the upper layer evaluates it where it needs to (extensions.EAGER_EVAL).
        if prim.higher_order:
            outs = _ext.EAGER_EVAL.fn(prim, args, params)
            if outs is not None:
                return outs
        else:
            for a in args:
                if type(a) is not Array and isinstance(a, Array):
                    outs = _ext.EAGER_EVAL.fn(prim, args, params)
                    if outs is not None:
                        return outs
                    break
        return eval_plain(prim, args, params)


def eval_plain(prim, args, params) -> list:
    """``prim``'s implementation on the arguments' buffers, as plain Arrays."""
    # numpy, or cupy when the devices are GPUs (resolved before the values are
    # converted: to_array_value moves host values to the device then).
    xp = _am._xp[0] or _am.current()
    avals_in = [get_aval(a) for a in args]
    avals_out = abstract_eval(prim, avals_in, params)
    vals = [to_array_value(a, av) for a, av in zip(args, avals_in)]
    outs = prim.impl(xp, *vals, **params)
    if not prim.multiple_results:
        outs = (outs,)
    return [wrap_value(o, av) for o, av in zip(outs, avals_out)]


class _TraceState(threading.local):
    """The tracing state of one thread (as JAX keeps it): the stack of active
    transformations, the dynamic (program-building) traces and the named axes in
    scope.  Per thread, so that threads tracing at once never see each other's
    transformations (a shared stack mixed them up: tracers of one thread's trace
    were lifted into another's program)."""

    def __init__(self):
        self.stack: list[MainTrace] = [MainTrace(0, EvalTrace, None)]
        self.dynamic: list[MainTrace | None] = [None]
        self.axis_env: list[AxisScope] = []
        self.equations: list = []  # the equations eval_program evaluates, innermost last
        self.functions: list[str] = []  # the jitted calls being prepared (see preparing)


_state = _TraceState()


def dynamic_trace() -> MainTrace | None:
    return _state.dynamic[-1]


def is_eager() -> bool:
    """True when no transformation is active (the jit fast path can run)."""
    st = _state
    return len(st.stack) == 1 and st.dynamic[-1] is None


@contextmanager
def new_main(trace_type, global_data=None, dynamic: bool = False):
    st = _state
    main = MainTrace(len(st.stack), trace_type, global_data)
    st.stack.append(main)
    if dynamic:
        st.dynamic.append(main)
    try:
        yield main
    finally:
        if dynamic:
            st.dynamic.pop()
        st.stack.pop()


# --------------------------------------------------------------------- bind

def find_top_trace(args) -> Trace:
    st = _state
    top = st.stack[0]
    for x in args:
        if isinstance(x, Tracer) and x._trace.main.level > top.level:
            top = x._trace.main
    dyn = st.dynamic[-1]
    if dyn is not None and dyn.level > top.level:
        top = dyn
    return top.trace_type(top)


def full_raise(trace: Trace, val):
    if not isinstance(val, Tracer):
        return trace.pure(val)
    main = val._trace.main
    if main is trace.main:
        return val
    if main.level < trace.main.level:
        stack = _state.stack
        # Only a transformation still active in this thread may be lifted from: a
        # tracer of a finished trace, or of another thread's, has no value here.
        if main.level < len(stack) and stack[main.level] is main:
            return trace.lift(val)
    raise SpmdError(
        f"a traced value {val.aval} escaped the transformation that created it (it was "
        "stored outside the function, e.g. in a global or a closure, and used later); "
        "return it from the function instead")


def full_lower(val):
    return val.full_lower() if isinstance(val, Tracer) else val


def bind(prim, *args, **params):
    """Apply ``prim`` to ``args`` under the right trace."""
    trace = find_top_trace(args)
    if prim.rules.batch_needs_axis:
        # A collective belongs to the level of its axes even when no argument is
        # traced there (axis_index has none; psum of a constant is a product); so
        # does a higher-order primitive whose body holds one.
        axes = params.get("axes", ())
        if prim.higher_order and _state.axis_env:
            axes = collective_axes(params)
        for a in axes:
            scope = axis_scope(a)
            if scope is not None and scope.main is not None and \
                    scope.main.level > trace.main.level:
                trace = scope.main.trace_type(scope.main)
    tracers = [full_raise(trace, a) for a in args]
    outs = trace.process_primitive(prim, tracers, params)
    if prim.multiple_results:
        return [full_lower(o) for o in outs]
    return full_lower(outs[0])


# ------------------------------------------------------- named axes in scope

class AxisScope:
    """Mesh or vmap axes in scope: ``sizes`` by name; ``track_vma`` when values
    carry varying-axes types (a ``shard_map`` body traced with ``check_vma``);
    ``manual`` when they are the manual mesh axes of a ``shard_map`` body being traced
    (not those of ``vmap``)."""

    __slots__ = ("sizes", "track_vma", "main", "manual")

    def __init__(self, sizes: dict, track_vma: bool, main=None, manual: bool = False):
        self.sizes = dict(sizes)
        self.track_vma = track_vma
        self.main = main  # the batch level that stands for these axes, if any
        self.manual = manual


@contextmanager
def extend_axis_env(sizes: dict, track_vma: bool = False, main=None, manual: bool = False):
    env = _state.axis_env
    env.append(AxisScope(sizes, track_vma, main, manual))
    try:
        yield
    finally:
        env.pop()


def axis_scope(name: str) -> AxisScope | None:
    """The innermost scope that binds axis ``name`` (None when out of scope)."""
    for scope in reversed(_state.axis_env):
        if name in scope.sizes:
            return scope
    return None


def axes_in_scope() -> list[str]:
    return [n for scope in _state.axis_env for n in scope.sizes]


def axis_env_key() -> tuple:
    """The named axes in scope as a hashable key: ``()`` outside any.

    A cache of traced programs must include it: a body traced with axis ``i`` of
    size 8 in scope (``psum`` of an invariant value folds to ``x * 8``) is not
    the program of the same function under another mesh or outside any.
    """
    env = _state.axis_env
    if not env:
        return ()
    return tuple((tuple(s.sizes.items()), s.track_vma) for s in env)


# ----------------------------------------------------------- program builder

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def user_source_info() -> SourceInfo | None:
    """The innermost frame outside the spmd package (for printed programs and errors)."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIR) and "functools" not in fn:
            return SourceInfo(fn, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


class ProgramTracer(Tracer):
    __slots__ = ("_aval", "var")

    def __init__(self, trace, aval, var):
        self._trace = trace
        self._aval = aval
        self.var = var

    @property
    def aval(self):
        return self._aval


class ProgramBuilder:
    """Collects equations and constants while a function is traced."""

    def __init__(self):
        self.eqns: list[Eqn] = []
        self.const_vars: list[Var] = []
        self.const_vals: list[Any] = []
        self._const_tracers: dict[int, ProgramTracer] = {}
        self.producer: dict = {}  # var -> the equation that defines it
        self._keepalive: list[Any] = []

    def new_const(self, trace, val) -> ProgramTracer:
        key = id(val)
        t = self._const_tracers.get(key)
        if t is None:
            self._keepalive.append(val)  # ids stay unique while the trace lives
            aval = get_aval(val)
            t = ProgramTracer(trace, aval, Var(aval))
            # Tracers of outer transformations stay as they are: the program is
            # then evaluated under those transformations (e.g. jit(grad(f))).
            if isinstance(val, Array):
                # Eager Arrays may wrap a caller's numpy buffer (snp.asarray does not
                # copy), so the program keeps its own copy of those too.  Programs
                # keep constants in host memory (constant folding runs on numpy); the
                # executor puts them on the device once, when it compiles.  An array
                # whose value is not all here (an upper layer's) stays itself.
                if val._holds_value():
                    val = np.array(_am.to_host(val.value), copy=True)
            elif type(val) in _am.device_types:
                val = np.array(_am.to_host(val), dtype=aval.dtype, copy=True)
            elif isinstance(val, np.ndarray):
                # A copy, as JAX takes one: mutating a closed-over array later
                # must not change what a cached program computes.
                val = np.array(val, dtype=aval.dtype, copy=True)
            elif not isinstance(val, Tracer):
                val = np.asarray(val, dtype=aval.dtype)
            self.const_vars.append(t.var)
            self.const_vals.append(val)
            self._const_tracers[key] = t
        return t

    def build(self, in_vars, out_tracers) -> ClosedProgram:
        # Scalar constants become literals; the rest stay constant inputs.
        literals = {}
        const_vars, const_vals = [], []
        for v, val in zip(self.const_vars, self.const_vals):
            if not isinstance(val, Tracer) and np.ndim(val) == 0:
                literals[v] = Literal(np.asarray(val)[()], v.aval)
            else:
                const_vars.append(v)
                const_vals.append(val)
        sub = (lambda a: literals.get(a, a)) if literals else (lambda a: a)
        eqns = [e.replace(inputs=[sub(a) for a in e.inputs]) if literals else e for e in self.eqns]
        outs = [sub(t.var) for t in out_tracers]
        return ClosedProgram(Program(const_vars + list(in_vars), eqns, outs), const_vals)


class ProgramTrace(Trace):
    """Builds a program: every primitive application becomes an equation."""

    @property
    def builder(self) -> ProgramBuilder:
        return self.main.global_data

    def new_arg(self, aval) -> ProgramTracer:
        return ProgramTracer(self, aval, Var(aval))

    def pure(self, val):
        return self.builder.new_const(self, val)

    lift = pure

    def process_primitive(self, prim, tracers, params):
        if prim.vma is None and len(tracers) > 1:
            avals = [t.aval for t in tracers]
            if _mt.has_marks(avals):
                # Unreduced and reduced operands: the casts of manual_types.casts.
                tracers = [self._cast(t, vary, red)
                           for t, (vary, red) in zip(tracers, _mt.casts(avals))]
            elif any(a.vma != avals[0].vma for a in avals):
                # Invariant operands meeting varying ones get an explicit pvary, so
                # that transposition turns it into the psum it needs (JEP 17111).
                union = frozenset().union(*(a.vma for a in avals))
                tracers = [self._pvary(t, tuple(sorted(union - t.aval.vma)))
                           if t.aval.vma != union else t for t in tracers]
        avals_out = abstract_eval(prim, [t.aval for t in tracers], params)
        outs = [ProgramTracer(self, a, Var(a)) for a in avals_out]
        eqn = Eqn(prim, [t.var for t in tracers], [o.var for o in outs], params,
                  user_source_info())
        self.builder.eqns.append(eqn)
        for o in outs:
            self.builder.producer[o.var] = eqn
        return outs

    def _cast(self, t, vary, red):
        if vary:
            t = self._pvary(t, vary)
        return full_raise(self, _ext.PREDUCED.fn(t, red)) if red else t

    def _pvary(self, t, axes):
        """``pvary(t, axes)``; for a broadcast value, pvary what was broadcast and
        broadcast again, so that its transpose sums the small value."""
        eqn = self.builder.producer.get(t.var)
        if eqn is not None and "broadcast" in eqn.primitive.traits and \
                isinstance(eqn.inputs[0], Var) and eqn.inputs[0].aval.vma == t.aval.vma:
            src = ProgramTracer(self, eqn.inputs[0].aval, eqn.inputs[0])
            return full_raise(self, eqn.primitive.bind(_ext.PVARY.fn(src, axes), **eqn.params))
        return full_raise(self, _ext.PVARY.fn(t, axes))


def trace_to_program(flat_fun: Callable, in_avals) -> ClosedProgram:
    """Trace ``flat_fun`` (a function of a flat list of arrays returning a flat list)."""
    builder = ProgramBuilder()
    with new_main(ProgramTrace, builder, dynamic=True) as main:
        trace = ProgramTrace(main)
        tracers_in = [trace.new_arg(a) for a in in_avals]
        outs = flat_fun(*tracers_in)
        tracers_out = [full_raise(trace, o) for o in outs]
        return builder.build([t.var for t in tracers_in], tracers_out)


def _hoisted_const(c) -> bool:
    # A tracer of an enclosing transformation, or an upper layer's Array whose value
    # is not all here (``_holds_value()`` False): neither can be a constant of a
    # program compiled here.
    return isinstance(c, Tracer) or (isinstance(c, Array) and type(c) is not Array
                                     and not c._holds_value())


def hoist_traced_consts(closed: ClosedProgram) -> tuple[ClosedProgram, list]:
    """Closure conversion: the constants of ``closed`` that are tracers of
    enclosing transformations, or an upper layer's Arrays whose value is not all
    here, become leading arguments.

    A function traced under another transformation may close over that
    transformation's values (``grad(lambda s: jit(lambda x: s * x)(y))``); kept as
    constants of the inner program, they would be invisible to the outer
    transformation (a zero gradient, a leaked tracer).  As explicit operands of the
    primitive that calls the program, the outer transformation sees them.  An Array
    whose value is not all here (the shard layer's, holding some blocks) cannot be
    copied into the program: as an operand, its layer runs the program on it (JAX,
    too, lets a jitted function close over a global Array).  Returns the program,
    whose arguments are now ``hoisted + original arguments`` (other constants stay
    constants), and the hoisted values.
    """
    consts = closed.consts
    if not any(_hoisted_const(c) for c in consts):
        return closed, []
    prog = closed.program
    n = len(consts)
    keep_vars, keep_vals, hoist_vars, hoisted = [], [], [], []
    for v, c in zip(prog.in_vars[:n], consts):
        if _hoisted_const(c):
            hoist_vars.append(v)
            hoisted.append(c)
        else:
            keep_vars.append(v)
            keep_vals.append(c)
    new = Program(keep_vars + hoist_vars + prog.in_vars[n:], prog.eqns, prog.out_atoms)
    return ClosedProgram(new, keep_vals), hoisted


def eval_program(closed: ClosedProgram | Program, *args, consts=None):
    """Interpret a program by binding each equation's primitive (works under any trace)."""
    if isinstance(closed, ClosedProgram):
        program, consts = closed.program, closed.consts
    else:
        program, consts = closed, consts or []
    env: dict = {}

    def read(a):
        return a.val if isinstance(a, Literal) else env[a]

    for v, x in zip(program.in_vars, list(consts) + list(args)):
        env[v] = x
    evaluating = _state.equations
    evaluating.append(None)
    try:
        for eqn in program.eqns:
            evaluating[-1] = eqn  # (read by current_equation)
            outs = bind(eqn.primitive, *map(read, eqn.inputs), **eqn.params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
            for v, o in zip(eqn.outputs, outs):
                env[v] = o
    finally:
        evaluating.pop()
    return [read(a) for a in program.out_atoms]


def current_equation():
    """The innermost equation :func:`eval_program` is evaluating in this thread (None
    outside one): the context a rule that binds other primitives may record, e.g. the
    equation a collective was lowered from, for an upper layer's reports."""
    evaluating = _state.equations
    return evaluating[-1] if evaluating else None


class preparing:
    """``with preparing("jit(step)"):`` around the first call of a jitted function (its
    trace, and what an upper layer builds for it): :func:`current_function` names it."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        _state.functions.append(self.name)

    def __exit__(self, *exc):
        _state.functions.pop()
        return False


def current_function() -> str | None:
    """The innermost jitted function whose call is being prepared in this thread."""
    functions = _state.functions
    return functions[-1] if functions else None

"""The executor: a program becomes one generated Python function.

Each equation becomes one line of straight-line code over the array module
``xp`` (numpy or cupy): either an inline expression from the primitive's
``emit`` rule (``c = xp.tanh(b)``) or a call of its ``impl`` with the static
parameters bound once at compile time.  Nothing is interpreted per call.  A
primitive whose expression depends on its operands' types registers
``rules.emit_avals(names, in_avals, **params) -> str | None`` instead
(``dot_general``: ``(a.T @ b)`` for a transposed 2-d operand; it is told the array
module, ``xp=``); for a
primitive with the ``fresh_result`` trait it is also called with ``out=NAME``, a
dead buffer of the result's shape and dtype, and code it returns for that call
writes there (the rule's contract: nothing reads the code to find out).

The code is planned before it is written: :func:`emit_eqns` walks the equations
once, deciding from each equation, its primitive's rules and the buffer plan
(:mod:`spmd.compiler.engine.buffers`, :mod:`spmd.compiler.engine.flat_writes`,
:mod:`spmd.compiler.passes.accumulate`) what its line calls and which buffers it
writes, into typed records (:mod:`spmd.compiler.engine.annotations`); rendering
the records into lines is the last step.  An emit rule's code is read once, where it
is planned, for what it is: a numpy ufunc applied to the operands (:func:`ufunc_of`:
its result may go into a buffer with ``out=``), or a reduction's call.

Which primitive gets which treatment is read from its traits
(:data:`spmd.compiler.core.primitives.TRAITS`: ``view``, ``implicit_broadcast``,
``broadcast``, ``fresh_result``), never from its name.  The exceptions are
patterns of particular primitives, compared by identity with the primitive
object: the flat ``concatenate`` of ``reshape``s that combining collectives
builds (:class:`~spmd.compiler.engine.flat_writes.FlatWrites`), and ``reduce_sum``'s
own emitted ``xp.sum(...)``, given ``out=`` (and its ``_blas_sum(...)``, a float sum
as a product with ones).

Example of generated code (``spmd.jit(f).lower(x).compile().source``)::

    def program(a, b):
        c = (a @ b)
        d = xp.tanh(c)
        return [d]
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from spmd.compiler.core.ir import ClosedProgram, Literal, Var
from spmd.compiler.engine.annotations import Assign, Call, Compact, Start, Wait, render
from spmd.compiler.engine.buffers import (DeadBuffers, Ownership, read_counts,
                                          results_into, reusable_input, takeable,
                                          updatable_operand)
from spmd.compiler.engine.flat_writes import FlatWrites
from spmd.compiler.ops.reduce import reduce_sum_p
from spmd.compiler.passes.accumulate import Accumulations


class Executable:
    """A compiled program: call it with raw arrays, get a list of raw arrays.

    Compiled with ``donated`` argument positions (:func:`compile_program`), its code
    may write into those arguments' buffers: ``consumed`` are the donated positions it
    writes into, and ``exclusive[k]`` says whether result ``k`` is a buffer that
    nothing else references (no argument, constant, other result, or view of one),
    which a caller may donate to its next call (a loop's carry); ``aliases[k]``, the
    argument positions whose buffers result ``k`` may share (the argument itself
    returned, or a view of it)."""

    __slots__ = ("fn", "source", "consumed", "exclusive", "aliases")

    def __init__(self, fn, source: str, consumed=frozenset(), exclusive=(), aliases=None):
        self.fn = fn
        self.source = source
        self.consumed = frozenset(consumed)
        self.exclusive = tuple(exclusive)
        self.aliases = tuple(aliases) if aliases is not None else None

    def __call__(self, *args):
        return self.fn(*args)


def _names():
    for i in itertools.count():
        yield f"v{i}"


def compile_program(closed: ClosedProgram, xp=np, name: str = "program",
                    donated=()) -> Executable:
    """Generate and compile Python source for ``closed``; constants are bound in.

    ``donated``: positions of arguments whose buffers the caller hands over (it holds
    no other reference to them and never reads them after the call, as a loop does
    with its carries): the code may update them in place."""
    program = closed.program
    namespace: dict = {"xp": xp}
    lines: list = []  # of annotations.Line
    gen = _names()
    names: dict = {}
    const_ids = itertools.count()

    def const(val) -> str:
        key = f"_k{next(const_ids)}"
        namespace[key] = val
        return key

    def atom(a) -> str:
        if isinstance(a, Literal):
            return const(_literal_value(a, xp))
        return names[a]

    n_consts = len(closed.consts)
    for v, val in zip(program.in_vars[:n_consts], closed.consts):
        # Constants are host (numpy) values; another array module (cupy) gets its
        # own copy once, here, rather than one per call.
        names[v] = const(val if xp is np else xp.asarray(val))
    args = []
    for v in program.in_vars[n_consts:]:
        names[v] = next(gen)
        args.append(names[v])
    # (A 0-d value may be a numpy scalar, which has no buffer to write into.)
    given = {k: v for k in donated if (v := program.in_vars[n_consts + k]).aval.ndim}
    written = emit_eqns(program.eqns, xp, namespace, names, gen, const, atom, lines,
                        live_out=program.out_atoms, donated=list(given.values()))
    # A constant (or literal) returned as a result is copied: results must not
    # alias the buffers the compiled function keeps for its next call.
    const_names = {names[v] for v in program.in_vars[:n_consts]}
    returned = [atom(a) for a in program.out_atoms]
    outs = ", ".join(f"xp.array({n})" if n in const_names or isinstance(a, Literal) else n
                     for a, n in zip(program.out_atoms, returned))
    lines = release_dead_names(lines, returned, args)
    src = f"def {name}({', '.join(args)}):\n" + "".join(f"    {ln}\n" for ln in lines)
    src += f"    return [{outs}]\n"
    exec(compile(src, f"<spmd:{name}>", "exec"), namespace)
    consumed = {k for k, v in given.items() if v in written.consumed}
    arg_vars = program.in_vars[n_consts:]
    return Executable(namespace[name], src, consumed,
                      [written.exclusive(a, program.out_atoms) for a in program.out_atoms],
                      [written.aliases(a, arg_vars) for a in program.out_atoms])


def release_dead_names(lines: list, returned, args=()) -> list:
    """The text of ``lines`` (:class:`~spmd.compiler.engine.annotations.Line`), with a
    ``del`` of each value name after the last line that mentions it.

    A local of the generated function lives until it returns: without this, every
    intermediate of a training step stays allocated to its end (the big transformer
    step's peak resident set was the sum of them, 1 GiB, against JAX's 0.56).  A name
    is kept while any later line mentions it (a dead buffer reused with ``out=NAME``
    is a mention) and when the function returns it (``returned``).  Only names a line
    binds, and the arguments ``args``, are released.  The code is straight-line, so
    the last line that mentions a name is its last use.
    """
    last: dict = {}
    bound = set(args)
    for i, ln in enumerate(lines):
        for n in ln.mentions + ln.binds:
            last[n] = i
        bound.update(ln.binds)
    keep = set(returned) | (set(last) - bound)
    dead_after: dict = {}
    for n, i in last.items():
        if n not in keep:
            dead_after.setdefault(i, []).append(n)
    out = []
    for i, ln in enumerate(lines):  # on the same line: one line per equation stays
        dead = dead_after.get(i)
        out.append(ln.text if not dead else
                   f"{ln.text}; del {', '.join(sorted(dead, key=lambda n: int(n[1:])))}")
    return out


def _literal_value(lit: Literal, xp):
    """The value a literal is bound to in the generated code.

    For numpy, a 0-d array: ``x + k`` with ``k`` a 0-d array is about a third
    faster than with a numpy scalar (measured, numpy 2.4).  Other array modules
    (cupy) get a 0-d array of their own: impls index, mask and combine literals
    with their other operands, and a host value among device arrays fails there.
    """
    val = np.asarray(lit.val, dtype=lit.aval.dtype)
    return val if xp is np else xp.asarray(val)


# ------------------------------------------------------- implicit broadcasting

# Primitives with the ``implicit_broadcast`` trait have an implementation that is a
# numpy-broadcasting elementwise function (a ufunc, ``xp.where`` or ``xp.choose``).
# When one operand comes from a ``broadcast`` primitive (``broadcast_in_dim``) and
# another operand already has the full result shape,
# the generated code passes the un-broadcast operand (reshaped to the result's
# rank) and lets the ufunc broadcast it in its inner loop: no ``broadcast_to``
# view is built (a Python-level numpy function, several microseconds) and the
# ufunc runs on its fast path for a stride-0 operand.  ``x @ w + b`` then costs
# what it costs in hand-written numpy.


def _compact_shape(eqn) -> tuple | None:
    """The shape numpy broadcasting needs in place of a ``broadcast_in_dim``.

    It is the operand reshaped to the result's rank (size-1 axes where the
    result has new ones), without leading 1s (numpy aligns shapes on the right).
    ``None`` where the dimensions are not increasing (a transposition hides in
    the broadcast: only an explicit broadcast is right then).
    """
    shape = eqn.params["shape"]
    bdims = eqn.params["broadcast_dimensions"]
    if any(a >= b for a, b in zip(bdims, bdims[1:])):
        return None
    expanded = [1] * len(shape)
    for d, s in zip(bdims, eqn.inputs[0].aval.shape):
        expanded[d] = s
    while expanded and expanded[0] == 1:
        expanded.pop(0)
    return tuple(expanded)


def plan_implicit_broadcasts(eqns, live_out=()) -> dict:
    """``{var: compact shape}`` for the broadcasts that need not be materialised.

    A broadcast qualifies when every use of its result is an operand of an
    ``implicit_broadcast`` equation that has another operand of the full
    result shape which is not itself such a broadcast (so the ufunc's result
    shape is unchanged), and the result is not a program output.
    """
    candidates = {}
    for eqn in eqns:
        if "broadcast" in eqn.primitive.traits and isinstance(eqn.inputs[0], Var):
            compact = _compact_shape(eqn)
            if compact is not None:
                candidates[eqn.outputs[0]] = compact
    if not candidates:
        return {}
    plan = dict(candidates)
    for a in live_out:
        plan.pop(a, None)
    for eqn in eqns:
        for i, a in enumerate(eqn.inputs):
            if a not in plan:
                continue
            if "implicit_broadcast" not in eqn.primitive.traits or \
                    eqn.primitive.multiple_results:
                del plan[a]
                continue
            full = eqn.outputs[0].aval.shape
            if not any(j != i and b not in candidates and b.aval.shape == full
                       for j, b in enumerate(eqn.inputs)):
                del plan[a]
    return plan


# --------------------------------------------------------------- buffer reuse

# A primitive with the ``fresh_result`` trait has code (``impl`` or emitted) that
# returns a new buffer nothing else references (never a view of an input), although
# it is not a ufunc call.

_INFIX_UFUNCS = {"+": "add", "-": "subtract", "*": "multiply", "&": "bitwise_and",
                 "|": "bitwise_or", "^": "bitwise_xor"}
_PREFIX_UFUNCS = {"-": "negative", "~": "invert"}


def ufunc_of(expr: str, ins: list[str]) -> str | None:
    """The numpy ufunc's name when ``expr`` is exactly that ufunc applied to ``ins``.

    >>> ufunc_of("(a + b)", ["a", "b"]), ufunc_of("xp.tanh(a)", ["a"])
    ('add', 'tanh')
    """
    if len(ins) == 2:
        for op, uf in _INFIX_UFUNCS.items():
            if expr == f"({ins[0]} {op} {ins[1]})":
                return uf
    if len(ins) == 1:
        for op, uf in _PREFIX_UFUNCS.items():
            if expr == f"({op}{ins[0]})":
                return uf
    if expr.startswith("xp.") and "(" in expr:
        name = expr[3:expr.index("(")]
        if isinstance(getattr(np, name, None), np.ufunc) and \
                expr == f"xp.{name}({', '.join(ins)})":
            return name
    return None


# ------------------------------------------------------------------ emission

# Calls that return a new array (never a view of an argument), besides ufuncs
# and ``fresh_result`` primitives: reading a value there leaves no alias behind.
# reduce_sum's emitted calls, which also take ``out=``:
_SUM_CALLS = ("xp.sum(", "_blas_sum(")
_FRESH_CALLS = _SUM_CALLS + ("xp.max(", "xp.min(", "xp.prod(", "xp.any(", "xp.all(")


def _note(eqn) -> str:
    """A collective names what it implements (e.g. "psum x7 combined (2678828 bytes)"):
    shown after its line, where the call itself says nothing."""
    what = eqn.params.get("what")
    return f"  # {what}" if isinstance(what, str) and "\n" not in what else ""


def emit_eqns(eqns, xp, namespace, names, gen, const, atom, lines, live_out=(),
              donated=()) -> Ownership:
    """Append the lines of code of the equations to ``lines``
    (:class:`~spmd.compiler.engine.annotations.Line`: the text, and the value names
    each mentions and binds).

    ``live_out`` are the atoms the caller reads after these equations (the
    program's outputs); values among them are always materialised and never
    overwritten.  ``donated`` are input variables whose buffers are this code's to
    overwrite (see :func:`compile_program`).  Each equation is planned first (a
    record of :mod:`spmd.compiler.engine.annotations`), and the records are rendered
    into source last.
    """
    plan = _Planner(eqns, xp, namespace, names, gen, const, atom, live_out, donated)
    for i, eqn in enumerate(eqns):
        plan.equation(i, eqn)
    lines.extend(render(plan.steps))
    return plan.done


class _Planner:
    """The state of planning one program's code: its names, the buffers it owns and
    may reuse, the requests of started collectives, the records planned so far."""

    def __init__(self, eqns, xp, namespace, names, gen, const, atom, live_out, donated):
        self.xp, self.namespace, self.names, self.gen = xp, namespace, names, gen
        self.const, self.atom = const, atom
        self.compact = plan_implicit_broadcasts(eqns, live_out)
        self.uses = read_counts(eqns, live_out)
        # Values in buffers that only this program's code references.
        self.owned: set = set(donated)
        self.dead = DeadBuffers(eqns, live_out)
        self.dead.keep.update(donated)  # a donated buffer is updated in place, not recycled
        self.done = Ownership(self.owned, self.dead, donated)
        self.flat = FlatWrites(eqns, live_out, self.uses)
        self.sums = Accumulations(eqns, self.uses, self.flat, xp)
        self.pending: list = []  # requests of started collectives not waited for yet
        self.steps: list = []

    def equation(self, i, eqn) -> None:
        """Plan the code of equation ``i``."""
        names, owned, dead, flat = self.names, self.owned, self.dead, self.flat
        self.sums.decide(i, names, owned, self.uses, dead, flat)
        self.steps.extend(flat.allocate(i, names, self.gen, self.const))
        if self.sums.emit_sum(eqn, names, owned, dead):  # its products added into acc
            return
        copies = flat.pack(eqn, names, self.atom)
        if copies is not None:  # its operands are in its buffer
            self.steps.extend(copies)
            dead.release_inputs(eqn, names, owned, never_aliases=False)
            return
        ins = [self.atom(a) for a in eqn.inputs]
        outs = []
        for v in eqn.outputs:
            names[v] = next(self.gen)
            outs.append(names[v])
        prim = eqn.primitive
        if prim.rules.starts or prim.rules.waits:
            self.steps.append(self._request(eqn, i, ins, outs))
            dead.release_inputs(eqn, names, owned, never_aliases=False)
            return
        target = self.sums.target(eqn, names, flat)  # a product accumulated into a sum
        into = target or flat.view(eqn, names)
        if eqn.outputs and eqn.outputs[0] in self.compact:
            shape = self.compact[eqn.outputs[0]]
            same = shape == eqn.inputs[0].aval.shape
            self.steps.append(Compact(outs[0], ins[0], None if same else shape))
            dead.release_inputs(eqn, names, owned, never_aliases=False)  # a view
            return
        call, into, fresh, aliasing = self._call(i, eqn, ins, target, into)
        dead.release_inputs(eqn, names, owned, never_aliases=fresh, aliasing=aliasing)
        self.steps.append(Assign(tuple(outs), prim.multiple_results, call, _note(eqn),
                                 into, tuple(self.pending)))

    def _request(self, eqn, i, ins, outs):
        """``collective_start`` keeps its request in ``_r<tag>``; ``collective_wait``
        waits for it (see :mod:`spmd.compiler.passes.overlap`)."""
        handle = f"_r{eqn.params['tag']}"
        if eqn.primitive.rules.starts:
            fname = f"_{eqn.primitive.name}_{i}"
            self.namespace[fname] = functools.partial(eqn.primitive.impl, self.xp,
                                                      **eqn.params)
            self.pending.append(handle)
            return Start(handle, fname, tuple(ins), _note(eqn))
        self.pending.remove(handle)
        return Wait(outs[0], handle, _note(eqn))

    def _call(self, i, eqn, ins, target, into):
        """``(call, into, fresh, aliasing)``: what ``eqn``'s line calls; the buffer its
        result is still to be copied into (None: none, or its code writes there);
        whether its results never alias an operand; per result, the operands it may
        alias (None: every one)."""
        prim = eqn.primitive
        template, written = self._template(eqn, ins, target, into)
        array_result = len(eqn.outputs) == 1 and eqn.outputs[0].aval.ndim > 0
        fresh = "fresh_result" in prim.traits
        if fresh and array_result and into is None:
            self.owned.add(eqn.outputs[0])
        elif fresh and prim.multiple_results:  # a fused kernel's new arrays
            self.owned.update(o for o in eqn.outputs if o.aval.ndim)
        if written is not None and written is into:
            into = None  # written in place
        if template is None:
            call, aliasing = self._impl_call(i, eqn, ins)
            return call, into, fresh, aliasing
        call = Call(None, tuple(ins), template=template, writes=written)
        if not prim.multiple_results and array_result:
            call, into, fresh = self._ufunc_call(eqn, ins, call, into, fresh)
        # (A reduction's result is new whatever its rank: reading a value there leaves
        # no view of it.)
        return call, into, fresh or template.startswith(_FRESH_CALLS), None

    def _template(self, eqn, ins, target, into):
        """The code of the primitive's emit rule for ``eqn`` (None: its impl is called),
        and the buffer that code writes into (None: a new one): an ``emit_avals`` rule
        of a ``fresh_result`` primitive given ``out=`` (``into``, else a dead buffer)
        writes there when it gives code (its contract), accumulating into ``target``."""
        prim, xp = eqn.primitive, self.xp
        emit_avals = prim.rules.emit_avals
        if emit_avals is None:
            use = prim.emit is not None and (xp is np or not prim.rules.emit_numpy_only)
            return (prim.emit(ins, **eqn.params) if use else None), None
        in_avals = [a.aval for a in eqn.inputs]
        expr = emit_avals(ins, in_avals, xp=xp, **eqn.params)
        fresh = "fresh_result" in prim.traits
        array_result = len(eqn.outputs) == 1 and eqn.outputs[0].aval.ndim > 0
        buf = into or (self.dead.take(eqn.outputs[0].aval)
                       if expr is not None and array_result and fresh else None)
        written = None
        if target is not None:  # (Accumulations checked that it emits this)
            expr = emit_avals(ins, in_avals, xp=xp, out=target, accumulate=True,
                              **eqn.params)
            written = target if expr is not None else None
        elif buf is not None and fresh:  # the same code, writing into a dead buffer
            code = emit_avals(ins, in_avals, xp=xp, out=buf, **eqn.params)
            if code is not None:
                expr, written = code, buf
        if expr is not None:  # the functions its code calls besides xp's
            self.namespace.update(prim.rules.emit_globals or {})
        return expr, written

    def _ufunc_call(self, eqn, ins, call, into, fresh):
        """``(call, into, fresh)`` for the template ``call`` of one array result: a
        ufunc's result is a fresh buffer (0-d results are numpy scalars: immutable,
        and never reused), written straight into ``into``, else into an operand's
        buffer or a dead one; reduce_sum's call is given ``into`` too."""
        template = call.template
        uf = ufunc_of(template, ins)
        if uf is not None and into is not None:  # straight into the flat buffer
            return Call(f"xp.{uf}", tuple(ins), out=into), None, True
        if into is not None and eqn.primitive is reduce_sum_p and \
                template.startswith(_SUM_CALLS):
            return Call(None, tuple(ins), out=into, template=template), None, True
        if uf is None:
            return call, into, fresh
        target = reusable_input(eqn, self.owned, self.uses)
        if target is not None:
            self.dead.handed_on.add(target)
        out = self.names[target] if target is not None else \
            self.dead.take(eqn.outputs[0].aval)
        self.owned.add(eqn.outputs[0])
        if out is None:
            return call, into, True
        return Call(f"xp.{uf}", tuple(ins), out=out), into, True

    def _impl_call(self, i, eqn, ins):
        """The call of the primitive's impl (bound to its params once, or in the form its
        rules give), and per result the operands it may alias (None: every one)."""
        prim, xp, owned, uses, dead = eqn.primitive, self.xp, self.owned, self.uses, \
            self.dead
        # A primitive may give its implementation with the parameters bound in a
        # cheaper form (rules.bind_impl: e.g. a collective calling its backend
        # operation directly); else the impl with its parameters as keywords.
        bind_impl = prim.rules.bind_impl
        fn = bind_impl(xp, **eqn.params) if bind_impl is not None else None
        target = updatable_operand(eqn, owned, uses, dead)
        given, aliasing = [], None
        if prim.rules.donated_impl is not None:
            fn, given = self._donate(eqn)
        aliased = prim.rules.aliased_operands
        if aliased is not None:
            # Per result, the operands it may share buffers with (a cond's branches
            # returning an operand or a view of it), and every operand it took
            # over: the others stay this code's own (a loop's carry read by a
            # cond stays exclusive, so the loop need not copy it every step, and
            # a buffer the cond read is free to update once the results that may
            # view it are gone).
            aliasing = [ks | frozenset(given)
                        for ks in aliased(xp, tuple(given), **eqn.params)]
        if target is not None:
            # Its operand's buffer is this code's alone and read nowhere else:
            # update it in place (rules.in_place) instead of a copy.
            fn = functools.partial(prim.rules.in_place, xp, **eqn.params)
            dead.handed_on.add(target)
        if fn is None:
            fn = functools.partial(prim.impl, xp, **eqn.params) if eqn.params else \
                functools.partial(prim.impl, xp)
        fname = f"_{prim.name}_{'in_place_' if target is not None else ''}{i}".replace(
            "-", "_")
        self.namespace[fname] = fn
        into_rule = prim.rules.results_into if xp is np else None
        outs = results_into(eqn, into_rule, owned, uses, dead, self.names) \
            if into_rule else None
        return Call(fname, tuple(ins), outs=outs), aliasing

    def _donate(self, eqn):
        """A higher-order primitive (cond, scan, while) taking over operands this code
        owns alone and never reads again: its programs may update them in place.  Its
        results that are its own alone become this code's (one loop's carries taken
        over by the next, not copied again).  Its impl, and the positions given."""
        given = [k for k, a in enumerate(eqn.inputs)
                 if takeable(a, eqn, self.owned, self.uses, self.dead)]
        fn, taken, exclusive = eqn.primitive.rules.donated_impl(self.xp, tuple(given),
                                                                **eqn.params)
        self.dead.handed_on.update(eqn.inputs[k] for k in taken)
        self.owned.update(o for o, x in zip(eqn.outputs, exclusive) if x and o.aval.ndim)
        return fn, given

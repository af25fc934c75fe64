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
dead buffer of the result's shape and dtype that its code may write into.

Which primitive gets which treatment is read from its traits
(:data:`spmd.compiler.core.primitives.TRAITS`: ``view``, ``implicit_broadcast``,
``broadcast``, ``fresh_result``), never from its name.  The exceptions are
patterns of particular primitives, compared by identity with the primitive
object: the flat ``concatenate`` of ``reshape``s that combining collectives
builds (:class:`FlatWrites`), and ``reduce_sum``'s own emitted ``xp.sum(...)``,
given ``out=`` (and its ``_blas_sum(...)``, a float sum as a product with ones).

Example of generated code (``spmd.jit(f).lower(x).compile().source``)::

    def program(a, b):
        c = (a @ b)
        d = xp.tanh(c)
        return [d]
"""

from __future__ import annotations

import functools
import itertools
import math
import re

import numpy as np

from spmd.compiler.passes.accumulate import Accumulations
from spmd.compiler.engine.buffers import (DeadBuffers, Ownership, read_counts,
                                    results_into, reusable_input, takeable,
                                    updatable_operand)
from spmd.compiler.core.ir import ClosedProgram, Literal, Program, Var
from spmd.compiler.ops.reduce import reduce_sum_p
from spmd.compiler.ops.slicing import concatenate_p
from spmd.compiler.ops.structural import reshape_p


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
    outs = ", ".join(f"xp.array({n})" if n in const_names or isinstance(a, Literal) else n
                     for a, n in zip(program.out_atoms, map(atom, program.out_atoms)))
    lines = release_dead_names(lines, outs, args)
    src = f"def {name}({', '.join(args)}):\n" + "".join(f"    {ln}\n" for ln in lines)
    src += f"    return [{outs}]\n"
    exec(compile(src, f"<spmd:{name}>", "exec"), namespace)
    consumed = {k for k, v in given.items() if v in written.consumed}
    arg_vars = program.in_vars[n_consts:]
    return Executable(namespace[name], src, consumed,
                      [written.exclusive(a, program.out_atoms) for a in program.out_atoms],
                      [written.aliases(a, arg_vars) for a in program.out_atoms])


_VALUE_NAME = re.compile(r"\bv\d+\b")
_ASSIGNED = re.compile(r"^((?:v\d+\s*,\s*)*v\d+)\s*=[^=]")


def release_dead_names(lines: list, returned: str, args=()) -> list:
    """``lines`` with a ``del`` of each value name after the last line that reads it.

    A local of the generated function lives until it returns: without this, every
    intermediate of a training step stays allocated to its end (the big transformer
    step's peak resident set was the sum of them, 1 GiB, against JAX's 0.56).  A name
    is kept while any later line mentions it (a dead buffer reused with ``out=NAME``
    is a mention) and when the function returns it.  The code is straight-line, so
    the last line that mentions a name is its last use.
    """
    last: dict = {}
    bound = set(args)  # only names the code binds are released (not a mention in text)
    for i, ln in enumerate(lines):
        for n in _VALUE_NAME.findall(ln):
            last[n] = i
        target = _ASSIGNED.match(ln)
        if target:
            bound.update(_VALUE_NAME.findall(target.group(1)))
    keep = set(_VALUE_NAME.findall(returned)) | (set(last) - bound)
    dead_after: dict = {}
    for n, i in last.items():
        if n not in keep:
            dead_after.setdefault(i, []).append(n)
    out = []
    for i, ln in enumerate(lines):  # on the same line: one line per equation stays
        dead = dead_after.get(i)
        out.append(ln if not dead else
                   f"{ln}; del {', '.join(sorted(dead, key=lambda n: int(n[1:])))}")
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


class FlatWrites:
    """Operands of a ``concatenate`` of contiguous slabs written straight into its buffer.

    Combining collectives (:mod:`spmd.compiler.passes.combine`) packs the gradients
    into one flat buffer: ``concatenate(reshape(g1), reshape(g2), ...)``.  A
    hand-written step has each gradient's matmul or sum write into its slice
    of that buffer (``out=``); so does the generated code, for every operand
    ``g`` produced in this program and read only by its ``reshape``: the
    buffer is allocated before the first of them is produced, ``g``'s
    equation writes into a view of its slice (or copies into it, where its
    code cannot write into a given array), and the ``concatenate`` only copies
    the operands that were not written so (used elsewhere too, or inputs).
    The same holds for any concatenation whose operands are contiguous slabs of
    the result (every dimension before the joined one of size 1): the gradient of
    stacked layers' weights, each layer's product written into its slab.
    """

    def __init__(self, eqns, live_out, uses):
        self.views: dict = {}    # g -> (concatenate output, start, stop)
        self.copies: dict = {}   # concatenate equation -> [(operand, start, stop)] to copy
        self.alloc: dict = {}    # equation index -> concatenate outputs to allocate there
        # (Kept: spmd.compiler.passes.accumulate plans on the same maps.)
        self.producer = producer = {o: (i, e) for i, e in enumerate(eqns) for o in e.outputs}
        self.live = live = {a for a in live_out if isinstance(a, Var)}
        for e in eqns:
            if e.primitive is not concatenate_p:
                continue
            d, shape = e.params["dimension"], e.outputs[0].aval.shape
            if any(n != 1 for n in shape[:d]):
                continue
            inner = math.prod(shape[d + 1:])  # elements per index of the joined dimension
            written, copied, at, first = [], [], 0, None
            for p in e.inputs:
                size = p.aval.shape[d] * inner
                g = self._source(p, producer, uses, live)
                if g is None:
                    copied.append((p, at, at + size))
                else:
                    written.append((g, at, at + size))
                    idx = producer[g][0]
                    first = idx if first is None else min(first, idx)
                at += size
            if written:
                buf = e.outputs[0]
                for g, a, b in written:
                    self.views[g] = (buf, a, b)
                self.copies[e] = copied
                self.alloc.setdefault(first, []).append(buf)

    @staticmethod
    def _source(p, producer, uses, live):
        """The value ``g`` whose ``reshape`` is operand ``p``, when ``g`` may be
        written into the buffer."""
        if not isinstance(p, Var) or uses.get(p) != 1 or p not in producer:
            return None
        r = producer[p][1]
        if r.primitive is not reshape_p or not isinstance(r.inputs[0], Var):
            return None
        g = r.inputs[0]
        if uses.get(g) != 1 or g in live or g not in producer or g.aval.dtype != p.aval.dtype:
            return None
        made = producer[g][1]
        if len(made.outputs) != 1 or made.primitive.multiple_results or \
                made.primitive.effectful or not g.aval.ndim or "view" in made.primitive.traits:
            return None
        return g

    def write_into(self, buf, name, names) -> None:
        """Have the slabs of ``buf`` written into the existing buffer ``name`` (of its
        shape and dtype) instead of a new one (:mod:`spmd.compiler.passes.accumulate`)."""
        for bufs in self.alloc.values():
            if buf in bufs:
                bufs.remove(buf)
        names[buf] = name

    def allocate(self, i, names, gen, const, lines) -> None:
        for buf in self.alloc.get(i, ()):
            names[buf] = next(gen)
            a = buf.aval
            shape = a.shape[0] if a.ndim == 1 else tuple(a.shape)
            lines.append(f"{names[buf]} = xp.empty({shape}, dtype={const(np.dtype(a.dtype))})")

    @staticmethod
    def _flat(buf, name) -> str:
        return name if buf.aval.ndim == 1 else f"{name}.reshape(-1)"

    def pack(self, eqn, names, atom, lines) -> bool:
        """For a planned ``concatenate``: copy the operands not written in place into
        its buffer (True); other equations: False."""
        copied = self.copies.get(eqn)
        if copied is None:
            return False
        out = eqn.outputs[0]
        buf = self._flat(out, names[out])
        flat = atom if out.aval.ndim == 1 else (lambda p: f"xp.reshape({atom(p)}, -1)")
        lines.extend(f"{buf}[{a}:{b}] = {flat(p)}" for p, a, b in copied)
        return True

    def view(self, eqn, names) -> str | None:
        """The code of the view ``eqn``'s result goes into, or None."""
        if len(eqn.outputs) != 1:
            return None
        hit = self.views.get(eqn.outputs[0])
        if hit is None:
            return None
        buf, a, b = hit
        return f"{self._flat(buf, names[buf])}[{a}:{b}].reshape(" \
               f"{tuple(eqn.outputs[0].aval.shape)!r})"


def _emit_request(eqn, i, xp, ins, outs, namespace, pending, lines) -> None:
    """``collective_start`` keeps its request in ``_r<tag>``; ``collective_wait`` waits
    for it (see :mod:`spmd.compiler.passes.overlap`)."""
    tag = eqn.params["tag"]
    handle = f"_r{tag}"
    what = eqn.params.get("what")
    note = f"  # {what}" if isinstance(what, str) and "\n" not in what else ""
    if eqn.primitive.rules.starts:
        fname = f"_{eqn.primitive.name}_{i}"
        namespace[fname] = functools.partial(eqn.primitive.impl, xp, **eqn.params)
        lines.append(f"{handle} = {fname}({', '.join(ins)}){note}")
        pending.append(handle)
    else:
        lines.append(f"{outs[0]} = {handle}.wait(){note}")
        pending.remove(handle)


def emit_eqns(eqns, xp, namespace, names, gen, const, atom, lines, live_out=(),
              donated=()) -> Ownership:
    """Append one line of code per equation to ``lines``.

    ``live_out`` are the atoms the caller reads after these equations (the
    program's outputs); values among them are always materialised and never
    overwritten.  ``donated`` are input variables whose buffers are this code's to
    overwrite (see :func:`compile_program`).
    """
    compact = plan_implicit_broadcasts(eqns, live_out)
    uses = read_counts(eqns, live_out)
    # Values in buffers that only this program's code references.
    owned: set = set(donated)
    dead = DeadBuffers(eqns, live_out)
    dead.keep.update(donated)  # a donated buffer is updated in place, not recycled
    done = Ownership(owned, dead, donated)
    flat = FlatWrites(eqns, live_out, uses)
    sums = Accumulations(eqns, uses, flat, xp)
    pending: list = []  # requests of started collectives not waited for yet
    for i, eqn in enumerate(eqns):
        prim = eqn.primitive
        sums.decide(i, names, owned, uses, dead, flat)
        flat.allocate(i, names, gen, const, lines)
        if sums.emit_sum(eqn, names, owned, dead):  # its products added into acc
            continue
        if flat.pack(eqn, names, atom, lines):  # its operands are in its buffer
            dead.release_inputs(eqn, names, owned, never_aliases=False)
            continue
        ins = [atom(a) for a in eqn.inputs]
        outs = []
        for v in eqn.outputs:
            names[v] = next(gen)
            outs.append(names[v])
        if prim.rules.starts or prim.rules.waits:
            _emit_request(eqn, i, xp, ins, outs, namespace, pending, lines)
            dead.release_inputs(eqn, names, owned, never_aliases=False)
            continue
        target = sums.target(eqn, names, flat)  # a product accumulated into a sum
        into = target or flat.view(eqn, names)
        aliasing = None  # every operand, unless the primitive says which (below)
        if eqn.outputs and eqn.outputs[0] in compact:
            shape = compact[eqn.outputs[0]]
            same = shape == eqn.inputs[0].aval.shape
            lines.append(f"{outs[0]} = {ins[0]}" if same else
                         f"{outs[0]} = {ins[0]}.reshape({shape!r})")
            dead.release_inputs(eqn, names, owned, never_aliases=False)  # a view
            continue
        out_aval = eqn.outputs[0].aval if len(eqn.outputs) == 1 else None
        array_result = out_aval is not None and out_aval.ndim > 0
        emit_avals = prim.rules.emit_avals
        if emit_avals is not None:  # an emit rule that needs the operands' types
            in_avals = [a.aval for a in eqn.inputs]
            expr = emit_avals(ins, in_avals, xp=xp, **eqn.params)
            buf = into or (dead.take(out_aval) if expr is not None and array_result and
                           "fresh_result" in prim.traits else None)
            if target is not None:  # (Accumulations checked that it emits this)
                expr = emit_avals(ins, in_avals, xp=xp, out=target, accumulate=True,
                                  **eqn.params)
            elif buf is not None:  # the same code, writing into a dead buffer
                expr = emit_avals(ins, in_avals, xp=xp, out=buf, **eqn.params) or expr
            if expr is not None:  # the functions its code calls besides xp's
                namespace.update(prim.rules.emit_globals or {})
        else:
            expr = prim.emit(ins, **eqn.params) if prim.emit is not None and (
            xp is np or not prim.rules.emit_numpy_only) else None
        fresh = "fresh_result" in prim.traits
        if fresh and array_result and into is None:
            owned.add(eqn.outputs[0])
        elif fresh and prim.multiple_results:  # a fused kernel's new arrays
            owned.update(o for o in eqn.outputs if o.aval.ndim)
        if into is not None and expr is not None and f"out={into}" in expr:
            into = None  # written in place
        if expr is None:
            # A primitive may give its implementation with the parameters bound in a
            # cheaper form (rules.bind_impl: e.g. a collective calling its backend
            # operation directly); else the impl with its parameters as keywords.
            bind_impl = prim.rules.bind_impl
            fn = bind_impl(xp, **eqn.params) if bind_impl is not None else None
            target = updatable_operand(eqn, owned, uses, dead)
            donate = prim.rules.donated_impl
            given = [k for k, a in enumerate(eqn.inputs)
                     if takeable(a, eqn, owned, uses, dead)] \
                if donate is not None else []
            if donate is not None:
                # A higher-order primitive (cond, scan, while) taking over operands this
                # code owns alone and never reads again: its programs may update them in
                # place.  Its results that are its own alone become this code's (one
                # loop's carries taken over by the next, not copied again).
                fn, taken, exclusive = donate(xp, tuple(given), **eqn.params)
                dead.handed_on.update(eqn.inputs[k] for k in taken)
                owned.update(o for o, x in zip(eqn.outputs, exclusive) if x and o.aval.ndim)
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
            namespace[fname] = fn
            into_rule = prim.rules.results_into if xp is np else None
            expr = f"{fname}({', '.join(ins)}" + (
                results_into(eqn, into_rule, owned, uses, dead, names) if into_rule
                else "") + ")"
        elif not prim.multiple_results and array_result:
            # A ufunc with an array result returns a fresh buffer (0-d results
            # are numpy scalars: immutable, and never reused).
            uf = ufunc_of(expr, ins)
            if uf is not None and into is not None:  # straight into the flat buffer
                expr, into, fresh = f"xp.{uf}({', '.join(ins)}, out={into})", None, True
            elif into is not None and prim is reduce_sum_p and expr.startswith(_SUM_CALLS):
                expr, into, fresh = f"{expr[:-1]}, out={into})", None, True
            elif uf is not None:
                fresh = True
                target = reusable_input(eqn, owned, uses)
                if target is not None:
                    dead.handed_on.add(target)
                out = names[target] if target is not None else dead.take(out_aval)
                if out is not None:
                    expr = f"xp.{uf}({', '.join(ins)}, out={out})"
                owned.add(eqn.outputs[0])
        # (A reduction's result is new whatever its rank: reading a value there leaves
        # no view of it.)
        fresh = fresh or expr.startswith(_FRESH_CALLS)
        dead.release_inputs(eqn, names, owned, never_aliases=fresh, aliasing=aliasing)
        if prim.multiple_results:
            lhs = (", ".join(outs) + ",") if outs else "_"
        else:
            lhs = outs[0]
        what = eqn.params.get("what")
        # A collective names what it implements (e.g. "psum x7 combined (2678828
        # bytes)"): shown in the source, where the call itself says nothing.
        note = f"  # {what}" if isinstance(what, str) and "\n" not in what else ""
        lines.append(f"{lhs} = {expr}{note}")
        if into is not None:  # the producer cannot write into the buffer: copy
            lines.append(f"{into}[...] = {outs[0]}")
        if pending:
            # Let the MPI library move the started collectives' data: it progresses
            # only inside MPI calls, and a bucket needs several rounds between the
            # ranks (after heavy equations only, a 1 MB bucket of the MLP step had
            # seldom completed at its wait; after every equation, often: about
            # 1 microsecond per test).
            lines.extend(f"{h}.test()" for h in pending)
    return done

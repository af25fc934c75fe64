"""``jit``: trace once per signature, optimise, generate code, cache.

Called eagerly, a jitted function runs its generated code directly (the fast
path: flatten the arguments, look up the cache, call).  Called under another
transformation, it binds the ``jit`` primitive, whose parameter is the traced
program, so the transformation sees one equation it knows how to handle.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Callable

import numpy as np

from spmd import tree_util
from spmd.compiler.core import array_module as _am, dtypes
from spmd.compiler import extensions as _ext
from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import abstract_arg_aval
from spmd.compiler.core.signature import (EMPTY, NDARRAY, NO_STATIC, arg_aval, flatten, leaf_key,
                                         norm_argnums, upper_token, walk)
from spmd.compiler.engine.codegen import Executable, compile_program
from spmd.compiler.core.ir import ClosedProgram
from spmd.compiler.core.program_vma import call_types, call_vma
from spmd.compiler.passes.pipeline import dce, lower_for_execution, optimize
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import (_state as _trace_state, axis_env_key, eval_plain, eval_program,
                                 hoist_traced_consts, is_eager, preparing,
                                 to_array_value, trace_to_program, Tracer, wrap_value)
from spmd.compiler.core.tracer import is_array_like
from spmd.config import config
from spmd.errors import OutputTypeError, StaticArgumentError
from spmd.compiler.transforms.ad import jvp_flat
from spmd.compiler.transforms.batching import batch_flat

# ------------------------------------------------------------- the primitive

jit_p = Primitive("jit", traits=(), multiple_results=True, higher_order=True)

# Compiled code lives as long as its program (programs are keys by identity).
_executables: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def executable_for(closed: ClosedProgram, xp=None, donated=()) -> Executable:
    """The compiled code of ``closed`` (compiled once per program, array module and
    ``donated`` argument positions (see :func:`spmd.compiler.engine.codegen.compile_program`);
    ``xp=None``: the module of this process's devices, numpy or cupy)."""
    if xp is None:
        xp = _am.current()
    per_program = _executables.get(closed)
    if per_program is None:
        per_program = _executables[closed] = {}
    key = (xp.__name__, tuple(donated))
    exe = per_program.get(key)
    if exe is None:
        exe = per_program[key] = compile_program(
            lower_for_execution(optimize(closed)), xp, donated=tuple(donated))
    return exe


@jit_p.def_impl
def _jit_impl(xp, *args, program: ClosedProgram, name: str):
    return executable_for(program, xp)(*args)


@jit_p.def_abstract_eval
def _jit_abstract_eval(*avals, program: ClosedProgram, name: str):
    return program.out_avals


jit_p.rules.inline = lambda eqn: eqn.params["program"]


# ------------------------------------------------------- results

def flatten_outputs(outs, fname: str):
    """Flatten a function's results, checking that every leaf is an array."""
    paths_leaves, treedef = tree_util.tree_flatten_with_path(outs)
    for path, leaf in paths_leaves:
        if not is_array_like(leaf):
            raise OutputTypeError(
                f"{fname} returned a {type(leaf).__name__} at output{tree_util.keystr(path)}: "
                f"{leaf!r:.60}; transformed functions must return arrays (or pytrees of "
                "arrays). Return Python values through static arguments or outside the function")
    return [leaf for _, leaf in paths_leaves], treedef


class _Entry:
    """One traced signature.  ``hoisted``: values of enclosing transformations (and
    an upper layer's Arrays whose value is not all here) that the function closed
    over, passed as the program's leading arguments (see :func:`hoist_traced_consts`);
    an entry with tracers among them is never cached, since they belong to the trace
    that made them (closed-over Arrays are cached, as any constant is)."""

    __slots__ = ("closed", "out_tree", "out_avals", "_optimized", "_exe", "hoisted")

    def __init__(self, closed, out_tree, hoisted=()):
        self.closed = closed
        self.hoisted = tuple(hoisted)
        self.out_tree = out_tree
        self.out_avals = closed.out_avals
        self._optimized = None
        self._exe = None

    @property
    def optimized(self) -> ClosedProgram:
        if self._optimized is None:
            self._optimized = optimize(self.closed)
        return self._optimized

    @property
    def exe(self) -> Executable:
        # Compiled for the array module of the devices (numpy; cupy on GPUs) as it
        # is at the first call.
        if self._exe is None:
            self._exe = compile_program(lower_for_execution(self.optimized), _am.current(),
                                        "program")
        return self._exe


class _CallPlan:
    """What a call with one fast key does: the traced entry, and per-leaf work.

    The fast key of a call (see :func:`lookup`) fixes the Python
    type of every leaf, and of numpy arrays their shape and raw dtype, so the
    work each leaf needs before the generated code runs is known once per key:
    ``arrays`` are the positions of ``spmd.Array`` leaves (their buffer is
    passed), ``converts`` the ``(position, aval)`` of leaves that need
    :func:`to_array_value` (Python and numpy scalars, arrays whose dtype is
    canonicalised, e.g. float64 without x64); other leaves are numpy arrays
    passed as they are.
    """

    __slots__ = ("entry", "avals", "arrays", "converts", "fn", "out_tree", "out_avals",
                 "single", "bind", "abstract")

    def __init__(self, entry: _Entry, leaves, avals):
        self.entry = entry
        self.avals = avals
        self.arrays = tuple(i for i, x in enumerate(leaves) if type(x) is Array)
        self.converts = tuple(
            (i, a) for i, (x, a) in enumerate(zip(leaves, avals))
            if type(x) is not Array and not (type(x) is np.ndarray and x.dtype == a.dtype))
        if _am.current() is not np:
            # On GPUs every leaf goes through to_array_value, which copies host
            # values (numpy arrays, Arrays holding them) to the device.
            self.arrays = ()
            self.converts = tuple(enumerate(avals))
        self.fn = None  # the generated function, compiled at the first call
        self.out_tree = entry.out_tree
        self.out_avals = tuple(entry.out_avals)
        # A function returning one array needs no unflattening.
        self.single = entry.out_tree.num_nodes == 1 and entry.out_tree.num_leaves == 1
        # Arrays of an upper layer's type among the arguments: the call binds ``jit``
        # eagerly, so that their layer evaluates it (extensions.EAGER_EVAL; the shard
        # layer's jit makes plans of its own for them).
        self.bind = any(
            type(x) is not Array and isinstance(x, Array) for x in (*leaves, *entry.hoisted))
        # Abstract arguments (ShapeDtypeStruct) can be traced, not run.
        self.abstract = any(abstract_arg_aval(x) is not None for x in leaves)


# ------------------------------------------------------- a jit's signature
# A jit is an object holding ``_fun``, ``_name``, its static and donated arguments
# (set by init_jit), its two caches and ``_upper`` (the key token of an upper layer's
# Arrays, see walk).  The functions below key, trace and run it; the compiler's own
# jit (JitFunction) and the shard layer's (spmd.shard.call.jit.Jit) call them.

def init_jit(j, fun: Callable, static_argnums=None, static_argnames=None,
             donate_argnums=None) -> None:
    """Set on ``j`` what the functions below read: the function, its name, the static
    and donated argument positions, the static keyword names and the empty caches.

    >>> jf = JitFunction(lambda x, n: x * n, static_argnums=1)  # calls init_jit
    >>> jf._static_argnums, jf._no_static
    ((1,), False)
    """
    functools.update_wrapper(j, fun)
    j._fun = fun
    j._name = getattr(fun, "__name__", "fun")
    try:
        sig = inspect.signature(fun)
        params = list(sig.parameters.values())
        varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
        n_pos = None if varargs else sum(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    except (TypeError, ValueError):
        sig, n_pos = None, None
    j._static_argnums = norm_argnums(static_argnums, n_pos, j._name, "static_argnums")
    j._donate_argnums = norm_argnums(donate_argnums, n_pos, j._name, "donate_argnums")
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    j._static_argnames = tuple(static_argnames or ())
    # static_argnames may name positional parameters too (as in JAX).
    if sig is not None:
        names = list(sig.parameters)
        for nm in j._static_argnames:
            if nm in names and n_pos is not None and names.index(nm) < n_pos:
                j._static_argnums = tuple(sorted(set(j._static_argnums) | {names.index(nm)}))
    j._cache = {}   # (treedef, static key, avals, x64, ...) -> _Entry
    j._plans = {}   # cheap key (see walk and plan_of) -> a call plan
    j._no_static = not j._static_argnums and not j._static_argnames


def signature(j, args, kwargs):
    """The signature of a call with static arguments: the static key (checked
    hashable), the leaves and the structure of the dynamic arguments."""
    if j._no_static:
        return NO_STATIC, *flatten((args, kwargs))
    static_pos = []
    dyn_args = []
    for i, a in enumerate(args):
        if i in j._static_argnums:
            static_pos.append((i, a))
        else:
            dyn_args.append(a)
    static_kw = tuple(sorted((k, v) for k, v in kwargs.items() if k in j._static_argnames))
    dyn_kw = {k: v for k, v in kwargs.items() if k not in j._static_argnames}
    static_key = (tuple(static_pos), static_kw)
    try:
        hash(static_key)
    except TypeError:
        for where, v in list(static_pos) + list(static_kw):
            try:
                hash(v)
            except TypeError:
                what = f"argument {where}" if isinstance(where, int) else f"argument {where!r}"
                raise StaticArgumentError(
                    f"jit({j._name}): static {what} is an unhashable "
                    f"{type(v).__name__} ({v!r:.60}); static arguments are cache keys and "
                    "must be hashable: pass a tuple instead of a list, or make the argument "
                    "non-static") from None
        raise
    return static_key, *flatten((tuple(dyn_args), dyn_kw))


def trace_entry(j, static_key, treedef, avals, wrap=None) -> _Entry:
    """Trace ``j``'s function on ``avals``; ``wrap`` (an upper layer's, e.g. explicit
    sharding's) transforms the flat function first."""
    static_pos, static_kw = static_key
    out_tree_box = []

    def flat_fun(*tracers):
        dyn_args, dyn_kw = tree_util.tree_unflatten(treedef, tracers)
        args = list(dyn_args)
        for i, v in static_pos:
            args.insert(i, v)
        outs = j._fun(*args, **dyn_kw, **dict(static_kw))
        leaves, out_tree = flatten_outputs(outs, f"jit({j._name})")
        out_tree_box.append(out_tree)
        return leaves

    fun = flat_fun if wrap is None else wrap(flat_fun)
    closed, hoisted = hoist_traced_consts(trace_to_program(fun, avals))
    return _Entry(closed, out_tree_box[0], hoisted)


# Two caches.  ``_plans`` is keyed by what is cheap to read off the arguments: the
# structure, the x64 switch and a key per leaf (no aval is built, only C-level
# hashing: see leaf_key); on a miss, the avals are computed and ``_cache`` (keyed by
# avals: a numpy array and an spmd.Array of one aval share their trace) gives the
# entry.  Without static or keyword arguments (the common case) the key holds the
# structure of ``args`` alone: no split, no sorting, and no wrapping tuple to flatten.
# ``prepare(key, static_key, treedef, leaves)``: the jit's maker of a new plan (it
# traces, and stores the plan under ``key`` when it may be kept).
def plan_of(j, args, kwargs, prepare):
    """The call plan for these arguments (made on a miss), and the leaves."""
    up = j._upper
    if j._no_static and not kwargs:
        leaves, treedef = flatten(args)
        key = (treedef, config.enable_x64, axis_env_key(), _ext.CONTEXT_KEY.fn(),
               tuple([(x.shape, x.dtype) if type(x) is NDARRAY else leaf_key(x, up)
                      for x in leaves]))
        plan = j._plans.get(key)
        if plan is None:
            plan = new_plan(j, prepare, key, NO_STATIC, flatten((args, EMPTY))[1], leaves)
        return plan, leaves
    static_key, leaves, treedef = signature(j, args, kwargs)
    # A 6-tuple: never equal to the 5-tuple keys of the common case.
    key = (treedef, static_key, config.enable_x64, axis_env_key(), _ext.CONTEXT_KEY.fn(),
           tuple([(x.shape, x.dtype) if type(x) is NDARRAY else leaf_key(x, up)
                  for x in leaves]))
    plan = j._plans.get(key)
    if plan is None:
        plan = new_plan(j, prepare, key, static_key, treedef, leaves)
    return plan, leaves


def new_plan(j, prepare, key, static_key, treedef, leaves):
    # (Named for what an upper layer does meanwhile: e.g. a collective set up.)
    with preparing(f"jit({j._name})"):
        return prepare(key, static_key, treedef, leaves)


def traced(j, static_key, treedef, leaves, extra=(), wrap=None) -> tuple:
    """``(entry, avals, cacheable)``: the traced program of a call signature (traced on
    a miss); not cacheable when it closed over an enclosing trace's values.  ``extra``
    and ``wrap``: an upper layer's part of the key and its transformation of the
    function (see :func:`trace_entry`).

    >>> entry, avals, keep = traced(jf, NO_STATIC, treedef, leaves)  # doctest: +SKIP
    """
    avals = tuple(map(arg_aval, leaves))  # raises DTypeError on unsupported leaves
    # The named axes in scope are part of the signature: a body traced inside a
    # shard_map over an 8-device axis is not the program for another mesh.
    akey = (treedef, static_key, avals, dtypes.x64_enabled(), axis_env_key(),
            _ext.CONTEXT_KEY.fn(), extra)
    entry = j._cache.get(akey)
    if entry is None:
        entry = trace_entry(j, static_key, treedef, avals, wrap)
        if any(isinstance(h, Tracer) for h in entry.hoisted):
            return entry, avals, False  # closed over an enclosing trace's values
        j._cache[akey] = entry  # only reached when tracing succeeded
    return entry, avals, True


def walked_plan(j, prepare, key, args, leaves):
    """The plan for a call that walk flattened (None: take the general path)."""
    flat, treedef = flatten((args, EMPTY))
    if len(flat) != len(leaves) or any(a is not b for a, b in zip(flat, leaves)):
        return None  # optree orders these leaves otherwise: never expected
    return new_plan(j, prepare, key, NO_STATIC, treedef, leaves)


def entry_of(j, args, kwargs, traced_by=traced):
    """The traced entry for these arguments, their leaves and avals, without a call
    plan (``lower``, ``trace``, ``eval_shape``: nothing is run, and no upper layer's
    plan is built, so one process alone may ask); ``traced_by``: the jit's
    :func:`traced`.

    >>> entry, leaves, avals = entry_of(jf, (np.ones(3),), {})  # doctest: +SKIP
    """
    if j._no_static and not kwargs:
        static_key, (leaves, treedef) = NO_STATIC, flatten((args, EMPTY))
    else:
        static_key, leaves, treedef = signature(j, args, kwargs)
    with preparing(f"jit({j._name})"):
        entry, avals, _ = traced_by(j, static_key, treedef, leaves)
    return entry, leaves, avals


def lookup(j, args, kwargs) -> tuple:
    """The call plan of these arguments (made on a miss by the jit's ``_prepare``) and
    their leaves.  (The maker is read from ``j`` on a miss only: a bound method made
    on every call costs the steady-state call 0.1 µs.)

    >>> plan, vals = lookup(jf, (np.ones(3),), {})             # doctest: +SKIP
    >>> run(jf, plan, (np.ones(3),), vals)                        # doctest: +SKIP
    Array([2., 2., 2.], dtype=float32)
    """
    # The common case (no static or keyword arguments; containers, arrays and
    # scalars) keys the plans on walk's tokens; anything else, plan_of.
    vals: list = []
    toks = [config.enable_x64, axis_env_key() if _trace_state.axis_env else (),
            _ext.CONTEXT_KEY.fn()]
    if j._no_static and not kwargs and walk(args, vals, toks, j._upper):
        key = tuple(toks)
        plan = j._plans.get(key)
        if plan is None:
            plan = walked_plan(j, j._prepare, key, args, vals)
            if plan is None:
                plan, vals = plan_of(j, args, kwargs, j._prepare)
    else:
        plan, vals = plan_of(j, args, kwargs, j._prepare)
        if plan.abstract:
            raise TypeError(f"jit({j._name}) was called with abstract arguments "
                            "(ShapeDtypeStruct), which have no values; pass arrays, or use "
                            ".trace(...), .lower(...) or spmd.eval_shape to trace only")
    return plan, vals


def run(j, plan: _CallPlan, args, vals: list):
    """Run a call of ``plan`` on its leaves ``vals`` (a fresh list: it is changed); see
    :func:`lookup` for an example."""
    if plan.bind or not is_eager():
        # Under a transformation, or (the compiler-only jit) arrays of an upper layer
        # among the leaves: the ``jit`` equation is bound, and evaluated by the trace
        # (eagerly: by those arrays' layer, extensions.EAGER_EVAL).
        outs = jit_p.bind(*plan.entry.hoisted, *vals, program=plan.entry.closed,
                          name=j._name)
        if plan.bind and j._donate_argnums:
            delete_donated(j, args)
        return outs[0] if plan.single else plan.out_tree.unflatten(outs)
    # Only the leaves that need it are touched (``vals`` is a fresh list).
    for i in plan.arrays:
        vals[i] = vals[i].value
    for i, a in plan.converts:
        vals[i] = to_array_value(vals[i], a)
    fn = plan.fn
    if fn is None:
        fn = plan.fn = plan.entry.exe.fn
    outs = fn(*vals)
    if j._donate_argnums:
        delete_donated(j, args)
    # Results of the generated code are fresh ndarrays of the right dtype, except
    # 0-d ones (numpy scalars), which wrap_value converts.
    if plan.single:
        o, a = outs[0], plan.out_avals[0]
        return Array(o, a) if type(o) is NDARRAY and o.dtype == a.dtype else wrap_value(o, a)
    return plan.out_tree.unflatten(
        [Array(o, a) if type(o) is NDARRAY and o.dtype == a.dtype else wrap_value(o, a)
         for o, a in zip(outs, plan.out_avals)])


def delete_donated(j, args) -> None:
    for i in j._donate_argnums:
        if i < len(args):
            for leaf in tree_util.tree_leaves(args[i]):
                if isinstance(leaf, Array):
                    leaf.delete()


def clear_caches(j) -> None:
    j._cache.clear()
    j._plans.clear()


# ------------------------------------------------------- the compiler's own jit

class JitFunction:
    """The compiler's own jit (the result of :func:`jit`): the functions above, with the
    compiler's plans (:class:`_CallPlan`).  ``spmd.jit`` is the shard layer's
    :class:`spmd.shard.call.jit.Jit`, which adds placed values and the stages."""

    # The key token of an Array of an upper layer's type (see walk).
    _upper = staticmethod(upper_token)

    def __init__(self, fun: Callable, static_argnums=None, static_argnames=None,
                 donate_argnums=None):
        init_jit(self, fun, static_argnums, static_argnames, donate_argnums)

    def __call__(self, *args, **kwargs):
        if config.disable_jit:  # spmd.disable_jit(): run the Python function op by op
            return self._fun(*args, **kwargs)
        plan, vals = lookup(self, args, kwargs)
        return run(self, plan, args, vals)

    def _prepare(self, key, static_key, treedef, leaves) -> _CallPlan:
        entry, avals, keep = traced(self, static_key, treedef, leaves)
        plan = _CallPlan(entry, leaves, avals)
        if keep:
            self._plans[key] = plan
        return plan

    def _entry(self, args, kwargs):
        return entry_of(self, args, kwargs)

    def eval_shape(self, *args, **kwargs):
        entry, _, _ = entry_of(self, args, kwargs)
        return tree_util.tree_unflatten(entry.out_tree, list(entry.out_avals))

    def clear_cache(self) -> None:
        clear_caches(self)

    def _cache_size(self) -> int:
        return len(self._cache)

    def __get__(self, obj, objtype=None):  # so that jit works on methods
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self):
        return f"<jit {self._name}>"


def jit(fun: Callable | None = None, *, static_argnums=None, static_argnames=None,
        donate_argnums=None):
    """Compile ``fun``: trace once per argument signature, then run generated code.

    >>> @jit
    ... def f(x):
    ...     return x * 2 + 1
    >>> f(np.arange(3.0))
    Array([1., 3., 5.], dtype=float32)
    """
    if fun is None:
        return functools.partial(jit, static_argnums=static_argnums,
                                 static_argnames=static_argnames, donate_argnums=donate_argnums)
    if not callable(fun):
        raise TypeError(f"jit: expected a function, got {type(fun).__name__}")
    return JitFunction(fun, static_argnums, static_argnames, donate_argnums)


def make_jaxpr(fun: Callable, static_argnums=None):
    """Return a function that traces ``fun`` and returns its :class:`ClosedProgram`.

    >>> print(make_jaxpr(lambda x: x + 1)(np.ones(3, np.float32)))  # doctest: +SKIP
    { lambda ; a:f32[3]. let
        b:f32[3] = add a 1.0
      in (b) }
    """
    def traced(*args, **kwargs):
        jf = JitFunction(fun, static_argnums=static_argnums)
        entry, _, _ = entry_of(jf, args, kwargs)
        return dce(entry.closed)  # dead equations are noise in a printed program

    return traced


def eval_shape(fun: Callable, *args, **kwargs):
    """The output avals (shape, dtype) of ``fun`` without running it.

    A function that knows its outputs' shardings (a jit with shardings, whose
    ``__spmd_eval_shape__`` does not return NotImplemented) answers itself, with
    ``ShapeDtypeStruct``s carrying them.

    >>> eval_shape(lambda x: x[:2], ShapeDtypeStruct((5,), np.float32))
    f32[2]
    """
    own = getattr(type(fun), "__spmd_eval_shape__", None)
    if own is not None:
        out = own(fun, *args, **kwargs)
        if out is not NotImplemented:  # (a jit without shardings: as any function)
            return out
    return JitFunction(fun).eval_shape(*args, **kwargs)


# ------------------------------------------- transformation rules of `jit`
# A nested jit is transparent to transformations: they see its body.  (The
# optimiser inlines nested jits anyway, so nothing is lost by inlining here.)

def _jit_jvp(primals, tangents, *, program, name):
    return jvp_flat(lambda *a: eval_program(program, *a), primals, tangents)


def _jit_batch(args, dims, *, program, name, _axis_data):
    # The body is batched under a level named like this one, so that collectives in
    # it still see the vmap or mesh axes (even when no argument is batched).
    level, size = _axis_data
    outs = batch_flat(lambda *a: eval_program(program, *a), args, dims, size, level,
                      [0] * len(program.out_avals))
    return outs, [0] * len(outs)


jit_p.def_jvp(_jit_jvp)
jit_p.def_batch(_jit_batch)
jit_p.def_vma(call_vma)
jit_p.rules.manual_types = call_types
jit_p.rules.batch_needs_axis = True

"""``spmd.jit``: the front door of a jitted call, placed values included.

One class, :class:`Jit`, plain or with shardings (then it holds a
:class:`~spmd.shard.partition.partitioned_jit.Partitioning`: its traces partition the
function).  It keys, traces and runs with the compiler's functions
(:mod:`spmd.compiler.core.jit`: ``lookup``, ``traced``, ``run``) and owns what
happens when a call's arguments are placed (sharded Arrays, Arrays spread over
processes closed over, a ``shard_map`` over processes inside).  Its call plans are keyed on the structure, each leaf's type and aval,
and for a placed leaf its sharding and whether it holds blocks or the whole value
(:func:`spmd.shard.call.plan.token`), with the statics, x64, the named axes and the mesh
context; on a miss the program is traced and handed to
:func:`spmd.shard.call.route.route`, which decides the plan (partition when
needed, the per-process executable, how each leaf is read, the output placements,
:mod:`spmd.shard.call.plan`); on a hit it is called.  Calls on unplaced values run the
compiler's plan as they always did.

>>> f = spmd.jit(lambda v: v * 2 + 1)
>>> x = spmd.device_put(np.arange(8.0), NamedSharding(mesh, P("d")))  # doctest: +SKIP
>>> f(x).sharding.spec                                                # doctest: +SKIP
PartitionSpec('d',)
"""

from __future__ import annotations

import functools
import time

from spmd import tree_util
from spmd.compiler.core.avals import ShapeDtypeStruct
from spmd.compiler.core import jit as compiler_jit
from spmd.compiler.core.jit import _CallPlan, _Entry
from spmd.compiler.core.jit import lookup as _lookup  # (a global: read on every call)
from spmd.compiler.passes.pipeline import dce
from spmd.compiler.core.trace import Tracer, is_eager
from spmd.config import config
from spmd.shard.call import plan as _call
# (A module: it imports the partitioner, whose package imports this module.)
from spmd.shard.call import route as routing
from spmd.shard.explicit import types as _explicit
from spmd.shard.explicit.mesh_context import tracing_call
from spmd.mesh import Mesh
from spmd.shard.call.stages import Lowered, Traced
# (A module of the partition package, which loads first: see spmd.shard.call.route.)
from spmd.shard.partition import partitioned_jit as _partitioned
from spmd.errors import SpmdError
from spmd.launch.timeline import recorder as _timeline
from spmd.shard.call import recording as _recording
from spmd.shard.call import tracebacks


class Placed:
    """A call signature whose values are placed: the traced entry and its
    :class:`spmd.shard.call.plan.Plan` (``bind``: under a transformation the ``jit``
    equation is bound, as for any plan)."""

    __slots__ = ("entry", "avals", "abstract", "single", "out_tree", "plan", "run",
                 "hoisted", "bind")

    def __init__(self, entry: _Entry, avals, abstract: bool, plan):
        self.entry = entry
        self.avals = avals
        self.abstract = abstract
        self.out_tree = entry.out_tree
        self.single = entry.out_tree.num_nodes == 1 and entry.out_tree.num_leaves == 1
        self.plan = plan
        # (A Plan's generated function; none for a trace's or abstract values.)
        self.run = _unrunnable if plan is None else getattr(plan, "run", plan)
        self.hoisted = list(entry.hoisted)
        self.bind = True


def _unrunnable(leaves):
    raise SpmdError("this jitted call's signature was traced under a transformation (its "
                    "leaves or closed-over values are tracers): it has no call plan to run "
                    "eagerly; a tracer may have escaped its transformation")


class Jit:
    """The result of ``spmd.jit(f)`` (see the module docstring), plain or with
    shardings.  Given ``in_shardings``, ``out_shardings`` or ``forbid_gather_bytes`` it
    holds a :class:`~spmd.shard.partition.partitioned_jit.Partitioning`, and its
    traces partition the function over the shardings' mesh (``.trace``/``.lower``/
    ``.eval_shape`` take arrays or ``ShapeDtypeStruct``s, whose ``sharding`` counts
    as an Array's); else ``_partitioning`` is None.  ``user=False`` marks the jits that
    run eager operations of sharded Arrays: ``disable_jit`` leaves them on (they would
    recurse)."""

    _upper = staticmethod(_call.token)

    def __init__(self, fun, static_argnums=None, static_argnames=None, donate_argnums=None,
                 *, in_shardings=None, out_shardings=None, forbid_gather_bytes=None,
                 user: bool = True):
        partitioning = None
        if in_shardings is not None or out_shardings is not None or \
                forbid_gather_bytes is not None:
            name = getattr(fun, "__name__", "fun")
            static_argnums, static_argnames, donate_argnums = _partitioned.argnums(
                fun, name, static_argnums, static_argnames, donate_argnums)
            partitioning = _partitioned.Partitioning(
                name, in_shardings, out_shardings, forbid_gather_bytes, static_argnums,
                static_argnames)
        # (After init_jit, whose update_wrapper copies the attributes of a jitted ``fun``.)
        compiler_jit.init_jit(self, fun, static_argnums, static_argnames, donate_argnums)
        self._partitioning = partitioning
        self._user = user

    def __call__(self, *args, **kwargs):
        # (An API boundary written out, not a wrapper: a try costs nothing until a raise.)
        try:
            if config.disable_jit and self._user:
                return self._fun(*args, **kwargs)
            plan, vals = _lookup(self, args, kwargs)
            if _timeline.ACTIVE is not None:  # (a load and a test: no call when no trace)
                return _recorded(self, plan, args, vals)
            # (The body of _call, written out: this is every jitted call's path.)
            if plan.__class__ is Placed and is_eager():
                outs = plan.run(plan.hoisted + vals if plan.hoisted else vals)
                if self._donate_argnums:
                    compiler_jit.delete_donated(self, args)
                return outs[0] if plan.single else plan.out_tree.unflatten(outs)
            return compiler_jit.run(self, plan, args, vals)
        except Exception as e:
            # The user's frames only (spmd.shard.call.tracebacks); a jit of spmd's own (an
            # eager operation on placed arrays) is no entry point: it filters nothing.
            if self._user:
                tracebacks.filter_exception(e)
            raise

    def _entry(self, args, kwargs):
        """The traced entry for these arguments, their leaves and avals (no call plan:
        see :func:`spmd.compiler.core.jit.entry_of`)."""
        if self._partitioning is None:
            return compiler_jit.entry_of(self, args, kwargs, _traced)
        return self._partitioning.entry(self._fun, args, kwargs)

    def _prepare(self, key, static_key, treedef, leaves):
        """The call plan of a new call signature (see :meth:`__call__`); with shardings,
        the partitioned trace of :meth:`_entry`, and how this call's leaves run it."""
        if self._partitioning is None:
            entry, avals, keep = _traced(self, static_key, treedef, leaves)
            plan = _make_plan(entry, leaves, avals)
            if keep:
                self._plans[key] = plan
            return plan
        static_pos, static_kw = static_key
        dyn, dkw = tree_util.tree_unflatten(treedef, leaves)
        args = list(dyn)
        for i, v in static_pos:
            args.insert(i, v)
        entry, leaves, avals = self._entry(tuple(args), {**dkw, **dict(static_kw)})
        everything = [*entry.hoisted, *leaves]
        abstract = any(type(x) is ShapeDtypeStruct for x in leaves)
        plan = None
        if not abstract and not any(isinstance(x, Tracer) for x in everything):
            # (In one process: the global program, placed results.)
            plan = routing.route(entry.closed, everything, entry.mesh, entry.partitioned)
        placed = Placed(entry, avals, abstract, plan)
        if not any(isinstance(h, Tracer) for h in entry.hoisted):
            self._plans[key] = placed  # (else: this call only, as a trace's values)
        return placed

    @tracebacks.api_boundary
    def lower(self, *args, **kwargs) -> Lowered:
        """The lowered program for these arguments (arrays or ``ShapeDtypeStruct``s);
        with shardings, the per-device program.

        >>> print(step.lower(x, y).as_text())  # doctest: +SKIP
        """
        entry, _, _ = self._entry(args, kwargs)
        return Lowered(entry, self._name)

    @tracebacks.api_boundary
    def trace(self, *args, **kwargs) -> Traced:
        """Trace for these arguments (arrays or ``ShapeDtypeStruct``s): ``.jaxpr``,
        ``.out_info`` (with shardings: the output shardings) and ``.lower()``.

        >>> spmd.jit(f).trace(ShapeDtypeStruct((8, 4), np.float32)).out_info  # doctest: +SKIP
        """
        entry, _, avals = self._entry(args, kwargs)
        return Traced(entry, self._name, avals)

    def eval_shape(self, *args, **kwargs):
        """The outputs' avals (with shardings: ``ShapeDtypeStruct``s with their
        shardings), computing nothing."""
        return self.trace(*args, **kwargs).out_info

    def __spmd_eval_shape__(self, *args, **kwargs):
        # spmd.eval_shape(f, ...) of a jit with shardings answers with its shardings;
        # of a plain jit, as of any function (NotImplemented).
        if self._partitioning is None:
            return NotImplemented
        return self.eval_shape(*args, **kwargs)

    def clear_cache(self) -> None:
        if self._partitioning is not None:
            self._partitioning.entries.clear()
        compiler_jit.clear_caches(self)

    def _cache_size(self) -> int:
        if self._partitioning is not None:
            return len(self._partitioning.entries)
        return len(self._cache)

    def __repr__(self):
        if self._partitioning is not None:
            return f"<jit {self._name} (partitioned)>"
        return f"<jit {self._name}>"

    def __get__(self, obj, objtype=None):  # so that jit works on methods
        return self if obj is None else functools.partial(self, obj)


def _call(j: Jit, plan, args, vals):
    """Run a call of ``plan`` (what :meth:`Jit.__call__` does after the lookup)."""
    if plan.__class__ is Placed and is_eager():
        outs = plan.run(plan.hoisted + vals if plan.hoisted else vals)
        if j._donate_argnums:
            compiler_jit.delete_donated(j, args)
        return outs[0] if plan.single else plan.out_tree.unflatten(outs)
    return compiler_jit.run(j, plan, args, vals)


def _recorded(j: Jit, plan, args, vals):
    """A call while a trace is on: run, and its span recorded on the devices it ran on
    (:mod:`spmd.shard.call.recording`; under a transformation nothing runs: no span)."""
    if not is_eager():
        return _call(j, plan, args, vals)
    t0 = time.monotonic()
    out = _call(j, plan, args, vals)
    _recording.program_called(j._name, plan, t0, time.monotonic())
    return out


def _traced(j, static_key, treedef, leaves):
    """:func:`spmd.compiler.core.jit.traced` for a :class:`Jit`: the meshes of placed
    arguments and, on explicit axes, the values' types key the trace (and the
    function is traced with those types)."""
    # A shard_map(mesh=AbstractMesh) inside may run on the mesh of the placed
    # arguments.
    meshes = tuple(dict.fromkeys(m for m in (getattr(getattr(x, "_sharding", None), "mesh",
                                                      None) for x in leaves)
                                 if isinstance(m, Mesh)))
    # (So the meshes key the trace: arguments on another mesh of the same shape
    # are another program.)
    on = ("meshes",) + meshes if meshes else ()
    with tracing_call(meshes):
        # On explicit mesh axes the values' shardings are part of their types: the
        # function is traced with them (spmd.shard.explicit.types), and they key the trace.
        sig = _explicit.signature(leaves)
        if sig is None:
            return compiler_jit.traced(j, static_key, treedef, leaves, on)
        mesh, types = sig
        lenient = _explicit.lenient_now()  # (an eager operation inside out_sharding=)
        return compiler_jit.traced(j, static_key, treedef, leaves,
                                  ("explicit", mesh, types, lenient) + on,
                                  lambda f: _explicit.wrap(f, mesh, types, lenient))


def _make_plan(entry: _Entry, leaves, avals):
    """The plan of a new unpartitioned call signature: routed when its values are placed."""
    plan = _CallPlan(entry, leaves, avals)
    if plan.abstract or any(isinstance(h, Tracer) for h in entry.hoisted) \
            or any(isinstance(x, Tracer) for x in leaves):
        return plan  # abstract values, or a call under a transformation
    everything = [*entry.hoisted, *leaves]
    placed = routing.route(entry.closed, everything)
    if placed is not None:
        return Placed(entry, avals, False, placed)
    if not entry.hoisted:
        plan.bind = False  # sharded leaves of no one mesh: whole values, unplaced
    return plan


def make_jaxpr(fun, static_argnums=None):
    """``spmd.make_jaxpr``: the program ``fun`` traces to, traced as :class:`Jit` traces
    it.  On explicit mesh axes it is traced with its values' types (ambiguities raise),
    each typed result is pinned by a ``sharding_constraint``, and the program prints
    each variable's type (``f32[8@x,4]``, a :class:`~spmd.shard.explicit.types.TypedProgram`).

    >>> print(spmd.make_jaxpr(lambda x: x + 1)(np.ones(3, np.float32)))  # doctest: +SKIP
    """
    @tracebacks.api_boundary
    def traced(*args, **kwargs):
        entry, leaves, _ = Jit(fun, static_argnums=static_argnums,
                               user=False)._entry(args, kwargs)
        closed = dce(entry.closed)  # dead equations are noise in a printed program
        sig = _explicit.signature(leaves)
        return closed if sig is None else _explicit.TypedProgram(closed, *sig)

    return traced

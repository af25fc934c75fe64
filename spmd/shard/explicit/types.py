"""Explicit sharding: on ``AxisType.Explicit`` mesh axes an array's sharding is part of
its type (JAX's explicit sharding mode).

A jitted function whose arguments are Arrays on an explicit mesh (or that runs
under ``set_mesh`` of one) is traced with its values' types: each value is an
:class:`ExplicitTracer` holding the traced value and its type, a
:class:`~spmd.shard.partition.placement.Placement`.  Every primitive's result type
comes from its rule (:mod:`spmd.shard.explicit.rules`): where the rule finds the
result ambiguous it raises :class:`~spmd.errors.ShardingTypeError` at that line,
naming the fix.  Each typed result is pinned in the traced program by a
``sharding_constraint``, so the partitioner places every value exactly as its
type says (no propagation choices), on one process or many.

``spmd.typeof(x).sharding`` reads the type; :func:`reshard` changes it (the
collective it needs is inserted by the partitioner); ``auto_axes`` and
``explicit_axes`` (:mod:`spmd.shard.explicit.modes`) switch axis types inside a program, as
traces over the same mesh with another *view* of its axis types.  Functions that
take ``out_sharding=`` (``spmd.numpy.einsum``, ``dot``, ``matmul``, ``reshape``,
``zeros``, ...) run through ``with_out_sharding`` (:mod:`spmd.shard.explicit.modes`): inside,
an ambiguous result is left untyped and the result is resharded to ``out_sharding``.

>>> mesh = spmd.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
>>> a = spmd.device_put(np.ones((8, 4)), NamedSharding(mesh, P("x", "y")))
>>> spmd.jit(lambda a: spmd.typeof(a @ a.T).sharding.spec)  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

from spmd import tree_util
from spmd.compiler.transforms.ad import JVPTracer
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.transforms.batching import BatchTracer
from spmd.compiler.core.ir import ClosedProgram, Namer, pp_program
from spmd.compiler.core.trace import (Trace, Tracer, full_raise, get_aval, is_eager, new_main)
from spmd.errors import ShardingTypeError
from spmd.mesh.mesh import AxisType, Mesh
from spmd.shard.explicit.rules import explicit_only, free_axes, out_types, replicated
from spmd.shard.explicit.mesh_context import device_put, get_mesh
from spmd.shard.partition.constraint import sharding_constraint_p
from spmd.shard.partition.placement import Placement
from spmd.shard.arrays.sharded import ShardedArray
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec, ct_spec


def is_explicit(mesh) -> bool:
    """Whether ``mesh`` has explicit axes."""
    return AxisType.Explicit in getattr(mesh, "axis_types", ())


# ------------------------------------------------------------------- the trace

class _Main:
    """An explicit trace's state: its mesh (the constraints' mesh, the partitioner's),
    its ``view`` (the mesh with the axis types that hold here: inside
    ``auto_axes(axes=...)`` some explicit axes are automatic), and how many lenient
    scopes are open (``out_sharding=``, :func:`trusted`: inside one an ambiguous result
    is untyped, not an error)."""

    __slots__ = ("mesh", "view", "lenient")

    def __init__(self, mesh, view=None):
        self.mesh = mesh
        self.view = mesh if view is None else view
        self.lenient = 0


class ExplicitTracer(Tracer):
    """A value and its type (a Placement, or None: untyped, placed by the partitioner)."""

    __slots__ = ("val", "type", "pinned", "_typed")

    def __init__(self, trace, val, typ, pinned: bool = False):
        self._trace = trace
        self.val = val
        self.type = typ
        self.pinned = pinned  # val is constrained to type in the program already
        self._typed = None

    @property
    def aval(self):
        # The abstract value with its type (``x.aval.sharding``, as in JAX), made once.
        if self._typed is None:
            self._typed = typeof(self)
        return self._typed

    def full_lower(self):
        return self  # the type is part of the value: it is never dropped

    def typed_on(self):
        """``(mesh, Placement or None)``: how lower modules read a traced value's type
        (``shard_map``'s inferred ``in_specs``) without importing this one."""
        return type_of(self)


def pin(val, typ, mesh, view=None):
    """``val`` constrained to ``typ`` in the traced program (untyped: as it is); the
    axes automatic in ``view`` (default: ``mesh``'s) are left to the partitioner."""
    if typ is None:
        return val
    free = free_axes(mesh if view is None else view)
    if free:  # the automatic axes stay the partitioner's
        return sharding_constraint_p.bind(val, spec=typ.to_spec(), mesh=mesh, free=free)
    return sharding_constraint_p.bind(val, spec=typ.to_spec(), mesh=mesh)


class ExplicitTrace(Trace):
    def pure(self, val):
        # A value typed by an enclosing explicit trace keeps its type; any other is
        # whole (a constant, a numpy value).
        t = type_of(val)
        state = self.main.global_data
        if t is not None and t[0] == state.mesh:
            return ExplicitTracer(self, val, None if t[1] is None else
                                  explicit_only(t[1], state.view))
        return ExplicitTracer(self, val, replicated(len(get_aval(val).shape)))

    lift = pure

    def process_primitive(self, prim, tracers, params):
        state = self.main.global_data
        vals = [t.val for t in tracers]
        types = [t.type for t in tracers]
        types_out = out_types(prim, [get_aval(v) for v in vals], types, params, state.view,
                              state.lenient > 0)
        outs = prim.bind(*vals, **params)
        outs = list(outs) if prim.multiple_results else [outs]
        if prim is not sharding_constraint_p:
            outs = [pin(o, t, state.mesh, state.view) for o, t in zip(outs, types_out)]
        return [ExplicitTracer(self, o, t, True) for o, t in zip(outs, types_out)]


_local = threading.local()


def _stack() -> list:
    st = getattr(_local, "stack", None)
    if st is None:
        st = _local.stack = []
    return st


def active() -> ExplicitTrace | None:
    """The innermost explicit trace of this thread, or None."""
    st = _stack()
    return st[-1] if st else None


@contextmanager
def explicit_trace(mesh, view=None):
    """A new explicit trace over ``mesh`` for the block (typed on ``view``'s explicit
    axes: ``mesh`` with some axis types changed; default ``mesh``)."""
    with new_main(ExplicitTrace, _Main(mesh, view)) as main:
        trace = ExplicitTrace(main)
        _stack().append(trace)
        try:
            yield trace
        finally:
            _stack().pop()


@contextmanager
def _suspended():
    """No explicit trace is active in the block (``auto_axes``)."""
    st = _stack()
    saved = st[:]
    st.clear()
    try:
        yield
    finally:
        st[:] = saved


# --------------------------------------------------------------------- types

class TypedAval(ShapedArray):
    """``spmd.typeof(x)`` of an explicitly sharded value: its abstract value and its
    ``sharding`` (a NamedSharding; None where it is untyped).  Compares and hashes as
    the plain abstract value."""

    __slots__ = ("sharding",)

    def __init__(self, aval: ShapedArray, sharding):
        super().__init__(aval.shape, aval.dtype, aval.weak_type, aval.vma, aval.unreduced,
                         aval.reduced)
        self.sharding = sharding

    def str_short(self) -> str:
        s = super().str_short()
        spec = None if self.sharding is None else self.sharding.spec
        if not spec and not getattr(spec, "unreduced", None) and \
                not getattr(spec, "reduced", None):
            return s
        name, _, rest = s.partition("[")
        dims = rest.split("]")[0].split(",")
        for d in range(min(len(dims), len(spec))):
            axes = spec.axes_of(d)
            if axes:
                dims[d] += "@" + (axes[0] if len(axes) == 1 else "(" + ",".join(axes) + ")")
        u = "{U:" + ",".join(sorted(spec.unreduced)) + "}" if spec.unreduced else ""
        u += "{R:" + ",".join(sorted(spec.reduced)) + "}" if spec.reduced else ""
        return f"{name}[{','.join(dims)}]" + s.split("]", 1)[1] + u

    __repr__ = __str__ = str_short


def _explicit_of(x):
    """``(the ExplicitTracer x carries, the batch dimensions between them)``: ``x`` itself,
    a JVP's primal, or a batched value's (``vmap``; its batch dimensions, outermost
    first, are not part of the carried type's view of ``x``), or ``(None, ())``."""
    bdims = []
    while isinstance(x, Tracer):
        if isinstance(x, ExplicitTracer):
            return x, tuple(bdims)
        if isinstance(x, JVPTracer):
            x = x.primal
        elif isinstance(x, BatchTracer):
            if x.bdim is not None:
                bdims.append(x.bdim)
            x = x.val
        else:
            return None, ()
    return None, ()


def type_of(x):
    """``(mesh, Placement or None)`` of an explicitly typed value, else None."""
    e, bdims = _explicit_of(x)
    if e is not None:
        typ = e.type
        # Under vmap: the batch dimensions leave the type (innermost vmap's last).
        for d in reversed(bdims):
            if typ is not None:
                typ = Placement(typ.dims[:d] + typ.dims[d + 1:], typ.partial)
        return e._trace.main.global_data.mesh, typ
    if isinstance(x, ShardedArray):
        s = x._sharding
        if isinstance(s, NamedSharding) and is_explicit(s.mesh):
            return s.mesh, explicit_only(Placement.from_spec(s.spec, x.ndim), s.mesh)
    return None


def typeof(x) -> ShapedArray:
    """The abstract value of ``x`` (``jax.typeof``): shape, dtype, ``.vma`` in a
    ``shard_map`` body, and on explicit axes ``.sharding``.

    >>> spmd.typeof(spmd.reshard(a, P("x"))).sharding.spec  # doctest: +SKIP
    PartitionSpec('x',)
    """
    # (An ExplicitTracer's own aval is this function's result: read its value's.)
    aval = get_aval(x.val if isinstance(x, ExplicitTracer) else x)
    t = type_of(x)
    if t is None:
        return aval
    mesh, typ = t
    e, _ = _explicit_of(x)
    if e is not None:  # the mesh as its axes are typed here (auto_axes changes them)
        mesh = e._trace.main.global_data.view
    if typ is None:
        return TypedAval(aval, None)
    # The spec names every dimension, as JAX's types do: a 3-d value split on its
    # second dimension is P(None, 'y', None), not P(None, 'y').
    parts = tuple(typ.to_spec()) + (None,) * (aval.ndim - len(typ.to_spec()))
    return TypedAval(aval, NamedSharding(mesh, PartitionSpec(
        *parts, unreduced=typ.partial, reduced=typ.reduced)))


# ------------------------------------------------------------ jit's signature

def signature(leaves):
    """``(mesh, types)`` when a jitted call's values are typed (an argument on an
    explicit mesh, or the current mesh explicit), else None.  One explicit mesh only."""
    mesh, found = None, []
    for x in leaves:
        t = type_of(x)
        found.append(t)
        if t is not None:
            if mesh is not None and t[0] != mesh:
                raise ShardingTypeError(
                    f"arguments are typed on two meshes, {mesh!r} and {t[0]!r}; put them on "
                    "one mesh (spmd.device_put(x, NamedSharding(mesh, spec)))")
            mesh = t[0]
    if mesh is None:
        ctx = get_mesh()
        if not is_explicit(ctx):
            return None
        mesh = ctx
    types = tuple(replicated(len(get_aval(x).shape)) if t is None else t[1] for x, t in
                  zip(leaves, found))
    return mesh, types


class TypedProgram(ClosedProgram):
    """What ``spmd.make_jaxpr`` gives for a program traced on explicit axes: the program,
    printed with the types of its arguments and of each ``sharding_constraint``'s result,
    ``f32[8@x,4]``.  A typed result shows as the constraint that pins it: the value
    before it prints untyped (an ``out_sharding=`` leaves it so, to the partitioner)."""

    __slots__ = ("types",)

    def __init__(self, closed: ClosedProgram, mesh, arg_types):
        super().__init__(closed.program, closed.consts)
        types = {}

        def name(var, placement):
            types.setdefault(id(var), TypedAval(var.aval, NamedSharding(
                mesh, explicit_only(placement, mesh).to_spec())).str_short())

        prog = closed.program
        for var, typ in zip(prog.in_vars[len(prog.in_vars) - len(arg_types):], arg_types):
            if typ is not None:
                name(var, typ)
        for eqn in prog.eqns:
            if eqn.primitive is sharding_constraint_p and eqn.params.get("mesh") == mesh:
                name(eqn.outputs[0],
                     Placement.from_spec(eqn.params["spec"], eqn.outputs[0].aval.ndim))
        self.types = types

    def __str__(self):
        return pp_program(self.program, n_consts=len(self.consts), namer=Namer(self.types))

    __repr__ = __str__


def lenient_now() -> bool:
    """Whether the active explicit trace leaves ambiguous results untyped (an
    ``out_sharding=`` scope, a replay): an eager operation run meanwhile does too."""
    tr = active()
    if tr is None:
        return getattr(_local, "lenient", 0) > 0
    return tr.main.global_data.lenient > 0


def wrap(flat_fun, mesh, types, lenient: bool = False, view=None):
    """``flat_fun`` traced with its arguments typed ``types``: its results pinned to
    their types.  ``lenient``: ambiguous results are untyped, not errors.  ``view``:
    the mesh as its axes are typed inside (a partial-manual ``shard_map`` body's, its
    manual axes ``Manual``); the arguments are pinned on entry there (nothing placed
    them so before)."""
    def typed(*args):
        with explicit_trace(mesh, view) as trace:
            trace.main.global_data.lenient = int(lenient)
            if view is None:
                ins = [ExplicitTracer(trace, a, t) for a, t in zip(args, types)]
            else:
                ins = [ExplicitTracer(trace, pin(a, t, mesh, view), t, True)
                       for a, t in zip(args, types)]
            outs = flat_fun(*ins)
            res = []
            for k, o in enumerate(outs):
                o = full_raise(trace, o)
                # (A result of an operation is pinned already; an argument or a
                # constant is not.)
                res.append(o.val if o.pinned else pin(o.val, o.type, mesh))
            return res
    return typed


# ----------------------------------------------------------------- reshard

def _resolve(sharding, where: str, x=None):
    """A NamedSharding from a NamedSharding or a PartitionSpec (on the explicit trace's
    mesh, else the current mesh, else ``x``'s)."""
    if isinstance(sharding, NamedSharding):
        return sharding
    if sharding is None:
        sharding = PartitionSpec()
    if not isinstance(sharding, PartitionSpec):
        raise ShardingTypeError(f"{where}: expected a PartitionSpec or NamedSharding, got "
                                f"{type(sharding).__name__} {sharding!r}")
    tr = active()
    mesh = tr.main.global_data.mesh if tr is not None else get_mesh()
    if mesh is None and isinstance(x, ShardedArray) and isinstance(x._sharding, NamedSharding):
        mesh = x._sharding.mesh
    if mesh is None and x is not None:
        t = type_of(x)
        mesh = None if t is None else t[0]
    if not isinstance(mesh, Mesh):
        raise ShardingTypeError(
            f"{where}: the PartitionSpec {sharding!r} needs a mesh: call it under "
            "spmd.sharding.set_mesh(mesh) (or use_mesh), or pass NamedSharding(mesh, spec)")
    return NamedSharding(mesh, sharding)


def _reshard_one(x, sharding):
    s = _resolve(sharding, "reshard", x)
    tr = active()
    view = tr.main.global_data.view if tr is not None and \
        s.mesh == tr.main.global_data.mesh else s.mesh
    free = free_axes(view) if is_explicit(view) else frozenset()
    auto = sorted(set(s.spec.mesh_axes) & free)
    if auto:
        raise ShardingTypeError(
            f"reshard: {s.spec!r} names automatic axes {auto} of {view!r}: a type names "
            "explicit axes only (the partitioner places values along the others); leave "
            "them out, or use with_sharding_constraint")
    if isinstance(x, Tracer) or not is_eager():
        if tr is not None and not isinstance(x, ExplicitTracer) and (
                not isinstance(x, Tracer) or x._trace.main.level < tr.main.level):
            x = tr.pure(x)  # a constant of the explicit trace: typed from here on
        if free:  # the automatic axes stay the partitioner's
            return sharding_constraint_p.bind(x, spec=s.spec, mesh=s.mesh, free=free)
        return sharding_constraint_p.bind(x, spec=s.spec, mesh=s.mesh)
    return device_put(x, s)


def reshard(xs, out_shardings):
    """``xs`` (a pytree) with the shardings ``out_shardings`` (a PartitionSpec or
    NamedSharding, or a pytree of them matching ``xs``): on explicit axes their types,
    else a sharding constraint; on concrete Arrays, ``device_put``.

    >>> y = spmd.sharding.reshard(x, P(None, "x"))   # doctest: +SKIP
    """
    if isinstance(out_shardings, (PartitionSpec, NamedSharding)) or out_shardings is None:
        return tree_util.tree_map(lambda v: _reshard_one(v, out_shardings), xs)
    return tree_util.tree_map(_reshard_one, xs, out_shardings,
                              is_leaf=lambda s: isinstance(s, (PartitionSpec, NamedSharding)))


# ------------------------------------------------ out_sharding and the modes

@contextmanager
def trusted():
    """The block replays or transposes a program whose types were checked when it was
    traced (``linearize``'s known part, a backward pass): on the active explicit trace
    an ambiguous result is untyped there, not an error (the program's constraints give
    the types back; each cotangent is given its primal's, :func:`like_primal`)."""
    tr = active()
    # Eagerly (no trace) the operations run one by one, each a jit of its own, which
    # reads the flag (lenient_now).
    state = tr.main.global_data if tr is not None else _local
    state.lenient = getattr(state, "lenient", 0) + 1
    try:
        yield
    finally:
        state.lenient -= 1


def retyped(flat_fun, primals):
    """``flat_fun`` traced with the types of ``primals`` (its arguments are traced
    stand-ins for them: a gradient's, whose program is traced abstractly), so that the
    types are checked, and ``typeof`` reads them, in the user's code; else ``flat_fun``."""
    sig = signature(primals)
    if sig is None:
        return flat_fun
    return wrap(flat_fun, *sig)


def like_primal(ct, primal):
    """``ct`` resharded to the type of ``primal``'s cotangent when that is explicit (else
    ``ct``): the primal's, with unreduced and reduced axes swapped."""
    t = type_of(primal)
    if t is None or t[1] is None or isinstance(ct, np.ndarray):
        return ct
    return reshard(ct, NamedSharding(t[0], ct_spec(t[1].to_spec())))

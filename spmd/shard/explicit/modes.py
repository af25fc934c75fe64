"""Switching axis types inside a program: ``auto_axes`` (some explicit axes become
automatic: the partitioner places values along them) and ``explicit_axes`` (some
axes become explicit: values are typed along them), JAX's ``jax.sharding.auto_axes``
and ``explicit_axes``.

Each opens an explicit trace (:mod:`spmd.shard.explicit.types`) over the same mesh with a
different *view*: the mesh as its axes are typed inside.  The constraints that pin
types there leave the view's automatic axes free, so one program, partitioned over
one mesh, mixes the modes.

>>> f = auto_axes(lambda a: a.reshape(-1), axes="y", out_sharding=P("x"))  # doctest: +SKIP
"""

from __future__ import annotations

from spmd import tree_util
from spmd.compiler.core.trace import full_raise, get_aval, is_eager
from spmd.errors import ShardingTypeError
from spmd.mesh.mesh import AxisType, Mesh
from spmd.shard.explicit.types import (ExplicitTracer, _resolve, _suspended, active, explicit_trace,
                                 is_explicit, pin, reshard, type_of)
from spmd.shard.arrays.sharded import ShardedArray
from spmd.shard.call.jit import Jit
from spmd.shard.explicit.rules import explicit_only
from spmd.shard.explicit.mesh_context import get_mesh
from spmd.shard.partition.placement import Placement
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec


# ------------------------------------------------------------- out_sharding=

def with_out_sharding(fn, args, out_sharding, where: str, static: tuple = ()):
    """``fn(*static, *args)`` (``static``: hashable leading arguments), its result
    resharded to ``out_sharding`` (None: just the call).  On explicit axes, results
    inside that would be ambiguous are untyped instead of an error: the final sharding
    is given.

    >>> with_out_sharding(_dot, (a, b), P("x"), "spmd.numpy.dot")  # doctest: +SKIP
    """
    if out_sharding is None:
        return fn(*static, *args)
    if is_eager() and any(type_of(a) is not None for a in args if isinstance(a, ShardedArray)):
        return _eager_jit(fn, static, out_sharding, where)(*args)
    tr = active()
    if tr is None:
        return reshard(fn(*static, *args), out_sharding)
    state = tr.main.global_data
    state.lenient += 1
    try:
        out = fn(*static, *args)
    finally:
        state.lenient -= 1
    return reshard(out, _resolve(out_sharding, where))


_EAGER: dict = {}


def _eager_jit(fn, static, out_sharding, where):
    """A cached jit of ``fn`` with ``out_sharding`` (eager calls on typed Arrays)."""
    key = (fn, static, out_sharding, where)
    j = _EAGER.get(key)
    if j is None:
        def call(*xs):
            return with_out_sharding(fn, xs, out_sharding, where, static)

        call.__name__ = where
        if len(_EAGER) >= 1024:
            _EAGER.clear()
        j = _EAGER[key] = Jit(call, user=False)
    return j


# ------------------------------------------------------------------ the modes

def _retyped(view, axes, to, where):
    """``view`` with ``axes`` (a name, names, or None: all of its axes not ``to`` yet)
    made ``to`` (``Auto`` or ``Explicit``)."""
    names = tuple(view.axis_names) if axes is None else \
        ((axes,) if isinstance(axes, str) else tuple(axes))
    unknown = [a for a in names if a not in view.axis_names]
    if unknown:
        raise ShardingTypeError(f"{where}(axes={axes!r}): {unknown[0]!r} is not an axis of "
                                f"the mesh {view!r}; name some of {view.axis_names}")
    return Mesh(view.devices, view.axis_names, axis_types=tuple(
        to if a in names else t for a, t in zip(view.axis_names, view.axis_types)))


def _enter(tr, inner, args, kwargs):
    """``(args, kwargs)`` with ``tr``'s values as ``inner``'s, typed on its view."""
    view = inner.main.global_data.view

    def move(v):
        if isinstance(v, ExplicitTracer) and v._trace.main is tr.main:
            return ExplicitTracer(inner, v.val, None if v.type is None else
                                  explicit_only(v.type, view))
        return v

    return tree_util.tree_map(move, (args, kwargs))


def _leave(inner, out):
    """``inner``'s results as values of the trace below (pinned to their types)."""
    state = inner.main.global_data

    def val(o):
        o = full_raise(inner, o)
        return o.val if o.pinned else pin(o.val, o.type, state.mesh, state.view)

    return tree_util.tree_map(val, out)


def auto_axes(fun=None, /, *, axes=None, out_sharding=None):
    """``fun`` with its values untyped along ``axes`` (None: all the explicit axes) —
    the partitioner places them there, as on ``Auto`` axes; its results resharded to
    ``out_sharding`` (given here or as a keyword of the call).

    >>> y = spmd.sharding.auto_axes(lambda a: a.reshape(-1), out_sharding=P("x"))(a)  # doctest: +SKIP
    """
    if fun is None:
        return lambda f: auto_axes(f, axes=axes, out_sharding=out_sharding)

    def auto(*args, **kwargs):
        out_s = kwargs.pop("out_sharding", None) if out_sharding is None else out_sharding
        if out_s is None:
            raise TypeError("auto_axes: missing required keyword argument 'out_sharding' "
                            "(the results' shardings on the explicit axes)")
        if is_eager() and any(type_of(a) is not None for a in tree_util.tree_leaves(args)):
            return Jit(lambda *a: auto(*a, out_sharding=out_s), user=False)(*args, **kwargs)
        tr = active()
        if tr is None:
            return reshard(fun(*args, **kwargs), out_s)
        state = tr.main.global_data
        view = _retyped(state.view, axes, AxisType.Auto, "auto_axes")
        mesh_s = _resolve_tree(out_s, "auto_axes", state.mesh)
        if is_explicit(view):  # some explicit axes stay: a trace typed on those
            with explicit_trace(state.mesh, view) as inner:
                args, kwargs = _enter(tr, inner, args, kwargs)
                inner.main.global_data.lenient = state.lenient
                out = _leave(inner, fun(*args, **kwargs))
        else:
            def strip(v):
                return v.val if isinstance(v, ExplicitTracer) and v._trace.main is tr.main \
                    else v

            args, kwargs = tree_util.tree_map(strip, (args, kwargs))
            with _suspended():
                out = fun(*args, **kwargs)
        return reshard(tree_util.tree_map(tr.pure, out), mesh_s)

    auto.__name__ = getattr(fun, "__name__", "auto")
    return auto


def _resolve_tree(shardings, where, mesh):
    return tree_util.tree_map(
        lambda s: s if isinstance(s, NamedSharding) else NamedSharding(mesh, s),
        shardings, is_leaf=lambda s: isinstance(s, (PartitionSpec, NamedSharding)))


def explicit_axes(fun=None, /, *, axes=None, in_sharding=None):
    """``fun`` traced with its array arguments typed ``in_sharding`` (a PartitionSpec or
    a pytree of them on the current mesh, given here or as a keyword of the call) on
    ``axes`` (None: all the mesh's axes), which are explicit inside; its results leave
    untyped along them.

    >>> f = spmd.sharding.explicit_axes(g, in_sharding=P("x"))  # doctest: +SKIP
    """
    if fun is None:
        return lambda f: explicit_axes(f, axes=axes, in_sharding=in_sharding)

    def explicit(*args, **kwargs):
        in_s = kwargs.pop("in_sharding", None) if in_sharding is None else in_sharding
        if in_s is None:
            raise TypeError("explicit_axes: missing required keyword argument 'in_sharding'")
        tr = active()
        mesh = tr.main.global_data.mesh if tr is not None else get_mesh()
        if mesh is None:
            raise ShardingTypeError("explicit_axes: no current mesh; call it under "
                                    "spmd.sharding.set_mesh(mesh)")
        base = tr.main.global_data.view if tr is not None else mesh
        view = _retyped(base, axes, AxisType.Explicit, "explicit_axes")
        leaves, tree = tree_util.tree_flatten(args)
        specs = tree_util.tree_leaves(
            _resolve_tree(in_s, "explicit_axes", mesh) if not isinstance(
                in_s, (PartitionSpec, NamedSharding)) else [in_s] * len(leaves),
            is_leaf=lambda s: isinstance(s, (PartitionSpec, NamedSharding)))
        if len(specs) != len(leaves):
            raise ShardingTypeError(f"explicit_axes: in_sharding has {len(specs)} shardings "
                                    f"for {len(leaves)} arrays; give one per argument")
        if tr is not None:
            leaves = [full_raise(tr, x).val for x in leaves]
        with explicit_trace(mesh, view) as trace:
            typed = []
            for x, s in zip(leaves, specs):
                t = explicit_only(Placement.from_spec(_resolve(s, "explicit_axes").spec,
                                                      len(get_aval(x).shape)), view)
                typed.append(ExplicitTracer(trace, pin(x, t, mesh, view), t, True))
            out = fun(*tree_util.tree_unflatten(tree, typed), **kwargs)
            types = tree_util.tree_map(lambda o: full_raise(trace, o).type, out)
            out = _leave(trace, out)
        if tr is None:
            return out
        # Back in the enclosing trace: typed on its explicit axes as they were here.
        outer = tr.main.global_data.view
        return tree_util.tree_map(
            lambda o, t: ExplicitTracer(tr, o, None if t is None else explicit_only(t, outer),
                                        True), out, types)

    explicit.__name__ = getattr(fun, "__name__", "explicit")
    return explicit

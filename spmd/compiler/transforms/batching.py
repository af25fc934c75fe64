"""vmap: the batching trace and the helpers batching rules are written with.

A batching rule ``rule(args, dims, **params) -> (out, out_dim)`` receives each
argument with its batch axis (``None`` when the argument is not batched).
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import numpy as np
from spmd import tree_util
from spmd.compiler.transforms.array_ops import OPS
from spmd.compiler.core.communication import collective_axes, communicates  # noqa: F401
from spmd.compiler.core.trace import abstract_eval, bind, extend_axis_env
from spmd.errors import ArgumentError

not_mapped = None


def bdim_size(args, dims) -> int:
    """The batch size, read off the first batched argument."""
    for a, d in zip(args, dims):
        if d is not None:
            return np.shape(a)[d]
    raise ValueError("bdim_size: no batched argument")


def move_to_front(x, d):
    """Move batch axis ``d`` of ``x`` to position 0 (no-op when already there)."""
    if d == 0:
        return x
    nd = len(np.shape(x))
    perm = (d,) + tuple(i for i in range(nd) if i != d)
    return OPS.transpose(x, perm)


def move_axis(x, src, dst):
    """Move axis ``src`` of ``x`` to position ``dst``."""
    if src == dst:
        return x
    nd = len(np.shape(x))
    order = [i for i in range(nd) if i != src]
    order.insert(dst, src)
    return OPS.transpose(x, tuple(order))


def broadcast_batch(x, d, size):
    """``x`` with its batch axis at 0, materialising it when ``d`` is None."""
    if d is None:
        shape = tuple(np.shape(x))
        return OPS.broadcast_in_dim(x, (size,) + shape, tuple(range(1, len(shape) + 1)))
    return move_to_front(x, d)


# --------------------------------------------------------------- the trace

from spmd.compiler.core.manual_types import UnreducedRuleError  # noqa: E402
from spmd.compiler.core.trace import (Trace, Tracer, _state, dynamic_trace, full_lower,  # noqa: E402
                                 full_raise, get_aval, new_main)


class BatchTracer(Tracer):
    __slots__ = ("val", "bdim", "vma")

    def __init__(self, trace, val, bdim, vma=None):
        self._trace = trace
        self.val = val
        self.bdim = bdim
        # In an eager shard_map body traced with check_vma: the mesh axes this value's
        # type varies along (computed by the primitives' rules); else None.
        self.vma = vma

    @property
    def aval(self):
        aval = get_aval(self.val)
        if self.bdim is not None:
            aval = aval.update(shape=aval.shape[:self.bdim] + aval.shape[self.bdim + 1:])
        return aval if self.vma is None else aval.update(vma=self.vma)

    def full_lower(self):
        # In the body of an eager shard_map (its level is the dynamic trace) a value
        # the same on every device stays a body value: it keeps its type and prints
        # per device, as in JAX.  Inside batching rules values are plain as usual.
        if self.bdim is None and not _in_eager_body(self._trace.main):
            return full_lower(self.val)
        return self

    # At a level marked ``concrete`` (an eager shard_map, spmd/shard/maps/on_blocks.py)
    # values are real: one converts to a Python value when it is the same on every
    # device, and prints as each device's block.  ``level.concrete`` is the hook the
    # shard layer gives (it knows the mesh and how its devices agree);
    # elsewhere the Tracer behaviour stands.
    def _hook(self):
        return _eager_hook(self._trace.main)

    def _concrete(self, what, convert):
        hook = self._hook()
        if not hook:
            return getattr(Tracer, f"__{what}__")(self)
        return convert(hook.value(self, f"{what}()"))

    def __bool__(self):
        return self._concrete("bool", bool)

    def __int__(self):
        return self._concrete("int", int)

    def __float__(self):
        return self._concrete("float", float)

    def __index__(self):
        import operator

        return self._concrete("index", operator.index)

    def __str__(self):
        hook = self._hook()
        return hook.text(self) if hook else Tracer.__repr__(self)

    def __repr__(self):
        hook = self._hook()
        return hook.text(self) if hook else Tracer.__repr__(self)

    def __format__(self, spec):
        hook = self._hook()
        if not hook:
            return Tracer.__format__(self, spec)
        return hook.text(self, spec)


def _in_eager_body(main) -> bool:
    """True while user code of an eager shard_map body runs at ``main``'s level."""
    return dynamic_trace() is main and _eager_hook(main) is not None


def _eager_hook(main):
    """The eager shard_map hook of ``main``'s level when ``main`` is that shard_map's
    own level (levels that rules open to re-batch bodies share its NamedAxes but
    trace programs: their values are not concrete)."""
    hook = getattr(main.global_data[0], "concrete", None)
    return hook if hook is not None and hook.main is main else None


class BatchTrace(Trace):
    """Carries a batch axis through each primitive with its batching rule.

    ``main.global_data`` is ``(axis_name, axis_size)``: collectives over
    ``axis_name`` under vmap read it (JAX's named-axis vmap).
    """

    def pure(self, val):
        hook = _eager_hook(self.main)
        return BatchTracer(self, val, None, frozenset() if getattr(hook, "typed", False)
                           else None)

    lift = pure

    def process_primitive(self, prim, tracers, params):
        dyn = _state.dynamic
        if dyn[-1] is not self.main:
            return self._process(prim, tracers, params)
        # An eager shard_map's level is the dynamic trace (values made in its body are
        # body values too); the rules' own binds go to the level below.  The hook
        # sees each operation first.
        hook = _eager_hook(self.main)
        if hook is not None:
            hook.before(prim, tracers, params, self._communicates(prim, params))
        dyn.append(None)
        try:
            if getattr(hook, "typed", False):
                return self._process_typed(prim, tracers, params)
            return self._process(prim, tracers, params)
        finally:
            dyn.pop()

    def _process_typed(self, prim, tracers, params):
        """An eager shard_map body with check_vma: values carry their varying-axes
        types, computed by the primitives' rules on the blocks' types as in a traced
        body (so that e.g. grad inside the body sums over devices, JEP 17111)."""
        avals = [t.aval for t in tracers]
        if prim.vma is None and len(avals) > 1:  # an implicit pvary: the types join
            union = frozenset().union(*(a.vma for a in avals))
            avals = [a.update(vma=union) for a in avals]
        out_avals = abstract_eval(prim, avals, params)
        if any(a.unreduced or a.reduced for a in out_avals):
            # (The eager types carry the varying axes only.)
            raise UnreducedRuleError(
                f"{prim.name} makes an unreduced or reduced value ({out_avals[0]}) in an "
                "eager shard_map body, whose values are typed by their varying axes only; "
                "give the shard_map out_specs with unreduced=/reduced=, or wrap it in jit")
        outs = self._process(prim, tracers, params)
        for o, a in zip(outs, out_avals):
            o.vma = a.vma
        return outs

    def _process(self, prim, tracers, params):
        vals = [t.val for t in tracers]
        dims = [t.bdim for t in tracers]
        if all(d is None for d in dims) and not self._communicates(prim, params) and \
                not prim.rules.batch_always:
            out = bind(prim, *vals, **params)
            outs = out if prim.multiple_results else [out]
            return [BatchTracer(self, o, None) for o in outs]
        rule = prim.batch
        if rule is None:
            raise NotImplementedError(f"vmap of '{prim.name}' is not supported (it has no "
                                      "batching rule)")
        rule_params = dict(params)
        if prim.rules.batch_needs_axis or prim.rules.batch_reads_level:
            # batch_reads_level: the rule reads the level (e.g. its spmd_axis_name) but,
            # unlike a collective, does not communicate over the level's axes.
            rule_params["_axis_data"] = self.main.global_data
        out, out_dims = rule(vals, dims, **rule_params)
        if prim.multiple_results:
            return [BatchTracer(self, o, d) for o, d in zip(out, out_dims)]
        return [BatchTracer(self, out, out_dims)]

    def _communicates(self, prim, params) -> bool:
        """A collective over this level's named axes acts even on unbatched values
        (``psum`` of an invariant value scales it; ``axis_index`` creates one), and so
        does a higher-order primitive whose body holds such a collective."""
        level = self.main.global_data[0]
        if level is None or not prim.rules.batch_needs_axis:
            return False
        names = level.names
        if any(a in names for a in params.get("axes", ())):
            return True
        return any(a in names for a in collective_axes(params))

    @property
    def axis_name(self):
        return self.main.global_data[0]


class NamedAxes:
    """The named axes one batch level stands for.

    ``vmap(axis_name='b')`` is one axis; the local backend runs a ``shard_map``
    body as one batch level standing for all mesh axes at once (the batch
    index is the device's position in the mesh, row-major), so collectives
    see the whole mesh shape.
    """

    __slots__ = ("names", "sizes", "layout", "spmd_name", "explicit_axes", "concrete")

    def __init__(self, names, sizes, layout=None, spmd_name=None, concrete=None,
                 explicit_axes=None):
        self.names = tuple(names)
        self.sizes = tuple(int(s) for s in sizes)
        # vmap(spmd_axis_name=...): the mesh axes the batch axis is split over when it
        # meets a shard_map or a sharding constraint (a tuple of names), else None.
        self.spmd_name = spmd_name
        # The explicit mesh axes the mapped inputs' types split the batch axis over (a
        # tuple of names; JAX's explicit_mesh_axis): it keeps that split where it meets a
        # sharding constraint or a shard_map, else None.
        self.explicit_axes = explicit_axes
        # Values at this level are concrete (an eager shard_map): a hook with
        # ``value(tracer, what)`` (a Python value, when the same on every device) and
        # ``text(tracer, spec="")`` (each device's block), else None.
        self.concrete = concrete
        # Where only some of the axes' devices are stacked at this level: their
        # layout, as the layer that made the level describes it for its collectives
        # (opaque here: spmd.collectives.layout.ProcessLayout); None: all of them.
        self.layout = layout


def active_spmd_axis_names() -> frozenset:
    """The mesh axes that enclosing ``vmap(spmd_axis_name=...)`` levels split their
    batch over (JAX's ``spmd_axis_names`` of the axis environment): a ``shard_map``
    differentiated inside such a vmap keeps its residuals per device along the other
    axes only, the batch being split along these."""
    return _active_level_axes("spmd_name")


def active_explicit_batch_axes() -> frozenset:
    """The explicit mesh axes that enclosing ``vmap`` levels split their batch over
    because the mapped inputs' types do (JAX's ``explicit_mesh_axis_names`` of the axis
    environment): vmap has taken them, so a ``shard_map`` inside may not be manual
    over them.

    >>> active_explicit_batch_axes()  # outside any vmap
    frozenset()
    """
    return _active_level_axes("explicit_axes")


def _active_level_axes(attr) -> frozenset:
    """The union of the enclosing batch levels' ``NamedAxes.<attr>`` mesh axes."""
    names = set()
    for main in _state.stack:
        data = main.global_data
        if main.trace_type is BatchTrace and isinstance(data, tuple) and data and \
                getattr(data[0], attr, None):
            names.update(getattr(data[0], attr))
    return frozenset(names)


def _scope_for(axis_name, main):
    from contextlib import nullcontext

    if axis_name is None:
        return nullcontext()
    return extend_axis_env(dict(zip(axis_name.names, axis_name.sizes)), main=main)


@contextmanager
def batch_level(axis_name, axis_size):
    """A new batch level, named by ``axis_name`` (None, a name or a :class:`NamedAxes`).

    A named level binds its axes to itself, so that collectives over them inside
    reach its batching rules.  Rules of higher-order primitives re-batch their
    bodies under a level named like the one they run at (``_axis_data``), so that
    collectives inside bodies keep seeing the mesh or vmap axes.
    """
    if isinstance(axis_name, str):
        axis_name = NamedAxes((axis_name,), (axis_size,))
    with new_main(BatchTrace, (axis_name, axis_size)) as main, _scope_for(axis_name, main):
        yield BatchTrace(main)


def batch_flat(fun, args, in_dims, axis_size, axis_name=None, out_dims_req=None):
    """Run ``fun`` (flat in, flat out) batched; returns outputs with batch at ``out_dims_req``.

    ``axis_name`` is None, a name, or a :class:`NamedAxes` (several mesh axes).
    ``out_dims_req`` is iterated once, alongside the outputs.
    """
    with batch_level(axis_name, axis_size) as trace:
        tracers = [BatchTracer(trace, a, d) if d is not None else a for a, d in zip(args, in_dims)]
        outs = fun(*tracers)
        outs = [full_raise(trace, o) for o in outs]
        res = []
        for o, want in zip(outs, out_dims_req):
            val, d = o.val, o.bdim
            if want is None:
                if d is not None:
                    raise ArgumentError("vmap: an output with out_axes=None varies along the "
                                        "mapped axis; only unbatched outputs can use None")
                res.append(val)
                continue
            val = broadcast_batch(val, d, axis_size)
            nd = len(np.shape(val))
            res.append(move_axis(val, 0, want % nd))
        return res


def vmap_at_level(fun, axis_name, axis_size):
    """``fun`` (pytrees in and out) mapped over axis 0 of every argument leaf at a level
    named ``axis_name``; every output leaf comes back batched at axis 0.

    The batching rules of user-rule primitives (custom_jvp/custom_vjp) use it to map
    the user's rules with the axes of the level they run at.
    """
    def mapped(*args):
        leaves, tree = tree_util.tree_flatten(args)
        box: list = []

        def flat(*xs):
            out = fun(*tree_util.tree_unflatten(tree, list(xs)))
            out_leaves, out_tree = tree_util.tree_flatten(out)
            box[:] = [out_tree]
            return out_leaves

        outs = batch_flat(flat, leaves, [0] * len(leaves), axis_size, axis_name,
                          itertools.repeat(0))
        return tree_util.tree_unflatten(box[0], outs)

    return mapped


def broadcast_prefix(prefix, tree, what: str, fname: str) -> list:
    """One entry of ``prefix`` per leaf of ``tree`` (``prefix`` is a pytree prefix;
    ``None`` and ints are leaves of the prefix), for ``in_axes``/``out_axes`` of vmap
    and pmap.

    >>> broadcast_prefix((0, None), ([1, 2], 3), "in_axes", "vmap")
    [0, 0, None]
    """
    try:
        pairs = tree_util.broadcast_prefix(prefix, tree,
                                           lambda e: e is None or isinstance(e, int))
    except tree_util.PrefixMismatch as e:
        raise ArgumentError(
            f"{fname}: {what} is not a pytree prefix of the arguments: at "
            f"{e.path or 'the top'} {what} has {tree_util.describe(e.prefix_node)} but the "
            f"value is {tree_util.describe(e.tree_node)}. Give one axis (or None) per "
            "argument, e.g. in_axes=(0, None)") from None
    return [entry for entry, _ in pairs]

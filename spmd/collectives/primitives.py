"""The collective primitives, with their varying-axes typing and transposes.

| primitive      | varying axes                | transpose                 |
| -------------- | --------------------------- | ------------------------- |
| psum           | varying -> invariant        | pvary                     |
| pvary          | invariant -> varying        | psum                      |
| all_gather     | varying -> varying          | psum_scatter              |
| psum_scatter   | varying -> varying          | all_gather                |
| all_to_all     | varying -> varying          | all_to_all (axes swapped) |
| ppermute       | varying -> varying          | ppermute (inverse perm)   |
| axis_index     | -> varying                  | (not linear)              |
| pcast (reduced)| invariant -> reduced        | psum (of the summands)    |
| pcast (unreduced) | varying -> unreduced     | pvary                     |

Unreduced and reduced operands (:mod:`spmd.compiler.core.manual_types`): ``psum`` and
``psum_scatter`` sum an operand unreduced along their axes (to invariant, varying;
their transposes then give reduced cotangents: ``pcast(to='reduced')``,
``all_gather(reduced=True)``); ``all_gather(reduced=True)`` makes a reduced result
(its transpose is ``psum_scatter`` of the unreduced cotangent); ``pvary`` of a
reduced operand transposes to ``pcast(to='unreduced')`` instead of a psum.  Along
other axes the collectives keep an operand's marks (they are linear).

A collective's ``axes`` parameter is a tuple of axis names.  Under a batch
level that stands for those axes (the local backend, or ``vmap`` with
``axis_name``) the batching rule performs the communication with
:class:`spmd.collectives.local.LocalGroup`; under any other batch level the
batch axis is just one more data axis.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import Zero
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.manual_types import UnreducedRuleError
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import axis_scope, axes_in_scope, bind, get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError, SpmdError
from spmd.collectives.local import LocalGroup, stacked_devices
from spmd.compiler.ops.indexing import dynamic_slice
from spmd.compiler.ops.structural import squeeze
from spmd.compiler.transforms.batching import NamedAxes, broadcast_batch, move_to_front
from spmd.compiler.ops.elementwise import add, convert, div, eq, mul


class CollectiveAxisError(SpmdError, NameError, ValueError):
    """A collective used outside any shard_map/vmap, or over an axis not in scope (a
    NameError, as JAX's unbound axis names, and a ValueError, as JAX's ``pvary``
    outside ``shard_map``)."""


class AxisNameTypeError(ArgumentError, TypeError):
    """An axis name that is not a name or a tuple of them (a TypeError, as JAX's)."""


def _axes(axis_name, fname) -> tuple[str, ...]:
    if isinstance(axis_name, (set, frozenset, dict)):
        # A set has no order: a tuple's order is the collective's (all_gather's blocks,
        # axis_index's row-major index), and a set's iteration order differs between
        # processes (string hashing is seeded per process), so ranks would disagree.
        raise AxisNameTypeError(
            f"{fname}: axis_name must be a tuple or a str, got the {type(axis_name).__name__} "
            f"{axis_name!r}; give the axes in order, e.g. {tuple(sorted(axis_name))!r}")
    axes = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
    if not axes or not all(isinstance(a, str) for a in axes):
        raise ArgumentError(f"{fname}: axis_name must be a mesh axis name or a tuple of them, "
                            f"got {axis_name!r}")
    if len(set(axes)) != len(axes):
        raise ArgumentError(f"{fname}: axis_name {axes} repeats an axis")
    for a in axes:
        if axis_scope(a) is None:
            scope = axes_in_scope()
            where = (f"axes in scope: {scope}" if scope else
                     "no axis is in scope: collectives run inside shard_map (over its mesh "
                     "axes) or vmap(..., axis_name=...)")
            err = CollectiveAxisError(f"{fname}: axis {a!r} is not in scope; {where}")
            err.axis, err.collective = a, fname  # for callers that know why (shard_map)
            raise err
    return axes


def _size(axes) -> int:
    return int(np.prod([axis_scope(a).sizes[a] for a in axes], dtype=np.int64))


def _tracking(axes) -> bool:
    return all(axis_scope(a).track_vma for a in axes)


def _tracked(axes) -> set:
    """The axes among ``axes`` whose variance values carry in their types: those of a
    shard_map traced with check_vma (not of check_vma=False bodies, nor of vmap).  An
    untracked axis must never enter a type: the implicit pvary it would cause
    transposes to a psum."""
    out = set()
    for a in axes:
        scope = axis_scope(a)
        if scope is None or scope.track_vma:
            out.add(a)
    return out


# ------------------------------------------------------------------ rules

def _linear_jvp(p):
    def rule(primals, tangents, **params):
        out = bind(p, *primals, **params)
        (t,) = tangents
        if isinstance(t, Zero):
            return out, Zero(get_aval(out).update(dtype=t.aval.dtype, weak_type=False))
        return out, bind(p, t, **params)

    p.def_jvp(rule)
    p.linear = True
    return p


def _batch(p, local_rule, shift):
    """Batching: communicate when the level stands for the axes, else map over data."""
    def rule(args, dims, *, _axis_data, **params):
        level, _ = _axis_data
        (x,), (d,) = (args, dims) if args else ((None,), (None,))
        axes = params["axes"]
        mine = tuple(a for a in axes if isinstance(level, NamedAxes) and a in level.names)
        if not mine:
            x = move_to_front(x, d)
            return bind(p, x, **shift(params)), 0
        if len(mine) != len(axes):
            # Reductions split into this level's part and the rest (an outer level).
            if p not in (psum_p, pmax_p, pmin_p):
                raise NotImplementedError(
                    f"{p.name} over axes {axes} that belong to different nested vmap/shard_map "
                    f"levels ({mine} to one, {tuple(a for a in axes if a not in mine)} to an "
                    "enclosing one) is not supported (only psum, pmax and pmin can span levels); "
                    "apply it over each level's axes in turn")
            out, d = local_rule(group_for(level, mine), x, d,
                                {**params, "axes": mine})
            rest = tuple(a for a in axes if a not in mine)
            return bind(p, out, axes=rest), d
        return local_rule(group_for(level, axes), x, d, params)

    p.def_batch(rule)
    p.rules.batch_needs_axis = True
    return p


def group_for(level, axes):
    """The communicator for ``axes`` at a batch level that stands for mesh axes: all
    devices in this process (local backend), or this process's devices of a
    multi-process mesh (the mpi backend)."""
    layout = getattr(level, "layout", None)
    if layout is None:
        # (The devices are noted only while a trace is on: the collectives are marked.)
        return LocalGroup(level.names, level.sizes, axes, stacked_devices(level))
    from spmd.collectives.process_group import ProcessGroup

    return ProcessGroup(level.names, level.sizes, axes, layout.local, layout.procs, layout.me)


def _front(x, d):
    return move_to_front(x, d)


def _plus1(*names):
    return lambda params: {**params, **{n: params[n] + 1 for n in names}}


_same = lambda params: params  # noqa: E731


# ------------------------------------------------------------ psum / pmax / pmin

def _reduce_prim(name, op):
    p = Primitive(name, traits=())
    p.def_impl(_no_impl(name))

    @p.def_abstract_eval
    def aval(x, *, axes):
        if op != "sum" and dtypes.is_complex(x.dtype):  # complex numbers have no order
            raise DTypeError(f"{name}: operand dtype {x.dtype} is complex, which has no "
                             f"{op}; reduce snp.real(x), snp.imag(x) or snp.abs(x) instead")
        return x

    p.def_vma(lambda x, *, axes: [x.vma - set(axes)])
    p.rules.manual_types = _sum_types if op == "sum" else _extremum_types(name)

    def local(group, x, d, params):
        if d is None:  # the same on every device
            return group.scale(x, None) if op == "sum" else (x, None)
        return group.all_reduce(_front(x, d), op)

    _batch(p, local, _same)
    return p


def _sum_types(x, *, axes, **_):
    """psum (psum_scatter): linear, and it sums an operand unreduced along its axes."""
    return [(x.unreduced - set(axes), x.reduced)]


def _extremum_types(name):
    def rule(x, *, axes):
        if x.unreduced:
            raise UnreducedRuleError(f"unreduced rule for {name} is not implemented: its "
                                     f"operand {x} is unreduced; psum it first")
        return [(frozenset(), x.reduced)]
    return rule


def _linear_types(name):
    """A collective moving blocks along its axes (not summing them): linear, so it keeps
    marks along other axes; an operand unreduced along its own axes is refused (the
    summands would move as if they were values)."""
    def rule(x, *, axes, **_):
        if x.unreduced & set(axes):
            raise UnreducedRuleError(
                f"unreduced rule for {name} over {tuple(axes)} is not implemented: its operand "
                f"{x} is unreduced along them; psum or psum_scatter it first")
        return [(x.unreduced, x.reduced)]
    return rule


def _no_impl(name):
    def impl(xp, *args, **params):
        raise CollectiveAxisError(f"{name} ran outside any shard_map or vmap; collectives must "
                                  "run inside a shard_map body (or vmap with axis_name)")
    return impl


psum_p = _linear_jvp(_reduce_prim("psum", "sum"))
pmax_p = _reduce_prim("pmax", "max")
pmin_p = _reduce_prim("pmin", "min")


def _pminmax_jvp(p):
    def rule(primals, tangents, *, axes):
        # The derivative flows from the devices holding the extremum (shared on ties).
        (x,), (t,) = primals, tangents
        out = bind(p, x, axes=axes)
        if isinstance(t, Zero):
            return out, Zero(get_aval(out).update(weak_type=False))
        mask = convert(eq(x, out), get_aval(t).dtype)
        return out, div(bind(psum_p, mul(t, mask), axes=axes), bind(psum_p, mask, axes=axes))

    p.def_jvp(rule)


_pminmax_jvp(pmax_p)
_pminmax_jvp(pmin_p)


# --------------------------------------------------------------------- pvary

pvary_p = _linear_jvp(Primitive("pvary", traits=()))
pvary_p.def_impl(lambda xp, x, *, axes: x)
pvary_p.def_emit(lambda ins, axes: ins[0])
pvary_p.def_abstract_eval(lambda x, *, axes: x)
pvary_p.def_vma(lambda x, *, axes: [x.vma | _tracked(axes)])
pvary_p.rules.manual_types = lambda x, *, axes: [(x.unreduced, x.reduced - set(axes))]
# No data moves: the stacked representation of an invariant value serves as is.
_batch(pvary_p, lambda group, x, d, params: (x, d), _same)


@psum_p.def_transpose
def _psum_transpose(ct, x, *, axes):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    # Typed axes: the cotangent of an invariant result is invariant, and pvary is all
    # the transpose needs (JEP 17111).  Untyped axes (check_vma=False, vmap): the
    # cotangent may differ between devices, so it is summed (JAX's psum transpose).
    tracked = _tracked(axes)
    untracked = tuple(a for a in axes if a not in tracked)
    if untracked:
        ct = bind(psum_p, ct, axes=untracked)
    # The summands of an unreduced operand: its cotangent is the reduced one.
    summed = tuple(a for a in axes if a in tracked and a in x.aval.unreduced)
    if summed:
        ct = bind(pcast_p, ct, axes=summed, to="reduced")
    typed = tuple(a for a in axes if a in tracked and a not in summed)
    return [bind(pvary_p, ct, axes=typed) if typed else ct]


@pvary_p.def_transpose
def _pvary_transpose(ct, x, *, axes):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    # A reduced operand's cotangent stays as the devices' summands (no psum).
    kept = tuple(a for a in axes if a in x.aval.reduced)
    summed = tuple(a for a in axes if a not in kept)
    if kept:
        ct = bind(pcast_p, as_varying(ct, kept), axes=kept, to="unreduced")
    return [bind(psum_p, ct, axes=summed) if summed else ct]


# ---------------------------------------------------------------------- pcast

# Casts between manual-axes types that move no data: ``to='reduced'`` marks an
# invariant value reduced (its cotangent arrives as summands, which the transpose
# sums); ``to='unreduced'`` marks a varying value as summands of one value (its
# cotangent is reduced, and the transpose makes it varying again).
pcast_p = _linear_jvp(Primitive("pcast", traits=()))
pcast_p.def_impl(lambda xp, x, *, axes, to: x)
pcast_p.def_emit(lambda ins, axes, to: ins[0])
pcast_p.def_abstract_eval(lambda x, *, axes, to: x)
pcast_p.def_vma(lambda x, *, axes, to: [x.vma])


def _pcast_types(x, *, axes, to):
    # (Only typed axes enter types: re-run untyped, as a partitioned body is, a cast
    # changes nothing.)
    axes = _tracked(axes)
    if to == "reduced":
        return [(x.unreduced, x.reduced | axes)]
    return [(x.unreduced | axes, x.reduced)]


pcast_p.rules.manual_types = _pcast_types


_batch(pcast_p, lambda group, x, d, params: (x, d), _same)


@pcast_p.def_transpose
def _pcast_transpose(ct, x, *, axes, to):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    if to == "reduced":
        return [bind(psum_p, as_summands(ct, axes), axes=axes)]
    return [bind(pvary_p, ct, axes=axes)]


def as_summands(ct, axes):
    """``ct`` typed unreduced along ``axes``, for a sum of the devices' parts: a varying
    cotangent's blocks are such parts already (retyped); an invariant one is whole on
    every device, so one device keeps it and the others hold zeros."""
    aval = get_aval(ct)
    axes = tuple(axes)
    whole = tuple(a for a in axes if a not in aval.vma)
    if whole:
        keep = convert(eq(bind(axis_index_p, axes=whole), np.int32(0)), aval.dtype)
        ct = mul(ct, keep)
    vary = tuple(a for a in axes if a not in get_aval(ct).unreduced)
    return bind(pcast_p, ct, axes=vary, to="unreduced") if vary else ct


def as_varying(ct, axes):
    """``ct`` varying along ``axes`` where it is typed invariant (a pvary)."""
    missing = tuple(a for a in axes if a not in get_aval(ct).vma)
    return bind(pvary_p, ct, axes=missing) if missing else ct


# ---------------------------------------------------------------- all_gather

# ``invariant=True`` (``all_gather_invariant``, JAX's ``to='invarying'``): the same data
# moves, but the result is typed invariant along ``axes`` (every device holds the same
# value), and its transpose takes each device's own block of the cotangent instead of
# summing and scattering it.  The parameter is bound only when true, so the programs
# of plain gathers print as they always did.
all_gather_p = _linear_jvp(Primitive("all_gather", traits=()))
all_gather_p.def_impl(_no_impl("all_gather"))
all_gather_p.def_vma(lambda x, *, axes, invariant=False, reduced=False, **_: [
    x.vma - set(axes) if invariant or reduced else x.vma | _tracked(axes)])


def _all_gather_types(x, *, axes, reduced=False, **params):
    (types,) = _linear_types("all_gather")(x, axes=axes)
    return [(types[0], types[1] | _tracked(axes))] if reduced else [types]


all_gather_p.rules.manual_types = _all_gather_types


@all_gather_p.def_abstract_eval
def _all_gather_aval(x, *, axes, axis, tiled, axis_size, invariant=False, reduced=False):
    if tiled:
        shape = x.shape[:axis] + (x.shape[axis] * axis_size,) + x.shape[axis + 1:]
    else:
        shape = x.shape[:axis] + (axis_size,) + x.shape[axis:]
    return x.update(shape=shape)


def _stacked(method: str, *names):
    """A local rule calling ``group.<method>(x, *params[names])`` on stacked blocks
    (a value the same on every device is stacked first)."""
    def rule(group, x, d, params):
        if d is None:
            x, d = broadcast_batch(x, None, group.stacked), 0
        return getattr(group, method)(_front(x, d), *(params[n] for n in names))

    return rule


_all_gather_local = _stacked("all_gather", "axis", "tiled")


_batch(all_gather_p, _all_gather_local, _plus1("axis"))


# -------------------------------------------------------------- psum_scatter

psum_scatter_p = _linear_jvp(Primitive("psum_scatter", traits=()))
psum_scatter_p.def_impl(_no_impl("psum_scatter"))
psum_scatter_p.def_vma(lambda x, *, axes, **_: [x.vma | _tracked(axes)])
psum_scatter_p.rules.manual_types = _sum_types


@psum_scatter_p.def_abstract_eval
def _psum_scatter_aval(x, *, axes, scatter_dimension, tiled, axis_size):
    n = x.shape[scatter_dimension]
    if tiled:
        shape = x.shape[:scatter_dimension] + (n // axis_size,) + x.shape[scatter_dimension + 1:]
    else:
        shape = x.shape[:scatter_dimension] + x.shape[scatter_dimension + 1:]
    return x.update(shape=shape)


_psum_scatter_local = _stacked("reduce_scatter", "scatter_dimension", "tiled")


_batch(psum_scatter_p, _psum_scatter_local, _plus1("scatter_dimension"))


@all_gather_p.def_transpose
def _all_gather_transpose(ct, x, *, axes, axis, tiled, axis_size, invariant=False,
                          reduced=False):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    if reduced:  # the cotangent's summands, reduced and scattered
        return [bind(psum_scatter_p, as_summands(ct, axes), axes=axes, scatter_dimension=axis,
                     tiled=tiled, axis_size=axis_size)]
    if invariant:  # every device has the whole cotangent: each keeps its own block
        ct_aval = get_aval(ct)
        k = x.aval.shape[axis] if tiled else 1
        start = mul(bind(axis_index_p, axes=axes), np.int32(k))
        starts = [np.int32(0)] * ct_aval.ndim
        starts[axis] = start
        sizes = list(ct_aval.shape)
        sizes[axis] = k
        block = dynamic_slice(ct, starts, sizes)
        return [block if tiled else squeeze(block, (axis,))]
    return [bind(psum_scatter_p, ct, axes=axes, scatter_dimension=axis, tiled=tiled,
                 axis_size=axis_size)]


@psum_scatter_p.def_transpose
def _psum_scatter_transpose(ct, x, *, axes, scatter_dimension, tiled, axis_size):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    # The summands of an unreduced operand: its cotangent is the gathered one, reduced.
    extra = {"reduced": True} if set(axes) <= x.aval.unreduced and _tracking(axes) else {}
    return [bind(all_gather_p, ct, axes=axes, axis=scatter_dimension, tiled=tiled,
                 axis_size=axis_size, **extra)]


# ---------------------------------------------------------------- all_to_all

all_to_all_p = _linear_jvp(Primitive("all_to_all", traits=()))
all_to_all_p.def_impl(_no_impl("all_to_all"))
all_to_all_p.def_vma(lambda x, *, axes, **_: [x.vma | _tracked(axes)])
all_to_all_p.rules.manual_types = _linear_types("all_to_all")


@all_to_all_p.def_abstract_eval
def _all_to_all_aval(x, *, axes, split_axis, concat_axis, axis_size):
    shape = list(x.shape)
    shape[split_axis] //= axis_size
    shape[concat_axis] *= axis_size
    return x.update(shape=tuple(shape))


_all_to_all_local = _stacked("all_to_all", "split_axis", "concat_axis")


_batch(all_to_all_p, _all_to_all_local, _plus1("split_axis", "concat_axis"))


@all_to_all_p.def_transpose
def _all_to_all_transpose(ct, x, *, axes, split_axis, concat_axis, axis_size):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    return [bind(all_to_all_p, ct, axes=axes, split_axis=concat_axis, concat_axis=split_axis,
                 axis_size=axis_size)]


# ------------------------------------------------------------------ ppermute

ppermute_p = _linear_jvp(Primitive("ppermute", traits=()))
ppermute_p.def_impl(_no_impl("ppermute"))
ppermute_p.def_abstract_eval(lambda x, *, axes, perm: x)
ppermute_p.def_vma(lambda x, *, axes, perm: [x.vma | _tracked(axes)])
ppermute_p.rules.manual_types = _linear_types("ppermute")


_ppermute_local = _stacked("ppermute", "perm")


_batch(ppermute_p, _ppermute_local, _same)


@ppermute_p.def_transpose
def _ppermute_transpose(ct, x, *, axes, perm):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    return [bind(ppermute_p, ct, axes=axes, perm=tuple((d, s) for s, d in perm))]


# ---------------------------------------------------------------- axis_index

axis_index_p = Primitive("axis_index", traits=())
axis_index_p.def_impl(_no_impl("axis_index"))
axis_index_p.def_abstract_eval(lambda *, axes: ShapedArray((), dtypes.int32))
axis_index_p.def_vma(lambda *, axes: [frozenset(_tracked(axes))])


@axis_index_p.def_jvp
def _axis_index_jvp(primals, tangents, *, axes):
    out = bind(axis_index_p, axes=axes)
    return out, Zero(tangent_aval(get_aval(out)))


def _axis_index_batch(args, dims, *, _axis_data, axes):
    level, _ = _axis_data
    if isinstance(level, NamedAxes) and all(a in level.names for a in axes):
        return group_for(level, axes).axis_index()
    if len(axes) == 1:
        return bind(axis_index_p, axes=axes), None
    # Axes spanning this level and outer ones (nested vmaps, or vmap inside shard_map):
    # combine the per-axis indices row-major over the tuple's order.
    out, dim = None, None
    for a in axes:
        if isinstance(level, NamedAxes) and a in level.names:
            idx, dim = group_for(level, (a,)).axis_index()
        else:
            idx = bind(axis_index_p, axes=(a,))
        out = idx if out is None else add(mul(out, np.int32(_size((a,)))), idx)
    return out, dim


axis_index_p.def_batch(_axis_index_batch)
axis_index_p.rules.batch_needs_axis = True

# The collectives that move data between devices (not pvary, axis_index: local): a
# process must not skip one its partners run (compiler.transforms.batching.communicates).
for _p in (psum_p, pmax_p, pmin_p, all_gather_p, psum_scatter_p, all_to_all_p, ppermute_p):
    _p.rules.communicates = True
del _p

"""``pmap`` built on ``jit(shard_map)``, as JAX now implements it.

``pmap(f, axis_name="i")(x)`` maps ``f`` over the leading axis of ``x``, one
slice per device: the devices form a one-axis mesh named ``"i"``; the mapped
axis of each argument (``in_axes``) is moved to the front and split over it
(``P("i")``) and each device's block of size 1 is squeezed before ``f`` sees it
(pmap is rank-reducing); unmapped arguments (``None``) are replicated
(``P()``); each result gets the axis back at ``out_axes`` (``None``: one copy,
``P()``).  The body is untyped (``check_vma=False``), as pmap never had
varying-axes types: ``psum`` transposes to ``psum`` there.

On a job of several processes, pmap follows JAX's multi-process rule: each
process passes its local values, whose mapped axis has one entry per local
device; the mesh holds every device of the job (so collectives span the
processes), and each process gets back its own devices' slices.
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable

import numpy as np

from spmd import mesh as m, tree_util
from spmd.compiler.ops.structural import reshape, transpose
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.errors import ArgumentError, SpmdError
from spmd.compiler.transforms.batching import broadcast_prefix
from spmd.mesh import Mesh, process_count, process_index
from spmd.shard.arrays.local_data import make_array_from_process_local_data
from spmd.shard.partition.api import jit
from spmd.shard.maps.shard_map import shard_map
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec as P

_names = itertools.count()


class PmapError(SpmdError, ValueError):
    """A bad pmap call: sizes, devices or axes that do not fit."""


def _move(x, src: int, dst: int):
    nd = len(get_aval(x).shape)
    if src == dst:
        return x
    perm = [i for i in range(nd) if i != src]
    perm.insert(dst, src)
    return transpose(x, perm)


def _squeeze0(x):
    return reshape(x, get_aval(x).shape[1:])


def _expand0(x):
    return reshape(x, (1,) + tuple(get_aval(x).shape))


def _norm(d, nd, what, fname):
    if d is None:
        return None
    if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or not -nd <= d < nd:
        raise PmapError(f"{fname}: {what}={d!r} is out of range for a value of rank {nd - 1} "
                        f"(the mapped axis may go at 0..{nd - 1})" if what == "out_axes" else
                        f"{fname}: {what}={d!r} is out of range for an argument of rank {nd}")
    return int(d) % nd


def pmap(fun: Callable, axis_name=None, *, in_axes=0, out_axes=0,
         static_broadcasted_argnums=(), devices=None, backend=None, axis_size=None,
         donate_argnums=()):
    """Map ``fun`` over axis ``in_axes`` of its arguments, one slice per device, with
    collectives over ``axis_name``.

    >>> spmd.pmap(lambda x: x / lax.psum(x, "i"), axis_name="i")(np.arange(4.0))
    Array([0.        , 0.16666667, 0.33333334, 0.5       ], dtype=float32)
    """
    if not callable(fun):
        raise TypeError(f"pmap: expected a function, got {type(fun).__name__}")
    name = f"_pmap{next(_names)}" if axis_name is None else axis_name
    if not isinstance(name, str):
        raise ArgumentError(f"pmap: axis_name must be a string, got {axis_name!r}")
    static = ((static_broadcasted_argnums,) if isinstance(static_broadcasted_argnums, int)
              else tuple(static_broadcasted_argnums))
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    fname = f"pmap({getattr(fun, '__name__', 'fun')})"
    runners: dict = {}

    @functools.wraps(fun)
    def mapped(*args, **kwargs):
        if kwargs:
            raise ArgumentError(f"{fname}: pass the arguments positionally (got keyword "
                                f"arguments {sorted(kwargs)})")
        bad = [i for i in static if not -len(args) <= i < len(args)]
        if bad:
            raise ArgumentError(f"{fname}: static_broadcasted_argnums={static} names argument "
                                f"{bad[0]}, but it was called with {len(args)} arguments")
        st = tuple(sorted(i % len(args) for i in static))
        dyn_idx = [i for i in range(len(args)) if i not in st]
        if isinstance(in_axes, tuple):
            if len(in_axes) != len(args):
                raise ArgumentError(f"{fname}: in_axes has {len(in_axes)} entries but the "
                                    f"function was called with {len(args)} arguments")
            dyn_axes = tuple(in_axes[i] for i in dyn_idx)
        else:
            dyn_axes = (in_axes,) * len(dyn_idx)
        dyn = tuple(args[i] for i in dyn_idx)
        dims, n = _mapped_dims(dyn, dyn_axes, axis_size, fname)
        multi = _multi_process()
        mesh = _mesh(n, devices, multi, name, fname)
        key = (mesh, st, multi)
        if key not in runners:
            runners[key] = _runner(fun, name, mesh, st, in_axes, out_axes, multi, fname)
        if not multi:
            return runners[key](*args)
        return _run_multi(runners[key], args, st, dyn_idx, dims, mesh, out_axes, fname)

    return mapped


def _mapped_dims(dyn, dyn_axes, axis_size, fname):
    """(the in_axes entry of each leaf, normalised; the mapped size)."""
    leaves = tree_util.tree_leaves(dyn)
    n, out = axis_size, []
    for x, d in zip(leaves, _leaf_dims(dyn, dyn_axes, fname)):
        if d is not None:
            if n is not None and np.shape(x)[d] != n:
                raise PmapError(f"{fname}: the mapped axes have different sizes: {n} and "
                                f"{np.shape(x)[d]} (an argument of shape {np.shape(x)})")
            n = np.shape(x)[d]
        out.append(d)
    if n is None:
        raise PmapError(f"{fname}: no argument is mapped (every in_axes is None); pass "
                        "axis_size= to say how many devices to use")
    return out, int(n)


def _multi_process() -> bool:
    return process_count() > 1


def _mesh(n, devices, multi, name, fname):
    """The one-axis mesh named after the pmap's axis (the inputs placed on it across
    processes are then on the very mesh of the shard_map)."""
    if devices is not None:
        devices = list(devices)
        if len(devices) != (n * m.process_count() if multi else n):
            raise PmapError(f"{fname}: {len(devices)} devices were given for a mapped axis "
                            f"of size {n}")
        return Mesh(np.array(devices, dtype=object), (name,))
    if multi:
        local = m.local_device_count()
        if n != local:
            raise PmapError(f"{fname}: on a job of {m.process_count()} processes, the "
                            f"mapped axis of each process's arguments must have one entry per "
                            f"local device ({local}), got {n}")
        return Mesh(np.array(m.devices(), dtype=object), (name,))
    if n > m.device_count():
        raise PmapError(f"{fname}: the mapped axis has size {n}, but there are only "
                        f"{m.device_count()} devices (SPMD_NUM_DEVICES sets how many are "
                        "simulated)")
    return Mesh(np.array(m.devices()[:n], dtype=object), (name,))


def _runner(fun, name, mesh, st, in_axes, out_axes, multi, fname):
    """The jitted ``shard_map`` for one mesh (and set of static arguments)."""
    def run(*args):
        dyn_idx = [i for i in range(len(args)) if i not in st]
        dyn = tuple(args[i] for i in dyn_idx)
        dyn_axes = (tuple(in_axes[i] for i in dyn_idx) if isinstance(in_axes, tuple)
                    else (in_axes,) * len(dyn_idx))
        if multi:  # the wrapper has moved the mapped axes to the front
            dyn_axes = tuple(None if a is None else 0 for a in dyn_axes)
        leaves, tree = tree_util.tree_flatten(dyn)
        dims = _leaf_dims(dyn, dyn_axes, fname)
        moved = [x if d is None else _move(x, d, 0) for x, d in zip(leaves, dims)]
        box: list = []

        def body(*blocks):
            blocks = [b if d is None else _squeeze0(b) for b, d in zip(blocks, dims)]
            full = list(args)
            for i, v in zip(dyn_idx, tree_util.tree_unflatten(tree, blocks)):
                full[i] = v
            out = fun(*full)
            outs, out_tree = tree_util.tree_flatten(out)
            odims = _out_dims(out, outs, out_axes, 1, fname)
            box[:] = [out_tree, odims]
            return [o if d is None else _expand0(o) for o, d in zip(outs, odims)]

        flat = shard_map(body, mesh=mesh, in_specs=tuple(P(name) if d is not None else P()
                                                         for d in dims),
                         out_specs=lambda: [P() if d is None else P(name) for d in box[1]],
                         check_vma=False)(*moved)
        out_tree, odims = box
        if not multi:  # (across processes the wrapper places the axis on local values)
            flat = [o if d is None else _move(o, 0, d) for o, d in zip(flat, odims)]
        return tree_util.tree_unflatten(out_tree, flat)

    return jit(run, static_argnums=st or None)


def _leaf_dims(dyn, dyn_axes, fname):
    dims = broadcast_prefix(dyn_axes, dyn, "in_axes", fname)
    return [_norm(d, np.ndim(x), "in_axes", fname)
            for x, d in zip(tree_util.tree_leaves(dyn), dims)]


def _out_dims(out, outs, out_axes, extra, fname):
    """Each output leaf's out_axes entry, normalised for a rank of its own plus ``extra``."""
    full = tree_util.tree_unflatten(tree_util.tree_structure(out), list(range(len(outs))))
    dims = broadcast_prefix(out_axes, full, "out_axes", fname)
    return [_norm(d, np.ndim(o) + extra, "out_axes", fname) for o, d in zip(outs, dims)]


def _run_multi(run, args, st, dyn_idx, dims, mesh, out_axes, fname):
    """Multi-process pmap: local values in, a global Array per mapped argument, the
    jitted shard_map, and this process's slices out."""
    leaves, tree = tree_util.tree_flatten(tuple(args[i] for i in dyn_idx))
    sharding = NamedSharding(mesh, P(mesh.axis_names[0]))
    glob = []
    for x, d in zip(leaves, dims):
        if isinstance(x, Tracer):
            raise PmapError(f"{fname}: on a job of several processes pmap takes concrete "
                            "values (call it outside jit/grad/vmap), got a traced value")
        if d is None:
            glob.append(x)
            continue
        local = np.moveaxis(np.asarray(x), d, 0)
        glob.append(make_array_from_process_local_data(
            sharding, local, (local.shape[0] * mesh.size // len(_mine(mesh)),)
            + local.shape[1:]))
    full = list(args)
    for i, v in zip(dyn_idx, tree_util.tree_unflatten(tree, glob)):
        full[i] = v
    out = run(*full)
    outs, out_tree = tree_util.tree_flatten(out)
    odims = _out_dims(out, outs, out_axes, 0, fname)
    res = [_local_slices(o, d) for o, d in zip(outs, odims)]
    return tree_util.tree_unflatten(out_tree, res)


def _mine(mesh):
    return [d for d in mesh.devices.flat if d.process_index == process_index()]


def _local_slices(o, d):
    """This process's devices' slices of a pmap output, the mapped axis at ``d``."""
    if d is None:
        return o
    shards = sorted(o.addressable_shards, key=lambda s: s.index[0].start or 0)
    local = np.concatenate([np.asarray(s.data) for s in shards], axis=0)
    return np.moveaxis(local, 0, d)

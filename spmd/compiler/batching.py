"""vmap: the batching trace and the helpers batching rules are written with.

A batching rule ``rule(args, dims, **params) -> (out, out_dim)`` receives each
argument with its batch axis (``None`` when the argument is not batched).
"""

from __future__ import annotations

import numpy as np

not_mapped = None


def bdim_size(args, dims) -> int:
    """The batch size, read off the first batched argument."""
    for a, d in zip(args, dims):
        if d is not None:
            return np.shape(a)[d]
    raise ValueError("bdim_size: no batched argument")


def move_to_front(x, d):
    """Move batch axis ``d`` of ``x`` to position 0 (no-op when already there)."""
    from spmd.compiler.ops.structural import transpose

    if d == 0:
        return x
    nd = len(np.shape(x))
    perm = (d,) + tuple(i for i in range(nd) if i != d)
    return transpose(x, perm)


def move_axis(x, src, dst):
    """Move axis ``src`` of ``x`` to position ``dst``."""
    from spmd.compiler.ops.structural import transpose

    if src == dst:
        return x
    nd = len(np.shape(x))
    order = [i for i in range(nd) if i != src]
    order.insert(dst, src)
    return transpose(x, tuple(order))


def broadcast_batch(x, d, size):
    """``x`` with its batch axis at 0, materialising it when ``d`` is None."""
    from spmd.compiler.ops.structural import broadcast_in_dim

    if d is None:
        shape = tuple(np.shape(x))
        return broadcast_in_dim(x, (size,) + shape, tuple(range(1, len(shape) + 1)))
    return move_to_front(x, d)


# --------------------------------------------------------------- the trace

from spmd.compiler.trace import Trace, Tracer, full_lower, full_raise, get_aval, new_main  # noqa: E402


class BatchTracer(Tracer):
    __slots__ = ("val", "bdim")

    def __init__(self, trace, val, bdim):
        self._trace = trace
        self.val = val
        self.bdim = bdim

    @property
    def aval(self):
        aval = get_aval(self.val)
        if self.bdim is None:
            return aval
        shape = aval.shape[:self.bdim] + aval.shape[self.bdim + 1:]
        return aval.update(shape=shape)

    def full_lower(self):
        return full_lower(self.val) if self.bdim is None else self


class BatchTrace(Trace):
    """Carries a batch axis through each primitive with its batching rule.

    ``main.global_data`` is ``(axis_name, axis_size)``: collectives over
    ``axis_name`` under vmap read it (JAX's named-axis vmap).
    """

    def pure(self, val):
        return BatchTracer(self, val, None)

    lift = pure

    def process_primitive(self, prim, tracers, params):
        vals = [t.val for t in tracers]
        dims = [t.bdim for t in tracers]
        if all(d is None for d in dims) and not self._communicates(prim, params):
            from spmd.compiler.trace import bind
            out = bind(prim, *vals, **params)
            outs = out if prim.multiple_results else [out]
            return [BatchTracer(self, o, None) for o in outs]
        rule = prim.batch
        if rule is None:
            raise NotImplementedError(f"vmap of '{prim.name}' is not supported (it has no "
                                      "batching rule)")
        rule_params = dict(params)
        if prim.rules.get("batch_needs_axis"):
            rule_params["_axis_data"] = self.main.global_data
        out, out_dims = rule(vals, dims, **rule_params)
        if prim.multiple_results:
            return [BatchTracer(self, o, d) for o, d in zip(out, out_dims)]
        return [BatchTracer(self, out, out_dims)]

    def _communicates(self, prim, params) -> bool:
        """A collective over this level's named axes acts even on unbatched values
        (``psum`` of an invariant value scales it; ``axis_index`` creates one)."""
        level = self.main.global_data[0]
        if level is None or not prim.rules.get("batch_needs_axis"):
            return False
        return any(a in level.names for a in params.get("axes", ()))

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

    __slots__ = ("names", "sizes", "local", "procs", "me")

    def __init__(self, names, sizes, local=None, procs=None, me=0):
        self.names = tuple(names)
        self.sizes = tuple(int(s) for s in sizes)
        # On a multi-process mesh only this process's devices are stacked: their
        # flat mesh positions, the owning process of every position, and ours.
        self.local = None if local is None else tuple(local)
        self.procs = None if procs is None else tuple(procs)
        self.me = me

    def size_of(self, axes) -> int:
        out = 1
        for a in axes:
            out *= self.sizes[self.names.index(a)]
        return out


def batch_flat(fun, args, in_dims, axis_size, axis_name=None, out_dims_req=None):
    """Run ``fun`` (flat in, flat out) batched; returns outputs with batch at ``out_dims_req``.

    ``axis_name`` is None, a name, or a :class:`NamedAxes` (several mesh axes).
    """
    from contextlib import nullcontext

    from spmd.compiler.trace import extend_axis_env

    if isinstance(axis_name, str):
        axis_name = NamedAxes((axis_name,), (axis_size,))
    with new_main(BatchTrace, (axis_name, axis_size)) as main, (
            extend_axis_env(dict(zip(axis_name.names, axis_name.sizes)), main=main)
            if axis_name is not None else nullcontext()):
        trace = BatchTrace(main)
        tracers = [BatchTracer(trace, a, d) if d is not None else a for a, d in zip(args, in_dims)]
        outs = fun(*tracers)
        outs = [full_raise(trace, o) for o in outs]
        res = []
        for o, want in zip(outs, out_dims_req):
            val, d = o.val, o.bdim
            if want is None:
                if d is not None:
                    from spmd.errors import ArgumentError
                    raise ArgumentError("vmap: an output with out_axes=None varies along the "
                                        "mapped axis; only unbatched outputs can use None")
                res.append(val)
                continue
            val = broadcast_batch(val, d, axis_size)
            nd = len(np.shape(val))
            res.append(move_axis(val, 0, want % nd))
        return res

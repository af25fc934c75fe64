"""Eager ``shard_map`` with concrete per-device values, for Python control flow.

A ``shard_map`` called outside any transformation traces its body once and
runs the program.  When that trace fails because the body branches in Python
on a value (``if lax.psum(x, "i") > 0:``, ``int(n)``), the body is run again
on the concrete blocks of every device at once: under one batch level standing
for the mesh (as the local backend runs bodies), operation by operation.  A
value then converts to a Python ``bool``/``int``/``float`` when it is the same on
every device (a ``psum`` result, say); one that differs between devices raises
an error naming the devices that disagree.  Under ``jit`` such a body still
needs ``lax.cond``, as in JAX.

Without a trace there are no varying-axes types: an output whose spec leaves
out a mesh axis is checked concretely to hold the same block on every device
along it.
"""

from __future__ import annotations

import numpy as np

from spmd import tree_util
from spmd.compiler.array_module import to_host
from spmd.compiler.batching import BatchTrace, BatchTracer, NamedAxes
from spmd.compiler.jit import flatten_outputs
from spmd.compiler.trace import Tracer, extend_axis_env, full_raise, get_aval, new_main


def can_run_eagerly(mesh, vals) -> bool:
    from spmd.compiler.trace import is_eager

    return is_eager() and not mesh.is_multi_process and \
        not any(isinstance(v, Tracer) for v in vals)


def run_eagerly(f, mesh, vals, specs, dyn, leaves, in_tree, out_specs, check_vma, manual,
                fname):
    """Run ``f`` on every device's concrete blocks; the global outputs, placed."""
    from spmd.shard.execute import from_blocks, to_blocks
    from spmd.shard.shard_map import _check_manual_spec, _check_out, _spec_leaves
    from spmd.shard.sharded import from_whole
    from spmd.shard.spec import NamedSharding

    level = NamedAxes(mesh.axis_names, mesh.axis_sizes, concrete=True)
    stacked = [to_blocks(v, s, mesh) for v, s in zip(vals, specs)]
    scope = dict(mesh.shape) if manual is None else {a: mesh.shape[a] for a in manual}
    with new_main(BatchTrace, (level, mesh.size)) as main, extend_axis_env(scope, main=main):
        trace = BatchTrace(main)
        full = list(leaves)
        for i, (v, d) in zip(dyn, stacked):
            full[i] = BatchTracer(trace, v, d) if d is not None else v
        outs = f(*tree_util.tree_unflatten(in_tree, full))
        out_leaves, out_tree = flatten_outputs(outs, fname)
        raw = [(o.val, o.bdim) for o in (full_raise(trace, x) for x in out_leaves)]
    if callable(out_specs):
        out_specs = out_specs()
    out_spec_paths = _spec_leaves(out_specs, outs, "out_specs", fname)
    for (v, d), (spec, path) in zip(raw, out_spec_paths):
        if manual is not None:
            _check_manual_spec(spec, manual, f"out_specs{path}", fname)
        _check_out(_block_aval(v, d, mesh, check_vma), spec, path, mesh, check_vma, fname)
    results = []
    for (v, d), (s, _) in zip(raw, out_spec_paths):
        out = from_blocks(v, d, s, mesh)
        results.append(from_whole(out.value, out.aval, NamedSharding(mesh, s)))
    return tree_util.tree_unflatten(out_tree, results)


def _block_aval(v, d, mesh, check_vma):
    """One device's block type, varying along the mesh axes whose blocks differ."""
    aval = get_aval(v)
    if d is None:
        return aval.update(vma=frozenset())
    block = aval.update(shape=aval.shape[:d] + aval.shape[d + 1:])
    if not check_vma:
        return block.update(vma=frozenset())
    x = np.moveaxis(np.asarray(to_host(getattr(v, "value", v))), d, 0)
    x = x.reshape(tuple(mesh.axis_sizes) + x.shape[1:])
    varying = frozenset(a for i, a in enumerate(mesh.axis_names)
                        if not np.array_equal(x, np.take(x, [0], axis=i).repeat(
                            mesh.axis_sizes[i], axis=i)))
    return block.update(vma=varying)

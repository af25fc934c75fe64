"""Partitioning ``random_bits``: each device computes only its own block of random numbers.

``random_bits`` has no array operand of its output's shape, so forward propagation
alone would compute the whole array everywhere and slice it.  Instead its output
placement comes from where the output is wanted (the backward hints: an output
sharding or a ``with_sharding_constraint`` reached through elementwise
equations), and each device binds ``random_bits`` for its block with the block's
offsets (``axis_index * block length``) as operands.  The Threefry counter of an
element is its flat index in the global shape, so every block holds exactly the
numbers of the unsharded array there.  Leading key-batch dimensions (``vmap``
over keys) keep the keys' own sharding.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.ops.threefry import (random_bits_p, random_unit_float_p, rng_counter_p,
                                        threefry2x32_p)
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import Propagate, Replicate
from spmd.shard.partition import rules_explicit as typed
from spmd.shard.partition.rules import elementwise
from spmd.shard.partition.reshard import reshard
from spmd.collectives.api import axis_index
from spmd.compiler.ops.elementwise import mul
from spmd.compiler.core.trace import bind


def _key_batch_dims(pl: Placement, nb: int) -> tuple:
    """The key's batch dimensions keep their split; its two data words stay whole."""
    return tuple(pl.dims[:nb])


def random_bits_rule(pls, avals_in, avals_out, mesh, **params):
    """Without a hint: the output's batch dimensions follow the key's; the rest is whole."""
    key_pl = pls[0]
    nb = len(avals_in[0].shape) - 1
    batch = _key_batch_dims(key_pl, nb)
    nd_out = len(avals_out[0].shape)
    wanted = [Placement(batch + ((),))] + [Placement(()) for _ in pls[1:]]
    return wanted, [Placement(batch + ((),) * (nd_out - nb))], params


def random_bits_source(ev, eqn, vals, pls, want_spec):
    """Bind ``random_bits`` per device for the placement its output is wanted in."""
    p = eqn.params
    key_aval = eqn.inputs[0].aval
    out_aval = eqn.outputs[0].aval
    nb = len(key_aval.shape) - 1
    if len(eqn.inputs) > 1 or want_spec is None:  # already a block, or no wish: forward rule
        return None
    mesh = ev.mesh
    batch = _key_batch_dims(pls[0], nb)
    used = {a for d in batch for a in d}
    want = Placement.from_spec(want_spec, len(out_aval.shape)).dims
    shape = tuple(p["shape"])
    dims = []
    for d, n in enumerate(shape):
        axes = want[nb + d]
        if axes and not (set(axes) & used) and n % mesh.axis_size(axes) == 0:
            used |= set(axes)
            dims.append(tuple(axes))
        else:
            dims.append(())
    if not any(dims):
        return None
    key_pl = Placement(batch + ((),))
    key = reshard(vals[0], pls[0], key_pl, ev.ctx, "the key of random_bits")
    local = tuple(n // (mesh.axis_size(a) if a else 1) for n, a in zip(shape, dims))
    offsets = [mul(axis_index(a), np.int32(m)) if a else np.int32(0)
               for a, m in zip(dims, local)]
    out = bind(eqn.primitive, key, *offsets, shape=local, global_shape=p["global_shape"],
               bit_width=p["bit_width"], split=p["split"])
    extra = ((),) if p["split"] else ()
    return [(out, Placement(batch + tuple(dims) + extra))]


# Explicit mode types the bits only whole (the typed split is not yet declared).
TABLE = {
    random_bits_p: Propagate(random_bits_rule, source=random_bits_source,
                             explicit=typed.whole_only("random_bits")),
    # Elementwise in their operands (counters/bits of the same shape as the output).
    threefry2x32_p: elementwise("none"),
    random_unit_float_p: elementwise("none"),
    rng_counter_p: Replicate("a scalar read from a host counter: every device reads the "
                             "same count"),
}

"""Pipeline parallelism: a model cut into ``S`` stages over a mesh axis, ``M``
microbatches flowing through them (the GPipe schedule), stage to stage by ``ppermute``.

Inside a ``shard_map`` over the pipeline axis, device ``s`` holds stage ``s``'s
parameters.  The forward runs ``M + S - 1`` ticks; at tick ``t`` stage ``s`` works on
microbatch ``t - s`` (stage 0 takes it from the inputs), then every stage passes its
result to the next one.  Stage ``s`` is busy in ``M`` of the ticks: the schedule's
bubble, the idle share of the ``S * (M + S - 1)`` stage-ticks, is ``(S - 1) / (M + S -
1)`` (:func:`gpipe_bubble`).  Differentiating the forward gives the backward pass as
the same ticks run in reverse (``ppermute``'s transpose sends the cotangents back one
stage), so the gradients are those of the unpipelined model by construction.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import spmd.numpy as snp
from spmd.collectives.api import axis_index, ppermute, psum
from spmd.collectives.primitives import _axes, _size
from spmd.compiler.jit import eval_shape
from spmd.compiler.trace import get_aval
from spmd.errors import ShapeError

__all__ = ["gpipe_bubble", "pipeline"]


def gpipe_bubble(stages: int, microbatches: int) -> float:
    """The idle share of GPipe's stage-ticks: ``(S - 1) / (M + S - 1)``."""
    return (stages - 1) / (microbatches + stages - 1)


def pipeline(stage: Callable, stage_params, microbatches, axis_name):
    """Run ``stage(stage_params, x)`` as stage ``s`` of an ``S``-stage pipeline over
    ``axis_name``, inside a ``shard_map`` over that axis.

    ``stage_params``: this device's stage's parameters (a pytree); ``microbatches``:
    ``(M, ...)``, the model's input cut into ``M`` microbatches (every device passes the
    same; stage 0 reads them); ``stage`` must return an array of a microbatch's shape
    and dtype.  Returns the ``(M, ...)`` outputs of the last stage, the same on every
    device.

    >>> run = shard_map(lambda p, xs: pipeline(layer, p, xs, "pipe"), mesh=mesh,
    ...                 in_specs=(P("pipe"), P()), out_specs=P())  # doctest: +SKIP
    """
    axes = _axes(axis_name, "pipeline")
    stages = _size(axes)
    xs = snp.asarray(microbatches)
    xa = get_aval(xs)
    if xa.ndim < 1 or xa.shape[0] < 1:
        raise ShapeError(f"pipeline: microbatches of shape {xa.shape} must be (M, ...) with "
                         "M >= 1 microbatches")
    m = xa.shape[0]
    mb = get_aval(xs[0])
    out_aval = eval_shape(stage, stage_params, xs[0])
    if (out_aval.shape, out_aval.dtype) != (mb.shape, mb.dtype):
        raise ShapeError(f"pipeline: the stage maps a microbatch {mb.shape} {mb.dtype} to "
                         f"{out_aval.shape} {out_aval.dtype}; each stage's output must be "
                         "the next stage's input (the same shape and dtype)")
    s = axis_index(axes)
    first, last = s == 0, s == stages - 1
    forward = [(i, i + 1) for i in range(stages - 1)]
    state = snp.zeros(mb.shape, mb.dtype)
    outs = []
    for t in range(m + stages - 1):
        x = snp.where(first, xs[min(t, m - 1)], state) if t < m else state
        y = stage(stage_params, x)
        if t >= stages - 1:  # the last stage finished microbatch t - (S - 1)
            outs.append(snp.where(last, y, np.zeros((), mb.dtype)))
        if t + 1 < m + stages - 1:
            state = ppermute(y, axes, forward)
    return psum(snp.stack(outs), axes)  # the last stage's, on every device

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

import functools
from typing import Any, Callable, NamedTuple

import numpy as np

import spmd.numpy as snp
from spmd import tree_util
from spmd.autodiff import value_and_grad, vjp
from spmd.collectives.api import axis_index, ppermute, psum, pvary
from spmd.collectives.primitives import _axes, _size
from spmd.compiler.core.jit import eval_shape
from spmd.compiler.transforms.split import split
from spmd.compiler.core.trace import get_aval
from spmd.errors import ShapeError
from spmd.lax import cond, dynamic_index_in_dim, dynamic_update_slice_in_dim, scan
from spmd.parallel.schedule import build, theory_bubble

__all__ = ["PipelineGrads", "gpipe_bubble", "pipeline", "pipeline_value_and_grad"]


def gpipe_bubble(stages: int, microbatches: int) -> float:
    """The idle share of GPipe's stage-ticks: ``(S - 1) / (M + S - 1)``."""
    return theory_bubble(stages, microbatches)


def _microbatch(stage, stage_params, xs, fname: str, stage_loss: bool = False):
    """A microbatch's abstract value, checked to be what ``stage`` maps it to (each
    stage's output is the next stage's input; with ``stage_loss``, the first of
    ``(output, loss term)``, the term a scalar)."""
    mb = get_aval(xs[0])
    out = eval_shape(stage, stage_params, xs[0])
    if stage_loss:
        if not (isinstance(out, tuple) and len(out) == 2 and getattr(out[1], "shape",
                                                                      None) == ()):
            raise ShapeError(f"{fname}: with stage_loss=True the stage must return (output, "
                             f"a scalar loss term), got {out}; return the pair, or leave "
                             "stage_loss out")
        out = out[0]
    if (out.shape, out.dtype) != (mb.shape, mb.dtype):
        raise ShapeError(f"{fname}: the stage maps a microbatch {mb.shape} {mb.dtype} to "
                         f"{out.shape} {out.dtype}; each stage's output must be the next "
                         "stage's input (the same shape and dtype)")
    return mb


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
    mb = _microbatch(stage, stage_params, xs, "pipeline")
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


class PipelineGrads(NamedTuple):
    """The gradients :func:`pipeline_value_and_grad` returns: of this device's stage
    parameters, of the loss's parameters (the same on every device), and of the
    microbatches (the same on every device; for what computed them, e.g. an
    embedding)."""

    stage: Any
    loss: Any
    inputs: Any


def pipeline_value_and_grad(stage: Callable, loss: Callable, stage_params, microbatches,
                            targets, axis_name, *, loss_params=None,
                            schedule: str = "1f1b", stage_loss: bool = False):
    """The mean loss over ``M`` microbatches of an ``S``-stage pipeline over
    ``axis_name`` and its gradients (:class:`PipelineGrads`), run by a schedule
    (``"1f1b"`` or ``"gpipe"``, :mod:`spmd.parallel.schedule`), inside a ``shard_map``
    over that axis.

    ``stage(stage_params, x)`` maps a microbatch to one of the same shape and dtype;
    ``loss(y, target)`` (or ``loss(loss_params, y, target)`` when ``loss_params`` is
    given: a model's head, say) is a scalar of the last stage's output for one
    microbatch; ``microbatches`` and ``targets`` are ``(M, ...)`` (every device passes
    the same).  Each tick, every stage does the forward and then the backward the
    schedule gives it (either may be none: on processes of their own an idle stage
    computes nothing); the last stage runs its forwards only inside its backwards
    (their results go to no stage).  Each result leaves as soon as it exists (``ppermute``:
    activations one stage on, cotangents one stage back), and the backward runs in two
    parts (:func:`spmd.compiler.transforms.split.split`): the input's cotangent, which the stage
    before waits for, then the parameters' gradient; what the neighbours sent during
    the tick is read at its end (on MPI the overlap pass starts each transfer early and
    waits there, ``spmd.compiler.passes.overlap``); the last stage adds each backward's
    parameters' gradient one backward later, so that it runs a weights' gradient ahead
    of the stage before, which then seldom waits for a cotangent (it keeps that one
    backward's values meanwhile).  A stage keeps its inputs only (the forward is
    recomputed in its backward; stage 0 reads its own in place), in a buffer of the
    most any stage holds at once: ``M`` for GPipe, ``2 S - 3`` for 1F1B (one for ``S =
    2``); a tick writes into it only on a stage that received something.  The
    gradients are those of the unpipelined model:
    ``stage`` of this device's stage parameters (never summed over the pipeline axis),
    ``loss`` of ``loss_params`` and ``inputs`` of the microbatches (both the same on
    every device).  ``stage`` may use collectives over other mesh axes (a tensor-parallel
    ``psum``, ring attention's ``ppermute``, the experts' ``all_to_all``, FSDP's
    ``all_gather``); then every process runs every branch (see ``control_cond``'s
    batching).  With ``stage_loss=True``, ``stage`` returns ``(output, term)``: a
    scalar term of the loss that the stage adds for the microbatch (a mixture of
    experts' load-balancing loss); the loss is then the head's plus every stage's
    terms, each averaged over the microbatches, and the gradients are of that sum.

    >>> run = shard_map(lambda p, xs, ys: pipeline_value_and_grad(layer, mse, p, xs, ys,
    ...                 "pipe"), mesh=mesh, in_specs=(P("pipe"), P(), P()),
    ...                 out_specs=(P(), PipelineGrads(P("pipe"), P(), P())))  # doctest: +SKIP
    """
    return _GradRun(stage, loss, stage_params, microbatches, targets, axis_name,
                    loss_params, schedule, stage_loss).run()


class _GradRun:
    """One :func:`pipeline_value_and_grad`: its set-up (the checked arguments, the
    schedule's table, this device's stage's column of it), then its named steps: a
    tick's forward and backward (:meth:`tick`), scanned over the schedule's segments
    (:meth:`run`)."""

    def __init__(self, stage, loss, stage_params, microbatches, targets, axis_name,
                 loss_params, schedule, stage_loss=False):
        # A forward needs the stage's output alone (the term's gradient comes with the
        # backward, which runs the forward again).
        self.stage_and_term = stage if stage_loss else None
        self.stage = (lambda p, x: stage(p, x)[0]) if stage_loss else stage
        self.loss_params = loss_params
        self.axes = axes = _axes(axis_name, "pipeline_value_and_grad")
        S = _size(axes)
        self.xs, self.ys = xs, ys = snp.asarray(microbatches), snp.asarray(targets)
        xa, ya = get_aval(xs), get_aval(ys)
        if xa.ndim < 1 or xa.shape[0] < 1 or ya.ndim < 1 or ya.shape[0] != xa.shape[0]:
            raise ShapeError(f"pipeline_value_and_grad: microbatches {xa.shape} and targets "
                             f"{ya.shape} must both be (M, ...) with the same M >= 1")
        self.M = M = xa.shape[0]
        self.mb = _microbatch(stage, stage_params, xs, "pipeline_value_and_grad", stage_loss)
        # Per stage: no gradient is summed over the pipeline axis implicitly (that would
        # be a collective inside the schedule's per-stage branches, which stages take
        # apart).
        self.stage_params = pvary(stage_params, axes)
        self.head = head = (lambda q, y, t: loss(y, t)) if loss_params is None else loss
        # Varying along the pipeline axis: each stage's gradient of the head stays its
        # own (only the last stage's counts).  Invariant, autodiff would sum every
        # stage's into it (the transpose of the implicit pvary is a psum).
        self.lp = lp = () if loss_params is None else pvary(loss_params, axes)
        sched = build(schedule, S, M)
        self.K, self.C = K, C = max(1, max(sched.inputs_held)), max(sched.cotangents_held)
        self.f_mb, self.b_mb, self.f_in, self.b_in = f_mb, b_mb, f_in, b_in = \
            _as_run(*sched.arrays())
        s = axis_index(axes)
        self.first, self.last = s == 0, s == S - 1
        self.forward = [(i, i + 1) for i in range(S - 1)]
        self.backward = [(i + 1, i) for i in range(S - 1)]
        self.scale = np.asarray(1.0 / M, np.float32)
        # The loss's dtype (float64 under x64): the accumulated loss keeps it.
        self.loss_dtype = np.dtype(eval_shape(head, lp, xs[0], ys[0]).dtype)
        # Every index a tick uses, worked out here from the static table (one column per
        # stage) and this device's stage's column taken once: a tick reads its own
        # numbers instead of computing them (measured: ~70 scalar operations a tick).
        table = _tick_table(f_mb, b_mb, f_in, b_in, K, C, M)
        cols = snp.asarray(table)[s]  # (T, fields) of this stage
        # The yes/no fields as booleans: a cond's predicate as it is (a switch's index
        # is clamped into range first, three operations a tick each).
        self.cols = [cols[:, k] != 0 if k in _FLAGS else cols[:, k]
                     for k in range(table.shape[-1])]

    @staticmethod
    def at(a, i):
        # The table's indices are in range: no wrap of negative ones (a tick's
        # arithmetic, not its data).
        return dynamic_index_in_dim(a, i, 0, keepdims=False, allow_negative_indices=False)

    @staticmethod
    def put(buf, slot, v, arrived):
        # A value into its slot (one copy of a microbatch), only on a stage that got
        # one: elsewhere the tick writes nothing (measured: each copy ~45-90 us on two
        # busy ranks; a tick's cond ~10 us).  Keeping a one-slot buffer's value itself
        # instead (no copy: the received array carried to the next tick) was tried and
        # taken back, unproven: the runs that showed it slower compared two checkouts,
        # which measure apart by themselves (docs/parallelism.md).
        def write(b, v):
            return dynamic_update_slice_in_dim(b, v[None], slot, 0,
                                               allow_negative_indices=False)

        return cond(arrived, write, lambda b, v: b, buf, v)

    def input_of(self, buf, slot, i):
        # Stage 0 reads its microbatches where they are; the others, their buffer (a
        # cond: a process takes only its own slice).
        return cond(self.first, lambda b: self.at(self.xs, i), lambda b: self.at(b, slot), buf)

    def bwd(self, buf, cts, b_slot, b_i, ct_slot):
        # A backward: the forward again (for the vjp), the loss on the last stage, the
        # vjp: (the input's cotangent, (what the parameters' gradient adds up)).
        lp, loss_dtype, scale = self.lp, self.loss_dtype, self.scale

        def from_next(y, cts):
            # Not the last stage: the cotangent the next stage sent; no loss here.
            return (self.at(cts, ct_slot), tree_util.tree_map(snp.zeros_like, lp),
                    pvary(np.zeros((), loss_dtype), self.axes))

        def from_head(y, cts):
            value, (dq, dy) = value_and_grad(self.head, argnums=(0, 1))(lp, y,
                                                                        self.at(self.ys, b_i))
            return (dy * scale.astype(dy.dtype),
                    tree_util.tree_map(lambda g: g * scale.astype(g.dtype), dq),
                    value.astype(loss_dtype) * scale.astype(loss_dtype))

        x = self.input_of(buf, b_slot, b_i)
        if self.stage_and_term is None:
            y, back = vjp(self.stage, self.stage_params, x)
            ct, dq, value = cond(self.last, from_head, from_next, y, cts)
            g, dx = back(ct)
            return dx, (g, dq, value)
        # The stage's own loss term: its value joins the loss on every stage, and its
        # cotangent (the microbatch's share, as the head's) joins the output's.
        (y, term), back = vjp(self.stage_and_term, self.stage_params, x)
        ct, dq, value = cond(self.last, from_head, from_next, y, cts)
        g, dx = back((ct, snp.ones_like(term) * scale.astype(get_aval(term).dtype)))
        return dx, (g, dq, value + term.astype(loss_dtype) * scale.astype(loss_dtype))

    def tick(self, carry, row, moves_f=True, moves_b=True, fwds=True, backs=True):
        buf, cts, gx, acc, held = carry
        (f_on, b_on, f_i, b_i, f_slot, b_slot, ct_slot, f_put, b_put, gx_put,
         f_got, b_got, gx_got, w_add) = row
        mb = self.mb

        def no_fwd(buf):
            return snp.zeros(mb.shape, mb.dtype)

        def fwd(buf):
            return self.stage(self.stage_params, self.input_of(buf, f_slot, f_i))

        # A tick's forward, its result sent on at once (the next stage reads it next
        # tick).  What arrives goes into its buffer at the tick's end: a cond's
        # results may be views of its operands, so a buffer the backward read is
        # written in place only once those results are gone.
        got_f = None
        if fwds:  # (GPipe's backward ticks have no forward on any stage)
            send_f = cond(f_on, fwd, no_fwd, buf)
            got_f = ppermute(send_f, self.axes, self.forward) if moves_f else None
        got_b = None
        if backs:
            gx, acc, held, got_b = self.tick_backward(
                buf, cts, gx, acc, held, (b_on, b_i, b_slot, ct_slot, gx_put, gx_got, w_add),
                moves_b)
        if got_f is not None:
            buf = self.put(buf, f_put, got_f, f_got)
        if got_b is not None:
            cts = self.put(cts, b_put, got_b, b_got)
        return (buf, cts, gx, acc, held), None

    def tick_backward(self, buf, cts, gx, acc, held, row, moves_b):
        """A tick's backward: ``(gx, acc, held, what comes back)``."""
        b_on, b_i, b_slot, ct_slot, gx_put, gx_got, w_add = row
        # The backward in two parts (spmd.compiler.transforms.split): the input's
        # cotangent, which the stage before waits for, goes back as soon as it is
        # computed; the parameters' gradient, which nobody waits for, is computed after.
        cotangent, gradient = split(self.bwd, buf, cts, b_slot, b_i, ct_slot)

        def no_cotangent(*args):
            dx, *carried = (snp.zeros(a.shape, a.dtype) for a in cotangent.out_avals)
            return dx, tuple(carried)

        def no_gradient(carried, acc):
            return acc

        def accumulate(carried, acc):
            g, dq, value = gradient(carried)
            gs, gq, total = acc
            return _add(gs, g), _add(gq, dq), total + value

        dx, carried = cond(b_on, cotangent, no_cotangent, buf, cts, b_slot, b_i, ct_slot)
        got_b = ppermute(dx, self.axes, self.backward) if moves_b else None
        # Stage 0's backward results are the inputs' gradients (other stages and idle
        # ticks write none).
        gx = self.put(gx, gx_put, dx, gx_got)
        # The parameters' gradient (_w_adds): a stage's own after its cotangent has
        # gone; the last stage's a tick later, after the next backward's cotangent has
        # gone, so that it keeps a weights' gradient's time ahead of the stage before,
        # which otherwise waits for each cotangent whenever the last stage's backward
        # runs slower than its own.  (One cond selects, computing nothing; `accumulate`
        # is in one branch only: a stage with collectives runs every branch of a cond,
        # control_cond.)
        added, held = cond(self.last, lambda c, h: (h, c), lambda c, h: (c, h),
                           carried, held)
        acc = cond(w_add, accumulate, no_gradient, added, acc)
        return gx, acc, held, got_b

    def run(self):
        """The ticks, scanned segment by segment; ``(loss, PipelineGrads)``."""
        mb, cols, axes = self.mb, self.cols, self.axes
        acc = (tree_util.tree_map(snp.zeros_like, self.stage_params),
               tree_util.tree_map(snp.zeros_like, self.lp), np.zeros((), self.loss_dtype))
        slots = lambda n: snp.zeros((n,) + mb.shape, mb.dtype)  # noqa: E731
        buf, cts = slots(self.K), slots(self.C)
        # The last stage's held backward (tick's w_add): zeros of the types of what a
        # backward hands its parameters' gradient.
        parts = split(self.bwd, buf, cts, cols[5][0], cols[3][0], cols[6][0])[0].out_avals[1:]
        held = tuple(snp.zeros(a.shape, a.dtype) for a in parts)
        carry = (buf, cts, slots(self.M), acc, held)
        for start, stop, moves_f, moves_b, fwds, backs in _segments(self.f_in, self.b_in,
                                                                     self.f_mb, self.b_mb):
            body = functools.partial(self.tick, moves_f=moves_f, moves_b=moves_b, fwds=fwds,
                                     backs=backs)
            carry, _ = scan(body, carry, tuple(c[start:stop] for c in cols))
        gx, (gs, gq, total) = carry[2], carry[3]
        # The loss and the head's gradient live on the last stage, the inputs' on the
        # first: every device gets them.
        gq = tree_util.tree_map(lambda g: psum(g, axes), gq)
        gx = psum(gx, axes)
        grads = PipelineGrads(gs, None if self.loss_params is None else gq, gx)
        return psum(total, axes), grads


def _add(a, b):
    """Two pytrees of the same structure, added leaf by leaf."""
    return tree_util.tree_map(lambda u, v: u + v, a, b)


def _as_run(f_mb, b_mb, f_in, b_in) -> tuple:
    """A schedule's ``(T, S)`` tables (:meth:`Schedule.arrays`) as the ticks run them.

    The last stage's forwards are not run: their results go to no stage, and its
    backward computes the forward again for the vjp and the loss (measured, two MPI
    ranks, M = 16, old and new alternating in one process: GPipe's step 537 -> 527
    ms, 1F1B's 536 -> 516 ms; stage 0's time in its transfers and waits 34 -> 25 and
    22 -> 13 ms: its wait for the first cotangent is one forward shorter).  What
    arrives is what arrives during each tick (:func:`_arriving_after`).  A tick in
    which no stage then works and nothing arrives (GPipe's last forward tick) is
    dropped: it would still move an empty message."""
    f_mb = f_mb.copy()
    f_mb[:, -1] = -1
    f_in, b_in = _arriving_after(f_in), _arriving_after(b_in)
    busy = ((f_mb >= 0) | (b_mb >= 0) | (f_in >= 0) | (b_in >= 0)).any(axis=1)
    run = [f_mb[busy], b_mb[busy], f_in[busy], b_in[busy]]
    if run[1][-1, -1] >= 0:
        # The last stage's held parameters' gradient (_w_adds) needs a tick after its
        # last backward (one stage only: every other stage's last backward comes later).
        run = [np.concatenate([a, np.full_like(a[:1], -1)]) for a in run]
    return tuple(run)


def _arriving_after(arrivals: np.ndarray) -> np.ndarray:
    """What arrives at each tick's start (a schedule's ``(T, S)`` table) as what
    arrives during each tick: a tick sends what it computes within itself, so what
    arrives at tick ``t + 1``'s start comes during tick ``t`` (-1: nothing)."""
    return np.concatenate([arrivals[1:], np.full_like(arrivals[:1], -1)])


_FLAGS = (0, 1, 10, 11, 12, 13)  # _tick_table's yes/no fields


def _w_adds(b_mb) -> np.ndarray:
    """``(T, S)`` bool: whether a tick adds a parameters' gradient: on a stage but the
    last, that of its backward in the tick; on the last stage, that of its backward in
    the tick before (held meanwhile; its last one needs a tick after it, _as_run)."""
    adds = b_mb >= 0
    adds[:, -1] = np.concatenate([[False], b_mb[:-1, -1] >= 0])
    return adds


def _tick_table(f_mb, b_mb, f_in, b_in, K: int, C: int, M: int) -> np.ndarray:
    """``(S, T, 14)`` int32: for each stage and tick, the numbers its tick reads.

    Whether it runs a forward and a backward (1/0: the conds' predicates); their
    microbatches; their inputs' slots in the ``K``-slot buffer and the backward's
    cotangent slot in the ``C``-slot one; the slots that the input and cotangent
    received during the tick go to (``f_in``, ``b_in``: :func:`_arriving_after`); where
    stage 0's backward result goes among the ``M`` inputs' gradients; and whether each
    of these three is written at all (1/0: nothing arrives, or a stage but the first
    or an idle tick has no input's gradient); last, whether it adds a parameters'
    gradient (:func:`_w_adds`).  Every index is in range (0 where it is not used): the tick reads
    and writes without wrapping or clamping.
    """
    S = f_mb.shape[1]
    first = (np.arange(S) == 0)[None, :]
    gx = first & (b_mb >= 0)
    fields = [f_mb >= 0, b_mb >= 0, np.maximum(f_mb, 0), np.maximum(b_mb, 0),
              np.maximum(f_mb, 0) % K, np.maximum(b_mb, 0) % K, np.maximum(b_mb, 0) % C,
              np.maximum(f_in, 0) % K, np.maximum(b_in, 0) % C, np.where(gx, b_mb, 0),
              f_in >= 0, b_in >= 0, gx, _w_adds(b_mb)]
    return np.stack(fields, axis=-1).astype(np.int32).transpose(1, 0, 2).copy()


def _segments(f_in, b_in, f_mb, b_mb) -> list:
    """The ticks cut into runs ``(start, stop, moves_f, moves_b, fwds, backs)`` by which
    of the two transfers carries anything during them (``f_in``, ``b_in``: what
    arrives during each tick, :func:`_arriving_after`; GPipe's forward ticks move
    activations only, its backward ticks cotangents only; 1F1B both in its steady
    state), and whether any stage runs a forward and a backward in them (``fwds``,
    ``backs``: GPipe's backward ticks run no forward, its forward ticks no backward,
    nor keep the inputs' gradients).  A tick without a transfer in one direction joins
    none, so a stage waits only for what it receives, never for a neighbour that has
    nothing for it: the ranks are not held in lockstep by empty messages, and half the
    messages are not sent (measured, GPipe at M = 16 on two MPI ranks: the step 587 ->
    567 ms, the idle share 9.1% -> 7.5%)."""
    fwds = [bool((f >= 0).any()) for f in f_mb]
    # (A backward's run also holds each tick that adds a parameters' gradient: the last
    # stage's held one comes a tick after its backward, _w_adds.)
    backs = [bool(b) for b in ((b_mb >= 0) | _w_adds(b_mb)).any(axis=1)]
    moves = [(bool((f >= 0).any()), bool((b >= 0).any())) for f, b in zip(f_in, b_in)]
    # A tick that receives nothing goes with a neighbouring run (the one before, else
    # the one after; one with forwards and backwards if it has them): one scan fewer,
    # and its empty transfer holds no stage up (the stage it would go to waits there
    # anyway).
    for t in range(len(moves)):
        if moves[t] == (False, False):
            near = [u for u in (t - 1, *range(t + 1, len(moves)))
                    if 0 <= u < len(moves) and moves[u] != (False, False)
                    and fwds[u] >= fwds[t] and backs[u] >= backs[t]]
            if near:
                u = near[0]
                moves[t], fwds[t], backs[t] = moves[u], fwds[u], backs[u]
    runs, start = [], 0
    key = lambda t: (moves[t], fwds[t], backs[t])  # noqa: E731
    for t in range(1, len(moves) + 1):
        if t == len(moves) or key(t) != key(start):
            runs.append((start, t) + moves[start] + (fwds[start], backs[start]))
            start = t
    return runs

"""``spmd.parallel.pipeline_value_and_grad``: an S-stage pipeline run by the GPipe and
1F1B schedules.  The tables keep every dependency and have the theory's bubble and
buffers; the loss and every gradient (the stages', the head's, the inputs') equal the
unpipelined model's, with varying-axes typing on and off, jitted and eagerly, with a
data-parallel axis beside the pipeline axis."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P
from spmd.errors import ArgumentError, ShapeError
from spmd.parallel import PipelineGrads, pipeline_schedule, pipeline_value_and_grad
from spmd.parallel.schedule import theory_bubble

B, D, IN, OUT = 4, 8, 5, 3


# ------------------------------------------------------------------- tables

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(1, 3), (2, 1), (2, 5), (3, 4), (4, 4),
                                                 (4, 9), (8, 16)])
def test_tables_keep_the_dependencies_and_the_theory(name, stages, microbatches):
    sched = pipeline_schedule(name, stages, microbatches)
    S, M = stages, microbatches
    when = {}
    for t, row in enumerate(sched.ticks):
        assert len(row) == S
        for s, ops in enumerate(row):
            assert [k for k, _ in ops] in ([], ["F"], ["B"], ["F", "B"])  # at most one each
            for op in ops:
                assert (op, s) not in when  # each operation once
                when[(op, s)] = t
    assert len(when) == 2 * S * M
    for s in range(S):
        for i in range(M):
            f, b = when[(("F", i), s)], when[(("B", i), s)]
            # The last stage may take a microbatch's backward in its forward's tick (it
            # recomputes the forward from its input); the others need the next stage's.
            assert f < b or (f == b and s == S - 1)
            if s > 0:
                assert when[(("F", i), s - 1)] < f
            if s < S - 1:
                assert when[(("B", i), s + 1)] < b
    assert len(sched.ticks) == (2 * (M + S - 1) if name == "gpipe" else M + 2 * (S - 1))
    # Lockstep (every tick as long as its busiest stage), both have the theory's bubble
    # when a forward costs a backward; and whatever they cost, 1F1B's is the theory's.
    assert sched.bubble == pytest.approx(theory_bubble(S, M))
    if name == "1f1b":
        f, b = 1.0, 3.3
        assert 1 - M * (f + b) / sched.lockstep_time(f, b) == pytest.approx(
            theory_bubble(S, M))
    # What a stage holds at once (stage 0 reads its inputs in place): every microbatch
    # for GPipe; for 1F1B, 2 (S - 1 - s) + 1 on stage s, however large M is.
    assert sched.inputs_held[0] == 0
    for s in range(1, S):
        want = M if name == "gpipe" else min(2 * (S - 1 - s) + 1, M)
        assert sched.inputs_held[s] == want, (s, sched.inputs_held)
    assert max(sched.cotangents_held) == 1


def test_bad_schedules_are_named():
    with pytest.raises(ArgumentError, match=r"pipeline schedule 'zb' is not one of"):
        pipeline_schedule("zb", 2, 4)
    with pytest.raises(ArgumentError, match=r"microbatches=0 must be an integer >= 1"):
        pipeline_schedule("1f1b", 2, 0)


# ------------------------------------------------------------------- values

def _model(stages, seed=0):
    rng = np.random.default_rng(seed)
    return (((rng.normal(size=(stages, D, D)) / 3).astype(np.float32),
             rng.normal(size=(stages, D)).astype(np.float32)),
            rng.normal(size=(D, OUT)).astype(np.float32),
            rng.normal(size=(IN, D)).astype(np.float32))


def _layer(p, x):  # this device's stage: its (1, ...) block of the stacked weights
    w, b = p
    return snp.tanh(x @ w[0] + b[0])


def _head(h, y, t):
    return ((y @ h - t) ** 2).mean()


def _unpipelined(stage_params, h, emb, xs, ys):
    w, b = stage_params
    a = xs @ emb
    for s in range(w.shape[0]):
        a = snp.tanh(a @ w[s] + b[s])
    return ((a @ h - ys) ** 2).mean(axis=(1, 2)).mean()


def _step(schedule):
    def step(p, h, emb, xs, ys):
        a, back = spmd.vjp(lambda e: xs @ e, emb)  # an embedding before the pipeline
        loss, g = pipeline_value_and_grad(_layer, _head, p, a, ys, "pipe", loss_params=h,
                                          schedule=schedule)
        return loss, g.stage, g.loss, back(g.inputs)[0]
    return step


def _data(stages, microbatches, data=1):
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(microbatches, B * data, IN)).astype(np.float32)
    ys = rng.normal(size=(microbatches, B * data, OUT)).astype(np.float32)
    return xs, ys


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(2, 1), (2, 3), (4, 4), (4, 7), (8, 3)])
@pytest.mark.parametrize("check_vma", [True, False], ids=["typed", "untyped"])
def test_loss_and_gradients_equal_the_unpipelined_models(schedule, stages, microbatches,
                                                         check_vma):
    p, h, emb = _model(stages)
    xs, ys = _data(stages, microbatches)
    want_loss, want = spmd.value_and_grad(_unpipelined, argnums=(0, 1, 2))(p, h, emb, xs, ys)
    mesh = spmd.make_mesh((stages,), ("pipe",))
    f = spmd.jit(spmd.shard_map(_step(schedule), mesh=mesh,
                                in_specs=((P("pipe"), P("pipe")), P(), P(), P(), P()),
                                out_specs=(P(), (P("pipe"), P("pipe")), P(), P()),
                                check_vma=check_vma))
    assert_matches(f(p, h, emb, xs, ys), want_loss, want)


def test_eagerly_and_without_a_head():
    stages, microbatches = 2, 3
    p, _, _ = _model(stages)
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(microbatches, B, D)).astype(np.float32)
    ys = rng.normal(size=(microbatches, B, D)).astype(np.float32)

    def unpipelined(p, xs):
        w, b = p
        for s in range(stages):
            xs = snp.tanh(xs @ w[s] + b[s])
        return ((xs - ys) ** 2).mean(axis=(1, 2)).mean()

    want_loss, (want_p, want_x) = spmd.value_and_grad(unpipelined, argnums=(0, 1))(p, xs)
    mesh = spmd.make_mesh((stages,), ("pipe",))
    mse = lambda y, t: ((y - t) ** 2).mean()  # noqa: E731
    f = spmd.shard_map(lambda p, xs, ys: pipeline_value_and_grad(_layer, mse, p, xs, ys,
                                                                 "pipe"),
                       mesh=mesh, in_specs=((P("pipe"), P("pipe")), P(), P()),
                       out_specs=(P(), PipelineGrads((P("pipe"), P("pipe")), P(), P())))
    loss, g = f(p, xs, ys)  # eagerly
    assert g.loss is None
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    for got, exp in zip([*g.stage, g.inputs], [*want_p, want_x]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=2e-5, atol=1e-6)


def test_with_a_data_parallel_axis():
    stages, microbatches, data = 2, 4, 2
    p, h, emb = _model(stages)
    xs, ys = _data(stages, microbatches, data)
    want_loss, want = spmd.value_and_grad(_unpipelined, argnums=(0, 1, 2))(p, h, emb, xs, ys)
    mesh = spmd.make_mesh((data, stages), ("data", "pipe"))
    inner = _step("1f1b")

    def step(p, h, emb, xs, ys):
        loss, gs, gh, ge = inner(p, h, emb, xs, ys)
        # The parameters are the same on both halves of the batch, so (typed) autodiff
        # sums their gradients over 'data' already: the mean is a division.
        mean = lambda t: spmd.tree_util.tree_map(lambda g: g / data, t)  # noqa: E731
        return spmd.lax.pmean(loss, "data"), mean(gs), mean(gh), mean(ge)

    f = spmd.jit(spmd.shard_map(step, mesh=mesh,
                                in_specs=((P("pipe"), P("pipe")), P(), P(), P(None, "data"),
                                          P(None, "data")),
                                out_specs=(P(), (P("pipe"), P("pipe")), P(), P())))
    assert_matches(f(p, h, emb, xs, ys), want_loss, want)


def assert_matches(got, want_loss, want) -> None:
    """A pipelined step's ``(loss, stage grads, head grads, input grads)`` against the
    unpipelined loss and ``want`` (its gradients, in that order)."""
    loss, gs, gh, ge = got
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    for g, exp in zip([*gs, gh, ge], [*want[0], want[1], want[2]]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(exp), rtol=2e-5, atol=1e-6)


def test_shape_errors_are_named():
    mesh = spmd.make_mesh((2,), ("pipe",))
    p, _, _ = _model(2)
    mse = lambda y, t: ((y - t) ** 2).mean()  # noqa: E731
    run = lambda xs, ys, stage=_layer: spmd.shard_map(  # noqa: E731
        lambda p, xs, ys: pipeline_value_and_grad(stage, mse, p, xs, ys, "pipe")[0],
        mesh=mesh, in_specs=((P("pipe"), P("pipe")), P(), P()), out_specs=P())(p, xs, ys)
    with pytest.raises(ShapeError, match=r"microbatches \(3, 4, 8\) and targets \(2, 4, 8\) "
                                         r"must both be \(M, \.\.\.\) with the same M"):
        run(np.ones((3, B, D), np.float32), np.ones((2, B, D), np.float32))
    with pytest.raises(ShapeError, match=r"the stage maps a microbatch \(4, 8\) float32 to "
                                         r"\(4, 2\) float32"):
        run(np.ones((3, B, D), np.float32), np.ones((3, B, D), np.float32),
            stage=lambda p, x: x[:, :2])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gradients_against_finite_differences(schedule, x64):
    # The returned gradients against central differences of the returned loss, in
    # float64, in random directions of every parameter and of the inputs.
    stages, microbatches = 2, 3
    p, h, emb = (spmd.tree_util.tree_map(lambda a: a.astype(np.float64), t)
                 for t in _model(stages))
    xs, ys = (a.astype(np.float64) for a in _data(stages, microbatches))
    mesh = spmd.make_mesh((stages,), ("pipe",))
    f = spmd.jit(spmd.shard_map(_step(schedule), mesh=mesh,
                                in_specs=((P("pipe"), P("pipe")), P(), P(), P(), P()),
                                out_specs=(P(), (P("pipe"), P("pipe")), P(), P())))
    loss, gs, gh, ge = f(p, h, emb, xs, ys)
    rng = np.random.default_rng(3)
    eps = 1e-6
    for which in range(4):  # w, b, the head, the embedding
        args = [p[0], p[1], h, emb]
        d = rng.normal(size=args[which].shape)
        plus, minus = list(args), list(args)
        plus[which], minus[which] = args[which] + eps * d, args[which] - eps * d
        num = (float(f((plus[0], plus[1]), plus[2], plus[3], xs, ys)[0])
               - float(f((minus[0], minus[1]), minus[2], minus[3], xs, ys)[0])) / (2 * eps)
        grad = [gs[0], gs[1], gh, ge][which]
        np.testing.assert_allclose(float(np.sum(np.asarray(grad) * d)), num, rtol=1e-6,
                                   atol=1e-9)


# ------------------------------------------------------------- the transfers

@pytest.mark.parametrize("name,stages,microbatches,runs", [
    ("gpipe", 2, 16, [(0, 16, True, False, True, False), (16, 33, False, True, False, True)]),
    ("gpipe", 4, 8, [(0, 10, True, False, True, False), (10, 21, False, True, False, True)]),
    ("1f1b", 2, 16, [(0, 1, True, False, True, False), (1, 16, True, True, True, True),
                     (16, 18, False, True, False, True)]),
    ("1f1b", 4, 8, [(0, 3, True, False, True, False), (3, 10, True, True, True, True),
                    (10, 14, False, True, False, True)]),
    ("gpipe", 1, 3, [(0, 4, False, False, False, True)]),
    ("1f1b", 1, 3, [(0, 4, False, False, False, True)]),
])
def test_ticks_transfer_only_what_some_stage_receives(name, stages, microbatches, runs):
    """GPipe's forward ticks move activations only and its backward ticks cotangents
    only (no empty message holds a stage up for a neighbour with nothing to send), and
    its backward ticks run no forward; each run of ticks is one scan, and every
    transfer a stage receives (during the tick that computed it), and every forward
    and backward it runs, is in a run that has them.  (The ticks as they run: the
    last stage's forwards only inside its backwards, GPipe's then empty tick gone.)"""
    from spmd.parallel.pipeline import _as_run, _segments

    f_mb, b_mb, f_in, b_in = _as_run(*pipeline_schedule(name, stages, microbatches).arrays())
    got = _segments(f_in, b_in, f_mb, b_mb)
    assert got == runs
    assert got[0][0] == 0 and got[-1][1] == len(f_in)
    for (start, stop, moves_f, moves_b, fwds, backs), (nxt, *_) in zip(
            got, got[1:] + [(len(f_in),) * 6]):
        assert stop == nxt
        assert moves_f or (f_in[start:stop] < 0).all()
        assert moves_b or (b_in[start:stop] < 0).all()
        assert fwds or (f_mb[start:stop] < 0).all()  # a run without forwards runs none
        assert backs or (b_mb[start:stop] < 0).all()  # a run without backwards runs none

    # The program: one scan per run, one ppermute per direction it moves.
    p, h, emb = _model(stages)
    xs, ys = _data(stages, microbatches)
    mesh = spmd.make_mesh((stages,), ("pipe",))
    f = spmd.shard_map(_step(name), mesh=mesh,
                       in_specs=((P("pipe"), P("pipe")), P(), P(), P(), P()),
                       out_specs=(P(), (P("pipe"), P("pipe")), P(), P()))
    text = str(spmd.make_jaxpr(f)(p, h, emb, xs, ys))
    assert text.count("scan[") == len(runs)
    assert text.count("ppermute[") == sum(mf + mb for _, _, mf, mb, _, _ in runs)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(1, 3), (2, 1), (2, 5), (3, 4), (4, 8)])
def test_the_last_stages_forwards_run_only_inside_its_backwards(name, stages,
                                                                microbatches):
    """As the pipeline runs a table: the last stage runs no forward of its own (its
    result would go to no stage; its backward computes it for the vjp and the loss);
    every other operation and every arrival is kept, in order; a tick is dropped only
    if nothing is left in it (GPipe's last forward tick, once its one forward is
    gone); one stage alone gets an empty tick after its last backward (for its held
    parameters' gradient)."""
    from spmd.parallel.pipeline import _arriving_after, _as_run

    f_mb, b_mb, f_in, b_in = pipeline_schedule(name, stages, microbatches).arrays()
    run = _as_run(f_mb, b_mb, f_in, b_in)
    assert (run[0][:, -1] == -1).all()
    want = [f_mb.copy(), b_mb, _arriving_after(f_in), _arriving_after(b_in)]
    want[0][:, -1] = -1
    kept = [t for t in range(len(f_mb)) if any((a[t] >= 0).any() for a in want)]
    added = int(stages == 1)
    for got, full in zip(run, want):
        np.testing.assert_array_equal(got[:len(got) - added], full[kept])
        assert (got[len(got) - added:] == -1).all()
    dropped = len(f_mb) - len(kept)
    assert dropped == (1 if name == "gpipe" and stages > 1 else
                       microbatches if name == "gpipe" else 0)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(1, 3), (2, 1), (2, 5), (3, 4), (4, 8)])
def test_the_last_stage_adds_each_gradient_a_tick_later(name, stages, microbatches):
    """The parameters' gradient of each backward is added once: in its own tick on
    every stage but the last; on the last stage in the tick after (its backwards come
    one a tick, so after the next backward's cotangent has gone), the last one in a
    tick that exists and is in a run of ticks that runs backwards (_segments)."""
    from spmd.parallel.pipeline import _as_run, _segments, _w_adds

    f_mb, b_mb, f_in, b_in = _as_run(*pipeline_schedule(name, stages, microbatches).arrays())
    adds = _w_adds(b_mb)
    assert adds.dtype == bool and adds.shape == b_mb.shape
    for s in range(stages):
        ticks = [t for t in range(len(b_mb)) if b_mb[t, s] >= 0]
        assert len(ticks) == microbatches
        later = int(s == stages - 1)
        assert list(np.nonzero(adds[:, s])[0]) == [t + later for t in ticks]
    assert ticks == list(range(ticks[0], ticks[-1] + 1))  # the last stage: one a tick
    backs = [t for start, stop, *_, bk in _segments(f_in, b_in, f_mb, b_mb) if bk
             for t in range(start, stop)]
    assert set(np.nonzero(adds.any(axis=1))[0]) <= set(backs)


@pytest.mark.parametrize("name,stages,microbatches", [
    ("gpipe", 2, 5), ("gpipe", 4, 3), ("1f1b", 2, 7), ("1f1b", 4, 8), ("1f1b", 3, 1)])
def test_tick_table_holds_each_ticks_indices(name, stages, microbatches):
    """``_tick_table`` against the schedule's operations tick by tick: each stage's
    forward and backward (whether, which microbatch, which slots it reads), where a
    received input and cotangent go (each received during the tick its neighbour
    computed it), and where stage 0's input gradient goes, with whether each is written
    at all; every index in range of its buffer, written or not (the tick reads and
    writes without wrapping or clamping)."""
    from spmd.parallel.pipeline import _arriving_after, _tick_table, _w_adds

    sched = pipeline_schedule(name, stages, microbatches)
    K, C = max(1, max(sched.inputs_held)), max(sched.cotangents_held)
    M = microbatches
    f_mb, b_mb, f_in, b_in = sched.arrays()
    table = _tick_table(f_mb, b_mb, _arriving_after(f_in), _arriving_after(b_in), K, C, M)
    assert table.shape == (stages, len(sched.ticks), 14) and table.dtype == np.int32
    for t, row in enumerate(sched.ticks):
        for s, ops in enumerate(row):
            (f_on, b_on, f_i, b_i, f_slot, b_slot, ct_slot, f_put, b_put, gx_put,
             f_got, b_got, gx_got, w_add) = table[s, t]
            assert w_add == _w_adds(b_mb)[t, s]
            fwd = [i for kind, i in ops if kind == "F"]
            bwd = [i for kind, i in ops if kind == "B"]
            assert (f_on, b_on) == (len(fwd), len(bwd))
            if fwd:
                assert (f_i, f_slot) == (fwd[0], fwd[0] % K)
            if bwd:
                assert (b_i, b_slot, ct_slot) == (bwd[0], bwd[0] % K, bwd[0] % C)
            # What the stage before forwards and the stage after backwards in this tick.
            sent_f = [i for kind, i in (row[s - 1] if s > 0 else ()) if kind == "F"]
            sent_b = [i for kind, i in (row[s + 1] if s + 1 < stages else ())
                      if kind == "B"]
            assert (f_got, b_got, gx_got) == (len(sent_f), len(sent_b),
                                              int(s == 0 and bool(bwd)))
            if sent_f:
                assert f_put == sent_f[0] % K
            if sent_b:
                assert b_put == sent_b[0] % C
            if s == 0 and bwd:
                assert gx_put == bwd[0]
            assert 0 <= f_i < M and 0 <= b_i < M and 0 <= f_slot < K and 0 <= b_slot < K
            assert 0 <= ct_slot < C and 0 <= f_put < K and 0 <= b_put < C
            assert 0 <= gx_put < M


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(1, 3), (2, 2), (2, 16), (3, 5), (4, 8)])
def test_the_dataflow_time_takes_the_weight_gradients_off_the_path(name, stages,
                                                                   microbatches):
    """Sending each result at once and reading at the tick's end: with uniform costs,
    nothing after the cotangent (``w = 0``) and the last stage's forwards priced as
    the others (``f_last = f``) the lockstep time; each weight gradient after its
    cotangent takes ``w`` off once per stage boundary; the last stage's forwards run
    inside its backwards take time off too, never add any."""
    sched = pipeline_schedule(name, stages, microbatches)
    for f, b, w in [(1.0, 2.0, 0.5), (7.1, 22.7, 7.2), (1.0, 1.0, 0.0)]:
        assert sched.dataflow_time(f, b, 0.0, f) == pytest.approx(sched.lockstep_time(f, b))
        assert sched.dataflow_time(f, b, w, f) == pytest.approx(
            sched.lockstep_time(f, b) - (stages - 1) * w)
        assert sched.dataflow_time(f, b, w) < sched.dataflow_time(f, b, w, f)
    # GPipe on 2 stages, 2 microbatches, by hand: F F | . F | B . | B B | . B with
    # f = 1, b = 2 of which w = 1: stage 0 takes microbatch 1's cotangent one unit early;
    # with the last stage's forwards inside its backwards, one unit earlier still.
    gpipe = pipeline_schedule("gpipe", 2, 2)
    assert gpipe.dataflow_time(1.0, 2.0, 1.0, 1.0) == 8.0
    assert gpipe.dataflow_time(1.0, 2.0, 1.0) == 7.0


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(1, 2), (2, 4), (3, 5)])
def test_each_tick_traces_each_product_once(name, stages, microbatches):
    """A one-layer stage has one product in its forward, two in its backward's first
    part (the forward again, the input's cotangent) and one in its weights' gradient:
    each run of ticks traces each of them in one branch only, the held weights'
    gradient included (a stage with collectives inside runs every branch of a cond on
    every process: a product traced twice would be computed twice)."""
    from spmd.parallel.pipeline import _as_run, _segments

    f_mb, b_mb, f_in, b_in = _as_run(*pipeline_schedule(name, stages, microbatches).arrays())
    want = sum(fw + 3 * bk for *_, fw, bk in _segments(f_in, b_in, f_mb, b_mb))

    def layer(p, x):
        return snp.tanh(x @ p[0])

    def mse(y, t):
        return ((y - t) ** 2).mean()

    mesh = spmd.make_mesh((stages,), ("pipe",))
    w = np.ones((stages, 8, 8), np.float32)
    xs = np.ones((microbatches, 4, 8), np.float32)
    f = spmd.shard_map(
        lambda p, xs, ys: pipeline_value_and_grad(layer, mse, p, xs, ys, "pipe",
                                                  schedule=name),
        mesh=mesh, in_specs=(P("pipe"), P(), P()),
        out_specs=(P(), PipelineGrads(P("pipe"), P(), P())))
    assert str(spmd.make_jaxpr(f)(w, xs, xs)).count("dot_general") == want

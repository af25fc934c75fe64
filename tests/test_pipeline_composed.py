"""examples/train_transformer.py with ``pipe=S`` and every other parallel axis: the
pipelined step on meshes with 'seq' (ring attention), 'expert' (a mixture of
experts), ``--fsdp`` and all of 'data', 'model', 'pipe' and 'seq' at once computes the
losses of one device, and its checkpoints resume on other meshes; what it rests on in
``spmd.parallel`` (a stage's own loss term, ``stage_loss``) and the experts split over
'expert' x 'model' (``moe(replicated_axes=)``, ``--experts-over-model``) (issue 58)."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P
from spmd.testing import simulated_devices
from tests.test_train_transformer import SMALL, _losses_on_ranks, ex  # noqa: F401

MOE = ["--experts", "4", "--capacity-factor", "4"]  # a capacity that drops no token


def _opt():
    # As tests/test_train_transformer.py's: a larger eps keeps the comparison about
    # the sharding (rounding-noise gradients take no full Adam step).
    TP = sys.modules["transformer_pipeline"]
    return spmd.optim.adamw(1e-2, eps=1e-4, weight_decay=0.01, mask=TP.decay_mask)


def _one_device(ex, cfg):
    """``[step, params, optimizer state]`` of the unpipelined model on one device."""
    mesh = ex.make_mesh(1, 1, moe=cfg.experts > 0, devices=spmd.devices()[:1])
    specs = ex.param_specs(cfg, False, expert=cfg.experts > 0)
    opt = _opt()
    params = ex.init_params(cfg, specs, mesh, seed=0)
    return [ex.make_step(cfg, mesh, specs, opt)[0], params, opt.init(params)]


def _piped(ex, cfg, data=1, model=1, seq=1, expert=1, pipe=2, fsdp=False,
           microbatches=2, schedule="1f1b"):
    """``[step, params, optimizer state]`` of the pipelined model on the mesh of these
    axes, from the same initial parameters as :func:`_one_device`'s."""
    TP = sys.modules["transformer_pipeline"]
    n = data * model * seq * expert * pipe
    mesh = ex.make_mesh(data, model, seq, expert, moe=cfg.experts > 0, pipe=pipe,
                        devices=spmd.devices()[:n])
    specs = ex.param_specs(cfg, fsdp, expert="expert" in mesh.axis_names)
    opt = _opt()
    params = ex.init_params(cfg, specs, mesh, seed=0)
    state = opt.init(params)
    step, state_specs = TP.make_pipe_step(ex, cfg, mesh, specs, opt, microbatches, schedule)
    return [step, TP.place(TP.stacked(params), mesh, TP.pipe_specs(specs)),
            TP.place(TP.map_param_trees(state, TP.stacked), mesh, state_specs)]


def _losses_for_20_steps(ex, cfg, runs):
    """Each run's first 20 losses, every run trained on the same 20 batches."""
    corpus = np.arange(4000, dtype=np.int32) % 96
    losses = [[] for _ in runs]
    for k in range(1, 21):
        batch = ex.batch_at(corpus, k, 8, cfg.context, seed=0)
        for run, out in zip(runs, losses):
            run[1], run[2], loss = run[0](run[1], run[2], batch)
            out.append(float(loss))
    return losses


@pytest.mark.parametrize("axes, extra, microbatches", [
    (dict(seq=2), [], 2),
    (dict(data=2, fsdp=True), [], 2),
    (dict(expert=2), MOE, 1),
], ids=["pipe=2,seq=2", "data=2,pipe=2,fsdp", "pipe=2,expert=2"])
def test_pipe_composes_losses_match_one_device_for_20_steps(ex, axes, extra, microbatches):
    """``pipe=2`` with seq, --fsdp, expert: the first 20 losses equal the one-device
    run's within 1e-3 (issue 58).  (With experts, one microbatch: with more, the
    load-balancing loss is each microbatch's, see the test below.)"""
    cfg = ex.Config(ex.parse_args(SMALL + extra))
    one, piped = _losses_for_20_steps(ex, cfg, [_one_device(ex, cfg),
                                                _piped(ex, cfg, microbatches=microbatches,
                                                       **axes)])
    np.testing.assert_allclose(piped, one, rtol=1e-3)


def test_pipe_and_experts_with_microbatches_match_one_device_without_balancing(ex,
                                                                               monkeypatch):
    """pipe=2 x expert=2 with 2 microbatches: the load-balancing loss is then each
    microbatch's (its statistics are not linear in the tokens), so it is weighed 0
    here to compare the rest: the experts' losses and gradients through the pipeline
    (within 1e-3 of one device; the balancing loss's own path is checked with one
    microbatch above)."""
    monkeypatch.setattr(ex, "AUX_WEIGHT", 0.0)
    cfg = ex.Config(ex.parse_args(SMALL + MOE))
    one, piped = _losses_for_20_steps(ex, cfg, [_one_device(ex, cfg),
                                                _piped(ex, cfg, expert=2, microbatches=2,
                                                       schedule="gpipe")])
    np.testing.assert_allclose(piped, one, rtol=1e-3)


def test_data_model_pipe_seq_on_16_devices_match_one_device_for_20_steps(ex):
    """data=2 x model=2 x pipe=2 x seq=2 on 16 simulated devices (one process): the
    first 20 losses within 1e-3 of one device's (issue 58)."""
    cfg = ex.Config(ex.parse_args(SMALL))
    with simulated_devices(16):
        one, piped = _losses_for_20_steps(ex, cfg, [
            _one_device(ex, cfg), _piped(ex, cfg, data=2, model=2, seq=2, microbatches=2)])
    np.testing.assert_allclose(piped, one, rtol=1e-3)


@pytest.mark.parametrize("saved_on, resumed_on, extra", [
    ("data=2,model=1,seq=2,pipe=2", "data=4,model=1,pipe=2 --fsdp", []),
    ("data=2,model=1,expert=2,pipe=2", "data=4,model=2", MOE + ["--microbatches", "1"]),
], ids=["pipe-seq-to-pipe-fsdp", "pipe-expert-to-no-pipe"])
def test_pipelined_checkpoints_resume_on_another_mesh(ex, tmp_path, capsys, saved_on,
                                                      resumed_on, extra):
    """A run saved on a composed pipelined mesh resumes on another (the checkpoints keep
    the list layout whatever the mesh): it continues the uninterrupted run's losses
    (issue 58)."""
    import spmd.checkpointing as ckpt

    ck = str(tmp_path / "ck")
    argv = SMALL + ["--microbatches", "2"] + extra + [
        "--steps", "8", "--save-every", "4", "--ckpt-dir", ck, "--sample", "0",
        "--log-every", "4", "--warmup", "2", "--stats", str(tmp_path / "stats")]
    assert ex.main(argv + ["--mesh", saved_on]) == 0
    with open(tmp_path / "stats.rank0.json") as f:
        whole = json.load(f)["losses"]
    shutil.rmtree(ckpt.step_dir(ck, 8))
    assert ex.main(argv + ["--mesh", *resumed_on.split()]) == 0
    assert "resumed from step 4" in capsys.readouterr().out
    with open(tmp_path / "stats.rank0.json") as f:
        resumed = json.load(f)["losses"]
    assert len(resumed) == 4
    np.testing.assert_allclose(resumed, whole[4:], rtol=1e-3)


def test_pipeline_meshes_are_checked(ex):
    with pytest.raises(SystemExit, match=r"'pipe'=4 must divide --layers \(2\); give a "
                                         r"multiple of it"):
        ex.main(SMALL + ["--mesh", "data=1,model=1,seq=2,pipe=4", "--steps", "1"])
    with pytest.raises(SystemExit, match=r"--microbatches 4 must divide each device's rows "
                                         r"\(2 = --batch 8 / data=2 x expert=2\)"):
        ex.main(SMALL + MOE + ["--mesh", "data=2,model=1,expert=2,pipe=2", "--steps", "1"])
    with pytest.raises(SystemExit, match=r"--microbatches 0 must divide"):
        ex.main(SMALL + ["--mesh", "data=4,model=1,pipe=2", "--microbatches", "0",
                         "--steps", "1"])


@pytest.mark.timeout(400)
def test_pipe_with_seq_and_with_fsdp_on_4_ranks_match_one_rank_for_20_steps(tmp_path):
    """On 4 MPI ranks, --mesh data=1,model=1,seq=2,pipe=2 and --mesh data=2,model=1,pipe=2
    --fsdp: the first 20 losses within 1e-3 of one rank's (issue 58)."""
    one, = _losses_on_ranks(tmp_path, [(1, "data=1,model=1")])
    seq, = _losses_on_ranks(tmp_path, [(4, "data=1,model=1,seq=2,pipe=2")],
                            ["--microbatches", "2"])
    np.testing.assert_allclose(seq, one, rtol=1e-3)
    fsdp, = _losses_on_ranks(tmp_path, [(4, "data=2,model=1,pipe=2")],
                             ["--microbatches", "2", "--fsdp"])
    np.testing.assert_allclose(fsdp, one, rtol=1e-3)


# ------------------------------------------- spmd.parallel: a stage's own loss term

def _term(w, b, x):
    """A stage's loss term, of its parameters and of its input (so that its gradient
    reaches both, and the stages before through the input)."""
    return 0.1 * snp.mean(x ** 2) + 0.01 * snp.sum(w ** 2) * snp.mean(b)


def _layer_and_term(p, x):
    w, b = p
    return snp.tanh(x @ w[0] + b[0]), _term(w[0], b[0], x)


def _unpipelined_with_terms(stage_params, h, emb, xs, ys):
    w, b = stage_params
    a, terms = xs @ emb, 0.0
    for s in range(w.shape[0]):
        # Each microbatch's term, averaged over them as the pipeline does.
        terms = terms + snp.mean(snp.stack([_term(w[s], b[s], a[m])
                                            for m in range(a.shape[0])]))
        a = snp.tanh(a @ w[s] + b[s])
    return ((a @ h - ys) ** 2).mean(axis=(1, 2)).mean() + terms


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(2, 3), (4, 5)])
def test_stage_loss_terms_join_the_loss_and_the_gradients(schedule, stages, microbatches):
    """``pipeline_value_and_grad(..., stage_loss=True)``: each stage's term of each
    microbatch is in the loss and in every gradient (the stages', the head's, the
    inputs'), as in the unpipelined model's."""
    from spmd.parallel import pipeline_value_and_grad
    from tests.parallel.test_pipeline_schedules import _data, _head, _model, assert_matches

    p, h, emb = _model(stages)
    xs, ys = _data(stages, microbatches)
    want_loss, want = spmd.value_and_grad(_unpipelined_with_terms, argnums=(0, 1, 2))(
        p, h, emb, xs, ys)

    def step(p, h, emb, xs, ys):
        a, back = spmd.vjp(lambda e: xs @ e, emb)
        loss, g = pipeline_value_and_grad(_layer_and_term, _head, p, a, ys, "pipe",
                                          loss_params=h, schedule=schedule, stage_loss=True)
        return loss, g.stage, g.loss, back(g.inputs)[0]

    f = spmd.jit(spmd.shard_map(step, mesh=spmd.make_mesh((stages,), ("pipe",)),
                                in_specs=((P("pipe"), P("pipe")), P(), P(), P(), P()),
                                out_specs=(P(), (P("pipe"), P("pipe")), P(), P())))
    assert_matches(f(p, h, emb, xs, ys), want_loss, want)


def test_a_stage_loss_stage_must_return_a_pair():
    from spmd.errors import ShapeError
    from spmd.parallel import pipeline_value_and_grad
    from tests.parallel.test_pipeline_schedules import _layer, _model

    p, _, _ = _model(2)
    mse = lambda y, t: ((y - t) ** 2).mean()  # noqa: E731
    xs = np.ones((2, 4, 8), np.float32)
    # An output alone, and a pair whose second is no scalar.
    for stage in (_layer, lambda p, x: (_layer(p, x), _layer(p, x))):
        run = spmd.shard_map(
            lambda p, xs, ys, stage=stage: pipeline_value_and_grad(
                stage, mse, p, xs, ys, "pipe", stage_loss=True)[0],
            mesh=spmd.make_mesh((2,), ("pipe",)), in_specs=((P("pipe"), P("pipe")), P(), P()),
            out_specs=P())
        with pytest.raises(ShapeError, match=r"with stage_loss=True the stage must return "
                                             r"\(output, a scalar loss term\), got .*; return "
                                             r"the pair, or leave stage_loss out"):
            run(p, xs, xs)


# ------------------------------------------------ experts over 'expert' x 'model'

@pytest.mark.parametrize("axes", [dict(model=2, expert=2, pipe=1), dict(model=2, expert=2)],
                         ids=["model=2,expert=2", "model=2,expert=2,pipe=2"])
def test_experts_over_model_match_one_device_for_20_steps(ex, axes):
    """``--experts-over-model``: whole experts on each device of 'expert' x 'model', each
    'model' device routing its share of the tokens; with and without a pipeline, the
    first 20 losses within 1e-3 of one device's (issue 58)."""
    cfg = ex.Config(ex.parse_args(SMALL + MOE + ["--experts-over-model"]))
    if axes.get("pipe") == 1:
        mesh = ex.make_mesh(1, 2, 1, 2, moe=True, devices=spmd.devices()[:4])
        specs = ex.param_specs(cfg, False, expert=True)
        params = ex.init_params(cfg, specs, mesh, seed=0)
        opt = _opt()
        run = [ex.make_step(cfg, mesh, specs, opt)[0], params, opt.init(params)]
    else:
        run = _piped(ex, cfg, microbatches=1, **axes)
    one, got = _losses_for_20_steps(ex, cfg, [_one_device(ex, cfg), run])
    np.testing.assert_allclose(got, one, rtol=1e-3)


def test_moe_with_replicated_axes_equals_one_device():
    """``moe(..., replicated_axes="model")``: tokens the same along 'model', experts split
    over 'expert' x 'model'; the output, the load-balancing loss and the gradients equal
    one device's (a capacity that drops nothing)."""
    from spmd.parallel import moe

    rng = np.random.default_rng(0)
    x, router = rng.normal(size=(16, 8)).astype(np.float32), \
        rng.normal(size=(8, 4)).astype(np.float32)
    w_in, w_out = (rng.normal(size=(4, 8, 12)) / 3).astype(np.float32), \
        (rng.normal(size=(4, 12, 8)) / 3).astype(np.float32)

    def loss(mesh, specs, **kw):
        def body(x, r, a, b):
            y, aux = moe(x, r, a, b, "expert", capacity_factor=4.0, **kw)
            return spmd.lax.psum(snp.sum(y ** 2), "expert") + aux["aux_loss"], y
        f = spmd.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), P("expert")))
        return spmd.jit(spmd.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True))

    one = loss(spmd.make_mesh((1,), ("expert",), devices=spmd.devices()[:1]),
               (P("expert"), P(), P("expert"), P("expert")))
    split = loss(spmd.make_mesh((2, 2), ("expert", "model"), devices=spmd.devices()[:4]),
                 (P("expert"), P(), P(("expert", "model")), P(("expert", "model"))),
                 replicated_axes="model")
    (want, want_y), want_g = one(x, router, w_in, w_out)
    (got, got_y), got_g = split(x, router, w_in, w_out)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got_y), np.asarray(want_y), rtol=1e-5, atol=1e-6)
    for a, b in zip(got_g, want_g):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_experts_over_model_are_checked(ex):
    from spmd.errors import ShapeError
    from spmd.parallel import moe

    over = ["--experts-over-model", "--capacity-factor", "4"]
    with pytest.raises(SystemExit, match=r"--experts-over-model: 'expert' x 'model' = 4 must "
                                         r"divide --experts \(6\); give --experts a multiple"):
        ex.main(SMALL + over + ["--experts", "6", "--mesh", "data=2,model=2,expert=2"])
    with pytest.raises(SystemExit, match=r"--experts-over-model: 'model'=2 must divide the "
                                         r"tokens of each call of the experts' layer \(15: "):
        ex.main(SMALL + over + ["--experts", "4", "--mesh", "data=4,model=2", "--batch", "4",
                                "--context", "15"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 8)).astype(np.float32)
    w = rng.normal(size=(1, 8, 8)).astype(np.float32)
    run = spmd.shard_map(
        lambda x, r, a, b: moe(x, r, a, b, "expert", replicated_axes="model")[0],
        mesh=spmd.make_mesh((2, 2), ("expert", "model"), devices=spmd.devices()[:4]),
        in_specs=(P("expert"), P(), P(("expert", "model")), P(("expert", "model"))),
        out_specs=P("expert"))
    with pytest.raises(ShapeError, match=r"moe: x \(3, 8\) must be \(t, d\) with t a multiple "
                                         r"of the 2 devices along replicated_axes="):
        run(x, rng.normal(size=(8, 4)).astype(np.float32), np.concatenate([w] * 4),
            np.concatenate([w] * 4))

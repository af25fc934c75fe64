"""``spmd.parallel.pipeline`` (GPipe): an S-stage model over a mesh axis, M
microbatches; the outputs and the gradients equal the unpipelined model's, eagerly and
under ``jit``, alone and with a data-parallel axis beside the pipeline axis."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P
from spmd.errors import ShapeError
from spmd.parallel import gpipe_bubble, pipeline

B, D = 4, 8


def _params(stages, seed=0):
    rng = np.random.default_rng(seed)
    return ((rng.normal(size=(stages, D, D)) / 3).astype(np.float32),
            rng.normal(size=(stages, D)).astype(np.float32))


def _layer(p, x):  # this device's stage: p holds its (1, ...) block of the stacked weights
    w, b = p
    return snp.tanh(x @ w[0] + b[0])


def _sequential(p, xs):
    w, b = p
    for s in range(w.shape[0]):
        xs = snp.tanh(xs @ w[s] + b[s])
    return xs


def _pipelined(stages, data=1):
    names = ("data", "pipe") if data > 1 else ("pipe",)
    mesh = spmd.make_mesh((data, stages) if data > 1 else (stages,), names)
    xs_spec = P(None, "data") if data > 1 else P()
    return spmd.shard_map(lambda p, xs: pipeline(_layer, p, xs, "pipe"), mesh=mesh,
                          in_specs=((P("pipe"), P("pipe")), xs_spec), out_specs=xs_spec)


@pytest.mark.parametrize("stages,microbatches", [(2, 1), (2, 5), (4, 3), (4, 8), (8, 2)])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_outputs_and_gradients_equal_the_unpipelined_models(stages, microbatches, jit):
    p = _params(stages)
    xs = np.random.default_rng(1).normal(size=(microbatches, B, D)).astype(np.float32)
    run = _pipelined(stages)
    got = (spmd.jit(run) if jit else run)(p, xs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(_sequential(p, xs)), rtol=1e-6,
                               atol=1e-6)
    loss = lambda f: lambda p, xs: snp.sum(f(p, xs) ** 2)  # noqa: E731
    grad = spmd.grad(loss(run))
    g = (spmd.jit(grad) if jit else grad)(p, xs)
    for a, b in zip(g, spmd.grad(loss(_sequential))(p, xs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_with_a_data_parallel_axis():
    p = _params(4, 2)
    xs = np.random.default_rng(3).normal(size=(3, B, D)).astype(np.float32)
    run = spmd.jit(_pipelined(4, data=2))
    np.testing.assert_allclose(np.asarray(run(p, xs)), np.asarray(_sequential(p, xs)),
                               rtol=1e-6, atol=1e-6)
    g = spmd.jit(spmd.grad(lambda p, xs: snp.sum(run(p, xs) ** 2)))(p, xs)
    want = spmd.grad(lambda p, xs: snp.sum(_sequential(p, xs) ** 2))(p, xs)
    for a, b in zip(g, want):  # the data axis's shares are summed
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_bubble_theory():
    assert gpipe_bubble(4, 8) == pytest.approx(3 / 11)
    assert gpipe_bubble(1, 5) == 0.0


def test_errors_name_the_argument():
    mesh = spmd.make_mesh((2,), ("pipe",))
    p = _params(2)

    def run(stage, xs):
        return spmd.shard_map(lambda p, xs: pipeline(stage, p, xs, "pipe"), mesh=mesh,
                              in_specs=((P("pipe"), P("pipe")), P()), out_specs=P())(p, xs)

    xs = np.ones((3, B, D), np.float32)
    with pytest.raises(ShapeError, match=r"maps a microbatch \(4, 8\) float32 to \(4, 4\) "
                                         r"float32; each stage's output must be the next"):
        run(lambda p, x: x[:, :4], xs)
    with pytest.raises(ShapeError, match=r"microbatches of shape \(\) must be \(M, \.\.\.\)"):
        run(_layer, np.float32(1.0))

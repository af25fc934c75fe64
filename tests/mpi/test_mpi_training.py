"""Gradients, the JEP 14273 matmul examples and data-parallel training across processes.

Runs on 4 ranks with one device each (``make test``) and on 2 ranks with
2 devices each (``test_hybrid_subprocess.py``); every result is
compared with numpy on the global arrays (formulas for the gradients, finite
differences through ``spmd.test_util.check_grads``, a numpy re-implementation
of the training loop).
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import assert_local_blocks, make_mesh  # noqa: E402

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding, P, lax  # noqa: E402

# Generic in the number of devices (even): also run on 2 ranks x 2 devices by
# test_hybrid_subprocess.py.
pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _gathered(x):
    return spmd.process_allgather(x) if not x.is_fully_addressable else np.asarray(x)


# ------------------------------------------------------------------ gradients

@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_grad_of_a_sharded_sum_of_squares(jit):
    mesh = make_mesh("1d")
    loss = spmd.shard_map(lambda b: lax.psum(snp.sum(b ** 2), "i"), mesh=mesh,
                          in_specs=P("i"), out_specs=P())
    x = _rand((mesh.size * 3, 2), 0)
    value, g = (spmd.jit(spmd.value_and_grad(loss)) if jit else spmd.value_and_grad(loss))(x)
    np.testing.assert_allclose(float(value), np.sum(x.astype(np.float64) ** 2), rtol=1e-5)
    if jit:  # jit results keep their sharding: this process's blocks
        assert_local_blocks(g, 2 * x, NamedSharding(mesh, P("i")))
    else:
        assert g.sharding == NamedSharding(mesh, P("i"))
        np.testing.assert_allclose(spmd.process_allgather(g), 2 * x, rtol=1e-6)


def _dp_loss(mesh, axis):
    """Mean squared error of a linear model: weights replicated, rows split over ``axis``."""
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P(axis), P(axis)),
                       out_specs=P())
    def loss(w, x, y):
        return lax.pmean(snp.mean((x @ w - y) ** 2), axis)
    return loss


@pytest.mark.parametrize("kind", ["1d", "2d", "2dT"])
def test_grad_of_replicated_weights_is_the_global_formula(kind):
    mesh = make_mesh(kind)
    axis = "i" if kind == "1d" else mesh.axis_names
    loss = _dp_loss(mesh, axis)
    x, w, y = _rand((mesh.size * 4, 3), 1), _rand((3, 2), 2), _rand((mesh.size * 4, 2), 3)
    g = spmd.grad(loss)(w, x, y)
    xd, wd, yd = (a.astype(np.float64) for a in (x, w, y))
    want = 2 * xd.T @ (xd @ wd - yd) / yd.size
    assert np.asarray(g).shape == w.shape  # replicated: complete on every process
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(spmd.jit(spmd.grad(loss))(w, x, y)), want,
                               rtol=1e-4, atol=1e-6)


def test_check_grads_of_a_data_parallel_loss_against_finite_differences():
    mesh = make_mesh("1d")
    x, y = _rand((mesh.size * 2, 3), 4), _rand((mesh.size * 2, 1), 5)

    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P("i"), P("i")),
                       out_specs=P())
    def loss(w, xb, yb):
        return lax.psum(snp.sum(snp.tanh(xb @ w) * yb), "i")

    spmd.test_util.check_grads(lambda w: loss(w, x, y), (_rand((3, 1), 6),), order=2,
                               modes=("fwd", "rev"))


# ------------------------------------------------------- JEP 14273 matmuls

def _matmul_cases(mesh1, mesh2):
    n = mesh1.size

    @functools.partial(spmd.shard_map, mesh=mesh2, in_specs=(P("a", "b"), P("b", None)),
                       out_specs=P("a", None))
    def psum_matmul(xb, wb):
        """Contracting dimension split over 'b': partial products summed."""
        return lax.psum(xb @ wb, "b")

    @functools.partial(spmd.shard_map, mesh=mesh2, in_specs=(P("a", "b"), P("b", None)),
                       out_specs=P("a", "b"))
    def reduce_scatter_matmul(xb, wb):
        """The same, with the result left scattered over 'b' along its columns."""
        return lax.psum_scatter(xb @ wb, "b", scatter_dimension=1, tiled=True)

    @functools.partial(spmd.shard_map, mesh=mesh1, in_specs=(P("i"), P("i")),
                       out_specs=P("i"))
    def all_gather_matmul(xb, wb):
        """Weights stored split over 'i' (FSDP) and gathered before use."""
        return xb @ lax.all_gather(wb, "i", tiled=True)

    @functools.partial(spmd.shard_map, mesh=mesh1, in_specs=(P("i", None), P(None, "i")),
                       out_specs=P(None, "i"))
    def collective_matmul(lhs, rhs):
        """JEP 14273's all-gather of the lhs fused with the matmul: each step multiplies
        the chunk at hand and passes it on with ppermute."""
        # JAX's example takes lax.psum(1, "i"), a static int there; spmd's psum of a
        # Python int is a traced value, which cannot size the accumulator.
        axis_size = n
        idx = lax.axis_index("i")
        chunk = lhs.shape[0]
        accum = snp.zeros((chunk * axis_size, rhs.shape[1]), lhs.dtype)
        for i in range(axis_size):
            update = lhs @ rhs
            row = ((idx + i) % axis_size) * chunk
            accum = lax.dynamic_update_slice(accum, update, (row, 0))
            if i < axis_size - 1:
                lhs = lax.ppermute(lhs, "i", [(j, (j - 1) % axis_size) for j in range(n)])
        return accum

    # name: (function, its mesh, x spec, w spec, out spec, x shape, w shape)
    return {"psum": (psum_matmul, mesh2, P("a", "b"), P("b", None), P("a", None),
                     (8, 4 * n), (4 * n, 6)),
            "reduce_scatter": (reduce_scatter_matmul, mesh2, P("a", "b"), P("b", None),
                               P("a", "b"), (8, 4 * n), (4 * n, 2 * n)),
            "all_gather": (all_gather_matmul, mesh1, P("i"), P("i"), P("i"),
                           (2 * n, 3 * n), (3 * n, 5)),
            "collective": (collective_matmul, mesh1, P("i", None), P(None, "i"),
                           P(None, "i"), (2 * n, 5), (5, 3 * n))}


def _inner(mesh, spec):
    """``sum(a * b)`` of two arrays placed by ``spec``, inside a shard_map (the blocks
    replicated over the axes ``spec`` leaves out are counted once)."""
    return spmd.shard_map(lambda a, b: lax.psum(snp.sum(a * b), spec.mesh_axes), mesh=mesh,
                          in_specs=(spec, spec), out_specs=P())


@pytest.mark.parametrize("case", ["psum", "reduce_scatter", "all_gather", "collective"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_jep_matmuls_and_their_gradients(case, jit):
    f, mesh, x_spec, w_spec, out_spec, xs, ws = _matmul_cases(make_mesh("1d"),
                                                              make_mesh("2d"))[case]
    x, w = _rand(xs, 10), _rand(ws, 11)
    xd, wd = x.astype(np.float64), w.astype(np.float64)
    want = xd @ wd
    r = _rand(want.shape, 12)
    inner = _inner(mesh, out_spec)

    def loss(x, w):
        return inner(f(x, w), r)

    value_and_grad = spmd.value_and_grad(loss, argnums=(0, 1))
    if jit:
        value_and_grad = spmd.jit(value_and_grad)
    value, (gx, gw) = value_and_grad(x, w)
    np.testing.assert_allclose(float(value), np.sum(want * r), rtol=1e-4)
    want_gx, want_gw = r @ wd.T, xd.T @ r
    if jit:  # jit results keep their sharding: compare this process's blocks
        np.testing.assert_allclose(float(spmd.jit(loss)(x, w)), np.sum(want * r), rtol=1e-4)
        assert_local_blocks(gx, want_gx.astype(np.float32), NamedSharding(mesh, x_spec))
        assert_local_blocks(gw, want_gw.astype(np.float32), NamedSharding(mesh, w_spec))
        return
    out = f(x, w)
    assert out.sharding == NamedSharding(mesh, out_spec)
    np.testing.assert_allclose(_gathered(out), want, rtol=1e-4, atol=1e-4)
    assert gx.sharding == NamedSharding(mesh, x_spec)
    assert gw.sharding == NamedSharding(mesh, w_spec)
    np.testing.assert_allclose(_gathered(gx), want_gx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_gathered(gw), want_gw, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------- data-parallel training

SIZES = (5, 16, 1)
LR = 0.2
STEPS = 6


def _init(seed=20):
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal(SIZES[:2]) / np.sqrt(SIZES[0])).astype(np.float32),
            "b1": np.zeros(SIZES[1], np.float32),
            "w2": (rng.standard_normal(SIZES[1:]) / np.sqrt(SIZES[1])).astype(np.float32),
            "b2": np.zeros(SIZES[2], np.float32)}


def _data(batch, seed=21):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
    y = np.sin(x @ rng.standard_normal((SIZES[0], 1))).astype(np.float32)
    return x, y


def _numpy_step(p, x, y):
    """The loss and one SGD step of the same MLP on the whole batch, in float64."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    out = h @ p["w2"] + p["b2"]
    loss = np.mean((out - y) ** 2)
    d_out = 2 * (out - y) / y.size
    d_h = d_out @ p["w2"].T * (1 - h ** 2)
    grads = {"w2": h.T @ d_out, "b2": d_out.sum(0), "w1": x.T @ d_h, "b1": d_h.sum(0)}
    return loss, {k: p[k] - LR * grads[k] for k in p}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_data_parallel_training_matches_numpy_on_the_whole_batch(jit):
    mesh = spmd.make_mesh((spmd.device_count(),), ("data",))
    rows = 8  # per process (its devices are consecutive in the mesh)
    x, y = _data(rows * spmd.process_count())
    # Each process gives only its own rows: the batch is spread over the processes.
    batch = NamedSharding(mesh, P("data"))
    me = spmd.process_index()
    xb = spmd.make_array_from_process_local_data(batch, x[me * rows:(me + 1) * rows])
    yb = spmd.make_array_from_process_local_data(batch, y[me * rows:(me + 1) * rows])
    assert xb.shape == x.shape and not xb.is_fully_addressable

    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                       out_specs=P())
    def loss(p, xs, ys):
        h = snp.tanh(xs @ p["w1"] + p["b1"])
        return lax.pmean(snp.mean((h @ p["w2"] + p["b2"] - ys) ** 2), "data")

    def train_step(p, xs, ys):
        value, grads = spmd.value_and_grad(loss)(p, xs, ys)
        return spmd.tree_util.tree_map(lambda a, g: a - LR * g, p, grads), value

    step = spmd.jit(train_step) if jit else train_step
    params = _init()
    ref = {k: v.astype(np.float64) for k, v in params.items()}
    losses = []
    for _ in range(STEPS):
        params, value = step(params, xb, yb)
        want, ref = _numpy_step(ref, x.astype(np.float64), y.astype(np.float64))
        losses.append(float(value))
        np.testing.assert_allclose(losses[-1], want, rtol=1e-4)
    assert losses[-1] < losses[0], losses
    for k in ref:  # replicated parameters: complete on every process
        np.testing.assert_allclose(np.asarray(params[k]), ref[k], rtol=1e-4, atol=1e-5)
    # Every process ends with the same parameters.
    gathered = spmd.process_allgather(np.asarray(params["w1"]))
    assert all(np.array_equal(g, gathered[0]) for g in gathered)

"""spmd.optim.mixed_precision: bfloat16 compute, float32 master weights and float32
gradient reduction, in a data-parallel step on 8 simulated devices.

Oracles: the same step's gradients taken directly in bfloat16 (the recipe's are their
exact float32 conversions), float32 numpy sums of the devices' gradients, and the
float32 training's losses.
"""

import ml_dtypes
import numpy as np
import pytest

import spmd
import spmd.numpy as snp
import spmd.optim as optim
from spmd import P, lax
from spmd.optim import OptimError

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, 8)).astype(F32)
    w_true = rng.normal(size=(8, 2)).astype(F32)
    y = x @ w_true + 0.01 * rng.normal(size=(64, 2)).astype(F32)
    params = {"w": (0.1 * rng.normal(size=(8, 2))).astype(F32), "b": np.zeros(2, F32)}
    return params, x, y


def loss_fn(p, x, y):
    pred = x.astype(p["w"].dtype) @ p["w"] + p["b"]
    return snp.mean((pred - y.astype(pred.dtype)) ** 2)


def test_gradients_are_float32_conversions_of_the_bfloat16_ones():
    params, x, y = _problem()
    loss, grads = spmd.jit(optim.mixed_precision.value_and_grad(loss_fn))(params, x, y)
    assert loss.dtype == F32 and all(g.dtype == F32 for g in grads.values())
    bf = optim.mixed_precision.cast_floating(params, BF16)
    direct = spmd.grad(loss_fn)(bf, x, y)
    for k in params:
        assert direct[k].dtype == BF16
        np.testing.assert_array_equal(np.asarray(grads[k]),
                                      np.asarray(direct[k]).astype(F32))
    assert float(loss) == float(np.asarray(loss_fn(bf, x, y)).astype(F32))


def _dp_step(opt):
    mesh = spmd.make_mesh((8,), ("data",))
    reduced = optim.mixed_precision.value_and_grad(loss_fn, axis_name="data")
    own = optim.mixed_precision.value_and_grad(loss_fn)

    def local(params, x, y):
        loss, grads = reduced(params, x, y)
        # Each device's own gradient (params marked varying first: no implicit psum).
        _, mine = own(lax.pvary(params, "data"), x, y)
        return loss, grads, mine

    sm = spmd.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                        out_specs=(P(), P(), P("data")))

    @spmd.jit
    def step(params, state, x, y):
        loss, grads, per_device = sm(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optim.apply_updates(params, updates), state, loss, grads, per_device

    return step


def test_data_parallel_reduction_is_in_float32():
    params, x, y = _problem(1)
    opt = optim.adamw(1e-2)
    step = _dp_step(opt)
    new, state, loss, grads, per_device = step(params, opt.init(params), x, y)
    assert all(v.dtype == F32 for v in new.values())
    assert all(v.dtype == F32 for v in spmd.tree_util.tree_leaves(state) if
               np.issubdtype(v.dtype, np.floating))
    for k in params:
        # per_device: the 8 devices' gradients (each a float32 conversion of bfloat16
        # values, concatenated along dim 0 for w; (8*2,) for b).
        parts = np.asarray(per_device[k]).reshape((8,) + params[k].shape)
        assert np.array_equal(parts, parts.astype(BF16).astype(F32))
        want = parts.astype(np.float64).mean(0)
        np.testing.assert_allclose(np.asarray(grads[k]), want, rtol=1e-6, atol=1e-7)
    g = np.asarray(grads["w"])
    assert not np.array_equal(g, g.astype(BF16).astype(F32))  # not rounded to bfloat16


def test_without_axis_name_a_replicated_parameter_is_reduced_in_bfloat16():
    # What axis_name= is for: the implicit pvary of the bfloat16 copy transposes to a
    # psum of bfloat16 cotangents, rounded before the float32 conversion.
    params, x, y = _problem(1)
    mesh = spmd.make_mesh((8,), ("data",))
    grad_fn = optim.mixed_precision.value_and_grad(loss_fn)
    sm = spmd.shard_map(lambda p, a, b: grad_fn(p, a, b)[1], mesh=mesh,
                        in_specs=(P(), P("data"), P("data")), out_specs=P())
    g = np.asarray(spmd.jit(sm)(params, x, y)["w"])
    assert np.array_equal(g, g.astype(BF16).astype(F32))


def test_training_follows_the_float32_run():
    params, x, y = _problem(2)
    opt = optim.adam(5e-2)
    step = _dp_step(opt)
    p, s = params, opt.init(params)
    losses = []
    for _ in range(40):
        p, s, loss, _, _ = step(p, s, x, y)
        losses.append(float(loss))

    def f32_loss(p):
        return float(np.mean((x @ p["w"] + p["b"] - y) ** 2))

    ref_p, ref_s = params, opt.init(params)
    for _ in range(40):
        g = spmd.grad(loss_fn)(ref_p, x, y)
        u, ref_s = opt.update(g, ref_s, ref_p)
        ref_p = optim.apply_updates(ref_p, u)
    assert losses[-1] < 0.05 * losses[0]
    # bfloat16 compute reaches the float32 run's loss to within its rounding.
    assert abs(f32_loss(p) - f32_loss(ref_p)) < 0.02 * losses[0] + 1e-3


def test_master_weights_must_be_float32():
    params, x, y = _problem()
    bf = optim.mixed_precision.cast_floating(params, BF16)
    with pytest.raises(OptimError, match=r"\['[wb]'\] has dtype bfloat16.*float32"):
        optim.mixed_precision.value_and_grad(loss_fn)(bf, x, y)
    with pytest.raises(OptimError, match="compute_dtype=int32"):
        optim.mixed_precision.value_and_grad(loss_fn, np.int32)


def test_cast_floating_leaves_other_leaves_alone():
    tree = {"w": np.ones(2, F32), "step": np.int32(3), "mask": np.array([True])}
    out = optim.mixed_precision.cast_floating(tree, BF16)
    assert out["w"].dtype == BF16 and out["step"] is tree["step"] and out["mask"] is tree["mask"]

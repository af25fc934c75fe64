"""spmd.optim against the textbook update formulas, written here in float64 numpy.

Each optimizer runs several steps on a small pytree of parameters with random
gradients, eagerly and under jit, and is compared with the reference; the state
of sharded parameters must be sharded like them.
"""

import numpy as np
import pytest

import spmd
import spmd.optim as optim
from spmd import P, NamedSharding
from spmd.optim import OptimError

STEPS = 5


def _params():
    r = np.random.default_rng(0)
    return {"w": r.standard_normal((3, 4)).astype(np.float32),
            "b": r.standard_normal(4).astype(np.float32)}


def _grads(step):
    r = np.random.default_rng(100 + step)
    return {"w": r.standard_normal((3, 4)).astype(np.float32),
            "b": r.standard_normal(4).astype(np.float32)}


def _run(opt, jit=False, steps=STEPS):
    params = _params()
    state = opt.init(params)
    update = spmd.jit(opt.update) if jit else opt.update
    for t in range(steps):
        updates, state = update(_grads(t), state, params)
        params = optim.apply_updates(params, updates)
    return {k: np.asarray(v, np.float64) for k, v in params.items()}


def _reference(step_fn, steps=STEPS):
    """``step_fn(t, p, g, slots) -> p`` per leaf in float64; ``slots`` is a per-leaf dict."""
    params = {k: v.astype(np.float64) for k, v in _params().items()}
    slots = {k: {} for k in params}
    for t in range(steps):
        g = _grads(t)
        for k in params:
            params[k] = step_fn(t + 1, params[k], g[k].astype(np.float64), slots[k], k)
    return params


def _assert_close(got, want, rtol=2e-5, atol=2e-6):
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)


def _sgd_ref(lr, momentum=None, nesterov=False):
    def step(t, p, g, s, k):
        if momentum is None:
            return p - lr * g
        v = g + momentum * s.get("v", 0.0)
        s["v"] = v
        return p - lr * (g + momentum * v if nesterov else v)
    return step


def _adam_dir(t, g, s, b1, b2, eps, eps_root):
    s["m"] = b1 * s.get("m", 0.0) + (1 - b1) * g
    s["v"] = b2 * s.get("v", 0.0) + (1 - b2) * g * g
    m_hat = s["m"] / (1 - b1 ** t)
    v_hat = s["v"] / (1 - b2 ** t)
    return m_hat / (np.sqrt(v_hat + eps_root) + eps)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("momentum, nesterov", [(None, False), (0.9, False), (0.9, True)])
def test_sgd(jit, momentum, nesterov):
    got = _run(optim.sgd(0.1, momentum, nesterov), jit)
    _assert_close(got, _reference(_sgd_ref(0.1, momentum, nesterov)))


@pytest.mark.parametrize("jit", [False, True])
def test_adam(jit):
    got = _run(optim.adam(0.01, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-9), jit)
    want = _reference(lambda t, p, g, s, k: p - 0.01 * _adam_dir(t, g, s, 0.8, 0.95, 1e-6, 1e-9))
    _assert_close(got, want)


@pytest.mark.parametrize("jit", [False, True])
def test_adamw_with_a_mask(jit):
    mask = {"w": True, "b": False}  # no decay on the bias
    got = _run(optim.adamw(0.01, weight_decay=0.1, mask=mask), jit)

    def step(t, p, g, s, k):
        d = _adam_dir(t, g, s, 0.9, 0.999, 1e-8, 0.0)
        return p - 0.01 * (d + (0.1 * p if mask[k] else 0.0))

    _assert_close(got, _reference(step))
    # A function of the parameters gives the same mask.
    got2 = _run(optim.adamw(0.01, weight_decay=0.1, mask=lambda p: {k: k == "w" for k in p}),
                jit)
    _assert_close(got2, got, rtol=0, atol=0)


@pytest.mark.parametrize("jit", [False, True])
def test_lion(jit):
    got = _run(optim.lion(0.003, b1=0.9, b2=0.99, weight_decay=0.01), jit)

    def step(t, p, g, s, k):
        m = s.get("m", 0.0)
        direction = np.sign(0.9 * m + 0.1 * g)
        s["m"] = 0.99 * m + 0.01 * g
        return p - 0.003 * (direction + 0.01 * p)

    _assert_close(got, _reference(step))


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_by_global_norm(max_norm):
    got = _run(optim.chain(optim.clip_by_global_norm(max_norm), optim.sgd(0.1)))
    params = {k: v.astype(np.float64) for k, v in _params().items()}
    for t in range(STEPS):
        g = {k: v.astype(np.float64) for k, v in _grads(t).items()}
        norm = np.sqrt(sum((v ** 2).sum() for v in g.values()))
        factor = 1.0 if norm < max_norm else max_norm / norm
        params = {k: params[k] - 0.1 * factor * g[k] for k in params}
    _assert_close(got, params)


def test_schedules_follow_their_formulas():
    counts = np.arange(0, 30)
    lin = optim.linear_schedule(1.0, 0.1, transition_steps=10, transition_begin=5)
    want = 1.0 + (0.1 - 1.0) * np.clip((counts - 5) / 10, 0, 1)
    np.testing.assert_allclose([float(lin(c)) for c in counts], want, rtol=1e-6)

    cos = optim.cosine_decay_schedule(2.0, decay_steps=20, alpha=0.1, exponent=2.0)
    t = np.minimum(counts, 20)
    want = 2.0 * (0.9 * (0.5 * (1 + np.cos(np.pi * t / 20))) ** 2 + 0.1)
    np.testing.assert_allclose([float(cos(c)) for c in counts], want, rtol=1e-5, atol=1e-7)

    wc = optim.warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps=5, decay_steps=25,
                                            end_value=0.1)
    up = np.clip(counts / 5, 0, 1)
    td = np.minimum(np.maximum(counts - 5, 0), 20)
    down = 1.0 * (0.9 * 0.5 * (1 + np.cos(np.pi * td / 20)) + 0.1)
    want = np.where(counts < 5, up, down)
    np.testing.assert_allclose([float(wc(c)) for c in counts], want, rtol=1e-5, atol=1e-7)
    assert optim.constant_schedule(0.3)(7) == 0.3


def test_a_schedule_as_learning_rate_counts_steps():
    sched = optim.linear_schedule(1.0, 0.0, transition_steps=4)
    got = _run(optim.sgd(sched), jit=True)
    want = _reference(lambda t, p, g, s, k: p - (1.0 - min(t - 1, 4) / 4) * g)
    _assert_close(got, want)


def test_adam_minimises_a_quadratic():
    target = np.array([3.0, -2.0], np.float32)
    loss = lambda p: spmd.numpy.sum((p - target) ** 2)  # noqa: E731
    opt = optim.adam(0.1)
    p = np.zeros(2, np.float32)
    state = opt.init(p)
    step = spmd.jit(lambda p, s: opt.update(spmd.grad(loss)(p), s, p))
    for _ in range(300):
        u, state = step(p, state)
        p = optim.apply_updates(p, u)
    np.testing.assert_allclose(np.asarray(p), target, atol=1e-2)


def test_frozen_parameters_with_none_updates():
    params = _params()
    opt = optim.adam(0.1)
    state = opt.init(params)
    grads = {"w": _grads(0)["w"], "b": None}
    updates, state = opt.update(grads, state, params)
    new = optim.apply_updates(params, updates)
    np.testing.assert_array_equal(np.asarray(new["b"]), params["b"])
    assert not np.allclose(np.asarray(new["w"]), params["w"])


def test_state_is_sharded_like_the_parameters():
    mesh = spmd.make_mesh((4, 2), ("data", "model"))
    sw = NamedSharding(mesh, P("data", "model"))
    sb = NamedSharding(mesh, P("model"))
    params = {"w": spmd.device_put(np.ones((8, 4), np.float32), sw),
              "b": spmd.device_put(np.ones(4, np.float32), sb)}
    opt = optim.adamw(0.1)
    state = opt.init(params)
    adam_state = state[0]
    for tree in (adam_state.mu, adam_state.nu):
        assert tree["w"].sharding == sw and tree["b"].sharding == sb
    grads = {"w": spmd.device_put(np.full((8, 4), 0.5, np.float32), sw),
             "b": spmd.device_put(np.full(4, 0.5, np.float32), sb)}
    updates, state = opt.update(grads, state, params)
    assert state[0].mu["w"].sharding == sw and updates["w"].sharding == sw
    new = optim.apply_updates(params, updates)
    # Adam's first step moves every coordinate by the learning rate (plus decay).
    np.testing.assert_allclose(np.asarray(new["w"]), 1 - 0.1 * (1 + 1e-4), rtol=1e-6)


# ------------------------------------------------------------ bad input

@pytest.mark.parametrize("make, match", [
    (lambda: optim.sgd(-0.1), "learning rate must be >= 0, got -0.1"),
    (lambda: optim.adam("fast"), "learning rate must be a number or a schedule"),
    (lambda: optim.adam(0.1, b1=1.0), "b1 must be in \\[0, 1\\), got 1.0"),
    (lambda: optim.sgd(0.1, momentum=1.5), "decay must be in \\[0, 1\\)"),
    (lambda: optim.clip_by_global_norm(0), "max_norm must be a number > 0, got 0"),
    (lambda: optim.add_decayed_weights(-1.0), "weight_decay must be a number >= 0"),
    (lambda: optim.chain(optim.sgd(0.1), "adam"), "argument 1 is a str"),
    (lambda: optim.linear_schedule(1.0, 0.0, 0), "transition_steps must be an integer >= 1"),
    (lambda: optim.cosine_decay_schedule(1.0, 2.5), "decay_steps must be an integer >= 1"),
    (lambda: optim.warmup_cosine_decay_schedule(0, 1, 10, 10), "must exceed warmup_steps"),
])
def test_bad_arguments(make, match):
    with pytest.raises(OptimError, match=match):
        make()


def test_mask_of_another_structure_names_the_paths():
    opt = optim.adamw(0.1, mask={"w": True, "bias": False})
    params = _params()
    state = opt.init(params)
    with pytest.raises(OptimError, match=r"only in the weight-decay mask: \[\"\['bias'\]\"\]; "
                                         r"only in params: \[\"\['b'\]\"\]"):
        opt.update(_grads(0), state, params)


def test_mask_leaves_must_be_booleans():
    opt = optim.adamw(0.1, mask={"w": True, "b": 1})
    params = _params()
    with pytest.raises(OptimError, match=r"Python booleans, got int 1 at \['b'\]"):
        opt.update(_grads(0), opt.init(params), params)


def test_weight_decay_needs_the_parameters():
    opt = optim.adamw(0.1)
    params = _params()
    with pytest.raises(OptimError, match="needs the parameters"):
        opt.update(_grads(0), opt.init(params))


def test_state_of_another_optimizer():
    params = _params()
    with pytest.raises(OptimError, match="state has 1 parts for 2 transformations"):
        optim.adam(0.1).update(_grads(0), (optim.EmptyState(),), params)


def test_adam_and_the_global_norm_of_complex_parameters():
    """The second moment of a complex gradient is |g|^2 (not g*g), as in optax; the
    global norm sums squared magnitudes."""
    p = {"z": np.array([1 + 2j, -3j], np.complex64)}
    g = {"z": np.array([3 - 4j, 1 + 1j], np.complex64)}
    opt = optim.adam(0.1, b1=0.9, b2=0.999, eps=1e-8)
    updates, state = opt.update(g, opt.init(p), p)
    mag2 = np.abs(g["z"]) ** 2
    mu_hat = 0.1 * g["z"] / (1 - 0.9)
    nu_hat = 0.001 * mag2 / (1 - 0.999)
    np.testing.assert_allclose(np.asarray(updates["z"]), -0.1 * mu_hat / (np.sqrt(nu_hat) + 1e-8),
                               rtol=1e-5)
    np.testing.assert_allclose(np.asarray(state[0].nu["z"]), 0.001 * mag2, rtol=1e-6)
    np.testing.assert_allclose(float(optim.global_norm(g)), np.sqrt(mag2.sum()), rtol=1e-6)

"""Issue 58, "the first hour of a JAX user": the names a JAX program reaches for
(spmd/transfer.py, spmd/compilation.py, spmd/experimental/, spmd/optim/losses.py)
and JAX's option names in spmd.config.  JAX and optax are not installed here, so the
losses are checked against their closed forms in numpy (values, and gradients by
central differences)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
import spmd.optim as optim
from spmd import NamedSharding, P, lax
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.experimental import mesh_utils, multihost_utils
from tests.tolerance import numerical_grad
from spmd.experimental.shard_map import shard_map as old_shard_map
from spmd.shard.maps.shard_map import ShardMapError
from tests.mpi import run_spmd_run


# ----------------------------------------------------------------- transfer

def test_block_until_ready_returns_the_tree_and_passes_other_leaves():
    tree = {"a": snp.ones(3), "b": [spmd.jit(lambda x: x * 2)(snp.ones(2)), 7]}
    out = spmd.block_until_ready(tree)
    assert out is tree


def test_device_get_gives_numpy_values():
    out = spmd.device_get({"w": snp.arange(3.0), "n": 3, "s": "x"})
    assert type(out["w"]) is np.ndarray and out["w"].dtype == np.float32
    np.testing.assert_array_equal(out["w"], [0.0, 1.0, 2.0])
    assert out["n"] == 3 and out["s"] == "x"
    mesh = spmd.make_mesh((4,), ("i",))
    x = spmd.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P("i")))
    np.testing.assert_array_equal(spmd.device_get(x), np.arange(8.0))


def test_device_get_refuses_a_traced_value():
    with pytest.raises(ArgumentError, match="device_get: got a traced value"):
        spmd.jit(spmd.device_get)(snp.ones(2))


def _mesh22():
    return spmd.Mesh(mesh_utils.create_device_mesh((2, 2), spmd.devices()[:4]), ("i", "j"))


def test_make_array_from_single_device_arrays_places_each_block():
    mesh = spmd.make_mesh((4,), ("i",))
    s = NamedSharding(mesh, P("i"))
    x = spmd.make_array_from_single_device_arrays(
        (8, 3), s, [np.full((2, 3), k, np.float32) for k in range(4)])
    assert x.sharding == s and x.shape == (8, 3)
    np.testing.assert_array_equal(np.asarray(x), np.repeat(np.arange(4.0), 2)[:, None]
                                  * np.ones((1, 3)))
    # Replicated over j: each block comes from its first device in mesh order.
    y = spmd.make_array_from_single_device_arrays(
        (4,), NamedSharding(_mesh22(), P("i")), [np.full(2, k, np.float32) for k in range(4)])
    np.testing.assert_array_equal(np.asarray(y), [0, 0, 2, 2])


def test_make_array_from_single_device_arrays_errors():
    s = NamedSharding(spmd.make_mesh((4,), ("i",)), P("i"))
    blocks = [np.zeros((2,), np.float32) for _ in range(4)]
    with pytest.raises(ArgumentError, match="got 3 arrays for the 4 devices"):
        spmd.make_array_from_single_device_arrays((8,), s, blocks[:3])
    bad = blocks[:2] + [np.zeros((3,), np.float32)] + blocks[3:]
    with pytest.raises(ShapeError, match=r"arrays\[2\] .* has shape \(3,\).* \(2,\)"):
        spmd.make_array_from_single_device_arrays((8,), s, bad)
    mixed = blocks[:3] + [np.zeros((2,), np.int32)]
    with pytest.raises(ArgumentError, match=r"arrays\[3\] has dtype int32"):
        spmd.make_array_from_single_device_arrays((8,), s, mixed)
    with pytest.raises(ArgumentError, match="not one array"):
        spmd.make_array_from_single_device_arrays((8,), s, np.zeros((4, 2)))
    with pytest.raises(ArgumentError, match=r"dtype=int32 but the arrays have dtype float32"):
        spmd.make_array_from_single_device_arrays((8,), s, blocks, dtype=np.int32)
    x = spmd.make_array_from_single_device_arrays((8,), s, blocks, dtype=np.float32)
    assert x.dtype == np.float32
    with pytest.raises(ArgumentError, match=r"arrays\[0\] is a traced value"):
        spmd.jit(lambda b: spmd.make_array_from_single_device_arrays((8,), s, [b] * 4))(
            blocks[0])
    with pytest.raises(ArgumentError, match="shape must be a tuple of ints"):
        spmd.make_array_from_single_device_arrays(None, s, blocks)


# ------------------------------------------------------------- compilation

def test_default_backend():
    assert spmd.default_backend() == spmd.devices()[0].platform == "cpu"


def test_clear_caches_makes_jitted_functions_trace_again():
    traces = []

    @spmd.jit
    def f(x):
        traces.append(1)
        return x + 1

    f(1.0), f(2.0)
    assert len(traces) == 1
    spmd.clear_caches()
    assert float(f(3.0)) == 4.0 and len(traces) == 2
    g = spmd.jit(lambda x: traces.append(2) or x, in_shardings=None,
                 out_shardings=NamedSharding(spmd.make_mesh((2,), ("i",)), P()))
    g(np.ones(2, np.float32)), g(np.ones(2, np.float32))
    assert traces.count(2) == 1
    spmd.clear_caches()
    g(np.ones(2, np.float32))
    assert traces.count(2) == 2


def test_named_scope_nests_and_changes_nothing_of_the_program():
    def f(x):
        with spmd.named_scope("outer"):
            with spmd.named_scope("inner"):
                assert spmd.compilation.name_stack() == "outer/inner"
                y = snp.tanh(x) * 2.0
            assert spmd.compilation.name_stack() == "outer"
        return y.sum()

    x = snp.arange(3.0)
    assert str(spmd.make_jaxpr(f)(x)) == str(spmd.make_jaxpr(
        lambda x: (snp.tanh(x) * 2.0).sum())(x))
    np.testing.assert_allclose(spmd.jit(spmd.grad(f))(x), 2 * (1 - np.tanh(np.arange(3.0)) ** 2),
                               rtol=1e-6)
    assert spmd.compilation.name_stack() == ""
    with pytest.raises(TypeError, match="named_scope: name must be a str, got 3"):
        with spmd.named_scope(3):
            pass


# ------------------------------------------------------------------ config

def test_config_takes_jax_option_names():
    old = spmd.config.enable_x64
    try:
        spmd.config.update("jax_enable_x64", True)
        assert spmd.config.enable_x64 is True and spmd.config.jax_enable_x64 is True
        assert spmd.config.read("jax_enable_x64") is True
        assert snp.arange(3.0).dtype == np.float64
    finally:
        spmd.config.update("enable_x64", old)
    spmd.config.update("jax_disable_jit", True)
    try:
        assert spmd.config.disable_jit and spmd.config.jax_disable_jit
    finally:
        spmd.config.update("jax_disable_jit", False)
    spmd.config.update("jax_default_matmul_precision", "float32")
    spmd.config.update("jax_default_matmul_precision", None)


def test_config_unknown_option_names_it_and_the_known_ones():
    with pytest.raises(ArgumentError, match=r"unknown option 'jax_debug_nans'.*'enable_x64'"
                                            r".*'jax_enable_x64'"):
        spmd.config.update("jax_debug_nans", True)
    with pytest.raises(ArgumentError, match="unknown option 'nope'"):
        spmd.config.read("nope")
    with pytest.raises(AttributeError, match="no option 'jax_nope'.*enable_x64"):
        spmd.config.jax_nope  # noqa: B018
    with pytest.raises(ArgumentError, match="unknown option 'jax__listeners'"):
        spmd.config.update("jax__listeners", [])


# ------------------------------------------------------------ mesh_utils

def test_create_device_mesh():
    devs = mesh_utils.create_device_mesh((2, 4))
    assert devs.shape == (2, 4) and list(devs.flat) == spmd.devices()[:8]
    mesh = spmd.Mesh(devs, ("a", "b"))
    assert dict(mesh.shape) == {"a": 2, "b": 4}
    sub = mesh_utils.create_device_mesh((2,), spmd.devices()[4:6])
    assert list(sub) == spmd.devices()[4:6]
    with pytest.raises(ArgumentError, match=r"mesh_shape=\(3, 2\) holds 6 devices but 8"):
        mesh_utils.create_device_mesh((3, 2))
    with pytest.raises(ArgumentError, match="size below 1"):
        mesh_utils.create_device_mesh((0, 8))
    with pytest.raises(ArgumentError, match="mesh_shape must be a sequence of ints"):
        mesh_utils.create_device_mesh(8)
    with pytest.raises(ArgumentError, match="must be spmd Devices"):
        mesh_utils.create_device_mesh((2,), ["a", "b"])


def test_create_hybrid_device_mesh_in_one_process():
    out = mesh_utils.create_hybrid_device_mesh((2, 4), (1, 1))
    assert out.shape == (2, 4) and list(out.flat) == spmd.devices()[:8]
    with pytest.raises(ArgumentError, match=r"dcn_mesh_shape=\(2, 1\) lays out 2 processes"):
        mesh_utils.create_hybrid_device_mesh((1, 4), (2, 1))
    with pytest.raises(ArgumentError, match="4 devices per process but the processes have"):
        mesh_utils.create_hybrid_device_mesh((1, 4), (1, 1))
    with pytest.raises(ArgumentError, match="same number of axes"):
        mesh_utils.create_hybrid_device_mesh((8,), (1, 1))
    with pytest.raises(ArgumentError, match="process_is_granule=False"):
        mesh_utils.create_hybrid_device_mesh((8,), (1,), process_is_granule=False)


# ------------------------------------------------------- old shard_map path

def test_old_shard_map_signature():
    mesh = _mesh22()
    x = snp.arange(8.0)
    want = np.arange(8.0).reshape(2, 4).sum(0)
    f = old_shard_map(lambda b: lax.psum(b, "i"), mesh, P("i"), P(), check_rep=False)
    np.testing.assert_array_equal(spmd.jit(f)(x), want)
    g = old_shard_map(lambda b: lax.psum(b, "i"), mesh, P("i"), P(), auto=frozenset({"j"}))
    np.testing.assert_array_equal(g(x), want)


def test_old_shard_map_errors():
    mesh = _mesh22()
    body = lambda b: b  # noqa: E731
    with pytest.raises(ShardMapError, match=r"auto=\['k'\] names \['k'\], not axes"):
        old_shard_map(body, mesh, P("i"), P("i"), auto=frozenset({"k"}))
    with pytest.raises(ShardMapError, match="leaves no manual axis"):
        old_shard_map(body, mesh, P(), P(), auto=frozenset({"i", "j"}))
    with pytest.raises(ShardMapError, match="auto must be a set"):
        old_shard_map(body, mesh, P(), P(), auto=3)
    with pytest.raises(ShardMapError, match="mesh must be a spmd.Mesh, got str"):
        old_shard_map(body, "mesh", P(), P())


# ------------------------------------------------ multihost_utils, 1 process

def test_multihost_utils_in_one_process():
    np.testing.assert_array_equal(multihost_utils.process_allgather(np.arange(2)), [[0, 1]])
    np.testing.assert_array_equal(
        multihost_utils.process_allgather(np.arange(2), tiled=True), [0, 1])
    out = multihost_utils.broadcast_one_to_all({"a": np.int32(3), "b": snp.ones(2)})
    assert int(out["a"]) == 3 and type(out["b"]) is np.ndarray
    multihost_utils.sync_global_devices("here")
    with pytest.raises(ArgumentError, match=r"exactly one process .* got processes \[\]"):
        multihost_utils.broadcast_one_to_all(np.int32(1), is_source=False)
    with pytest.raises(ArgumentError, match="is_source must be True or False"):
        multihost_utils.broadcast_one_to_all(np.int32(1), is_source=1)
    with pytest.raises(ArgumentError, match="name must be a str"):
        multihost_utils.sync_global_devices(3)


_MULTIHOST_JOB = textwrap.dedent("""
    import numpy as np, spmd
    from spmd import P, NamedSharding
    from spmd.errors import NotFullyAddressableError, ProgramMismatchError
    from spmd.experimental import mesh_utils, multihost_utils as mu
    me = spmd.process_index()
    assert spmd.process_count() == 2
    g = mu.process_allgather(np.array([me, 10 + me]))
    assert g.tolist() == [[0, 10], [1, 11]], g
    assert mu.process_allgather(np.array([me]), tiled=True).tolist() == [0, 1]
    assert int(mu.broadcast_one_to_all(np.int32(100 + me))) == 100
    assert int(mu.broadcast_one_to_all(np.int32(100 + me), is_source=me == 1)) == 101
    try:
        mu.broadcast_one_to_all(np.int32(0), is_source=True)
        raise SystemExit("two sources were taken")
    except spmd.errors.ArgumentError as e:
        assert "got processes [0, 1]" in str(e), e
    mu.sync_global_devices("same")
    try:
        mu.sync_global_devices(f"point {me}")
        raise SystemExit("different names were taken")
    except ProgramMismatchError as e:
        assert "{0: 'point 0', 1: 'point 1'}" in str(e), e
    mesh = spmd.Mesh(mesh_utils.create_hybrid_device_mesh((1,), (2,)), ("i",))
    x = spmd.make_array_from_single_device_arrays(
        (4,), NamedSharding(mesh, P("i")), [np.full(2, me, np.float32)])
    assert mu.process_allgather(x).tolist() == [0, 0, 1, 1]
    try:
        mu.broadcast_one_to_all({"x": x})
        raise SystemExit("a spread array was broadcast")
    except spmd.errors.ArgumentError as e:
        assert "spread over processes" in str(e), e
    if me == 0:  # a mesh of process 1's device only: none of this process's
        other = NamedSharding(spmd.Mesh(np.array(spmd.devices()[1:]), ("i",)), P())
        try:
            spmd.make_array_from_single_device_arrays((2,), other, [])
            raise SystemExit("no devices, yet an array")
        except spmd.errors.ArgumentError as e:
            assert "holds no device" in str(e), e
    try:
        spmd.device_get(x)
        raise SystemExit("device_get of a spread array worked")
    except NotFullyAddressableError as e:
        assert "process_allgather" in str(e), e
    print("rank", me, "ok")
""")


def test_multihost_utils_on_two_ranks(tmp_path):
    status, out, _ = run_spmd_run(_MULTIHOST_JOB, 2, tmp_path, timeout=180)
    assert status == 0, out
    assert "rank 0 ok" in out and "rank 1 ok" in out, out


# ------------------------------------------------------------------ losses

def _np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


_RNG = np.random.default_rng(0)
_LOGITS = _RNG.normal(size=(3, 5))
_PROBS = np.exp(_np_log_softmax(_RNG.normal(size=(3, 5))))
_INT_LABELS = np.array([0, 4, 2])
_BIN = (_RNG.uniform(size=(3, 5)) > 0.5).astype(np.float64)
_PRED, _TARG = _RNG.normal(size=(3, 4)) * 2, _RNG.normal(size=(3, 4))


def _np_cos(p, t):
    return (p * t).sum(-1) / (np.linalg.norm(p, axis=-1) * np.linalg.norm(t, axis=-1))


def _np_huber(e, d=1.0):
    return np.where(np.abs(e) <= d, 0.5 * e ** 2, d * (np.abs(e) - 0.5 * d))


# name: (spmd loss of x, closed form in numpy of x, x)
LOSSES = {
    "softmax_cross_entropy": (lambda x: optim.softmax_cross_entropy(x, _PROBS),
                              lambda x: -(_PROBS * _np_log_softmax(x)).sum(-1), _LOGITS),
    "softmax_cross_entropy_with_integer_labels": (
        lambda x: optim.softmax_cross_entropy_with_integer_labels(x, snp.asarray(_INT_LABELS)),
        lambda x: -_np_log_softmax(x)[np.arange(3), _INT_LABELS], _LOGITS),
    "sigmoid_binary_cross_entropy": (
        lambda x: optim.sigmoid_binary_cross_entropy(x, _BIN),
        lambda x: -_BIN * np.log(1 / (1 + np.exp(-x)))
        - (1 - _BIN) * np.log(1 - 1 / (1 + np.exp(-x))), _LOGITS),
    "l2_loss": (lambda x: optim.l2_loss(x, _TARG), lambda x: 0.5 * (x - _TARG) ** 2, _PRED),
    "squared_error": (lambda x: optim.squared_error(x, _TARG), lambda x: (x - _TARG) ** 2,
                      _PRED),
    "squared_error_no_targets": (lambda x: optim.squared_error(x), lambda x: x ** 2, _PRED),
    "huber_loss": (lambda x: optim.huber_loss(x, _TARG), lambda x: _np_huber(x - _TARG), _PRED),
    "huber_loss_delta": (lambda x: optim.huber_loss(x, _TARG, delta=0.5),
                         lambda x: _np_huber(x - _TARG, 0.5), _PRED),
    "log_cosh": (lambda x: optim.log_cosh(x, _TARG), lambda x: np.log(np.cosh(x - _TARG)),
                 _PRED),
    "cosine_similarity": (lambda x: optim.cosine_similarity(x, _TARG),
                          lambda x: _np_cos(x, _TARG), _PRED),
    "cosine_distance": (lambda x: optim.cosine_distance(x, _TARG),
                        lambda x: 1 - _np_cos(x, _TARG), _PRED),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_values_and_gradients_match_the_closed_form(name, x64):
    loss, ref, x = LOSSES[name]
    got = spmd.jit(loss)(x)
    np.testing.assert_allclose(np.asarray(got), ref(x), rtol=1e-10, atol=1e-12)
    grad = spmd.jit(spmd.grad(lambda x: loss(x).sum()))(x)
    np.testing.assert_allclose(np.asarray(grad),
                               numerical_grad(lambda x: ref(x).sum(), x, 1e-6),
                               rtol=1e-6, atol=1e-7)


OPTAX_CASES = [
    ("softmax_cross_entropy", (_LOGITS, _PROBS), {}),
    ("softmax_cross_entropy_with_integer_labels", (_LOGITS, _INT_LABELS), {}),
    ("sigmoid_binary_cross_entropy", (_LOGITS, _BIN), {}),
    ("l2_loss", (_PRED, _TARG), {}), ("squared_error", (_PRED, _TARG), {}),
    ("huber_loss", (_PRED, _TARG), {"delta": 0.5}), ("log_cosh", (_PRED, _TARG), {}),
    ("cosine_similarity", (_PRED, _TARG), {}), ("cosine_distance", (_PRED, _TARG), {})]


@pytest.mark.parametrize("name,args,kwargs", OPTAX_CASES, ids=[c[0] for c in OPTAX_CASES])
def test_losses_match_optax(name, args, kwargs):
    """Where JAX and optax are installed (an optional test dependency): the same
    values and gradients (with respect to the first argument) in float32."""
    optax = pytest.importorskip("optax")
    jax = pytest.importorskip("jax")
    first, rest = np.asarray(args[0], np.float32), [
        a if a.dtype.kind == "i" else np.asarray(a, np.float32) for a in args[1:]]
    ours, theirs = getattr(optim, name), getattr(optax, name)
    np.testing.assert_allclose(np.asarray(ours(snp.asarray(first), *rest, **kwargs)),
                               np.asarray(theirs(first, *rest, **kwargs)), rtol=2e-5, atol=1e-6)
    g_ours = spmd.grad(lambda x: ours(x, *rest, **kwargs).sum())(snp.asarray(first))
    g_theirs = jax.grad(lambda x: theirs(x, *rest, **kwargs).sum())(first)
    np.testing.assert_allclose(np.asarray(g_ours), np.asarray(g_theirs), rtol=2e-5, atol=1e-6)


def test_losses_shard_and_keep_float32():
    mesh = spmd.make_mesh((4,), ("b",))
    logits = spmd.device_put(np.asarray(_RNG.normal(size=(8, 5)), np.float32),
                             NamedSharding(mesh, P("b")))
    labels = spmd.device_put(np.arange(8, dtype=np.int32) % 5, NamedSharding(mesh, P("b")))
    out = spmd.jit(optim.softmax_cross_entropy_with_integer_labels)(logits, labels)
    assert out.dtype == np.float32 and out.shape == (8,)
    np.testing.assert_allclose(np.asarray(out), -_np_log_softmax(
        np.asarray(logits, np.float64))[np.arange(8), np.arange(8) % 5], rtol=1e-5)
    assert optim.log_cosh(snp.ones(2)).dtype == np.float32
    assert spmd.losses.l2_loss is optim.l2_loss


def test_losses_large_logits_stay_finite():
    big = snp.array([[1000.0, -1000.0]])
    assert np.isfinite(np.asarray(optim.softmax_cross_entropy(big, snp.array([[0.0, 1.0]])))).all()
    assert np.isfinite(np.asarray(optim.sigmoid_binary_cross_entropy(big, snp.ones((1, 2))))).all()
    np.testing.assert_allclose(np.asarray(optim.log_cosh(snp.array([1000.0]))),
                               [1000.0 - np.log(2.0)], rtol=1e-6)


def test_integer_labels_must_be_integers():
    with pytest.raises(DTypeError, match="labels must be integers .* got dtype float32"):
        optim.softmax_cross_entropy_with_integer_labels(snp.zeros((2, 3)), snp.zeros(2))


# ------------------------------------------------ a port by changing imports

def test_a_jax_style_program_runs_after_changing_imports():
    import spmd as jax
    import spmd.numpy as jnp
    import spmd.optim as optax
    from spmd.experimental import mesh_utils as mu
    from spmd.experimental.shard_map import shard_map

    jax.config.update("jax_enable_x64", False)
    mesh = jax.sharding.Mesh(mu.create_device_mesh((jax.device_count(),)), ("data",))
    backend = jax.default_backend()
    assert backend in ("cpu", "gpu")
    key = jax.random.PRNGKey(0)
    params = {"w": jax.random.normal(key, (5, 3)) * 0.1, "b": jnp.zeros(3)}
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 5))
    y = jnp.arange(8) % 3
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))

    def loss_fn(p, x, y):
        with jax.named_scope("linear"):
            logits = x @ p["w"] + p["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    opt = optax.sgd(0.5)
    state = opt.init(params)

    @jax.jit
    def step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    losses = []
    for _ in range(5):
        params, state, loss = step(params, state, x, y)
        losses.append(float(jax.device_get(loss)))
    jax.block_until_ready(params)
    assert losses[-1] < losses[0]
    count = shard_map(lambda b: jax.lax.psum(b.shape[0] * jnp.ones(()), "data"), mesh,
                      in_specs=P("data"), out_specs=P(), check_rep=False)(x)
    assert float(count) == 8
    jax.clear_caches()
    params2, _, loss2 = step(params, state, x, y)
    assert np.isfinite(float(loss2))
    host = jax.device_get(params2)
    assert type(host["w"]) is np.ndarray and host["w"].shape == (5, 3)

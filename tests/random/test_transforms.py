"""Keys and samplers under jit, vmap, grad, scan and as pytrees."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import random as sr
from spmd.tree_util import tree_leaves, tree_map


def test_jit_matches_eager_and_traces_once():
    calls = []

    def f(k):
        calls.append(1)
        return sr.normal(k, (3, 2)), sr.randint(k, (4,), 0, 7)

    g = spmd.jit(f)
    for seed in (0, 1, 2):
        k = sr.key(seed)
        a, b = g(k)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(sr.normal(k, (3, 2))))
        np.testing.assert_array_equal(np.asarray(b), np.asarray(sr.randint(k, (4,), 0, 7)))
    assert len(calls) == 1  # a new key is a new value, not a new trace


def test_jit_of_seed_and_fold_in():
    f = spmd.jit(lambda s, i: sr.key_data(sr.fold_in(sr.key(s), i)))
    np.testing.assert_array_equal(f(np.int32(3), np.int32(9)),
                                  sr.key_data(sr.fold_in(sr.key(3), 9)))


def test_vmap_over_keys_is_one_call():
    keys = sr.split(sr.key(0), 5)
    f = spmd.vmap(lambda k: sr.uniform(k, (3,)))
    want = np.stack([np.asarray(sr.uniform(k, (3,))) for k in keys])
    np.testing.assert_array_equal(np.asarray(f(keys)), want)
    text = str(spmd.make_jaxpr(f)(keys))
    assert text.count("random_bits") == 1


def test_vmap_over_other_arguments():
    k = sr.key(1)
    f = spmd.vmap(lambda lo: sr.uniform(k, (2,), minval=lo, maxval=lo + 1.0))
    los = np.array([0.0, 10.0, 20.0], np.float32)
    want = np.stack([np.asarray(sr.uniform(k, (2,), minval=lo, maxval=lo + 1.0)) for lo in los])
    np.testing.assert_allclose(np.asarray(f(los)), want, rtol=1e-6)


def test_vmap_of_split_and_seeds():
    seeds = np.arange(4, dtype=np.int32)
    ks = spmd.vmap(lambda s: sr.key_data(sr.split(sr.key(s), 3)))(seeds)
    for s in seeds:
        np.testing.assert_array_equal(ks[s], sr.key_data(sr.split(sr.key(int(s)), 3)))
    legacy = spmd.vmap(lambda k: sr.split(k))(sr.key_data(sr.split(sr.key(0), 2)))
    assert legacy.shape == (2, 2, 2)


def test_grad_of_reparameterised_sample():
    k = sr.key(2)
    eps = np.asarray(sr.normal(k, (5,)))

    def loss(mu, sigma):
        return snp.sum((mu + sigma * sr.normal(k, (5,))) ** 2)

    gmu, gsig = spmd.grad(loss, argnums=(0, 1))(np.float32(0.5), np.float32(2.0))
    np.testing.assert_allclose(gmu, np.sum(2 * (0.5 + 2.0 * eps)), rtol=1e-5)
    np.testing.assert_allclose(gsig, np.sum(2 * (0.5 + 2.0 * eps) * eps), rtol=1e-5)


def test_grad_through_truncated_normal_and_uniform_bounds():
    k = sr.key(3)
    # uniform(minval=a, maxval=b) = a + (b - a) u: d/da = sum(1 - u), d/db = sum(u)
    u = np.asarray(sr.uniform(k, (4,)))
    ga, gb = spmd.grad(lambda a, b: snp.sum(sr.uniform(k, (4,), minval=a, maxval=b)),
                       argnums=(0, 1))(np.float32(1.0), np.float32(3.0))
    np.testing.assert_allclose(ga, np.sum(1 - u), rtol=1e-5)
    np.testing.assert_allclose(gb, np.sum(u), rtol=1e-5)


def test_integer_samplers_have_zero_cotangents():
    k = sr.key(4)

    def f(x):
        return snp.sum(x * sr.randint(k, (3,), 0, 5).astype(np.float32))

    g = spmd.grad(f)(np.float32(1.0))
    np.testing.assert_allclose(g, np.sum(np.asarray(sr.randint(k, (3,), 0, 5))))
    # The bits' own tangent is a symbolic zero of dtype float0.
    from spmd.compiler.ops import threefry

    _, t = spmd.jvp(lambda lo: threefry.random_bits(sr.PRNGKey(0), (2,)) + lo.astype(np.uint32)
                    * 0, (np.float32(1.0),), (np.float32(1.0),))
    assert t.dtype == spmd.compiler.core.dtypes.float0


def test_scan_threads_keys():
    def body(k, _):
        k, sub = sr.split(k)
        return k, sr.normal(sub, ())

    k_end, xs = spmd.lax.scan(body, sr.key(9), None, length=4)
    k, ref = sr.key(9), []
    for _ in range(4):
        k, sub = sr.split(k)
        ref.append(float(sr.normal(sub, ())))
    np.testing.assert_allclose(np.asarray(xs), ref, rtol=1e-6)
    np.testing.assert_array_equal(sr.key_data(k_end), sr.key_data(k))


def test_keys_are_pytrees_with_one_leaf():
    ks = sr.split(sr.key(0), 3)
    leaves = tree_leaves({"a": ks, "b": 1.0})
    assert len(leaves) == 2 and leaves[0].shape == (3, 2)
    again = tree_map(lambda x: x, {"k": ks})["k"]
    assert isinstance(again, sr.PRNGKeyArray) and again.shape == (3,)


def test_key_array_indexing_iteration_and_reshape():
    ks = sr.split(sr.key(0), 6)
    assert ks[2].shape == () and ks[1:3].shape == (2,)
    np.testing.assert_array_equal(sr.key_data(ks[2]), sr.key_data(ks)[2])
    assert len(list(ks)) == 6 and len(ks) == 6
    assert ks.reshape(2, 3).shape == (2, 3)
    assert sr.key_impl(ks) == "threefry2x32"
    assert sr.clone(ks) is ks


def test_determinism_and_independence():
    k = sr.key(11)
    a, b = sr.normal(k, (1000,)), sr.normal(k, (1000,))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    k1, k2 = sr.split(k)
    c = np.asarray(sr.normal(k1, (1000,)))
    d = np.asarray(sr.normal(k2, (1000,)))
    assert abs(np.corrcoef(c, d)[0, 1]) < 0.1


@pytest.mark.parametrize("native", ["1", "0"])
def test_numpy_rounds_fallback_gives_the_same_numbers(monkeypatch, native):
    from spmd.compiler.ops import threefry_native

    monkeypatch.setattr(threefry_native, "_lib", [] if native == "1" else [None])
    k = sr.key(123)
    x = np.asarray(sr.bits(k, (3, 7)))
    monkeypatch.setattr(threefry_native, "_lib", [None])
    np.testing.assert_array_equal(x, np.asarray(sr.bits(k, (3, 7))))

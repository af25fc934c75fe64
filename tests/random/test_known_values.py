"""spmd.random gives JAX's numbers: Threefry known-answer vectors and recorded JAX values.

``jax_values.json`` was written by ``record_jax_values.py`` (jax 0.10.2, CPU, x32,
``jax_threefry_partitionable=True``); the suite itself does not need JAX.
Keys, bits and integer samplers must match exactly; float samplers to a few
float32 ulps (``normal`` goes through ``erf_inv``, whose last bit may differ
from XLA's evaluation order).
"""

import json
import os

import numpy as np
import pytest

import spmd
from spmd import random as sr
from spmd.compiler.ops import threefry as tf
from spmd.compiler.ops import threefry_native

with open(os.path.join(os.path.dirname(__file__), "jax_values.json")) as f:
    JAX = json.load(f)


def expected(name):
    e = JAX[name]
    return np.array(e["values"], dtype=e["dtype"] if e["dtype"] != "bfloat16" else "float32"
                    ).reshape(e["shape"])


# Salmon et al. (2011), Random123 kat_vectors, threefry2x32 with 20 rounds:
# (key, counter) -> output.
KAT = [((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6b200159, 0x99ba4efe)),
       ((0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff), (0x1cb996fc, 0xbb002be7)),
       ((0x13198a2e, 0x03707344), (0x243f6a88, 0x85a308d3), (0xc4923a9c, 0x483df7a0))]


@pytest.mark.parametrize("key,ctr,out", KAT)
def test_threefry_known_answer_vectors(key, ctr, out):
    u = np.uint32
    y = tf.threefry2x32(u(key[0]), u(key[1]), u(ctr[0]), u(ctr[1]))
    assert (int(y[0]), int(y[1])) == out


def test_threefry_vectorised_matches_scalar_kat():
    keys = np.array([k for k, _, _ in KAT], np.uint32)
    ctrs = np.array([c for _, c, _ in KAT], np.uint32)
    y0, y1 = tf.threefry2x32(keys[:, 0], keys[:, 1], ctrs[:, 0], ctrs[:, 1])
    np.testing.assert_array_equal(np.stack([y0, y1], 1), np.array([o for *_, o in KAT]))


def test_native_kernel_and_numpy_rounds_agree():
    if threefry_native.kernel() is None:
        pytest.skip("no C compiler here: only the numpy rounds exist")
    key = np.array([[7, 9], [0xdeadbeef, 3]], np.uint32)
    shape, glob, offs = (3, 5), (6, 10), [3, 5]
    fast = tf._hash_block(np, key, shape, glob, offs, True)
    hi, lo = tf._counter_words(np, shape, glob, offs)
    slow = tf.threefry_rounds(np, key[:, :1], key[:, 1:], hi[None], lo[None])
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_array_equal(fast[1], slow[1])


@pytest.mark.parametrize("seed", [0, 42, -1, 2**31 - 1])
def test_keys_and_split(seed):
    np.testing.assert_array_equal(sr.key_data(sr.key(seed)), expected(f"key_data/{seed}"))
    np.testing.assert_array_equal(sr.PRNGKey(seed), expected(f"key_data/{seed}"))
    np.testing.assert_array_equal(sr.key_data(sr.split(sr.key(seed), 4)),
                                  expected(f"split4/{seed}"))


def test_split_shape_and_fold_in():
    k = sr.key(42)
    np.testing.assert_array_equal(sr.key_data(sr.split(k, (2, 3))), expected("split23"))
    for d in (0, 1, 123456789, 2**32 - 1):
        np.testing.assert_array_equal(sr.key_data(sr.fold_in(k, d)), expected(f"fold_in/{d}"))


EXACT = {
    "bits_u32_2x3": lambda k: sr.bits(k, (2, 3)),
    "bits_u8_9": lambda k: sr.bits(k, (9,), np.uint8),
    "bits_u16_9": lambda k: sr.bits(k, (9,), np.uint16),
    "uniform_f32_7": lambda k: sr.uniform(k, (7,)),
    "uniform_f32_range": lambda k: sr.uniform(k, (2, 4), minval=-3.0, maxval=5.0),
    "uniform_f16_6": lambda k: sr.uniform(k, (6,), np.float16),
    "randint_0_10": lambda k: sr.randint(k, (10,), 0, 10),
    "randint_m5_5": lambda k: sr.randint(k, (2, 5), -5, 5),
    "randint_u8_0_256": lambda k: sr.randint(k, (8,), 0, 256, np.uint8),
    "randint_big": lambda k: sr.randint(k, (6,), -2**31, 2**31 - 1),
    "randint_empty": lambda k: sr.randint(k, (4,), 5, 3),
    "bernoulli_03": lambda k: sr.bernoulli(k, 0.3, (12,)),
    "rademacher": lambda k: sr.rademacher(k, (10,)),
    "categorical_1d": lambda k: sr.categorical(k, np.log(np.array([.1, .2, .3, .4], np.float32)),
                                               shape=(12,)),
    "categorical_2d_axis0": lambda k: sr.categorical(
        k, np.arange(12.0, dtype=np.float32).reshape(4, 3) / 4, axis=0),
    "categorical_noreplace": lambda k: sr.categorical(
        k, np.log(np.array([.1, .2, .3, .4], np.float32)), shape=(3,), replace=False),
    "choice_replace": lambda k: sr.choice(k, 10, (6,)),
    "choice_noreplace": lambda k: sr.choice(k, 10, (6,), replace=False),
    "choice_p": lambda k: sr.choice(k, 5, (8,), p=np.array([.1, .2, .3, .2, .2], np.float32)),
    "choice_p_noreplace": lambda k: sr.choice(k, 5, (3,), replace=False,
                                              p=np.array([.1, .2, .3, .2, .2], np.float32)),
    "choice_array_axis1": lambda k: sr.choice(k, np.arange(12).reshape(3, 4), (2,), axis=1),
    "permutation_10": lambda k: sr.permutation(k, 10),
    "permutation_2d": lambda k: sr.permutation(k, np.arange(12).reshape(4, 3)),
    "poisson_small": lambda k: sr.poisson(k, 3.0, (8,)),
    "poisson_mixed": lambda k: sr.poisson(k, np.array([0.0, 0.5, 12.0, 40.0, 200.0], np.float32)),
    "permutation_indep": lambda k: sr.permutation(k, np.arange(12).reshape(3, 4), axis=1,
                                                  independent=True),
}

CLOSE = {
    "normal_f32_3x4": lambda k: sr.normal(k, (3, 4)),
    "normal_f32_big": lambda k: sr.normal(sr.key(7), (1000,)),
    "normal_f16_5": lambda k: sr.normal(k, (5,), np.float16),
    "uniform_bf16_6": lambda k: np.asarray(sr.uniform(k, (6,), spmd.compiler.core.dtypes.bfloat16),
                                           np.float32),
    "exponential": lambda k: sr.exponential(k, (6,)),
    "laplace": lambda k: sr.laplace(k, (6,)),
    "logistic": lambda k: sr.logistic(k, (6,)),
    "gumbel": lambda k: sr.gumbel(k, (6,)),
    "truncated_normal": lambda k: sr.truncated_normal(k, -1.0, 2.0, (8,)),
    "legacy_normal": lambda k: sr.normal(sr.PRNGKey(3), (4,)),
    "gamma": lambda k: sr.gamma(k, np.array([0.3, 1.0, 2.5, 7.0], np.float32), (2, 4)),
    "loggamma": lambda k: sr.loggamma(k, 0.2, (5,)),
    "beta": lambda k: sr.beta(k, 2.0, 3.0, (5,)),
    "dirichlet": lambda k: sr.dirichlet(k, np.array([1.0, 2.0, 0.5], np.float32), (2,)),
    "multivariate_normal": lambda k: sr.multivariate_normal(
        k, np.array([1.0, -1.0, 0.5], np.float32),
        np.array([[2.0, 0.3, 0.1], [0.3, 1.0, -0.2], [0.1, -0.2, 0.5]], np.float32), (4,)),
    "orthogonal": lambda k: sr.orthogonal(k, 4),
    "orthogonal_3x5": lambda k: sr.orthogonal(k, 3, m=5),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_samplers_match_jax(name):
    got = np.asarray(EXACT[name](sr.key(42)))
    want = expected(name)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want.astype(got.dtype))


@pytest.mark.parametrize("name", sorted(CLOSE))
def test_float_samplers_match_jax_to_float32_rounding(name):
    got = np.asarray(CLOSE[name](sr.key(42)))
    want = expected(name)
    assert got.shape == want.shape
    # A few ulps of the result's own precision.
    eps = np.finfo(got.dtype).eps if got.dtype != np.float32 or name != "uniform_bf16_6" \
        else 2.0 ** -7
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=4 * eps, atol=4 * eps)


with open(os.path.join(os.path.dirname(__file__), "jax_values_x64.json")) as f:
    JAX64 = json.load(f)


def test_x64_keys_bits_and_samplers_match_jax(x64):
    def want(name):
        e = JAX64[name]
        return np.array(e["values"], e["dtype"]).reshape(e["shape"])

    k = sr.key(2**40 + 7)  # the seed's high word counts under x64
    np.testing.assert_array_equal(sr.key_data(k), want("x64_key"))
    np.testing.assert_array_equal(sr.key_data(sr.key(-3)), want("x64_key_neg"))
    np.testing.assert_array_equal(sr.bits(k, (4,), np.uint64), want("x64_bits64"))
    np.testing.assert_array_equal(sr.uniform(k, (4,), np.float64), want("x64_uniform64"))
    np.testing.assert_array_equal(sr.randint(k, (5,), -2**40, 2**40, np.int64),
                                  want("x64_randint64"))
    np.testing.assert_allclose(sr.normal(k, (4,), np.float64), want("x64_normal64"),
                               rtol=1e-15, atol=1e-15)

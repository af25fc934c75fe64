"""Distribution checks with fixed seeds: moments and Kolmogorov-Smirnov statistics
against scipy's distributions, with tolerances that a correct sampler passes for
these seeds with a wide margin (about 5 standard errors)."""

import numpy as np
import pytest
from scipy import stats

from spmd import random as sr

N = 20000
# KS critical value at alpha = 1e-4 for N samples, roughly 1.95 / sqrt(N).
KS = 1.95 / np.sqrt(N)


@pytest.mark.parametrize("name,draw,dist", [
    ("uniform", lambda k: sr.uniform(k, (N,)), stats.uniform()),
    ("uniform_range", lambda k: sr.uniform(k, (N,), minval=-2.0, maxval=5.0),
     stats.uniform(-2, 7)),
    ("normal", lambda k: sr.normal(k, (N,)), stats.norm()),
    ("exponential", lambda k: sr.exponential(k, (N,)), stats.expon()),
    ("laplace", lambda k: sr.laplace(k, (N,)), stats.laplace()),
    ("logistic", lambda k: sr.logistic(k, (N,)), stats.logistic()),
    ("gumbel", lambda k: sr.gumbel(k, (N,)), stats.gumbel_r()),
    ("truncated_normal", lambda k: sr.truncated_normal(k, -0.5, 1.5, (N,)),
     stats.truncnorm(-0.5, 1.5)),
])
def test_continuous_samplers_ks(name, draw, dist):
    x = np.asarray(draw(sr.key(17)), np.float64)
    assert np.isfinite(x).all()
    assert stats.kstest(x, dist.cdf).statistic < KS, name


def test_normal_moments_and_tails():
    x = np.asarray(sr.normal(sr.key(3), (N,)), np.float64)
    se = 1 / np.sqrt(N)
    assert abs(x.mean()) < 5 * se
    assert abs(x.var() - 1) < 5 * np.sqrt(2) * se
    assert abs(stats.skew(x)) < 5 * np.sqrt(6) * se
    assert -7 < x.min() and x.max() < 7


def test_truncated_normal_stays_inside_its_bounds():
    x = np.asarray(sr.truncated_normal(sr.key(0), -0.1, 0.1, (N,)))
    assert (x > -0.1).all() and (x < 0.1).all()


@pytest.mark.parametrize("lo,hi", [(0, 10), (-5, 3), (0, 1000)])
def test_randint_is_uniform_over_its_range(lo, hi):
    x = np.asarray(sr.randint(sr.key(5), (N,), lo, hi))
    assert x.min() >= lo and x.max() < hi
    counts = np.bincount(x - lo, minlength=hi - lo)
    if hi - lo <= 10:
        assert stats.chisquare(counts).pvalue > 1e-4
    else:
        assert stats.kstest(x, stats.randint(lo, hi).cdf).statistic < KS + 1.0 / (hi - lo)


def test_bernoulli_and_rademacher_frequencies():
    b = np.asarray(sr.bernoulli(sr.key(1), 0.3, (N,)))
    assert b.dtype == np.bool_
    assert abs(b.mean() - 0.3) < 5 * np.sqrt(0.21 / N)
    r = np.asarray(sr.rademacher(sr.key(1), (N,)))
    assert set(np.unique(r)) == {-1, 1} and abs(r.mean()) < 5 / np.sqrt(N)


def test_categorical_frequencies():
    p = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    x = np.asarray(sr.categorical(sr.key(2), np.log(p), shape=(N,)))
    counts = np.bincount(x, minlength=4)
    assert stats.chisquare(counts, p * N).pvalue > 1e-4


def test_choice_with_weights_frequencies():
    p = np.array([0.5, 0.0, 0.25, 0.25], np.float32)
    x = np.asarray(sr.choice(sr.key(8), 4, (N,), p=p))
    counts = np.bincount(x, minlength=4)
    assert counts[1] == 0
    assert stats.chisquare(counts[[0, 2, 3]], p[[0, 2, 3]] * N).pvalue > 1e-4


def test_permutations_are_permutations_and_uniform():
    x = np.asarray(sr.permutation(sr.key(0), 50))
    assert sorted(x.tolist()) == list(range(50))
    # Position of item 0 over many keys is uniform.
    keys = sr.split(sr.key(1), 2000)
    pos = [int(np.argmax(np.asarray(sr.permutation(k, 5)) == 0)) for k in list(keys)[:500]]
    assert stats.chisquare(np.bincount(pos, minlength=5)).pvalue > 1e-4


def test_choice_without_replacement_has_no_repeats():
    x = np.asarray(sr.choice(sr.key(3), 100, (60,), replace=False))
    assert len(set(x.tolist())) == 60


def test_split_keys_give_uncorrelated_streams():
    ks = sr.split(sr.key(0), 64)
    m = np.stack([np.asarray(sr.uniform(k, (512,))) for k in ks])
    c = np.corrcoef(m)
    off = c[~np.eye(64, dtype=bool)]
    assert np.abs(off).max() < 5 / np.sqrt(512)


@pytest.mark.parametrize("a", [0.4, 1.0, 3.5])
def test_gamma_ks(a):
    x = np.asarray(sr.gamma(sr.key(21), a, (4000,)), np.float64)
    assert (x > 0).all()
    assert stats.kstest(x, stats.gamma(a).cdf).statistic < 1.95 / np.sqrt(4000)


def test_beta_and_dirichlet_moments():
    x = np.asarray(sr.beta(sr.key(4), 2.0, 5.0, (4000,)), np.float64)
    assert stats.kstest(x, stats.beta(2, 5).cdf).statistic < 1.95 / np.sqrt(4000)
    alpha = np.array([1.0, 2.0, 3.0], np.float32)
    d = np.asarray(sr.dirichlet(sr.key(4), alpha, (3000,)), np.float64)
    np.testing.assert_allclose(d.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(d.mean(0), alpha / alpha.sum(), atol=0.02)


@pytest.mark.parametrize("lam", [0.7, 4.0, 25.0])
def test_poisson_mean_and_variance(lam):
    x = np.asarray(sr.poisson(sr.key(6), lam, (4000,)), np.float64)
    se = np.sqrt(lam / 4000)
    assert abs(x.mean() - lam) < 5 * se
    assert abs(x.var() / lam - 1) < 0.15


def test_multivariate_normal_covariance_and_orthogonality():
    cov = np.array([[2.0, 0.6], [0.6, 1.0]], np.float32)
    x = np.asarray(sr.multivariate_normal(sr.key(9), np.zeros(2, np.float32), cov, (N,)))
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.06)
    q = np.asarray(sr.orthogonal(sr.key(9), 5, (3,)))
    np.testing.assert_allclose(np.einsum("bij,bkj->bik", q, q), np.broadcast_to(np.eye(5),
                                                                                (3, 5, 5)),
                               atol=1e-5)

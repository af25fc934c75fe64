"""The stateful generator (JEP 28845): fold_in(base, counter) per draw, NumPy-style."""

import threading

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import random as sr
from spmd.errors import ArgumentError


def test_draws_are_fold_in_of_the_counter():
    rng = sr.stateful_rng(42)
    base = sr.key(42)
    np.testing.assert_array_equal(sr.key_data(rng.key()), sr.key_data(sr.fold_in(base, 0)))
    np.testing.assert_array_equal(np.asarray(rng.normal(size=3)),
                                  np.asarray(sr.normal(sr.fold_in(base, 1), (3,))))
    np.testing.assert_array_equal(np.asarray(rng.uniform(2.0, 3.0, (2,))),
                                  np.asarray(sr.uniform(sr.fold_in(base, 2), (2,),
                                                        minval=2.0, maxval=3.0)))
    np.testing.assert_array_equal(np.asarray(rng.integers(10, size=4)),
                                  np.asarray(sr.randint(sr.fold_in(base, 3), (4,), 0, 10)))
    np.testing.assert_array_equal(np.asarray(rng.random(2)),
                                  np.asarray(sr.uniform(sr.fold_in(base, 4), (2,))))


def test_normal_loc_scale_and_sizes():
    rng = sr.stateful_rng(0)
    x = np.asarray(rng.normal(loc=np.array([0.0, 100.0], np.float32), scale=2.0))
    assert x.shape == (2,) and 80 < x[1] < 120
    assert rng.integers(3, 7, size=(2, 2)).shape == (2, 2)
    assert rng.key((3,)).shape == (3,)


def test_jit_with_the_generator_as_argument_advances_its_counter():
    @spmd.jit
    def step(rng, x):
        return rng, x + rng.normal(size=x.shape)

    rng = sr.stateful_rng(1)
    rng, a = step(rng, np.zeros(3, np.float32))
    rng, b = step(rng, np.zeros(3, np.float32))
    assert not np.array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(b),
                                  np.asarray(sr.normal(sr.fold_in(sr.key(1), 1), (3,))))
    assert int(rng.count) == 2


def test_closed_over_generator_under_jit_advances_on_every_call():
    rng = sr.stateful_rng(3)
    f = spmd.jit(lambda x: x + rng.uniform(size=2))
    base = sr.key(3)
    for n in range(3):  # traced once, the counter read at run time on each call
        np.testing.assert_array_equal(np.asarray(f(np.zeros(2, np.float32))),
                                      np.asarray(sr.uniform(sr.fold_in(base, n), (2,))))
    assert rng.count == 3
    text = str(spmd.make_jaxpr(lambda x: x + rng.uniform())(np.float32(0)))
    assert "rng_counter[cell=counter#" in text
    # Tracing alone draws nothing; eager draws continue the same sequence.
    np.testing.assert_array_equal(np.asarray(rng.uniform(size=2)),
                                  np.asarray(sr.uniform(sr.fold_in(base, 3), (2,))))


def test_closed_over_generator_in_a_scan_body_draws_per_iteration():
    rng = sr.stateful_rng(10)

    @spmd.jit
    def run():
        return spmd.lax.scan(lambda c, _: (c, rng.normal()), 0.0, None, length=3)[1]

    base = sr.key(10)
    np.testing.assert_allclose(np.asarray(run()),
                               [float(sr.normal(sr.fold_in(base, n), ())) for n in range(3)],
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(run()),
                               [float(sr.normal(sr.fold_in(base, n), ())) for n in range(3, 6)],
                               rtol=1e-6)


def test_closed_over_generator_under_grad_and_vmap():
    rng = sr.stateful_rng(4)
    base = sr.key(4)
    # grad called eagerly runs the function once per call: the counter advances.
    g1 = spmd.grad(lambda s: snp.sum(s * rng.normal(size=3)))(np.float32(1))
    np.testing.assert_allclose(g1, np.sum(np.asarray(sr.normal(sr.fold_in(base, 0), (3,)))),
                               rtol=1e-6)
    # Compiled, likewise (the counter is read when the program runs).
    jg = spmd.jit(spmd.grad(lambda s: snp.sum(s * rng.normal(size=3))))
    np.testing.assert_allclose(jg(np.float32(1)),
                               np.sum(np.asarray(sr.normal(sr.fold_in(base, 1), (3,)))),
                               rtol=1e-6)
    np.testing.assert_allclose(jg(np.float32(1)),
                               np.sum(np.asarray(sr.normal(sr.fold_in(base, 2), (3,)))),
                               rtol=1e-6)
    # vmap (eager or compiled) reads the counter once: one key for the whole batch.
    out = spmd.vmap(lambda x: x + rng.uniform())(np.zeros(3, np.float32))
    assert len(set(np.asarray(out).tolist())) == 1
    out = spmd.jit(spmd.vmap(lambda x: x + rng.uniform()))(np.zeros(3, np.float32))
    assert len(set(np.asarray(out).tolist())) == 1 and rng.count == 5
    # vmap over a split generator: one base key and counter per batch entry.
    keys = rng.split(4)
    out = spmd.vmap(lambda r: r.uniform())(keys)
    assert out.shape == (4,) and len(set(np.asarray(out).tolist())) == 4


def test_unseeded_generator_inside_a_compiled_function_is_refused():
    with pytest.raises(sr.StatefulTraceError, match="explicit seed"):
        spmd.jit(lambda x: x + sr.stateful_rng().uniform())(np.float32(0))


def test_spawn_gives_independent_generators():
    kids = sr.stateful_rng(5).spawn(3)
    vals = [float(k.uniform()) for k in kids]
    assert len(set(vals)) == 3
    assert sr.stateful_rng(5).spawn(0) == []
    with pytest.raises(ArgumentError, match="n_children"):
        sr.stateful_rng(5).spawn(-1)


def test_threads_get_distinct_counts():
    rng = sr.stateful_rng(6)
    seen = []

    def draw():
        for _ in range(20):
            seen.append(int(sr.key_data(rng.key())[1]))

    ts = [threading.Thread(target=draw) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(set(seen)) == 80


def test_unseeded_generators_differ_and_typed_key_seeds():
    a, b = sr.stateful_rng(), sr.stateful_rng()
    assert float(a.uniform()) != float(b.uniform())
    r = sr.stateful_rng(sr.key(9))
    np.testing.assert_array_equal(sr.key_data(r.key()), sr.key_data(sr.fold_in(sr.key(9), 0)))


@pytest.mark.parametrize("policy", [None, "dots_saveable"])
def test_checkpoint_saves_the_counter_read_instead_of_recomputing_it(policy):
    rng = sr.stateful_rng(1)
    pol = None if policy is None else getattr(spmd.checkpoint_policies, policy)
    body = spmd.checkpoint(lambda s: snp.sum(snp.sin(s * rng.normal(size=3))), policy=pol)
    f = spmd.jit(spmd.value_and_grad(body))
    for n in range(2):
        v, g = f(np.float32(1.0))
        z = np.asarray(sr.normal(sr.fold_in(sr.key(1), n), (3,)), np.float64)
        np.testing.assert_allclose(v, np.sum(np.sin(z)), rtol=1e-5)
        np.testing.assert_allclose(g, np.sum(np.cos(z) * z), rtol=1e-5)
    assert rng.count == 2  # one read per call, not one more for the recomputation

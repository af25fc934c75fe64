"""The call plans of jitted calls on placed values, in one process (spmd/shard/call/jit.py,
spmd/shard/call/plan.py): keyed on each leaf's type, aval and placement, built once, right
for every way of passing the same values.  Oracles: numpy on the whole values.
(Over processes: tests/mpi/test_mpi_call_plans.py.)"""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P
from spmd.errors import DeletedArrayError
from spmd.shard.call.jit import Placed
from spmd.shard.arrays.sharded import placement_token


@pytest.fixture
def mesh():
    return spmd.make_mesh((4,), ("i",), devices=spmd.devices()[:4])


def _placed_plans(f) -> list:
    return [p for p in f._plans.values() if isinstance(p, Placed)]


def test_placement_tokens_name_placements_and_equal_placements_share_one(mesh):
    x = np.arange(8.0, dtype=np.float32)
    a = spmd.device_put(x, NamedSharding(mesh, P("i")))
    b = spmd.device_put(x * 2, NamedSharding(mesh, P("i")))  # another value, same placement
    c = spmd.device_put(x, NamedSharding(mesh, P()))
    d = spmd.device_put(x.astype(np.int32), NamedSharding(mesh, P("i")))
    assert a._token == b._token
    assert len({a._token, c._token, d._token}) == 3
    assert a._token == placement_token(type(a), a.aval, a.sharding, a._value is None)


def test_an_unpickled_array_gets_this_process_token_and_runs_right(mesh):
    a = spmd.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P("i")))
    a._token = -1  # as if another process had numbered it
    b = pickle.loads(pickle.dumps(a))
    assert b._token == placement_token(type(b), b.aval, b.sharding, b._value is None)
    f = spmd.jit(lambda v: v + 1)
    np.testing.assert_array_equal(np.asarray(f(b)), np.arange(8.0) + 1)


def test_one_plan_per_placement_and_each_gives_numpy(mesh):
    f = spmd.jit(lambda v: snp.sin(v) * 2 + 1)
    x = np.arange(8.0, dtype=np.float32)
    want = np.sin(x) * 2 + 1
    args = [spmd.device_put(x, NamedSharding(mesh, P("i"))),
            spmd.device_put(x, NamedSharding(mesh, P())),
            spmd.device_put(x, NamedSharding(mesh, P("i"))),  # an equal placement: a hit
            x, snp.asarray(x)]
    for a in args * 2:
        out = f(a)
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
        if hasattr(a, "sharding") and isinstance(a.sharding, NamedSharding):
            assert out.sharding == a.sharding
    assert len(_placed_plans(f)) == 2


def test_in_shardings_read_numpy_arrays_arrays_and_placed_arrays_alike(mesh):
    """One partitioned entry, leaves of every kind: each gets the plan that reads it."""
    s = NamedSharding(mesh, P("i"))
    f = spmd.jit(lambda v, w: v * w + 1, in_shardings=(s, NamedSharding(mesh, P())))
    x = np.arange(8.0, dtype=np.float32)
    w = np.float32(3)
    forms = [x, snp.asarray(x), spmd.device_put(x, s), x.astype(np.float64), list(x)]
    for _ in range(2):
        for v in forms[:4]:
            for ww in (w, snp.asarray(w), np.asarray(w)):
                out = f(v, ww)
                np.testing.assert_array_equal(np.asarray(out), x * 3 + 1)
                assert out.sharding == s


def test_closures_threads_and_donation(mesh):
    s = NamedSharding(mesh, P("i"))
    shift = spmd.device_put(np.full(8, 2.0, np.float32), s)
    f = spmd.jit(lambda v: v * 3 + shift, donate_argnums=0)
    x = np.arange(8.0, dtype=np.float32)
    results, errors = {}, []

    def work(k):
        try:
            a = spmd.device_put(x + k, s)
            results[k] = (np.asarray(f(a)), a.is_deleted())
        except Exception as e:  # reported on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k, (got, deleted) in results.items():
        np.testing.assert_array_equal(got, (x + k) * 3 + 2)
        assert deleted
    a = spmd.device_put(x, s)
    f(a)
    with pytest.raises(DeletedArrayError):
        f(a)
    assert len(_placed_plans(f)) == 1


def test_a_program_the_partitioner_cannot_take_runs_whole_and_says_so_once(mesh):
    """A shard_map over another mesh of the same devices, on arrays placed on the first:
    the values are computed whole and are right, the results are unplaced, and one
    warning per plan says so (not silently)."""
    import warnings

    from spmd import lax

    other = spmd.make_mesh((4,), ("j",), devices=spmd.devices()[:4])
    x = spmd.device_put(np.arange(16.0, dtype=np.float32), NamedSharding(mesh, P("i")))
    g = spmd.shard_map(lambda v: lax.psum(v, "j"), mesh=other, in_specs=P("j"),
                       out_specs=P())
    f = spmd.jit(lambda v: g(v * 2.0) + 1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [f(x) for _ in range(3)]
    said = [w for w in caught if "unplaced results" in str(w.message)]
    assert len(said) == 1 and "PartitionError" in str(said[0].message)
    want = (np.arange(16.0) * 2).reshape(4, -1).sum(0) + 1
    for y in outs:
        np.testing.assert_array_equal(np.asarray(y), want)


@pytest.mark.parametrize("name,fn", [
    ("x * 2 + 1", lambda x, y, n: x * 2 + 1),
    ("2 - x (reflected)", lambda x, y, n: 2 - x),
    ("x + numpy row", lambda x, y, n: x + n),
    ("numpy row * x", lambda x, y, n: n * x),
    ("x + y, two placements", lambda x, y, n: x + y),
    ("x > y (bool)", lambda x, y, n: x > y),
    ("x / 0 (inf)", lambda x, y, n: x / 0.0),
    ("int ** float scalar", lambda x, y, n: x.astype(np.int32) ** 2.0),
    ("tanh, exp, where", lambda x, y, n: snp.where(x > 3, snp.tanh(x), snp.exp(-x))),
])
def test_eager_operations_on_placed_arrays_equal_the_unplaced_ones(name, fn):
    """The eager ufuncs on placed operands run as one jitted call of the whole function
    (spmd/numpy/_elementwise.py): the same values, dtypes and weak types as on plain
    arrays, with the shardings that propagation gives."""
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    x0 = np.arange(32.0, dtype=np.float32).reshape(8, 4) - 5
    y0 = np.linspace(-3, 3, 32, dtype=np.float32).reshape(8, 4)
    n = np.arange(4.0, dtype=np.float32)
    x = spmd.device_put(x0, NamedSharding(mesh, P("i")))
    y = spmd.device_put(y0, NamedSharding(mesh, P(None, "j")))
    got = fn(x, y, n)
    want = fn(snp.asarray(x0), snp.asarray(y0), n)
    assert got.dtype == want.dtype and got.aval.weak_type == want.aval.weak_type
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert isinstance(got.sharding, NamedSharding) and got.sharding.mesh == mesh


def test_a_leaked_tracer_called_eagerly_says_it_escaped(mesh):
    """A jit with shardings traced under a transformation keeps that signature's entry
    without a call plan; calling it eagerly with the leaked tracer raises, naming the
    cause, instead of running anything."""
    from spmd.errors import SpmdError

    s = NamedSharding(mesh, P("i"))
    f = spmd.jit(lambda v: v * 2, in_shardings=s, out_shardings=s)
    leaked = []

    def outer(x):
        leaked.append(x)
        return f(x)

    np.testing.assert_array_equal(np.asarray(spmd.jit(outer)(np.ones(8, np.float32))), 2.0)
    with pytest.raises(SpmdError, match="traced under a transformation.*a tracer may have "
                                        "escaped its transformation"):
        f(leaked[0])
    np.testing.assert_array_equal(np.asarray(f(np.ones(8, np.float32))), 2.0)

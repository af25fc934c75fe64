"""The call plans of jitted calls over processes (spmd/shard/call/jit.py, spmd/shard/call/plan.py).

A jit's call plan is keyed on the arguments' structure, types, avals and, for placed
Arrays, their shardings and whether they hold blocks or the whole value; it is built
at the first call of its key and called as it is afterwards.  Each test here compares
the plans' results with numpy on the global arrays and with the traced program's
``jit`` equation bound eagerly (:func:`_bound`: how a nested jit equation runs in a
program evaluated by equation, the dispatch's route), for changed shapes, dtypes and shardings, closures, threads and ranks that
disagree, and checks that errors still fire.

Runs on 2 and on 4 ranks with one device each (``make test``) and on 2 ranks
with 2 devices each (``test_hybrid_subprocess.py``).
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import make_mesh, x64_if  # noqa: E402

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding, P, lax  # noqa: E402
from spmd.compiler.core.jit import jit_p  # noqa: E402
from spmd.errors import DeletedArrayError  # noqa: E402
from spmd.shard.call.fingerprint import ProgramMismatchError  # noqa: E402
from spmd.shard.call.jit import Placed  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _placed(f) -> list:
    """The placed call plans of ``f`` (spmd.shard.call.plan.Plan objects)."""
    return [p.plan for p in f._plans.values() if isinstance(p, Placed)]


@pytest.fixture
def builds(monkeypatch):
    """A list that grows by one at each call plan decided (the one routing decision)."""
    from spmd.shard.call import route

    made, real = [], route.decide

    def counting(*args):
        made.append(1)
        return real(*args)

    monkeypatch.setattr(route, "decide", counting)
    return made


def _bound(fun):
    """``fun`` traced by ``spmd.jit`` and run as its ``jit`` equation bound eagerly: the
    compiler's eager trace offers it to the shard layer (extensions.EAGER_EVAL), whose
    dispatch runs a program holding a shard_map over processes partitioned over its
    mesh -- a route of its own, beside the jit's call plans."""
    traced = spmd.jit(fun)

    def call(*args):
        entry, leaves, _ = traced._entry(args, {})
        outs = jit_p.bind(*entry.hoisted, *leaves, program=entry.closed, name="bound")
        return entry.out_tree.unflatten(outs)

    return call


def _global(rows, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(-8, 8, (rows, 3)).astype(dtype)


def _gather(a):
    return np.asarray(spmd.process_allgather(a, tiled=True))


_BODIES = {
    "psum": (lambda b: lax.psum(b, "i"), P(),
             lambda x, n: x.reshape(n, -1, x.shape[1]).sum(0)),
    "all_gather": (lambda b: lax.all_gather(b, "i", tiled=True), P(), lambda x, n: x),
    "psum_scatter": (lambda b: lax.psum_scatter(b, "i", tiled=True), P("i"),
                     lambda x, n: x.reshape(n, -1, x.shape[1]).sum(0)),
    "all_to_all": (lambda b: lax.all_to_all(b, "i", 0, 0, tiled=True), P("i"),
                   lambda x, n: x.reshape(n, n, -1, x.shape[1]).transpose(1, 0, 2, 3)
                   .reshape(x.shape)),
}


def _jitted(kind, mesh, jit=spmd.jit):
    body, out_spec, ref = _BODIES[kind]
    check = kind != "all_gather"  # its result is typed varying (as in JAX)
    f = jit(spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=out_spec,
                           check_vma=check))
    return f, ref


@pytest.mark.parametrize("kind", list(_BODIES))
def test_repeated_calls_build_one_plan_and_equal_the_bound_route(kind, builds):
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted(kind, mesh)
    g, _ = _jitted(kind, mesh, _bound)
    for seed in range(4):
        x = _global(4 * n * n, seed=seed)
        got = f(x)
        want = g(x)
        assert got.sharding == want.sharding and got.dtype == want.dtype
        np.testing.assert_array_equal(_gather(got), ref(x, n))
        np.testing.assert_array_equal(_gather(got), _gather(want))
    assert len(_placed(f)) == 1
    assert len(builds) == 2  # f's first call, and g's (the dispatch keeps its plan too)


def test_other_shapes_and_dtypes_get_their_own_plans_and_stay_right():
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted("psum", mesh)
    cases = [(2 * n, np.float32), (6 * n, np.float32), (2 * n, np.int32), (2 * n, np.float64),
             (2 * n, np.float16)]
    for _ in range(2):  # back and forth between the plans
        for rows, dtype in cases:
            x = _global(rows, dtype, seed=rows)
            with x64_if(dtype):
                out = f(x)
            assert out.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(_gather(out), ref(x, n))
    assert len(_placed(f)) == len(cases)


def test_a_changed_sharding_gets_its_own_plan_and_stays_right(builds):
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted("psum", mesh)
    x = _global(4 * n)
    split = spmd.device_put(x, NamedSharding(mesh, P("i")))  # this process's blocks
    whole = spmd.device_put(x, NamedSharding(mesh, P()))     # the whole value
    # The same aval and type, two placements: two plans; an equal sharding is a hit.
    for arg in (split, split, whole, split, whole,
                spmd.device_put(x, NamedSharding(mesh, P("i")))):  # an equal sharding
        np.testing.assert_array_equal(_gather(f(arg)), ref(x, n))
    assert len(_placed(f)) == 2
    assert len(builds) == 2


def test_results_fed_back_as_arguments_stay_right():
    """A training-loop shape: each call's outputs (placed by the out specs) are the
    next call's arguments."""
    mesh = make_mesh("1d")
    n = mesh.size

    @spmd.jit
    @spmd.shard_map(mesh=mesh, in_specs=(P(), P("i")), out_specs=(P(), P("i")))
    def step(w, b):
        return w - 0.5 * lax.pmean(snp.sum(b, axis=0), "i"), b * 2.0

    x = _global(2 * n)
    w, b = np.zeros(3, np.float32), x
    want_w, want_b = np.zeros(3, np.float32), x.copy()
    for _ in range(4):
        w, b = step(w, b)
        want_w = want_w - 0.5 * want_b.reshape(n, -1, 3).sum(1).mean(0)
        want_b = want_b * 2.0
        np.testing.assert_allclose(_gather(w), want_w, rtol=1e-6)
        np.testing.assert_array_equal(_gather(b), want_b)
    assert len(_placed(step)) >= 1


def test_closed_over_constants_give_what_the_bound_route_gives():
    mesh = make_mesh("1d")
    n = mesh.size
    scale = np.arange(3, dtype=np.float32) + 1      # a numpy constant
    shift = snp.asarray(np.full(3, 2.0, np.float32))  # an spmd Array constant
    wide = np.full(3, 0.5)                           # float64: converted, as the general path does
    f = spmd.jit(spmd.shard_map(lambda b: lax.psum(b * scale + shift + wide, "i"), mesh=mesh,
                                in_specs=P("i"), out_specs=P()))
    for seed in range(3):
        x = _global(2 * n, seed=seed)
        want = (x * scale + 2.0 + 0.5).reshape(n, -1, 3).sum(0)
        np.testing.assert_allclose(_gather(f(x)), want, rtol=1e-6)
    assert len(_placed(f)) == 1
    g = _bound(spmd.shard_map(lambda b: lax.psum(b * scale + shift + wide, "i"),
                                    mesh=mesh, in_specs=P("i"), out_specs=P()))
    g(x)
    # Deleting a closed-over Array after tracing: both routes keep what the trace took.
    shift.delete()
    x = _global(2 * n, seed=7)
    want = _gather(g(x))
    np.testing.assert_array_equal(_gather(f(x)), want)


def test_a_donated_argument_raises_at_its_next_call():
    mesh = make_mesh("1d")
    n = mesh.size
    f = spmd.jit(spmd.shard_map(lambda b: b * 2.0, mesh=mesh, in_specs=P("i"),
                                out_specs=P("i")), donate_argnums=0)
    x = _global(2 * n)
    a = spmd.device_put(x, NamedSharding(mesh, P("i")))
    b = f(a)
    c = f(b)  # the plan of a's call, donating b
    np.testing.assert_array_equal(_gather(c), x * 4)
    assert len(_placed(f)) == 1 and a.is_deleted() and b.is_deleted()
    with pytest.raises(DeletedArrayError):
        f(b)
    np.testing.assert_array_equal(_gather(f(c)), x * 8)  # and the plan still works


def test_calls_from_threads_share_the_plan_and_get_their_own_results():
    """The plan is built in one thread and used in others (one thread at a time,
    same thread names on every rank, as the collective thread rules ask)."""
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted("psum", mesh)
    results, errors = {}, []

    def work(k):
        try:
            x = _global(2 * n, seed=k)
            results[k] = (np.asarray(f(x)), ref(x, n))
        except Exception as e:  # reported below, on the test's thread
            errors.append(e)

    for k in range(4):
        t = threading.Thread(target=work, args=(k,), name=f"plans-{k}")
        t.start()
        t.join()
    assert not errors, errors
    work(4)  # the main thread, with the plan the threads built
    for got, want in results.values():
        np.testing.assert_array_equal(got, want)
    assert len(_placed(f)) == 1


def test_ranks_that_disagree_on_a_new_shape_still_raise_and_the_plans_keep_working():
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted("psum", mesh)
    x = _global(2 * n)
    for _ in range(2):
        f(x)  # every rank has its plan for this shape
    rows = 4 * n if spmd.process_index() == 0 else 6 * n
    with pytest.raises(ProgramMismatchError):
        f(_global(rows))
    np.testing.assert_array_equal(_gather(f(x)), ref(x, n))
    assert len(_placed(f)) == 1


def test_under_a_transformation_the_jit_equation_is_bound():
    """A jitted call traced by an enclosing jit binds its equation (no plan is called)."""
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted("psum", mesh)
    x = _global(2 * n)
    f(x)
    f(x)
    outer = spmd.jit(lambda y: f(y) * 2.0)
    np.testing.assert_array_equal(_gather(outer(x)), ref(x, n) * 2)
    np.testing.assert_array_equal(_gather(outer(x)), ref(x, n) * 2)


def test_a_program_the_partitioner_cannot_take_whole_runs_by_equation_and_says_so_once():
    """A shard_map over another mesh of the same devices inside a jit over placed
    values: each equation runs as its own SPMD computation, with one warning per plan
    (not a silent fallback), and the result is numpy's."""
    import warnings

    from spmd.shard.call.route import ByEquation

    n = spmd.device_count()  # every device: a mesh over the processes
    a = spmd.make_mesh((n,), ("i",))
    b = spmd.make_mesh((n,), ("j",))
    x = spmd.device_put(np.arange(n * 4.0, dtype=np.float32), NamedSharding(a, P("i")))
    g = spmd.shard_map(lambda v: lax.psum(v, "j"), mesh=b, in_specs=P("j"), out_specs=P())
    f = spmd.jit(lambda v: g(v * 2.0) + 1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [f(x) for _ in range(3)]
    said = [w for w in caught if "equation by equation" in str(w.message)]
    assert len(said) == 1 and "PartitionError" in str(said[0].message)
    want = (np.arange(n * 4.0) * 2).reshape(n, -1).sum(0) + 1
    for y in outs:
        np.testing.assert_array_equal(_gather(y), want)
    assert [type(p) for p in _placed(f)] == [ByEquation]


def test_a_jit_equation_the_partitioner_cannot_take_is_run_by_equation_and_said():
    """A jit equation bound on unplaced values (the known part of a gradient, a nested
    jit run by equation) whose shard_maps are over two meshes of the same devices: it
    runs equation by equation, with the same warning as a call plan's fallback (it
    used to fall back silently), and numpy's result."""
    import warnings

    n = spmd.device_count()
    a = spmd.make_mesh((n,), ("i",))
    b = spmd.make_mesh((n,), ("j",))
    g = spmd.shard_map(lambda v: lax.psum(v, "j"), mesh=b, in_specs=P("j"), out_specs=P())
    h = spmd.shard_map(lambda v: lax.psum(v, "i"), mesh=a, in_specs=P("i"), out_specs=P())
    x = np.arange(n * 4.0, dtype=np.float32)
    program = spmd.make_jaxpr(lambda v: g(v * 2.0) + h(v))(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (out,) = jit_p.bind(x, program=program, name="bound")
    said = [w for w in caught if "equation by equation" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    np.testing.assert_array_equal(np.asarray(out), 3 * x.reshape(n, 4).sum(0))  # (replicated)


def test_eager_operations_on_an_array_spread_over_processes_keep_its_placement():
    """``astype`` used to read the whole value (raising on a spread array); every eager
    operation now runs on this process's blocks."""
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    s = NamedSharding(mesh, P("i"))
    g = np.arange(4.0 * n, dtype=np.float32) - 3
    x = spmd.device_put(g, s)
    for got, want in [(x.astype(np.int32), g.astype(np.int32)),
                      (x * 2 + 1, g * 2 + 1),
                      (snp.maximum(x, 0.5), np.maximum(g, 0.5)),
                      (x.astype(np.int32) ** 2.0,  # (a weak float: float32, as in JAX)
                       (g.astype(np.int32) ** 2.0).astype(np.float32))]:
        assert got.sharding == s and got.dtype == want.dtype
        np.testing.assert_array_equal(_gather(got), want)


def test_one_rank_alone_may_lower_trace_or_eval_shape_a_call_on_spread_arrays():
    """Inspecting a jit builds no call plan: nothing is partitioned for the processes
    or agreed with the other ranks, so rank 0 may print it alone (a plan's build
    agrees on the program with every rank: that happens at the first call)."""
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    x = spmd.device_put(np.arange(4.0 * n, dtype=np.float32), NamedSharding(mesh, P("i")))
    f = spmd.jit(lambda v: snp.sin(v) * 2)
    g = spmd.jit(lambda v: snp.cos(v) + 1)  # inspected by rank 0 alone, never called
    if spmd.process_index() == 0:
        assert "cos" in g.lower(x).as_text()
        assert g.trace(x).out_info.shape == (4 * n,)
        assert spmd.eval_shape(g, x).shape == (4 * n,)
        assert not _placed(g)
    # (Had rank 0 agreed on g's program, this call's agreement would pair with it.)
    np.testing.assert_allclose(_gather(f(x)), np.sin(np.arange(4.0 * n)) * 2, rtol=1e-6)
    assert len(_placed(f)) == 1

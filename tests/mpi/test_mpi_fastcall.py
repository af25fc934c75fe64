"""The fast path of jitted calls over processes (spmd/shard/fastcall.py).

A jit's call plan learns, at its first call, how the general path ran the program
over the processes; later calls with the same plan reuse that (a Runner) after
checking the guards.  Each test here compares the fast path with numpy on the
global arrays and with the general path (the same function jitted with the
``EAGER_CALL`` extension point at its default: no runner ever), for changed
shapes, dtypes and shardings, closures, threads and ranks that disagree, and checks
that errors still fire.

Runs on 2 and on 4 ranks with one device each (``.ci/pytest_mpi.sh``) and on 2 ranks
with 2 devices each (``test_hybrid_subprocess.py``).
"""

from __future__ import annotations

import contextlib
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
from spmd.compiler import extensions  # noqa: E402
from spmd.errors import DeletedArrayError  # noqa: E402
from spmd.shard.fastcall import Runner  # noqa: E402
from spmd.shard.fingerprint import ProgramMismatchError  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _runners(f) -> list:
    """The runners of ``f``'s call plans (False: a plan that has none)."""
    return [p.runner for p in f._plans.values()]


@contextlib.contextmanager
def _general_path_only():
    """Jitted calls made meanwhile get no runner: every call takes the general path."""
    point = extensions.EAGER_CALL
    old, who = point.fn, point.installed_by
    point.install(point.default, by="tests")
    try:
        yield
    finally:
        point.install(old, by=who)


@pytest.fixture
def general_runs(monkeypatch):
    """A list that grows by one at each call that took the general path over the
    processes (the dispatch notes each such run for the fast path)."""
    from spmd.shard import fastcall

    runs, real = [], fastcall.note

    def counting(*args):
        runs.append(1)
        real(*args)

    monkeypatch.setattr(fastcall, "note", counting)
    return runs


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


def _jitted(kind, mesh):
    body, out_spec, ref = _BODIES[kind]
    check = kind != "all_gather"  # its result is typed varying (as in JAX)
    f = spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=out_spec,
                                check_vma=check))
    return f, ref


@pytest.mark.parametrize("kind", list(_BODIES))
def test_repeated_calls_take_the_fast_path_and_equal_the_general_path(kind, general_runs):
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted(kind, mesh)
    with _general_path_only():
        g, _ = _jitted(kind, mesh)
    for seed in range(4):
        x = _global(4 * n * n, seed=seed)
        got = f(x)
        with _general_path_only():
            want = g(x)
        assert got.sharding == want.sharding and got.dtype == want.dtype
        np.testing.assert_array_equal(_gather(got), ref(x, n))
        np.testing.assert_array_equal(_gather(got), _gather(want))
    (runner,) = _runners(f)
    assert isinstance(runner, Runner)
    assert _runners(g) == [False]
    assert len(general_runs) == 1 + 4  # f's first call, and every call of g


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
    assert all(isinstance(r, Runner) for r in _runners(f)) and len(_runners(f)) == len(cases)


def test_a_changed_sharding_takes_the_general_path_and_stays_right(general_runs):
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted("psum", mesh)
    x = _global(4 * n)
    split = spmd.device_put(x, NamedSharding(mesh, P("i")))  # this process's blocks
    whole = spmd.device_put(x, NamedSharding(mesh, P()))     # the whole value
    # The same aval and type: one call plan; its runner is built for `split`.
    for arg in (split, split, whole, split, whole,
                spmd.device_put(x, NamedSharding(mesh, P("i")))):  # an equal sharding
        np.testing.assert_array_equal(_gather(f(arg)), ref(x, n))
    (runner,) = _runners(f)
    assert isinstance(runner, Runner)
    assert len(general_runs) == 3  # the first call and the two with `whole`


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
    assert sum(isinstance(r, Runner) for r in _runners(step)) >= 1


def test_closed_over_constants_give_what_the_general_path_gives():
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
    assert isinstance(_runners(f)[0], Runner)
    with _general_path_only():
        g = spmd.jit(spmd.shard_map(lambda b: lax.psum(b * scale + shift + wide, "i"),
                                    mesh=mesh, in_specs=P("i"), out_specs=P()))
        g(x)
    # Deleting a closed-over Array after tracing: both paths keep what the trace took.
    shift.delete()
    x = _global(2 * n, seed=7)
    with _general_path_only():
        want = _gather(g(x))
    np.testing.assert_array_equal(_gather(f(x)), want)


def test_a_donated_argument_raises_on_the_fast_path():
    mesh = make_mesh("1d")
    n = mesh.size
    f = spmd.jit(spmd.shard_map(lambda b: b * 2.0, mesh=mesh, in_specs=P("i"),
                                out_specs=P("i")), donate_argnums=0)
    x = _global(2 * n)
    a = spmd.device_put(x, NamedSharding(mesh, P("i")))
    b = f(a)
    c = f(b)  # the fast path, donating b
    np.testing.assert_array_equal(_gather(c), x * 4)
    assert isinstance(_runners(f)[0], Runner) and a.is_deleted() and b.is_deleted()
    with pytest.raises(DeletedArrayError):
        f(b)
    np.testing.assert_array_equal(_gather(f(c)), x * 8)  # and the plan still works


def test_calls_from_threads_share_the_plan_and_get_their_own_results():
    """The runner is built in one thread and used in others (one thread at a time,
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
        t = threading.Thread(target=work, args=(k,), name=f"fastcall-{k}")
        t.start()
        t.join()
    assert not errors, errors
    work(4)  # the main thread, with the plan the threads built
    for got, want in results.values():
        np.testing.assert_array_equal(got, want)
    assert isinstance(_runners(f)[0], Runner)


def test_ranks_that_disagree_on_a_new_shape_still_raise_and_the_plans_keep_working():
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted("psum", mesh)
    x = _global(2 * n)
    for _ in range(2):
        f(x)  # every rank has its runner for this shape
    rows = 4 * n if spmd.process_index() == 0 else 6 * n
    with pytest.raises(ProgramMismatchError):
        f(_global(rows))
    np.testing.assert_array_equal(_gather(f(x)), ref(x, n))
    assert isinstance(_runners(f)[0], Runner)


def test_under_a_transformation_the_general_path_runs():
    """A jitted call traced by an enclosing jit binds as before (no runner is used)."""
    mesh = make_mesh("1d")
    n = mesh.size
    f, ref = _jitted("psum", mesh)
    x = _global(2 * n)
    f(x)
    f(x)
    outer = spmd.jit(lambda y: f(y) * 2.0)
    np.testing.assert_array_equal(_gather(outer(x)), ref(x, n) * 2)
    np.testing.assert_array_equal(_gather(outer(x)), ref(x, n) * 2)

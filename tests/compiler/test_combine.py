"""Collective combining (spmd/compiler/passes/combine.py) on programs with real MPI all-reduces.

Single process: the ``mpi`` primitive runs on a one-rank communicator (mpi4py
initialises a singleton MPI), so every program here really communicates; the
oracle is the same program compiled without combining.  The multi-process
behaviour (data-parallel steps, gradients) is in tests/mpi/test_combine_mpi.py.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mpi4py")

import spmd  # noqa: E402
from spmd.collectives import mpi  # noqa: E402
from spmd.compiler.core.avals import ShapedArray  # noqa: E402
from spmd.compiler.engine.codegen import compile_program  # noqa: E402
from spmd.compiler.passes.combine import combine_collectives  # noqa: E402
from spmd.compiler.ops.elementwise import add, mul  # noqa: E402
from spmd.compiler.core.trace import trace_to_program  # noqa: E402

RANKS = (0,)


def allreduce(x, op="sum"):
    return mpi.call("allreduce", x, RANKS, op=op, what="psum")


def trace(fn, *shapes, dtype=np.float32):
    return trace_to_program(lambda *xs: fn(*xs), [ShapedArray(s, np.dtype(dtype))
                                                  for s in shapes])


def collectives(closed):
    return [e for e in closed.program.eqns if e.primitive.name == "mpi"]


def run(closed, *args):
    return compile_program(closed)(*args)


def check_same(closed, bucket, *args):
    combined = combine_collectives(closed, bucket)
    want = run(closed, *args)
    got = run(combined, *args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    return combined


def args_for(closed, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.aval.shape).astype(v.aval.dtype)
            for v in closed.program.in_vars[len(closed.consts):]]


def test_independent_allreduces_become_one():
    closed = trace(lambda a, b, c: [mul(allreduce(a), 2.0), allreduce(b), allreduce(c)],
                   (3, 4), (5,), ())
    combined = check_same(closed, 1 << 20, *args_for(closed))
    (one,) = collectives(combined)
    assert one.inputs[0].aval.shape == (18,)
    assert "psum x3 combined (72 bytes)" in str(combined)


def test_a_dependent_allreduce_is_not_combined_with_its_source():
    # b's all-reduce reads a's result: they cannot run as one call.
    closed = trace(lambda a, c: [allreduce(add(allreduce(a), 1.0)), allreduce(c)], (4,), (4,))
    combined = check_same(closed, 1 << 20, *args_for(closed))
    sizes = [e.inputs[0].aval.shape for e in collectives(combined)]
    # a's alone (the next one reads its result), then the dependent one with c's
    assert sizes == [(4,), (8,)]


def test_the_bucket_limit_splits_groups():
    closed = trace(lambda a, b, c, d: [allreduce(a), allreduce(b), allreduce(c), allreduce(d)],
                   (4,), (4,), (4,), (4,))
    combined = check_same(closed, 32, *args_for(closed))  # two float32[4] per bucket
    assert [e.inputs[0].aval.shape for e in collectives(combined)] == [(8,), (8,)]


def test_only_equal_operations_and_dtypes_combine():
    f32 = trace(lambda a, b, c: [allreduce(a), allreduce(b, "max"), allreduce(c)],
                (4,), (4,), (4,))
    combined = check_same(f32, 1 << 20, *args_for(f32))
    # sum, max, sum: a different operation closes the group (order is kept)
    assert len(collectives(combined)) == 3
    mixed = trace_to_program(lambda a, b: [allreduce(a), allreduce(b)],
                             [ShapedArray((4,), np.dtype(np.float32)),
                              ShapedArray((4,), np.dtype(np.int32))])
    a = np.arange(4, dtype=np.float32)
    b = np.arange(4, dtype=np.int32)
    combined = combine_collectives(mixed, 1 << 20)
    assert len(collectives(combined)) == 2
    for g, w in zip(run(combined, a, b), run(mixed, a, b)):
        np.testing.assert_array_equal(g, w)


def test_uses_between_members_move_after_the_combined_call():
    def f(a, b):
        ra = allreduce(a)
        t = mul(ra, 3.0)  # reads a member's result: held back until after the call
        return [t, allreduce(b)]

    closed = trace(f, (2, 2), (2, 2))
    combined = check_same(closed, 1 << 20, *args_for(closed))
    eqns = [e.primitive.name for e in combined.program.eqns]
    assert eqns.count("mpi") == 1 and eqns.index("mul") > eqns.index("mpi")


def test_disabled_and_single_collectives_are_unchanged():
    closed = trace(lambda a, b: [allreduce(a), allreduce(b)], (4,), (4,))
    assert combine_collectives(closed, 0) is closed
    single = trace(lambda a: [allreduce(a)], (4,))
    assert combine_collectives(single, 1 << 20) is single


def test_jit_combines_and_the_config_switch_disables_it():
    from spmd.config import config

    def f(a, b):
        return allreduce(a) * 2, allreduce(b)

    a, b = np.ones((3,), np.float32), np.arange(5, dtype=np.float32)
    old = config.combine_collectives_bytes
    try:
        on = spmd.jit(f)
        text = on.lower(a, b).as_text(executed=True)
        assert "x2 combined (32 bytes)" in text
        assert "# psum x2 combined (32 bytes)" in on.lower(a, b).compile().as_text()
        got = on(a, b)
        config.update("combine_collectives_bytes", 0)
        off = spmd.jit(f)
        assert "combined" not in off.lower(a, b).as_text(executed=True)
        for g, w in zip(got, off(a, b)):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    finally:
        config.update("combine_collectives_bytes", old)


@pytest.mark.parametrize("bad", [-1, 1.5, "32", True])
def test_config_rejects_bad_bucket_sizes(bad):
    from spmd.config import config
    from spmd.errors import ArgumentError

    with pytest.raises(ArgumentError, match="combine_collectives_bytes must be an int >= 0"):
        config.update("combine_collectives_bytes", bad)


@pytest.mark.parametrize("raw", ["abc", "-5", "1.5"])
def test_a_bad_environment_value_is_named_at_import(raw):
    import subprocess
    import sys

    env = dict(__import__("os").environ, SPMD_COMBINE_COLLECTIVES_BYTES=raw)
    proc = subprocess.run([sys.executable, "-c", "import spmd"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"SPMD_COMBINE_COLLECTIVES_BYTES={raw!r} is not an integer >= 0" in proc.stderr


def test_the_local_backend_has_nothing_to_combine():
    """Simulated devices reduce stacked arrays (no collective calls): the executed
    program of a data-parallel step has no mpi equation, so nothing changes there."""
    import functools

    from spmd import P, lax

    mesh = spmd.make_mesh((8,), ("d",))
    w = np.ones((4, 3), np.float32)
    x = np.arange(32 * 4, dtype=np.float32).reshape(32, 4) / 100

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P("d")), out_specs=P(),
                       check_vma=False)
    def grads(w, x):
        g = spmd.grad(lambda w: spmd.numpy.sum(spmd.numpy.tanh(x @ w)))(w)
        return lax.pmean(g, "d"), lax.pmean(x.sum(), "d")

    text = grads.lower(w, x).as_text(executed=True)
    assert "mpi[" not in text and "combined" not in text
    assert "reduce_sum" in text or "dot_general" in text

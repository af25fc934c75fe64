"""Overlapped collectives (spmd/compiler/passes/overlap.py) and the code generated for them
(spmd/compiler/engine/codegen.py: requests, ``test()`` between equations, gradients written
straight into the flat buffer), on programs with real MPI all-reduces.

Single process: the ``mpi`` primitive runs on a one-rank communicator (mpi4py
initialises a singleton MPI), so each start, test and wait is a real MPI call; the
oracle is the same program compiled without the pass.  The multi-process data-parallel
steps are in tests/mpi/test_combine_mpi.py.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mpi4py")

import spmd  # noqa: E402
from spmd.collectives import mpi  # noqa: E402
from spmd.compiler.core.avals import ShapedArray  # noqa: E402
from spmd.compiler.engine.codegen import compile_program  # noqa: E402
from spmd.compiler.ops.elementwise import add, mul, tanh  # noqa: E402
from spmd.compiler.ops.linalg import dot_general  # noqa: E402
from spmd.compiler.passes.overlap import overlap_collectives  # noqa: E402
from spmd.compiler.core.trace import trace_to_program  # noqa: E402
from spmd.config import config  # noqa: E402
from spmd.errors import ArgumentError  # noqa: E402

RANKS = (0,)
MM = (((1,), (0,)), ((), ()))


def allreduce(x, op="sum"):
    return mpi.call("allreduce", x, RANKS, op=op, what="psum")


def trace(fn, *shapes):
    return trace_to_program(fn, [ShapedArray(s, np.dtype(np.float32)) for s in shapes])


def args_for(closed, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.aval.shape).astype(v.aval.dtype)
            for v in closed.program.in_vars[len(closed.consts):]]


def names(closed):
    return [e.primitive.name for e in closed.program.eqns]


def check_same(closed, bucket):
    """The overlapped program computes the same bits as the original; returns it and
    its generated source."""
    over = overlap_collectives(closed, bucket)
    args = args_for(closed)
    want = compile_program(closed)(*args)
    exe = compile_program(over)
    got = exe(*args)
    for _ in range(2):  # again: buffers of the previous call are reused safely
        got = exe(*args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    return over, exe.source


def backward_like(x, w1, w2):
    """Two "layers": the second's gradient exists before the first's is computed."""
    h = tanh(dot_general(x, w1, MM))
    g2 = dot_general(h, w2, MM)            # produced first
    r2 = allreduce(g2)
    g1 = dot_general(tanh(g2), w2, MM)     # more work, then the second gradient
    r1 = allreduce(g1)
    return [mul(r2, 0.5), mul(r1, 0.25)]


def sendrecv(x):
    """A ppermute's exchange on the one rank: to itself and from itself."""
    return mpi.call("sendrecv", x, RANKS, dst=0, src=0, what="ppermute")


def test_a_send_receive_starts_alone_and_waits_where_its_result_is_needed():
    """A pipeline tick: a stage sends what it computed at once, computes what does not
    need what it receives (its weights' gradient), and waits only then.  Send-receives
    are never combined: each starts after its own operand."""
    def f(x, w):
        y = tanh(dot_general(x, w, MM))
        got_y = sendrecv(y)                    # sent as soon as y exists
        z = dot_general(tanh(y), w, MM)        # work that does not need what comes
        got_x = sendrecv(tanh(x))
        return [add(got_y, z), mul(got_x, 2.0)]

    closed = trace(f, (64, 64), (64, 64))
    over, source = check_same(closed, 1 << 20)
    seq = names(over)
    assert seq.count("collective_start") == 2 and seq.count("collective_wait") == 2
    assert "mpi" not in seq and "combined" not in str(over)
    first_start, first_wait = seq.index("collective_start"), seq.index("collective_wait")
    dots = [i for i, n in enumerate(seq) if n == "dot_general"]
    assert first_start < dots[-1] < first_wait
    assert "= _r0.wait()  # ppermute" in source


def test_a_bucket_starts_when_its_operand_exists_and_waits_at_first_use():
    closed = trace(backward_like, (128, 128), (128, 128), (128, 128))
    over, source = check_same(closed, 128 * 128 * 4)  # one gradient per bucket
    seq = names(over)
    assert seq.count("collective_start") == 2 and seq.count("collective_wait") == 2
    assert "mpi" not in seq
    first_start, first_wait = seq.index("collective_start"), seq.index("collective_wait")
    # the second dot_general (the first "layer"'s gradient) runs between start and wait
    dots = [i for i, n in enumerate(seq) if n == "dot_general"]
    assert first_start < dots[-1] < first_wait
    text = str(over)
    assert "collective_start[collective=mpi" in text and "collective_wait[tag=0" in text
    assert "_r0 = _collective_start" in source and "_r0.test()" in source
    assert "= _r0.wait()" in source and "= _r1.wait()" in source


def test_bucket_members_are_written_straight_into_the_flat_buffer():
    def f(x, w1, w2):
        g2 = dot_general(x, w1, MM)
        g3 = add(dot_general(x, w2, MM), 1.0)
        h = tanh(g3)                       # g3 is read again: it is copied in
        r2, r3, r4 = allreduce(g2), allreduce(g3), allreduce(tanh(x))
        g1 = dot_general(h, w2, MM)
        return [r2, r3, r4, allreduce(g1)]

    closed = trace(f, (8, 16), (16, 16), (16, 16))
    over, source = check_same(closed, 3 * 8 * 16 * 4)  # g2, g3, tanh(x) in one bucket
    assert names(over).count("collective_start") == 2
    assert "x3 combined (1536 bytes)" in str(over)
    # g2's product and tanh(x) write into slices of one buffer, g3 is copied there:
    # no concatenate
    assert "xp.empty(384" in source and "xp.concatenate" not in source
    assert "xp.matmul(v0, v1, out=v3[0:128].reshape((8, 16)))" in source, source
    assert "xp.tanh(v0, out=v3[256:384].reshape((8, 16)))" in source, source
    assert "v3[128:256] = " in source, source


def test_a_bias_gradient_sums_straight_into_the_flat_buffer():
    """A float sum over leading axes (a bias gradient) is a product with ones, which
    writes into its slice of the bucket as numpy's sum did."""
    from spmd.compiler.ops.reduce import reduce_sum

    def f(x, w):
        g = dot_general(x, w, MM)
        return [allreduce(reduce_sum(g, (0,))), allreduce(reduce_sum(tanh(g), (0,)))]

    closed = trace(f, (8, 16), (16, 16))
    over, source = check_same(closed, 1 << 20)
    assert "_blas_sum(" in source and "out=v" in source.split("_blas_sum(", 1)[1], source
    assert "xp.concatenate" not in source


def test_a_start_directly_followed_by_its_wait_stays_blocking():
    closed = trace(lambda a: [mul(allreduce(tanh(a)), 2.0)], (4, 4))
    over, source = check_same(closed, 1 << 20)
    assert "collective_start" not in names(over) and names(over).count("mpi") == 1
    assert ".wait()" not in source


def test_a_member_reading_another_members_result_leaves_the_stretch_alone():
    closed = trace(lambda a, b: [allreduce(add(allreduce(tanh(a)), 1.0)), allreduce(b)],
                   (4,), (4,))
    over, _ = check_same(closed, 1 << 20)
    assert over is closed


def test_collectives_never_move_across_another_collective():
    def f(x, w):
        g = dot_general(x, w, MM)
        r = allreduce(g)
        gathered = mpi.call("allgather", tanh(x), RANKS, what="all_gather")
        h = dot_general(x, w, MM)
        return [r, gathered, allreduce(tanh(h)), h]

    closed = trace(f, (8, 16), (16, 16))
    over, _ = check_same(closed, 1 << 20)
    # the first all-reduce starts and completes before the all-gather; the second,
    # with nothing left to overlap, is one blocking call after it
    effects = [n for n in names(over) if n in ("collective_start", "collective_wait", "mpi")]
    assert effects == ["collective_start", "collective_wait", "mpi", "mpi"]
    gather = next(e for e in over.program.eqns if e.params.get("kind") == "allgather")
    assert over.program.eqns.index(gather) == names(over).index("mpi")


def test_the_config_switch_turns_overlap_off_and_keeps_results():
    def f(a, b):
        ra = allreduce(spmd.numpy.tanh(a @ b))
        c = spmd.numpy.tanh(b @ b) @ b
        return ra * 2, allreduce(c) + 1

    a, b = np.ones((8, 8), np.float32), np.eye(8, dtype=np.float32) * 0.5
    old = config.overlap_bucket_bytes
    try:
        config.update("overlap_bucket_bytes", 256)
        on = spmd.jit(f)
        assert "collective_start" in on.lower(a, b).as_text(executed=True)
        got = on(a, b)
        config.update("overlap_bucket_bytes", 0)
        off = spmd.jit(f)
        text = off.lower(a, b).as_text(executed=True)
        assert "collective_start" not in text and "combined" in text
        for g, w in zip(got, off(a, b)):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    finally:
        config.update("overlap_bucket_bytes", old)


@pytest.mark.parametrize("bad", [-1, 2.5, "1", False])
def test_config_rejects_bad_overlap_bucket_sizes(bad):
    with pytest.raises(ArgumentError, match="overlap_bucket_bytes must be an int >= 0"):
        config.update("overlap_bucket_bytes", bad)


def test_a_bad_environment_value_is_named_at_import():
    import os
    import subprocess
    import sys

    env = dict(os.environ, SPMD_OVERLAP_BUCKET_BYTES="lots")
    proc = subprocess.run([sys.executable, "-c", "import spmd"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "SPMD_OVERLAP_BUCKET_BYTES='lots'" in proc.stderr


def test_the_data_parallel_step_on_simulated_devices_is_unchanged_by_the_switches():
    """On the local backend (simulated devices in this process) no collective can start
    without waiting: the step's results are the same bits with the passes on or off,
    and match the 1-device step."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import dp_step

    sizes = (12, 8, 8, 3)
    mesh = spmd.make_mesh((4,), ("d",))
    params = dp_step.make_params(sizes)
    x, y = dp_step.make_batch(16, sizes)
    old = config.overlap_bucket_bytes, config.combine_collectives_bytes
    results = {}
    try:
        for over, comb in ((0, 0), (1 << 21, 1 << 25), (64, 1 << 25)):
            config.update("overlap_bucket_bytes", over)
            config.update("combine_collectives_bytes", comb)
            steps = dp_step.make_steps(mesh, "d", with_grads=True)
            for form in ("grad outside", "grad inside"):
                text = steps[form].lower(params, x, y).as_text(executed=True)
                assert "collective_start" not in text
                results.setdefault(form, []).append(
                    [np.asarray(v) for v in spmd.tree_util.tree_leaves(steps[form](params, x, y))])
            one = [np.asarray(v) for v in
                   spmd.tree_util.tree_leaves(steps["1 device"](params, x, y))]
    finally:
        config.update("overlap_bucket_bytes", old[0])
        config.update("combine_collectives_bytes", old[1])
    for runs in results.values():
        for run in runs[1:]:
            for g, w in zip(run, runs[0]):
                np.testing.assert_array_equal(g, w)
        for g, w in zip(runs[0], one):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

"""Every collective across processes against numpy on the global arrays.

Runs on 4 ranks with one device each (``make test``), and on 2 ranks
with 2 devices each (``test_hybrid_subprocess.py``): the meshes are ``(4,)``
and ``(2, 2)`` in two device orders (``tests.mpi.make_mesh``), the collectives
run over single axes and tuples of axes in both orders.  Each device's block
is the ``c``-th row block of a global input; the body's results come back
stacked by device (``run_per_device``) and are compared with
:class:`tests.mpi.RefMesh`.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import (MESH_AXES, RefMesh, assert_local_blocks, axes_id,  # noqa: E402
                       make_mesh, run_per_device, values, x64_if)

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import P, lax  # noqa: E402

# Generic in the number of devices (even): also run on 2 ranks x 2 devices by
# test_hybrid_subprocess.py.
pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

DTYPES = [np.float32, np.float64, np.int32, np.float16, np.bool_]
DTYPE_IDS = ["f32", "f64", "i32", "f16", "bool"]
MA_IDS = [f"{k}-{axes_id(a)}" for k, a in MESH_AXES]


def _check(got, want, dtype):
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    if np.dtype(dtype).kind == "f":
        tol = 1e-2 if np.dtype(dtype) == np.float16 else 1e-6
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


def _run(kind, body, ref_fn, block_shape, dtype, seed=0):
    """Run ``body`` per device on row blocks of a random global input of ``dtype``;
    compare with ``ref_fn(ref, blocks, c)`` for every device ``c``."""
    mesh = make_mesh(kind)
    ref = RefMesh.of(mesh)
    n = mesh.size
    x = values((n * block_shape[0],) + tuple(block_shape[1:]), dtype, seed)
    with x64_if(dtype):
        got = run_per_device(mesh, body, x)
    blocks = ref.split_rows(x)
    want = ref.stack({c: ref_fn(ref, blocks, c) for c in ref.coords()})
    _check(got, want, dtype)


# ------------------------------------------------------------------ reductions

REDUCTIONS = [(op, dt) for op in ("psum", "pmean", "pmax", "pmin")
              for dt, name in zip(DTYPES, DTYPE_IDS)
              if not (dt == np.bool_ and op in ("psum", "pmean"))
              and not (op == "pmean" and np.dtype(dt).kind != "f")]


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("op,dtype", REDUCTIONS,
                         ids=[f"{op}-{np.dtype(dt).name}" for op, dt in REDUCTIONS])
def test_reductions(kind, axes, op, dtype):
    _run(kind, lambda b: getattr(lax, op)(b, axes),
         lambda ref, blocks, c: getattr(ref, op)(blocks, c, axes), (2, 3), dtype)


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
def test_psum_of_a_python_scalar_is_the_group_size(kind, axes):
    mesh = make_mesh(kind)
    got = run_per_device(mesh, lambda b: lax.psum(1, axes) + 0 * b[0, 0],
                         np.zeros((mesh.size, 1), np.float32))
    assert np.all(got == RefMesh.of(mesh).size(axes))


# ---------------------------------------------------------------- all_gather

@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("tiled", [False, True], ids=["stacked", "tiled"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_gather(kind, axes, axis, tiled, dtype):
    _run(kind, lambda b: lax.all_gather(b, axes, axis=axis, tiled=tiled),
         lambda ref, blocks, c: ref.all_gather(blocks, c, axes, axis, tiled), (2, 3), dtype)


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("tiled", [False, True], ids=["stacked", "tiled"])
def test_all_gather_invariant(kind, axes, tiled):
    _run(kind, lambda b: lax.all_gather(b, axes, axis=1, tiled=tiled, to="invarying"),
         lambda ref, blocks, c: ref.all_gather(blocks, c, axes, 1, tiled), (2, 3), np.float32)


# -------------------------------------------------------------- psum_scatter

@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("tiled", [False, True], ids=["untiled", "tiled"])
@pytest.mark.parametrize("dtype", DTYPES[:4], ids=DTYPE_IDS[:4])
def test_psum_scatter(kind, axes, dim, tiled, dtype):
    n = RefMesh.of(make_mesh(kind)).size(axes)
    # The scattered dimension holds n (untiled) or 2n (tiled) entries.
    size = 2 * n if tiled else n
    block = (size, 3) if dim == 0 else (2, size)
    _run(kind, lambda b: lax.psum_scatter(b, axes, scatter_dimension=dim, tiled=tiled),
         lambda ref, blocks, c: ref.psum_scatter(blocks, c, axes, dim, tiled), block, dtype)


# ---------------------------------------------------------------- all_to_all

A2A = [(0, 1), (1, 0), (0, 0), (1, 1)]


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("split_axis,concat_axis", A2A, ids=[f"s{s}c{c}" for s, c in A2A])
@pytest.mark.parametrize("tiled", [False, True], ids=["untiled", "tiled"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_to_all(kind, axes, split_axis, concat_axis, tiled, dtype):
    n = RefMesh.of(make_mesh(kind)).size(axes)
    block = [2, 3]
    block[split_axis] = 2 * n if tiled else n  # untiled: one entry per member
    _run(kind, lambda b: lax.all_to_all(b, axes, split_axis, concat_axis, tiled=tiled),
         lambda ref, blocks, c: ref.all_to_all(blocks, c, axes, split_axis, concat_axis,
                                               tiled), tuple(block), dtype)


# ------------------------------------------------------------------ ppermute

def _perms(n):
    return {"shift": [(i, (i + 1) % n) for i in range(n)],
            "reverse": [(i, n - 1 - i) for i in range(n)],
            "partial": [(0, n - 1)] if n > 1 else [(0, 0)]}


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("which", ["shift", "reverse", "partial"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_ppermute(kind, axes, which, dtype):
    perm = _perms(RefMesh.of(make_mesh(kind)).size(axes))[which]
    _run(kind, lambda b: lax.ppermute(b, axes, perm),
         lambda ref, blocks, c: ref.ppermute(blocks, c, axes, perm), (2, 3), dtype)


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
def test_ppermute_of_a_transposed_block(kind, axes):
    # The operand's last axis is not contiguous (a transpose's view): the received
    # buffer must still be one run of bytes (it kept the operand's strides and failed).
    perm = _perms(RefMesh.of(make_mesh(kind)).size(axes))["shift"]
    _run(kind, lambda b: lax.ppermute(snp.transpose(b), axes, perm),
         lambda ref, blocks, c: ref.ppermute(blocks, c, axes, perm).T, (2, 3), np.float32)


# float32 elements past the shared outboxes' slot (spmd.collectives.mpi.p2p, whose
# window is made collectively at a group's first move in range): MPI's own path.
_PAST_A_SLOT = (2 << 20) // 4 + 16


def _pair_of_ranks(monkeypatch):
    """``(comm, rank)`` for a test of the ``mpi`` backend's point-to-point calls between
    ranks 0 and 1: their communicator made collectively, before, and the checking mode
    off on every rank alike (it compares each collective across its ranks first:
    lockstep by design)."""
    from mpi4py import MPI

    from spmd.collectives import mpi as backend
    from spmd.collectives.mpi import control as mpi_control

    comm = MPI.COMM_WORLD
    monkeypatch.setattr(mpi_control, "_check", [False])
    if comm.Get_rank() in (0, 1):
        backend.communicator((0, 1), "the test's pair")
    return comm, comm.Get_rank()


def test_a_ppermute_sender_does_not_wait_for_its_receiver(monkeypatch):
    """A rank that sends and receives nothing returns at once: rank 0 sends 2 MiB
    (beyond any eager limit, and past the shared outboxes' slot: MPI's path; the
    outboxes' own test is tests/mpi/test_mpi_p2p.py) and reaches a barrier that rank 1
    passes before it posts its receive; a sender waiting for its message to be taken
    would never get there.  The caller's buffer is overwritten right after the call:
    the message keeps what was sent (it is a copy)."""
    from spmd.collectives import mpi as backend

    comm, r = _pair_of_ranks(monkeypatch)
    pair = (0, 1)
    sent = [np.arange(_PAST_A_SLOT, dtype=np.float32) + k for k in range(3)]
    # and small ones: a 0-d value, booleans, a transposed (non-contiguous) block
    small = [np.asarray(np.float32(2.5)), np.array([True, False, True]),
             np.arange(12, dtype=np.float64).reshape(3, 4).T]
    if r == 0:
        for x in sent:
            backend.sendrecv(x, pair, 1, None)
            x[:] = -1.0  # the code that gave x reuses its buffer at once
        for x in small:
            backend.sendrecv(x, pair, 1, None)
        comm.Barrier()
    elif r == 1:
        comm.Barrier()
        for k in range(3):
            got = backend.sendrecv(np.zeros(_PAST_A_SLOT, np.float32), pair, None, 0)
            np.testing.assert_array_equal(got, np.arange(_PAST_A_SLOT, dtype=np.float32) + k)
        for want in small:
            got = backend.sendrecv(np.zeros_like(want), pair, None, 0)
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    else:
        comm.Barrier()
    backend.settle_sends(wait=True)
    assert not backend.nonblocking._sends
    comm.Barrier()


def test_a_send_nobody_receives_holds_no_rank(monkeypatch):
    """Ranks that disagree: rank 0 sends and rank 1 has not posted its receive.  The
    sender returns, a later call settles only what finished, and the exit hook's
    wait for the pending send is bounded (it returns with the send still pending);
    the message is then received intact (past the outboxes' slot: MPI's path)."""
    from spmd.collectives import mpi as backend

    comm, r = _pair_of_ranks(monkeypatch)
    pair = (0, 1)
    x = np.arange(_PAST_A_SLOT, dtype=np.float32)
    if r == 0:
        backend.sendrecv(x, pair, 1, None)
        backend.settle_sends()          # does not wait for the receiver
        assert len(backend.nonblocking._sends) == 1
        backend.nonblocking._settle_at_exit(limit_s=0.2)  # bounded: returns, the send pending
        assert len(backend.nonblocking._sends) == 1 and not backend.nonblocking._sends[0][0].Test()
    comm.Barrier()
    if r == 1:
        np.testing.assert_array_equal(backend.sendrecv(np.zeros_like(x), pair, None, 0), x)
    backend.settle_sends(wait=True)
    assert not backend.nonblocking._sends
    comm.Barrier()


def test_a_started_exchange_is_read_at_its_wait(monkeypatch):
    """``isendrecv`` (a ppermute the overlap pass starts early): the receive is posted
    and the message sent at the start, the caller's buffer may be overwritten right
    after, and what came is read at the wait.  An exchange dropped before its wait (a
    program that raised in between) keeps its buffers until MPI is done with them."""
    from spmd.collectives import mpi as backend

    comm, r = _pair_of_ranks(monkeypatch)
    pair = (0, 1)
    if r in pair:
        other = 1 - r
        x = np.arange(1 << 16, dtype=np.float32) + r
        ex = backend.isendrecv(x, pair, other, other, "ppermute")
        x[:] = -1.0  # the code that gave x reuses its buffer at once
        work = np.tanh(np.ones((256, 256), np.float32) @ np.ones((256, 256), np.float32))
        assert ex.test() in (True, False)
        got = ex.wait()
        np.testing.assert_array_equal(got, np.arange(1 << 16, dtype=np.float32) + other)
        assert work.shape == (256, 256)
        kept = len(backend.nonblocking._abandoned)
        backend.isendrecv(np.full(8, r, np.float32), pair, other, other)  # dropped
        assert len(backend.nonblocking._abandoned) == kept + 1
        req, out, _ = backend.nonblocking._abandoned.pop()
        req.Wait()
        np.testing.assert_array_equal(out, np.full(8, other, np.float32))
    backend.settle_sends(wait=True)
    assert not backend.nonblocking._sends
    comm.Barrier()


# ---------------------------------------------------------------- axis_index

@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
def test_axis_index(kind, axes):
    _run(kind, lambda b: lax.axis_index(axes) + 0 * b[0, 0].astype(np.int32),
         lambda ref, blocks, c: ref.axis_index(blocks, c, axes), (1, 1), np.int32)


# ------------------------------------------- composed, jitted, and differentiated

@pytest.mark.parametrize("kind", ["1d", "2d", "2dT"])
def test_jitted_shard_map_chain_matches_eager(kind):
    """Two shard_maps chained: the first's output (spread over processes) feeds the
    second, eagerly and under jit."""
    mesh = make_mesh(kind)
    names = mesh.axis_names
    ref = RefMesh.of(mesh)
    first = spmd.shard_map(lambda b: b * 2 + lax.axis_index(names).astype(np.float32),
                           mesh=mesh, in_specs=P(names), out_specs=P(names))
    second = spmd.shard_map(lambda b: lax.psum(snp.sum(b ** 2), names), mesh=mesh,
                            in_specs=P(names), out_specs=P())
    x = values((mesh.size * 2, 3), np.float32)
    y = first(x)
    assert not y.is_fully_addressable
    blocks = ref.split_rows(x)
    want_y = np.concatenate([blocks[c] * 2 + ref.index(c, names) for c in ref.coords()])
    np.testing.assert_allclose(spmd.process_allgather(y), want_y)
    want = np.sum(want_y ** 2)
    np.testing.assert_allclose(float(second(y)), want, rtol=1e-6)
    np.testing.assert_allclose(float(spmd.jit(lambda v: second(first(v)))(x)), want, rtol=1e-6)


@pytest.mark.parametrize("kind,axes", MESH_AXES, ids=MA_IDS)
@pytest.mark.parametrize("coll", ["all_gather", "all_gather_tiled", "all_gather_invariant",
                                  "psum_scatter", "all_to_all", "ppermute", "psum", "pmax"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_gradients_of_collectives(kind, axes, coll, jit):
    """grad of sum(C(x) * r) for a collective C: the transpose of C applied to r, which
    the oracle gives column by column (C is linear; for pmax, on distinct values, a
    one-sided difference of 0.5 is exact: the derivative flows to the maximum)."""
    mesh = make_mesh(kind)
    ref = RefMesh.of(mesh)
    names = mesh.axis_names
    n = ref.size(axes)
    bodies = {
        "all_gather": (lambda b: lax.all_gather(b, axes),
                       lambda bl, c: ref.all_gather(bl, c, axes)),
        "all_gather_tiled": (lambda b: lax.all_gather(b, axes, axis=1, tiled=True),
                             lambda bl, c: ref.all_gather(bl, c, axes, 1, True)),
        # Typed invariant: its transpose keeps each device's block of the (summed)
        # cotangent, which is psum_scatter's result: the same gradient.
        "all_gather_invariant": (lambda b: lax.all_gather_invariant(b, axes, axis=1, tiled=True),
                                 lambda bl, c: ref.all_gather(bl, c, axes, 1, True)),
        "psum_scatter": (lambda b: lax.psum_scatter(b, axes, tiled=True),
                         lambda bl, c: ref.psum_scatter(bl, c, axes, 0, True)),
        "all_to_all": (lambda b: lax.all_to_all(b, axes, 0, 1, tiled=True),
                       lambda bl, c: ref.all_to_all(bl, c, axes, 0, 1, True)),
        "ppermute": (lambda b: lax.ppermute(b, axes, _perms(n)["shift"]),
                     lambda bl, c: ref.ppermute(bl, c, axes, _perms(n)["shift"])),
        "psum": (lambda b: lax.psum(b, axes), lambda bl, c: ref.psum(bl, c, axes)),
        "pmax": (lambda b: lax.pmax(b, axes), lambda bl, c: ref.pmax(bl, c, axes)),
    }
    body, oracle = bodies[coll]
    block = (2 * n, 2)
    x = values((mesh.size * block[0], block[1]), np.float32, seed=1)
    if coll == "pmax":  # distinct values: no ties
        x = np.random.default_rng(3).permutation(x.size).reshape(x.shape).astype(np.float32)
    out_block = oracle(ref.split_rows(x), ref.coords()[0]).shape
    r = values(mesh.axis_sizes + out_block, np.float32, seed=2)

    def loss(x, r):
        def per_device(b, rb):
            return lax.psum(snp.sum(body(b) * snp.reshape(rb, out_block)), names)
        return spmd.shard_map(per_device, mesh=mesh, in_specs=(P(names), P(*names)),
                              out_specs=P())(x, r)

    # d loss / d x[i] = sum(oracle(e_i) * r): the oracle is linear (pmax: locally).
    want = np.zeros(x.size, np.float64)
    for i in range(x.size):
        e = np.zeros(x.size, np.float32)
        e[i] = 1
        eps = e.reshape(x.shape)
        if coll == "pmax":  # the derivative at x: a one-sided difference of ints is exact
            plus = ref.stack({c: oracle(ref.split_rows(x + 0.5 * eps), c) for c in ref.coords()})
            base = ref.stack({c: oracle(ref.split_rows(x), c) for c in ref.coords()})
            want[i] = np.sum((plus - base) / 0.5 * r)
        else:
            want[i] = np.sum(ref.stack({c: oracle(ref.split_rows(eps), c)
                                        for c in ref.coords()}) * r)
    want = want.reshape(x.shape)
    g = (spmd.jit(spmd.grad(loss)) if jit else spmd.grad(loss))(x, r)
    if jit:  # jit results keep their sharding: compare this process's blocks
        assert_local_blocks(g, want.astype(np.float32), spmd.NamedSharding(mesh, P(names)))
    else:
        assert not g.is_fully_addressable
        np.testing.assert_allclose(spmd.process_allgather(g), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(loss(x, r)), np.sum(ref.stack(
        {c: oracle(ref.split_rows(x), c) for c in ref.coords()}) * r), rtol=1e-5)


def test_jit_output_is_marked_as_spread():
    mesh = make_mesh("1d")
    f = spmd.jit(spmd.shard_map(lambda b: b * 2, mesh=mesh, in_specs=P("i"),
                                out_specs=P("i")))
    x = np.arange(mesh.size * 2, dtype=np.float32)
    y = f(x)
    assert not y.is_fully_addressable
    np.testing.assert_allclose(spmd.process_allgather(y, tiled=True), x * 2)


def test_collective_time_counts_this_processes_collectives():
    """spmd.distributed.collective_time: one more call and some seconds per psum."""
    mesh = spmd.make_mesh((spmd.device_count(),), ("i",))
    f = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                                out_specs=P()))
    x = np.ones(spmd.device_count(), np.float32)
    f(x)  # traced, compiled and agreed on (fingerprints are control traffic)
    calls0, seconds0 = spmd.distributed.collective_time()
    for _ in range(5):
        np.testing.assert_array_equal(np.asarray(f(x)), [spmd.device_count()])
    calls1, seconds1 = spmd.distributed.collective_time()
    assert calls1 - calls0 == 5 and seconds1 > seconds0

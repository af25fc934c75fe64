"""The ``mpi`` equation's cheap call path: generated code calls the backend
operation with its parameters bound (``rules["bind_impl"]``,
:func:`spmd.collectives.backend.bound`), and ``_widen`` hands contiguous arrays
to MPI as they are.  Both must give exactly what the general impl gives.

Single-process, on a one-rank ``COMM_WORLD`` (skipped without mpi4py); the
multi-process behaviour is covered by the MPI suite (tests/mpi).
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest

import spmd  # noqa: F401  (fills the compiler's extension points)
from spmd.collectives import backend, mpi

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                                reason="mpi4py is not installed")

RANKS = (0,)
CASES = [  # (kind, params, operand)
    ("allreduce", {"op": "sum", "what": "psum"}, np.arange(12, dtype=np.float32).reshape(3, 4)),
    ("allreduce", {"op": "max", "what": "pmax"}, np.arange(6, dtype=np.float16)),
    ("allreduce", {"op": "sum", "what": "psum"}, np.array([True, False])),
    ("allgather", {"what": "all_gather"}, np.arange(6, dtype=np.int32).reshape(2, 3)),
    ("reduce_scatter", {"op": "sum", "what": "psum_scatter"},
     np.arange(8, dtype=np.float64).reshape(1, 8)),
    ("alltoall", {"what": "all_to_all"}, np.arange(4, dtype=np.float32).reshape(1, 4)),
    ("sendrecv", {"dst": None, "src": None, "what": "ppermute"}, np.ones(3, np.float32)),
]


def _full(params):
    return {"op": None, "dst": None, "src": None, "what": None, **params}


@pytest.mark.parametrize("kind,params,x", CASES, ids=[f"{c[0]}-{c[2].dtype}" for c in CASES])
def test_the_bound_operation_gives_what_the_impl_gives(kind, params, x):
    fn = mpi.mpi_p.rules.bind_impl(np, kind=kind, ranks=RANKS, **_full(params))
    if kind == "allreduce":  # its own bound form (the fast call after the first)
        assert isinstance(fn, mpi.primitive._BoundAllreduce)
    else:
        assert isinstance(fn, functools.partial) and fn.func is getattr(mpi, kind)
    want = mpi.mpi_p.impl(np, x, kind=kind, ranks=RANKS, **_full(params))
    for _ in range(3):  # the first call, then the later ones
        got = fn(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_the_bound_allreduce_takes_its_fast_call_only_for_the_operand_it_learned():
    fn = mpi.mpi_p.rules.bind_impl(np, kind="allreduce", ranks=RANKS,
                                      **_full({"op": "sum", "what": "psum"}))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    fn(x)
    assert fn.fast is not None and fn.fast[:2] == ((3, 4), np.dtype(np.float32))
    others = [x.T,                                   # not contiguous
              np.arange(12, dtype=np.int32).reshape(3, 4),  # another dtype
              np.arange(6, dtype=np.float32),        # another shape
              x.astype(np.float16),                  # widened for MPI
              np.float32(3.0)]                       # not an ndarray
    for y in others:
        got = fn(y)
        want = mpi.mpi_p.impl(np, y, kind="allreduce", ranks=RANKS,
                              **_full({"op": "sum", "what": "psum"}))
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert fn.fast[:2] == ((3, 4), np.dtype(np.float32))  # (kept: the first one learned)
    big = np.ones(mpi.POOL_MIN_BYTES // 4, np.float32)  # pooled receive buffers: no fast call
    fresh = mpi.mpi_p.rules.bind_impl(np, kind="allreduce", ranks=RANKS,
                                         **_full({"op": "sum", "what": "psum"}))
    np.testing.assert_array_equal(fresh(big), big)
    assert fresh.fast is None


def test_other_array_modules_and_unknown_kinds_keep_the_impl():
    class OtherModule:  # e.g. cupy: the impl stages through host memory
        __name__ = "cupy"

    bind = mpi.mpi_p.rules.bind_impl
    assert bind(OtherModule(), kind="allreduce", ranks=RANKS, op="sum") is None
    assert bind(np, kind="iallreduce_start", ranks=RANKS, op="sum") is None


def test_bound_names_the_kinds_for_an_unknown_one():
    with pytest.raises(ValueError, match=r"unknown transport kind 'allreduse'.*'allreduce'"):
        backend.bound(mpi, "allreduse", RANKS, {})


def test_generated_code_calls_the_backend_operation_directly():
    from spmd.compiler.core.avals import ShapedArray
    from spmd.compiler.engine.codegen import compile_program
    from spmd.compiler.core.trace import trace_to_program

    closed = trace_to_program(lambda x: [mpi.call("allreduce", x, RANKS, op="sum",
                                                   what="psum")],
                              [ShapedArray((2, 3), np.dtype(np.float32), False)])
    exe = compile_program(closed, np)
    bound = [v for k, v in exe.fn.__globals__.items() if k.startswith("_mpi_")]
    assert len(bound) == 1 and isinstance(bound[0], mpi.primitive._BoundAllreduce), exe.source
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (out,) = exe(x)
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("x", [np.arange(6, dtype=np.float32).reshape(2, 3),
                               np.array(2.5, np.float32)],
                         ids=["2d", "0d"])
def test_widen_passes_contiguous_arrays_as_they_are(x):
    buf, orig = mpi.buffers.widen(x)
    assert buf is x and orig is None


@pytest.mark.parametrize("x,dtype", [
    (np.arange(6, dtype=np.float32).reshape(2, 3).T, np.float32),  # transposed: C copy
    (np.arange(6, dtype=np.float32)[::2], np.float32),              # strided: C copy
    (np.arange(4, dtype=np.float16), np.float32),                   # widened for MPI
    (np.array([True, False]), np.uint8),
    (np.float32(3.0), np.float32),                                   # a numpy scalar
], ids=["transposed", "strided", "f16", "bool", "scalar"])
def test_widen_copies_what_mpi_cannot_read_as_it_is(x, dtype):
    buf, orig = mpi.buffers.widen(x)
    assert buf is not x and buf.flags.c_contiguous and buf.dtype == dtype
    assert buf.shape == np.shape(x)
    np.testing.assert_array_equal(buf, np.asarray(x).astype(dtype))
    assert orig == (x.dtype if dtype != x.dtype else None)

"""``make_array_from_process_local_data`` with local data that does not make one global
array (issue 58): every rank raises at that call, naming each rank's shapes and the
fix, and no rank is left waiting (the next call over the same ranks works).  Before,
ranks giving 2 and 3 rows built arrays of 8 and 12 rows, and the mismatch surfaced
later as a ProgramMismatchError at some jit.

Generic in the number of devices per process; runs on 4 ranks with one device each.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import make_mesh  # noqa: E402

import spmd  # noqa: E402
from spmd import NamedSharding, P  # noqa: E402
from spmd.errors import ShapeError  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

FNAME = "make_array_from_process_local_data"


def _rows(mesh, per_device):
    """This process's rows when each of its devices holds ``per_device`` rows: the
    values of row i are i (numbered over the whole agreeing array)."""
    n, me = len(mesh.local_devices), spmd.process_index()
    start = me * n * per_device
    return np.repeat(np.arange(start, start + n * per_device, dtype=np.float32)[:, None],
                     3, axis=1)


def _agreeing_call_works(mesh):
    """The same ranks, right after the error: one global array, as asked."""
    a = spmd.make_array_from_process_local_data(NamedSharding(mesh, P("i")), _rows(mesh, 2))
    assert a.shape == (2 * mesh.size, 3)
    np.testing.assert_array_equal(spmd.process_allgather(a)[:, 0], np.arange(2 * mesh.size))


def test_different_local_shapes_raise_on_every_rank_naming_each_ranks_shapes():
    mesh = make_mesh("1d")
    me, n = spmd.process_index(), len(mesh.local_devices)
    s = NamedSharding(mesh, P("i"))
    per_device = 3 if me == 1 else 2  # rank 1's last batch is longer
    with pytest.raises(ShapeError) as info:
        spmd.make_array_from_process_local_data(s, _rows(mesh, per_device))
    msg = str(info.value)
    others = ", ".join(str(r) for r in range(spmd.process_count()) if r != 1)
    assert msg.startswith(f"{FNAME}: the processes of the mesh would build arrays of "
                          "different global shapes"), msg
    short, long_ = (2 * n, 3), (3 * n, 3)
    assert (f"rank{'s' if spmd.process_count() > 2 else ''} {others}: local_data {short} "
            f"float32 -> global shape {(2 * mesh.size, 3)} float32") in msg, msg
    assert f"rank 1: local_data {long_} float32 -> global shape {(3 * mesh.size, 3)} " \
           "float32" in msg, msg
    assert "pass the same global_shape= everywhere" in msg, msg
    _agreeing_call_works(mesh)


def test_different_dtypes_raise_on_every_rank():
    mesh = make_mesh("1d")
    s = NamedSharding(mesh, P("i"))
    local = _rows(mesh, 2)
    if spmd.process_index() == 1:
        local = local.astype(np.int32)
    with pytest.raises(ShapeError, match=re.escape(f"{(2 * mesh.size, 3)} int32")) as info:
        spmd.make_array_from_process_local_data(s, local)
    assert f"global shape {(2 * mesh.size, 3)} float32" in str(info.value)
    _agreeing_call_works(mesh)


def test_one_ranks_own_error_is_every_ranks_error():
    """Rank 1 alone gives local data that does not fit global_shape: it fails its own
    check, and the others, which passed theirs, raise too instead of waiting for it."""
    mesh = make_mesh("1d")
    s = NamedSharding(mesh, P("i"))
    me = spmd.process_index()
    shape = (2 * mesh.size, 3)
    local = _rows(mesh, 2)[:-1] if me == 1 else _rows(mesh, 2)
    with pytest.raises(ShapeError) as info:
        spmd.make_array_from_process_local_data(s, local, shape)
    msg = str(info.value)
    assert msg.startswith(f"{FNAME}: the processes of the mesh would build arrays"), msg
    n = len(mesh.local_devices)
    assert f"rank 1: local_data {(2 * n - 1, 3)} float32 -> error: {FNAME}: local_data has shape" in msg, msg
    assert f"-> global shape {shape} float32" in msg, msg
    # The failing rank's own error is the cause.
    cause = info.value.__cause__
    assert (cause is not None and "must have shape" in str(cause)) == (me == 1)
    _agreeing_call_works(mesh)


def test_the_same_error_on_every_rank_is_raised_as_it_is():
    mesh = make_mesh("1d")
    s = NamedSharding(mesh, P("i"))
    with pytest.raises(ShapeError, match="not divisible") as info:
        spmd.make_array_from_process_local_data(s, np.zeros((2, 8), np.float32),
                                                (4 * mesh.size + 1, 8))
    assert info.value.__cause__ is None
    _agreeing_call_works(mesh)


def test_agreeing_local_data_with_and_without_global_shape():
    mesh = make_mesh("1d")
    s = NamedSharding(mesh, P("i"))
    want = np.arange(2 * mesh.size, dtype=np.float32)
    for shape in (None, (2 * mesh.size, 3)):
        a = spmd.make_array_from_process_local_data(s, _rows(mesh, 2), shape)
        assert a.shape == (2 * mesh.size, 3) and a.dtype == np.float32
        np.testing.assert_array_equal(spmd.process_allgather(a)[:, 0], want)
    # Replicated: every rank gives the whole (same) value.
    whole = np.ones((4, 3), np.float32)
    r = spmd.make_array_from_process_local_data(NamedSharding(mesh, P()), whole)
    np.testing.assert_array_equal(spmd.process_allgather(r), whole)

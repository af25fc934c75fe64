"""``snp.repeat(x, repeats, total_repeat_length=n)``: ``repeats`` static or traced, the
result ``n`` long, as in JAX (cut short when the repeats sum to more, the last element
repeated when they sum to less), eagerly, under ``jit``, and under ``vmap`` of a
``shard_map`` with per-device repeats.  Oracle: numpy's repeat, cut or padded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import spmd
import spmd.numpy as snp
from spmd import P
from spmd.errors import ArgumentError, ShapeError


def _oracle(x, reps, n, axis=0):
    full = np.repeat(x, reps, axis=axis)
    if full.shape[axis] >= n:
        return np.take(full, np.arange(n), axis=axis)
    last = np.take(x, [x.shape[axis] - 1], axis=axis)
    pad = np.repeat(last, n - full.shape[axis], axis=axis)
    return np.concatenate([full, pad], axis=axis)


@given(st.lists(st.integers(0, 4), min_size=1, max_size=6), st.integers(1, 12),
       st.booleans())
def test_static_and_traced_repeats(reps, n, jit):
    x = np.arange(len(reps) * 2, dtype=np.float32).reshape(len(reps), 2)
    r = np.array(reps, np.int32)
    f = lambda x, r: snp.repeat(x, r, axis=0, total_repeat_length=n)  # noqa: E731
    got = (spmd.jit(f) if jit else f)(x, r)
    np.testing.assert_array_equal(np.asarray(got), _oracle(x, r, n))


def test_a_scalar_repeat_and_a_flattened_input():
    x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(snp.repeat(x, 2, total_repeat_length=9)),
                                  _oracle(x.ravel(), 2, 9))
    np.testing.assert_array_equal(np.asarray(snp.repeat(x, 3, axis=1, total_repeat_length=4)),
                                  _oracle(x, 3, 4, axis=1))
    assert snp.repeat(x, 3, axis=1, total_repeat_length=0).shape == (2, 0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_traced_repeats_under_vmap_of_a_shard_map(jit):
    mesh = spmd.make_mesh((4,), ("i",))
    body = lambda x, r: snp.repeat(x, r, total_repeat_length=8)  # noqa: E731
    f = spmd.vmap(spmd.shard_map(body, mesh=mesh, in_specs=(P("i"), P("i")), out_specs=P("i")))
    x = np.arange(48, dtype=np.float32).reshape(3, 16)
    r = np.tile(np.array([1, 3, 2, 2], np.int32), (3, 4))
    r[1, :4] = [0, 0, 1, 1]  # a device whose repeats sum to 2: its last element fills
    got = np.asarray((spmd.jit(f) if jit else f)(x, r))
    want = np.stack([np.concatenate([_oracle(x[k, 4 * d:4 * d + 4], r[k, 4 * d:4 * d + 4], 8)
                                     for d in range(4)]) for k in range(3)])
    np.testing.assert_array_equal(got, want)


def test_errors_name_the_argument():
    x = np.arange(4.0, dtype=np.float32)
    with pytest.raises(ArgumentError, match=r"total_repeat_length=-1 must be >= 0"):
        snp.repeat(x, 2, total_repeat_length=-1)
    with pytest.raises(ArgumentError, match=r"repeats must be integers, got float32"):
        snp.repeat(x, np.ones(4, np.float32), total_repeat_length=4)
    with pytest.raises(ShapeError, match=r"3 repeats for an axis of size 4"):
        snp.repeat(x, np.ones(3, np.int32), total_repeat_length=4)

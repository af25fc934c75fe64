"""Shared utilities for the ``spmd.numpy`` oracle tests (numpy is the oracle).

Every check runs a function in one of two modes:

* ``"eager"``: array arguments are first turned into ``spmd.Array`` (so that
  Python operators dispatch to spmd, not numpy) and the function is called;
* ``"jit"``: the function is wrapped in ``spmd.jit`` and called on the raw
  numpy arguments.

The expected dtype is always given explicitly (JAX's 32-bit rules), never
derived from numpy, whose promotion rules differ.

The module has a unique name (not ``_helpers``) so that it cannot collide with
a helper module of the same name in a sibling test directory that also has no
``__init__.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp

MODES = ("eager", "jit")

F16 = np.dtype(np.float16)
C64 = np.dtype(np.complex64)
F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)
BOOL = np.dtype(np.bool_)

try:  # hypothesis settings shared by the property tests
    from hypothesis import HealthCheck, settings

    # max_examples comes from the active profile (tests/conftest.py: `ci`)
    HYP = settings(
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture,
                               HealthCheck.too_slow],
    )
except ImportError:  # pragma: no cover
    HYP = None


@pytest.fixture(params=MODES)
def mode(request):
    """Run a test eagerly and under ``spmd.jit``."""
    return request.param


# ---------------------------------------------------------------------------
# random inputs


def rand(shape=(), dtype=np.float32, seed=0, low=None, high=None):
    """A reproducible random numpy array.

    floats: standard normal, or uniform in [low, high) when both are given;
    ints: uniform integers in [low, high) (default [-5, 6), [0, 6) unsigned);
    bools: fair coin flips.
    """
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind in "iu":
        if low is None:
            low = 0 if dtype.kind == "u" else -5
        if high is None:
            high = 6
        return np.asarray(rng.integers(low, high, size=shape), dtype=dtype)
    if dtype.kind == "f":
        if low is None and high is None:
            vals = rng.standard_normal(shape)
        else:
            vals = rng.uniform(low, high, size=shape)
        return np.asarray(vals, dtype=dtype)
    raise ValueError(f"rand: unsupported dtype {dtype}")


def rand_nonzero(shape=(), dtype=np.float32, seed=0):
    """Values bounded away from zero, random sign: |x| in [0.5, 3) or 1..5."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    sign = np.where(rng.random(shape) < 0.5, -1, 1)
    if dtype.kind in "iu":
        return np.asarray(sign * rng.integers(1, 6, size=shape), dtype=dtype)
    return np.asarray(sign * rng.uniform(0.5, 3.0, size=shape), dtype=dtype)


def rand_intlike(shape=(), dtype=np.float32, seed=0, low=-10, high=11, nonzero=False):
    """Integer-valued floats (exact in float32), for ``//`` and ``%``."""
    rng = np.random.default_rng(seed)
    vals = rng.integers(low, high, size=shape)
    if nonzero:
        vals = np.where(vals == 0, 1, vals)
    return np.asarray(vals, dtype=dtype)


# ---------------------------------------------------------------------------
# running and comparing


def to_spmd(a):
    """numpy arrays -> spmd.Array; anything else (Python scalars) unchanged."""
    if isinstance(a, np.ndarray):
        return snp.asarray(a)
    return a


def run(fn, args, mode, **jit_kwargs):
    """Call ``fn(*args)`` eagerly (on spmd.Array arguments) or under jit."""
    if mode == "eager":
        return fn(*[to_spmd(a) for a in args])
    if mode == "jit":
        return spmd.jit(fn, **jit_kwargs)(*args)
    raise ValueError(mode)


def _up(a):
    """Float numpy arrays -> float64, so the oracle is more precise than spmd."""
    if isinstance(a, np.ndarray) and a.dtype.kind == "f":
        return a.astype(np.float64)
    if isinstance(a, np.ndarray) and a.dtype.kind == "c":
        return a.astype(np.complex128)
    return a


def assert_array(out, expected, dtype, rtol=1e-5, atol=1e-6):
    """``out`` is an spmd.Array of ``dtype`` and ``expected``'s shape and values."""
    expected = np.asarray(expected)
    dtype = np.dtype(dtype)
    assert isinstance(out, spmd.Array), f"expected spmd.Array, got {type(out)}"
    assert tuple(out.shape) == expected.shape, (tuple(out.shape), expected.shape)
    assert np.dtype(out.dtype) == dtype, f"dtype {out.dtype}, expected {dtype}"
    assert out.ndim == expected.ndim
    assert out.size == expected.size
    got = np.asarray(out)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.dtype == dtype, f"np.asarray dtype {got.dtype}, expected {dtype}"
    if dtype.kind == "f":
        if dtype == F16:
            rtol, atol = max(rtol, 2e-3), max(atol, 2e-3)
        np.testing.assert_allclose(
            got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol
        )
    elif dtype.kind == "c":
        np.testing.assert_allclose(
            got.astype(np.complex128), expected.astype(np.complex128), rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, expected.astype(dtype))


def assert_tree(out, expected, dtype, rtol=1e-5, atol=1e-6):
    """Like assert_array, recursing through lists/tuples (e.g. ``split``)."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(out, (list, tuple)), f"expected a sequence, got {type(out)}"
        assert len(out) == len(expected), (len(out), len(expected))
        for o, e in zip(out, expected):
            assert_tree(o, e, dtype, rtol, atol)
    else:
        assert_array(out, expected, dtype, rtol, atol)


def check(fn, ref, *args, mode, dtype, rtol=1e-5, atol=1e-6, upcast=True, **jit_kwargs):
    """Run ``fn`` in ``mode`` and compare with ``ref`` (numpy) on the same args.

    Float arguments are upcast to float64 for the numpy oracle unless
    ``upcast=False``.  Returns spmd's output.
    """
    out = run(fn, args, mode, **jit_kwargs)
    np_args = [_up(a) for a in args] if upcast else list(args)
    expected = ref(*np_args)
    assert_tree(out, expected, dtype, rtol, atol)
    return out


def same(fn, *args, mode, dtype, rtol=1e-5, atol=1e-6, upcast=True):
    """``check`` with the same function as its own oracle (works for operators
    and methods that numpy arrays share with spmd arrays)."""
    return check(fn, fn, *args, mode=mode, dtype=dtype, rtol=rtol, atol=atol,
                 upcast=upcast)

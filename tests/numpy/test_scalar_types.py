"""The scalar types (``snp.float32`` and friends): constructors on any value, dtypes everywhere.

Oracle: numpy's conversion ``np.asarray(x, dtype)`` of the same values (narrowed to
32 bits unless x64 is on), and finite differences for the gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P
from spmd.compiler.core import dtypes
from spmd.errors import DTypeError

NAMES = ["bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
         "float16", "float32", "float64", "complex64", "complex128"]
if dtypes.bfloat16 is not None:
    NAMES.append("bfloat16")
NARROW = {"int64": np.int32, "uint64": np.uint32, "float64": np.float32,
          "complex128": np.complex64}
VALUES = np.array([0.0, 1.0, 2.75, 7.0], np.float32)


def _want(name: str, x, x64: bool = False):
    target = np.dtype(getattr(snp, name))
    if not x64:
        target = np.dtype(NARROW.get(name, target))
    return np.asarray(x).astype(target)


def _check(got, want):
    assert isinstance(got, snp.ndarray), type(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("name", NAMES)
def test_eager_matches_numpy(name):
    _check(getattr(snp, name)(VALUES), _want(name, VALUES))


@pytest.mark.parametrize("name", NAMES)
def test_under_jit(name):
    f = spmd.jit(lambda x: getattr(snp, name)(x))
    _check(f(snp.asarray(VALUES)), _want(name, VALUES))


@pytest.mark.parametrize("name", NAMES)
def test_under_vmap(name):
    x = np.stack([VALUES, VALUES[::-1]])
    _check(spmd.vmap(getattr(snp, name))(snp.asarray(x)), _want(name, x))


@pytest.mark.parametrize("name", ["float16", "float32", "int8", "uint32", "bool_", "complex64"])
def test_in_shard_map_body(name):
    mesh = spmd.make_mesh((4,), ("i",))
    x = np.arange(8, dtype=np.float32) * 1.5
    f = spmd.shard_map(lambda b: getattr(snp, name)(b), mesh=mesh, in_specs=P("i"),
                       out_specs=P("i"))
    _check(spmd.jit(f)(snp.asarray(x)), _want(name, x))


def test_python_scalars_and_lists():
    _check(snp.float32(3), np.asarray(3, np.float32))
    _check(snp.int16(2.9), np.asarray(2, np.int16))
    _check(snp.bool_(0.5), np.asarray(True))
    _check(snp.float32([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]], np.float32))
    _check(snp.complex64(1 + 2j), np.asarray(1 + 2j, np.complex64))
    # A list holding traced values is stacked, as snp.asarray does.
    f = spmd.jit(lambda a, b: snp.float16([a, b]))
    _check(f(snp.asarray(1.0), snp.asarray(2.5)), np.array([1.0, 2.5], np.float16))


def test_result_is_not_weakly_typed():
    # float32(2.0) is a float32 array: it promotes with float16 to float32 (a weak 2.0 would not).
    assert (snp.float32(2.0) * snp.ones(2, snp.float16)).dtype == np.float32
    f = spmd.jit(lambda x: snp.float32(x) * snp.ones(2, snp.float16))
    assert f(2.0).dtype == np.float32  # a weak traced Python float made strong


def test_x64_mode_keeps_64_bits(x64):
    for name in ("float64", "int64", "uint64", "complex128"):
        _check(getattr(snp, name)(VALUES), _want(name, VALUES, x64=True))
    _check(spmd.jit(snp.float64)(snp.asarray(VALUES)), VALUES.astype(np.float64))


def test_grad_through_float_conversion():
    # d/dx sum(float32(x16)^2 * 3) = 6 x, through a float16 -> float32 convert.
    def f(x):
        return snp.sum(snp.float32(x) ** 2 * 3.0)

    x = snp.asarray(VALUES)
    np.testing.assert_allclose(np.asarray(spmd.grad(f)(x)), 6 * VALUES, rtol=1e-6)
    g = spmd.grad(lambda x: snp.sum(snp.float16(x) * 2.0))(x)  # f32 -> f16 -> back
    assert g.dtype == np.float32
    np.testing.assert_allclose(np.asarray(g), np.full(4, 2.0))
    # finite differences on a nonlinear function of the converted value
    h = lambda x: snp.sin(snp.float32(x)) * snp.float32(x)  # noqa: E731
    eps = 1e-3
    fd = (np.asarray(h(2.0 + eps)) - np.asarray(h(2.0 - eps))) / (2 * eps)
    np.testing.assert_allclose(np.asarray(spmd.grad(h)(2.0)), fd, rtol=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_usable_as_a_dtype(name):
    t, nt = getattr(snp, name), np.dtype(getattr(snp, name)).type
    assert np.dtype(t) == np.dtype(nt) and snp.dtype(t) == np.dtype(nt)
    assert t == nt and nt == t and t == np.dtype(nt) and not (t != nt)
    assert hash(t) == hash(nt) and {nt: 1}[t] == 1
    want = np.dtype(NARROW.get(name, nt))
    assert snp.zeros(3, t).dtype == want
    assert snp.zeros(3, dtype=t).dtype == want
    assert snp.ones(3).astype(t).dtype == want
    assert snp.asarray([1, 0], dtype=t).dtype == want
    assert snp.zeros(3, t).dtype == getattr(snp, want.name if want.name != "bool" else "bool_")
    assert np.zeros(2, t).dtype == np.dtype(nt)  # numpy takes it too
    if name not in ("bool_", "bfloat16"):
        assert snp.issubdtype(t, snp.number) and np.issubdtype(t, np.number)


def test_isinstance_and_subdtype_follow_jax():
    assert isinstance(np.float32(1), snp.float32)
    assert not isinstance(np.float64(1), snp.float32)
    assert not isinstance(snp.float32(1), snp.float32)  # an Array, as in JAX
    assert snp.issubdtype(snp.float32, snp.floating)
    assert not snp.issubdtype(snp.int8, snp.floating)
    assert snp.issubdtype(snp.uint8, snp.unsignedinteger)
    assert snp.finfo(snp.float16).eps == np.finfo(np.float16).eps
    assert snp.iinfo(snp.int8).max == 127
    assert snp.float32 != snp.float64 and snp.float32 is not np.float32
    assert repr(snp.float32) == "<class 'spmd.numpy.float32'>"


def test_jit_static_dtype_argument():
    f = spmd.jit(lambda x, dt: x.astype(dt), static_argnums=1)
    assert f(snp.ones(2), snp.int8).dtype == np.int8
    assert f(snp.ones(2), np.int8).dtype == np.int8


def test_bad_inputs_raise_named_errors():
    with pytest.raises(DTypeError, match="spmd.numpy.float32"):
        snp.float32(1 + 2j)  # would drop the imaginary part
    with pytest.raises(DTypeError, match="spmd.numpy.int32"):
        snp.int32("12")
    with pytest.raises(TypeError):
        snp.float32()  # the value is required, as in JAX


def test_a_scalar_type_is_not_a_value():
    for bad in (lambda: snp.float32(snp.float32), lambda: snp.asarray(snp.int8),
                lambda: snp.sin(snp.float32)):
        with pytest.raises(DTypeError, match="got the type .* where a value is expected"):
            bad()
    with pytest.raises(DTypeError, match="_ScalarMeta"):
        spmd.jit(lambda x: x)(snp.float32)  # as an argument: mark it static instead

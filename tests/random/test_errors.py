"""Bad input to spmd.random: each case raises a specific error naming the argument and the fix."""

import numpy as np
import pytest

import spmd
from spmd import random as sr
from spmd.errors import ArgumentError, DTypeError, ShapeError


def test_arithmetic_on_typed_keys_names_key_data():
    k = sr.key(0)
    for op in (lambda: k + 1, lambda: 1 + k, lambda: k * 2, lambda: -k, lambda: k ^ k,
               lambda: k < k, lambda: int(k)):
        with pytest.raises(DTypeError, match="key_data"):
            op()


def test_numpy_conversion_of_typed_keys_names_key_data():
    with pytest.raises(DTypeError, match="key_data"):
        np.asarray(sr.key(0))
    with pytest.raises(DTypeError, match="key_data"):
        sr.key(0) == sr.key(0)  # noqa: B015


def test_wrap_key_data_of_a_typed_key_says_how_to_convert():
    with pytest.raises(DTypeError, match=r"key_data\(key\)"):
        sr.wrap_key_data(sr.key(0))
    assert sr.wrap_key_data(sr.PRNGKey(0)).shape == ()


@pytest.mark.parametrize("bad", [np.zeros(3, np.uint32), np.zeros(2, np.int32),
                                 np.zeros(2, np.float32), np.uint32(5)])
def test_malformed_legacy_keys(bad):
    with pytest.raises(DTypeError, match="wrap_key_data|uint32\\[..., 2\\]"):
        sr.normal(bad, (2,))


def test_non_keys():
    with pytest.raises(DTypeError, match="spmd.random.key"):
        sr.uniform(3, (2,))
    with pytest.raises(DTypeError, match="not a PRNG key"):
        sr.split("seed")


def test_batch_of_keys_where_one_is_required():
    with pytest.raises(ShapeError, match="vmap"):
        sr.uniform(sr.split(sr.key(0), 2), (3,))
    with pytest.raises(ShapeError, match="vmap"):
        sr.split(sr.split(sr.key(0), 2))


@pytest.mark.parametrize("seed,exc", [(1.5, DTypeError), ("3", DTypeError),
                                      (np.array([1, 2]), ShapeError),
                                      (np.float32(2.0), DTypeError), (2**64, OverflowError)])
def test_bad_seeds(seed, exc):
    with pytest.raises(exc, match="seed"):
        sr.key(seed)
    with pytest.raises(exc, match="seed"):
        sr.PRNGKey(seed)


def test_seed_of_a_typed_key():
    with pytest.raises(DTypeError, match="already a typed key"):
        sr.key(sr.key(0))


@pytest.mark.parametrize("shape", [3.0, (2, 1.5), (2, -1), "ab", None, (np.float32(2),)])
def test_bad_shapes(shape):
    with pytest.raises(ShapeError, match="shape"):
        sr.normal(sr.key(0), shape)


def test_shape_not_a_broadcast_of_parameters():
    with pytest.raises(ShapeError, match="broadcast"):
        sr.uniform(sr.key(0), (3,), minval=np.zeros(4, np.float32))
    with pytest.raises(ShapeError, match="broadcast"):
        sr.bernoulli(sr.key(0), np.full(3, 0.5, np.float32), (2,))


def test_wrong_dtypes():
    with pytest.raises(DTypeError, match="float dtype"):
        sr.uniform(sr.key(0), (2,), np.int32)
    with pytest.raises(DTypeError, match="integer dtype"):
        sr.randint(sr.key(0), (2,), 0, 3, np.float32)
    with pytest.raises(DTypeError, match="unsigned"):
        sr.bits(sr.key(0), (2,), np.int32)
    with pytest.raises(DTypeError, match="minval"):
        sr.randint(sr.key(0), (2,), True, 3)


def test_minval_maxval_types():
    with pytest.raises(DTypeError, match="number or an array"):
        sr.uniform(sr.key(0), (2,), minval="0")


def test_randint_with_empty_range_returns_minval_as_jax():
    x = np.asarray(sr.randint(sr.key(0), (5,), 4, 2))
    np.testing.assert_array_equal(x, 4)


def test_choice_without_replacement_of_too_many():
    with pytest.raises(ArgumentError, match="replace=False"):
        sr.choice(sr.key(0), 5, (6,), replace=False)
    with pytest.raises(ShapeError, match="p has shape"):
        sr.choice(sr.key(0), 5, (2,), p=np.ones(4, np.float32) / 4)
    with pytest.raises(ArgumentError, match="empty"):
        sr.choice(sr.key(0), 0, (2,))


def test_split_and_fold_in_arguments():
    with pytest.raises(ArgumentError, match="num"):
        sr.split(sr.key(0), -1)
    with pytest.raises(ArgumentError, match="num"):
        sr.split(sr.key(0), 2.0)
    with pytest.raises(DTypeError, match="data"):
        sr.fold_in(sr.key(0), 1.5)
    with pytest.raises(OverflowError, match="data"):
        sr.fold_in(sr.key(0), 2**40)
    with pytest.raises(DTypeError, match="data"):
        sr.fold_in(sr.key(0), np.zeros(2, np.int32))


def test_unknown_impl_and_modes():
    with pytest.raises(ArgumentError, match="threefry2x32"):
        sr.key(0, impl="rbg")
    with pytest.raises(ArgumentError, match="mode"):
        sr.gumbel(sr.key(0), (2,), mode="high")
    with pytest.raises(ArgumentError, match="axis"):
        sr.categorical(sr.key(0), np.zeros(3, np.float32), axis=2)
    with pytest.raises(ShapeError, match="batch shape"):
        sr.categorical(sr.key(0), np.zeros((2, 3), np.float32), shape=(4,))


def test_errors_under_jit_too():
    with pytest.raises(ShapeError, match="shape"):
        spmd.jit(lambda k: sr.normal(k, (2, -1)))(sr.key(0))


def test_legacy_key_where_a_typed_key_or_seed_is_expected():
    legacy = sr.PRNGKey(3)
    with pytest.raises(DTypeError, match="wrap_key_data"):
        sr.key(legacy)
    with pytest.raises(DTypeError, match="wrap_key_data"):
        sr.stateful_rng(legacy)
    # The conversion it names works both ways.
    typed = sr.wrap_key_data(legacy)
    np.testing.assert_array_equal(sr.key_data(typed), legacy)
    assert sr.stateful_rng(typed).key().shape == ()
    with pytest.raises(ArgumentError, match="one key"):
        sr.stateful_rng(sr.split(typed, 2))

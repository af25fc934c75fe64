"""JAX semantics of issue 14: item assignment points to ``.at``; list operands raise
TypeError; ``.at[i].get(mode='fill'|'clip')`` honours the mode eagerly too."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp


@pytest.mark.parametrize("idx,text", [(0, "0"), ((slice(1, 2), 0), "1:2, 0"),
                                      ((Ellipsis, None), "..., None"),
                                      (slice(None, None, 2), "::2"), (np.array([1]), "idx")])
def test_item_assignment_points_to_at(idx, text):
    x = snp.zeros((3, 3))
    with pytest.raises(TypeError, match=rf"x = x\.at\[{__import__('re').escape(text)}\]\.set\(1\)"):
        x[idx] = 1


def test_item_assignment_under_jit_points_to_at():
    def f(x):
        x[0] = x[1]
        return x

    with pytest.raises(TypeError, match=r"immutable.*x\.at\[0\]\.set\(value\)"):
        spmd.jit(f)(np.zeros(3, np.float32))


@pytest.mark.parametrize("call", [
    lambda: snp.sum([1, 2, 3]), lambda: snp.mean((1.0, 2.0)), lambda: snp.max([1, 2]),
    lambda: snp.cumsum([1, 2]), lambda: snp.add([1], 1), lambda: snp.sin([0.5]),
    lambda: snp.matmul([[1.0]], np.ones((1, 1))), lambda: snp.linalg.norm([3.0, 4.0]),
    lambda: snp.allclose([1.0], np.ones(1)), lambda: snp.isnan([1.0]),
    lambda: snp.where(np.ones(2, bool), [1, 2], 0),
], ids=["sum", "mean", "max", "cumsum", "add", "sin", "matmul", "norm", "allclose", "isnan",
        "where"])
def test_list_operands_raise_type_error_as_in_jax(call):
    with pytest.raises(TypeError, match="requires ndarray or scalar arguments.*asarray"):
        call()


def test_arrays_scalars_and_explicit_conversion_still_work():
    assert int(snp.sum(snp.asarray([1, 2, 3]))) == 6
    assert int(snp.sum(np.array([1, 2, 3]))) == 6
    assert float(snp.sum(2.5)) == 2.5
    assert snp.array([[1, 2], [3, 4]]).sum(axis=0).tolist() == [4, 6]
    assert snp.stack([np.ones(2), np.zeros(2)]).shape == (2, 2)  # sequences of arrays
    assert snp.concatenate([np.ones(2), np.zeros(1)]).shape == (3,)


def test_at_get_modes_honoured_eagerly_and_under_jit():
    x = snp.arange(5.0)
    idx = np.array([1, 7, -1, -9])
    for run in (lambda f: f(x), lambda f: spmd.jit(f)(x)):
        assert np.isnan(float(run(lambda v: v.at[7].get(mode="fill"))))
        assert float(run(lambda v: v.at[7].get(mode="clip"))) == 4.0
        assert float(run(lambda v: v.at[-7].get(mode="clip"))) == 0.0  # -7 + 5 -> clamp 0
        assert float(run(lambda v: v.at[-2].get(mode="fill"))) == 3.0
        got = run(lambda v: v.at[idx].get(mode="fill", fill_value=-1.0))
        assert np.asarray(got).tolist() == [1.0, -1.0, 4.0, -1.0]
        assert np.asarray(run(lambda v: v.at[idx].get(mode="clip"))).tolist() == \
            [1.0, 4.0, 4.0, 0.0]
    y = snp.arange(12).reshape(3, 4)
    assert np.asarray(y.at[5, 1:3].get(mode="fill")).tolist() == [np.iinfo(np.int32).min] * 2
    assert np.asarray(y.at[5, np.array([0, 9])].get(mode="clip")).tolist() == [8, 11]
    assert int(y.at[1, 9].get(mode="fill", fill_value=0)) == 0
    # without a mode, a concrete out-of-bounds index still raises (docs/jax_differences.md)
    with pytest.raises(spmd.errors.IndexOutOfBoundsError):
        x.at[7].get()

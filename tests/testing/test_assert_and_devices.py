"""spmd.testing: assert_sharded_allclose (values and placements, block by block, and
what a failure says) and simulated_devices (more devices for a block, put back)."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
from spmd import NamedSharding, P
from spmd.errors import ArgumentError
from spmd.testing import assert_sharded_allclose, simulated_devices


@pytest.fixture(scope="module")
def mesh():
    return spmd.make_mesh((4, 2), ("i", "j"))


def _placed(value, mesh, spec):
    return spmd.device_put(np.asarray(value), NamedSharding(mesh, spec))


def test_equal_values_and_placements_pass(mesh):
    v = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    x = _placed(v, mesh, P("i", "j"))
    y = spmd.jit(lambda a: a * 2)(x)
    assert_sharded_allclose(y, v * 2)
    assert_sharded_allclose(y, _placed(v * 2, mesh, P("i", "j")))
    assert_sharded_allclose(y, v * 2 * (1 + 1e-7), rtol=1e-6)
    assert_sharded_allclose(y, v * 2 + 1e-7, atol=1e-6)


def test_a_differing_element_names_its_block_device_and_place(mesh):
    v = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    x = _placed(v, mesh, P("i", "j"))
    want = v.copy()
    want[5, 3] += 1.0  # rows 4:6 are mesh row i=2, columns 2:4 are j=1: device 5
    with pytest.raises(AssertionError) as e:
        assert_sharded_allclose(x, want, err_msg="step 3")
    msg = str(e.value)
    assert "(step 3)" in msg
    assert "the block of device 5, mesh coordinates {'i': 2, 'j': 1}" in msg
    assert "global index [4:6, 2:4]" in msg
    assert "differs in 1 of 4 elements" in msg
    assert "first at global index (5, 3): actual 23.0, expected 24.0" in msg


def test_placements_must_match_unless_told(mesh):
    v = np.arange(16.0, dtype=np.float32).reshape(8, 2)
    a, b = _placed(v, mesh, P("i")), _placed(v, mesh, P(None, "j"))
    with pytest.raises(AssertionError, match=r"placements differ: .*device 0 holds "
                                             r"\(\(0, 2\), \(0, 2\)\) in actual and "
                                             r"\(\(0, 8\), \(0, 1\)\) in expected"):
        assert_sharded_allclose(a, b)
    assert_sharded_allclose(a, b, check_sharding=False)
    # The same placement spelled another way is the same placement.
    assert_sharded_allclose(a, _placed(v, mesh, P("i", None)))


def test_shape_dtype_and_argument_errors(mesh):
    x = _placed(np.zeros((8, 2), np.float32), mesh, P("i"))
    with pytest.raises(AssertionError, match=r"shapes differ: actual \(8, 2\), expected \(2, 8\)"):
        assert_sharded_allclose(x, np.zeros((2, 8)))
    with pytest.raises(AssertionError, match="dtypes differ: actual float32, expected int32"):
        assert_sharded_allclose(x, _placed(np.zeros((8, 2), np.int32), mesh, P("i")))
    with pytest.raises(ArgumentError, match="actual must be an spmd.Array .* got ndarray"):
        assert_sharded_allclose(np.zeros(2), np.zeros(2))


def test_nan_matches_nan_and_ints_compare_exactly(mesh):
    v = np.array([[np.nan, 1.0]] * 8, np.float32)
    assert_sharded_allclose(_placed(v, mesh, P("i")), v)
    k = np.arange(16, dtype=np.int32).reshape(8, 2)
    with pytest.raises(AssertionError, match="first at global index"):
        assert_sharded_allclose(_placed(k, mesh, P("i")), k + 1)


def test_simulated_devices_gives_more_and_puts_the_count_back():
    before = spmd.device_count()
    with simulated_devices(before * 2):
        assert spmd.device_count() == before * 2
        mesh = spmd.make_mesh((before, 2), ("i", "j"))
        x = spmd.device_put(np.arange(before * 4.0).reshape(before * 2, 2),
                            NamedSharding(mesh, P("i", "j")))
        assert_sharded_allclose(spmd.jit(lambda a: a + 1)(x),
                                np.arange(before * 4.0).reshape(before * 2, 2) + 1)
    assert spmd.device_count() == before
    with simulated_devices(2):  # enough already: nothing changes
        assert spmd.device_count() == before


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "4"])
def test_simulated_devices_refuses_a_bad_count(n):
    with pytest.raises(ArgumentError, match=r"simulated_devices: n=.* must be a positive number"):
        with simulated_devices(n):
            pass


@pytest.mark.spmd(processes=2, timeout=120)
def test_values_only_across_placements_on_two_ranks():
    # check_sharding=False with blocks placed differently: expected is moved to actual's
    # placement (a collective of both ranks), and each rank compares its own blocks;
    # nothing reads the whole value of an array spread over the processes.
    mesh = spmd.make_mesh((2,), ("i",))
    v = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    split, whole = _placed(v, mesh, P("i")), _placed(v, mesh, P())
    assert not split.is_fully_addressable
    assert_sharded_allclose(split, whole, check_sharding=False)
    assert_sharded_allclose(whole, split, check_sharding=False)
    wrong = v.copy()
    wrong[3, 1] += 1  # in rank 1's block of `split`
    if spmd.process_index() == 1:
        with pytest.raises(AssertionError, match=r"global index \[2:4, 0:2\], differs in 1"):
            assert_sharded_allclose(split, _placed(wrong, mesh, P()), check_sharding=False)
    else:
        assert_sharded_allclose(split, _placed(wrong, mesh, P()), check_sharding=False)

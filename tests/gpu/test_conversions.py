"""Raw CuPy arrays at every eager entry point, and arrays of another GPU, on the
CPU stand-in (:mod:`tests.gpu.fake_cupy`).

Real CuPy refuses ``np.asarray`` of a device array, and its kernels refuse an
array of another GPU; the stand-in does both, so an entry point that converts
a user's value with numpy instead of the array module fails here as it would
on a GPU.  Oracles: numpy on the host copies.
"""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax
from spmd.compiler.core import array_module

RNG = np.random.default_rng(5)
A = RNG.standard_normal(8).astype(np.float32)
I2 = np.array([1, 6])


def _host(r):
    return [np.asarray(leaf) for leaf in spmd.tree_util.tree_leaves(r)]


def _set(a, index, values):
    a[index] = values
    return a


def _mesh():
    return spmd.make_mesh((4,), ("i",))


# name -> (spmd call on (cupy module, device x, device index), numpy oracle)
CASES = {
    "shard_map without jit": (
        lambda cp, x, i: spmd.shard_map(lambda v: lax.psum(v, "i") * 2, mesh=_mesh(),
                                        in_specs=P("i"), out_specs=P())(x),
        lambda: A.reshape(4, 2).sum(0) * 2),
    "shard_map under jit": (
        lambda cp, x, i: spmd.jit(spmd.shard_map(lambda v: v * 2, mesh=_mesh(),
                                                 in_specs=P("i"), out_specs=P("i")))(x),
        lambda: A * 2),
    "numpy function": (lambda cp, x, i: snp.tanh(x) + snp.sum(x), lambda: np.tanh(A) + A.sum()),
    "take with device indices": (lambda cp, x, i: snp.take(x, i), lambda: A[I2]),
    "take_along_axis": (lambda cp, x, i: snp.take_along_axis(x, i, axis=0), lambda: A[I2]),
    "indexing with a device index": (lambda cp, x, i: snp.asarray(A)[i], lambda: A[I2]),
    ".at with a device index": (
        lambda cp, x, i: snp.zeros(8).at[i].set(x[:2]),
        lambda: _set(np.zeros(8, np.float32), I2, A[:2])),
    "repeat with device counts": (lambda cp, x, i: snp.repeat(x, cp.asarray(np.full(8, 2))),
                                  lambda: np.repeat(A, 2)),
    "grad": (lambda cp, x, i: spmd.grad(lambda v: snp.sum(v ** 2))(x), lambda: 2 * A),
    "value_and_grad": (lambda cp, x, i: spmd.value_and_grad(lambda v: snp.sum(v ** 3))(x),
                       lambda: ((A ** 3).sum(), 3 * A ** 2)),
    "vmap": (lambda cp, x, i: spmd.vmap(lambda v: v * v)(x), lambda: A * A),
    "device_put": (lambda cp, x, i: spmd.device_put(x), lambda: A),
    "device_put with a sharding": (
        lambda cp, x, i: spmd.device_put(x, NamedSharding(_mesh(), P("i"))), lambda: A),
    "lax op": (lambda cp, x, i: lax.mul(x, x), lambda: A * A),
    "fori_loop with a device bound": (
        lambda cp, x, i: lax.fori_loop(0, cp.asarray(np.int32(3)), lambda k, c: c + 1.0, x),
        lambda: A + 3),
    "scan": (lambda cp, x, i: lax.scan(lambda c, v: (c + v, c), 0.0, x)[1],
             lambda: np.r_[0, np.cumsum(A)[:-1]]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_eager_entry_points_take_raw_cupy_arrays(fake_gpu, name):
    call, oracle = CASES[name]
    got = call(fake_gpu, fake_gpu.asarray(A), fake_gpu.asarray(I2))
    for leaf in spmd.tree_util.tree_leaves(got):
        assert type(leaf.value) is fake_gpu.ndarray, (name, type(leaf.value))
    want = oracle()
    want = list(want) if isinstance(want, tuple) else [want]
    for g, w in zip(_host(got), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_process_allgather_of_a_cupy_array(fake_gpu):
    x = fake_gpu.asarray(A)
    got = spmd.process_allgather(x)
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, A[None])
    np.testing.assert_array_equal(spmd.process_allgather({"x": x}, tiled=True)["x"], A)


def test_the_stand_in_refuses_what_cupy_refuses(fake_gpu):
    """The checks the tests above rely on."""
    x = fake_gpu.asarray(A)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
        np.asarray(x)
    with pytest.raises(TypeError, match="Unsupported type"):
        fake_gpu.add(x, A)
    with fake_gpu.cuda.Device(0):
        pass
    assert x.device.id == 0 and fake_gpu.asnumpy(x).tolist() == A.tolist()


def test_arrays_of_another_gpu_are_moved(fake_gpu, runtime_env):
    """A cupy array made on another GPU than this process's is copied to it (CuPy's
    kernels refuse arrays of another GPU without peer access)."""
    runtime_env(FAKE_CUPY_GPUS="2")
    cp = fake_gpu
    assert array_module.current() is cp and array_module.device_id[0] == 0
    with cp.cuda.Device(1):
        y = cp.asarray(A)
    assert y.device.id == 1
    with pytest.raises(ValueError, match="array device = 1 while current = 0"):
        y + 1.0  # what CuPy does: the bug this guards against
    mesh = _mesh()
    results = {
        "eager": snp.sin(y),
        "jit": spmd.jit(lambda v: v * 2)(y),
        "shard_map": spmd.shard_map(lambda v: v + 1, mesh=mesh, in_specs=P("i"),
                                    out_specs=P("i"))(y),
        "device_put": spmd.device_put(y, NamedSharding(mesh, P("i"))),
        "grad": spmd.grad(lambda v: snp.sum(v * v))(y),
    }
    wants = {"eager": np.sin(A), "jit": 2 * A, "shard_map": A + 1, "device_put": A,
             "grad": 2 * A}
    for name, got in results.items():
        assert got.value.device.id == 0, name
        np.testing.assert_allclose(np.asarray(got), wants[name], rtol=1e-5, err_msg=name)


def test_the_gpu_of_a_local_rank_takes_arrays_made_before(fake_gpu, runtime_env):
    """Local rank 1 of a node with 2 GPUs uses GPU 1; an array the user made before
    spmd chose (on CuPy's default GPU 0) is moved there."""
    cp = fake_gpu
    runtime_env(FAKE_CUPY_GPUS="2", PMI_SIZE="2", MPI_LOCALRANKID="1", MPI_LOCALNRANKS="2",
                SPMD_GPU_BACKEND="mpi")
    early = cp.asarray(A)  # before spmd resolved its array module: on GPU 0
    assert early.device.id == 0
    assert array_module.current() is cp and array_module.device_id[0] == 1
    assert cp.cuda.runtime.getDevice() == 1
    moved = array_module.to_device(early, np.dtype(np.float32))
    assert moved.device.id == 1 and cp.asnumpy(moved).tolist() == A.tolist()
    out = snp.tanh(early)
    assert out.value.device.id == 1
    np.testing.assert_allclose(np.asarray(out), np.tanh(A), rtol=1e-6)


def test_static_arguments_given_as_cupy_scalars(fake_gpu):
    """Concrete bounds, shifts and counts may come as 0-d CuPy arrays."""
    cp = fake_gpu
    n = cp.asarray(np.int32(5))
    np.testing.assert_array_equal(np.asarray(snp.arange(n)), np.arange(5))
    np.testing.assert_array_equal(np.asarray(snp.arange(cp.asarray(1.0), n, cp.asarray(2))),
                                  np.arange(1.0, 5, 2))
    x = cp.asarray(A.reshape(2, 4))
    np.testing.assert_array_equal(np.asarray(snp.roll(x, cp.asarray(np.int32(1)), axis=1)),
                                  np.roll(A.reshape(2, 4), 1, axis=1))

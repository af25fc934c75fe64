"""DLPack (issue 58, item 2): ``__dlpack__``/``__dlpack_device__`` on Arrays and on
their shards' data, and ``spmd.numpy.from_dlpack`` -- zero-copy where the layout
allows (checked by writing through one side and reading the other, and by buffer
addresses), copies otherwise, and the errors of the cases that cannot be done.

spmd never writes into a buffer it did not make, so an Array on a producer's memory
and a consumer's view of an Array's buffer stay as they are through donation, loops
that update their carries in place and ``.at[...].set``: the tests under "what spmd
does never reaches shared memory" hold that.
"""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import Device, Mesh, NamedSharding, P, lax
from spmd.collectives.mpi import buffers
from spmd.compiler.core import dlpack_capsules as capsules
from spmd.compiler.core import dtypes
from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.dlpack import DLPackError
from spmd.errors import DeletedArrayError, NotFullyAddressableError
from spmd.shard.arrays.sharded import ShardedArray, from_blocks
from spmd.shard.arrays.spec import ShardingError

NUMPY_21 = tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 1)
needs_numpy_21 = pytest.mark.skipif(not NUMPY_21, reason="np.from_dlpack(copy=) is numpy >= 2.1")


def _addr(a) -> int:
    """The address of an array's first element (numpy arrays, Arrays whole here)."""
    return np.asarray(a).__array_interface__["data"][0]


def _mesh():
    return spmd.make_mesh((4, 2), ("i", "j"))


def _values(shape=(8, 4), dtype=np.float32):
    return np.arange(np.prod(shape)).astype(dtype).reshape(shape)


# ------------------------------------------------------------------ export

def test_np_from_dlpack_of_an_array_shares_its_buffer_both_ways():
    x = snp.arange(12.0).reshape(3, 4) * 2  # an eager result: a plain Array
    assert type(x) is Array
    y = np.from_dlpack(x)
    assert _addr(y) == _addr(x)
    y[1, 2] = -5.0  # a write through the consumer shows in the Array's numpy view
    assert np.asarray(x)[1, 2] == -5.0


def test_a_placed_arrays_export_is_its_buffer_and_its_device_the_host():
    x = spmd.device_put(_values(), NamedSharding(_mesh(), P("i", "j")))
    assert isinstance(x, ShardedArray)
    y = np.from_dlpack(x)
    np.testing.assert_array_equal(y, _values())
    assert _addr(y) == _addr(x)
    assert x.__dlpack_device__() == (1, 0) == snp.ones(2).__dlpack_device__()


def test_each_addressable_shards_data_exports_its_block_without_a_copy():
    v = _values()
    x = spmd.device_put(v, NamedSharding(_mesh(), P("i", "j")))
    whole = np.asarray(x)
    for s in x.addressable_shards:
        assert s.data.__dlpack_device__() == (1, 0)
        block = np.from_dlpack(s.data)
        np.testing.assert_array_equal(block, v[s.index])
        assert np.shares_memory(block, whole)  # a view of the Array's buffer


def test_an_array_holding_a_numpy_scalar_exports_it_as_0_d():
    x = Array(np.float32(2.5), ShapedArray((), np.dtype(np.float32)))
    assert x.__dlpack_device__() == (1, 0)
    y = np.from_dlpack(x)
    assert y.shape == () and float(y) == 2.5


@needs_numpy_21
def test_copy_true_exports_a_fresh_buffer_and_copy_false_the_same_one():
    x = snp.arange(6.0) + 1
    fresh = np.from_dlpack(x, copy=True)
    assert not np.shares_memory(fresh, np.asarray(x))
    fresh[0] = 100.0
    assert float(x[0]) == 1.0
    assert _addr(np.from_dlpack(x, copy=False)) == _addr(x)


def test_the_array_api_keywords_reach_the_buffer():
    x = snp.arange(4.0)
    assert "dltensor_versioned" in repr(x.__dlpack__(max_version=(1, 0)))
    assert "dltensor" in repr(x.__dlpack__())
    assert "dltensor" in repr(x.__dlpack__(dl_device=(1, 0)))
    with pytest.raises(RuntimeError, match="stream=None"):  # numpy's rule on the CPU
        x.__dlpack__(stream=1)
    with pytest.raises(BufferError):  # a CUDA device asked of host memory
        x.__dlpack__(dl_device=(2, 0))


def _blocks_array(spec):
    """An Array of this process's mesh held as blocks (as shard_map's local results
    are), built from its blocks."""
    mesh = _mesh()
    v = _values()
    sharding = NamedSharding(mesh, spec)
    blocks = np.stack([v[sharding.device_index(d, v.shape)] for d in mesh.devices.flat])
    return v, from_blocks(blocks, ShapedArray(v.shape, np.dtype(np.float32)), sharding)


def test_an_array_held_as_blocks_is_assembled_and_copy_false_refuses():
    v, x = _blocks_array(P("i", "j"))
    assert x._value is None
    np.testing.assert_array_equal(np.from_dlpack(x), v)
    assert x.__dlpack_device__() == (1, 0)
    with pytest.raises(DLPackError, match=r"addressable_shards\[i\]\.data") as e:
        x.__dlpack__(copy=False)
    assert isinstance(e.value, BufferError)
    assert "copy=None" in str(e.value)


def test_from_dlpack_copy_false_of_an_array_held_as_blocks_raises():
    v, x = _blocks_array(P("i"))
    with pytest.raises(DLPackError, match="copy=False"):
        snp.from_dlpack(x, copy=False)
    np.testing.assert_array_equal(np.asarray(snp.from_dlpack(x)), v)


def test_a_replicated_array_held_as_blocks_exports_its_first_block():
    v, x = _blocks_array(P())
    y = np.from_dlpack(x)
    np.testing.assert_array_equal(y, v)
    assert np.shares_memory(y, x._blocks)
    assert "dltensor" in repr(x.__dlpack__(copy=False))


def _spread_mesh():
    """Devices 0, 1 of this process, then two of a pretend process 1 (never run on
    here): tests/mpi/test_arrays_single_process.py's mesh."""
    theirs = [Device(1000 + k, 1, k) for k in range(2)]
    return Mesh(np.array(spmd.local_devices()[:2] + theirs, dtype=object), ("i",))


def test_an_array_spread_over_processes_raises_naming_addressable_shards():
    v = _values()
    x = spmd.device_put(v, NamedSharding(_spread_mesh(), P("i")))
    for export in (np.from_dlpack, lambda a: a.__dlpack_device__()):
        with pytest.raises(NotFullyAddressableError, match=r"addressable_shards\[i\]\.data"):
            export(x)
    # Each of this process's blocks exports (the fix the message names).
    for s in x.addressable_shards:
        np.testing.assert_array_equal(np.from_dlpack(s.data), v[s.index])


def test_an_array_replicated_over_processes_is_whole_here_and_exports():
    v = _values()
    x = spmd.device_put(v, NamedSharding(_spread_mesh(), P()))
    assert not x.is_fully_addressable
    np.testing.assert_array_equal(np.from_dlpack(x), v)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_over_mpi_processes_each_exports_its_own_blocks():
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    v = _values((2 * n, 3))
    split = NamedSharding(mesh, P("i"))
    x = spmd.device_put(v, split)
    with pytest.raises(NotFullyAddressableError, match=r"addressable_shards\[i\]\.data"):
        np.from_dlpack(x)
    assert spmd.process_count() >= 2 and x.addressable_shards  # every rank holds some
    for s in x.addressable_shards:
        np.testing.assert_array_equal(np.from_dlpack(s.data), v[s.index])
    np.testing.assert_array_equal(np.from_dlpack(spmd.device_put(v, NamedSharding(mesh, P()))), v)
    # Each process gives the whole value; it keeps copies of its own blocks.
    y = snp.from_dlpack(v, device=split)
    np.testing.assert_array_equal(np.asarray(spmd.process_allgather(y, tiled=True)), v)
    with pytest.raises(DLPackError, match="only some of its blocks"):
        snp.from_dlpack(v, device=split, copy=False)


@pytest.mark.parametrize("placed", [False, True])
def test_a_donated_or_deleted_array_raises(placed):
    x = snp.arange(4.0) + 1
    if placed:
        x = spmd.device_put(x, NamedSharding(_mesh(), P()))
    spmd.jit(lambda a: a * 2, donate_argnums=0)(x)
    for export in (np.from_dlpack, lambda a: a.__dlpack_device__()):
        with pytest.raises(DeletedArrayError, match="donated"):
            export(x)
    shard = (snp.arange(8.0) + 1).addressable_shards[0].data
    shard.delete()
    with pytest.raises(DeletedArrayError):
        np.from_dlpack(shard)


# ------------------------------------------------------------------ import

@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.float16, np.bool_,
                                   np.complex64, np.int8])
def test_from_dlpack_shares_the_producers_memory(dtype):
    a = np.zeros((3, 5), dtype)
    x = snp.from_dlpack(a)
    assert type(x) is Array and x.dtype == np.dtype(dtype) and x.shape == (3, 5)
    assert _addr(x) == _addr(a)
    a[2, 1] = 1  # a write through the producer shows in the Array
    assert np.asarray(x)[2, 1] == 1
    np.testing.assert_array_equal(np.asarray(x[::-1, 1:]), a[::-1, 1:])  # computes on it


def test_a_zero_dimensional_producer():
    a = np.array(3.5, np.float32)
    x = snp.from_dlpack(a)
    assert x.shape == () and float(x) == 3.5 and _addr(x) == _addr(a)


def test_copy_true_gives_a_buffer_of_its_own():
    a = np.arange(4, dtype=np.float32)
    x = snp.from_dlpack(a, copy=True)
    assert not np.shares_memory(np.asarray(x), a)
    a[0] = 9
    assert float(x[0]) == 0.0


@pytest.mark.parametrize("view", [lambda a: a[:, ::2], lambda a: a.T,
                                  lambda a: np.asfortranarray(a)])
def test_a_strided_producer_is_copied_into_c_order(view):
    a = view(_values((4, 6)))
    x = snp.from_dlpack(a)
    np.testing.assert_array_equal(np.asarray(x), a)
    assert np.asarray(x).flags.c_contiguous and not np.shares_memory(np.asarray(x), a)
    with pytest.raises(DLPackError, match="not C-contiguous") as e:
        snp.from_dlpack(a, copy=False)
    assert "ascontiguousarray" in str(e.value)


@pytest.mark.parametrize("wide,narrow", [(np.float64, np.float32), (np.int64, np.int32),
                                         (np.complex128, np.complex64)])
def test_64_bit_producers_are_narrowed_by_a_copy_unless_x64(wide, narrow):
    a = np.arange(6).astype(wide)
    x = snp.from_dlpack(a)
    assert x.dtype == np.dtype(narrow)
    np.testing.assert_array_equal(np.asarray(x), a.astype(narrow))
    with pytest.raises(DLPackError, match=f"{np.dtype(wide)} is {np.dtype(narrow)}.*enable_x64"):
        snp.from_dlpack(a, copy=False)


def test_64_bit_producers_are_shared_under_x64(x64):
    a = np.arange(6, dtype=np.float64)
    x = snp.from_dlpack(a, copy=False)
    assert x.dtype == np.float64 and _addr(x) == _addr(a)


def test_a_read_only_producer_is_shared_and_computes():
    a = _values((2, 3))
    a.flags.writeable = False
    x = snp.from_dlpack(a)
    assert _addr(x) == _addr(a) and not np.asarray(x).flags.writeable
    np.testing.assert_array_equal(np.asarray(spmd.jit(lambda v: v * 2 + 1)(x)), a * 2 + 1)
    np.testing.assert_array_equal(np.asarray(x.at[0, 0].set(7.0))[0], [7.0, 1.0, 2.0])
    # A DLPack 1 consumer is told it is read-only (numpy's from_dlpack asks for it);
    # a legacy one cannot be, and numpy refuses it.
    assert not np.from_dlpack(x).flags.writeable
    with pytest.raises(BufferError, match="readonly"):
        x.__dlpack__()


def test_an_array_round_trips_through_from_dlpack_without_a_copy():
    x = snp.arange(5.0) * 3
    assert _addr(snp.from_dlpack(x)) == _addr(x)


@pytest.mark.parametrize("bad", [[1.0, 2.0], 3.0, np.arange(3).__dlpack__()])
def test_a_value_that_is_no_producer_raises(bad):
    with pytest.raises(DLPackError, match="not a DLPack producer.*snp|asarray"):
        snp.from_dlpack(bad)


def test_device_places_the_result_sharing_where_it_can():
    mesh = _mesh()
    a = _values()
    on_one = snp.from_dlpack(a, device=spmd.devices()[3])
    assert on_one.sharding.device == spmd.devices()[3] and _addr(on_one) == _addr(a)
    replicated = snp.from_dlpack(a, device=NamedSharding(mesh, P()), copy=False)
    assert replicated.sharding.spec == P() and _addr(replicated) == _addr(a)
    split = snp.from_dlpack(a, device=NamedSharding(mesh, P("i")), copy=False)
    assert split.sharding.spec == P("i") and _addr(split) == _addr(a)  # whole here
    # Over processes, this process keeps copies of its blocks.
    spread = NamedSharding(_spread_mesh(), P("i"))
    mine = snp.from_dlpack(a, device=spread)
    np.testing.assert_array_equal(np.asarray(mine.addressable_shards[1].data), a[2:4])
    with pytest.raises(DLPackError, match="only some of its blocks"):
        snp.from_dlpack(a, device=spread, copy=False)
    with pytest.raises(ShardingError, match="device"):
        snp.from_dlpack(a, device="cpu")


def test_from_dlpack_is_listed_in_the_namespace():
    assert "from_dlpack" in snp.__all__ and snp.from_dlpack.__module__ == "spmd.numpy._dlpack"


# ----------------------------------------------------------------- bfloat16

@pytest.mark.parametrize("versioned", [False, True])
def test_the_capsule_structures_read_numpys_capsules(versioned):
    a = _values((2, 3))[:, ::2]
    cap = a.__dlpack__(max_version=(1, 0)) if versioned else a.__dlpack__()
    t = capsules.tensor(cap)
    assert (t.ndim, t.shape[0], t.shape[1], t.strides[1]) == (2, 2, 2, 2)
    assert t.data + t.byte_offset == a.__array_interface__["data"][0]
    assert (t.device.device_type, t.device.device_id) == (1, 0)
    assert capsules.dtype_of(cap) == (2, 32, 1)  # kDLFloat, 32 bits
    np.from_dlpack(capsules.Held(cap, (1, 0)))  # consumed: no longer readable
    with pytest.raises(ValueError, match="used_dltensor"):
        capsules.tensor(cap)


needs_bfloat16 = pytest.mark.skipif(dtypes.bfloat16 is None, reason="ml_dtypes not installed")


@needs_bfloat16
@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_bfloat16_crosses_dlpack_without_a_copy(max_version):
    v = np.arange(6, dtype=np.float32).reshape(2, 3).astype(dtypes.bfloat16)
    x = snp.asarray(v) * 2
    # What a consumer (PyTorch) reads: kDLBfloat, 16 bits, on the Array's memory.
    cap = x.__dlpack__(max_version=max_version)
    assert capsules.dtype_of(cap) == capsules.BFLOAT16
    assert capsules.tensor(cap).data == _addr(x)
    y = snp.from_dlpack(x)
    assert y.dtype == dtypes.bfloat16 and _addr(y) == _addr(x)
    np.testing.assert_array_equal(np.asarray(y).astype(np.float32), v.astype(np.float32) * 2)
    with pytest.raises((BufferError, RuntimeError), match="dtype"):  # numpy has no bfloat16
        np.from_dlpack(x)


# ------------------------------------ what spmd does never reaches shared memory

def _rows(n):
    """A loop that writes row i of its carry (updated in place in its own buffer)."""
    return lambda c: lax.fori_loop(0, n, lambda i, c: c.at[i].set(c[i] * 0 + i), c)


@pytest.mark.parametrize("jitted", [False, True])
def test_updates_in_place_never_reach_a_producers_memory(jitted):
    a = _values((4, 3))
    before = a.copy()
    x = snp.from_dlpack(a)
    f = spmd.jit(_rows(4)) if jitted else _rows(4)
    np.testing.assert_array_equal(np.asarray(f(x)), np.repeat(np.arange(4.0), 3).reshape(4, 3))
    x.at[1].set(-1.0)
    lax.scan(lambda c, _: (c.at[0].add(1.0), None), x, None, length=3)
    lax.while_loop(lambda c: c[0, 0] < 5, lambda c: c.at[0, 0].add(1.0), x)
    np.testing.assert_array_equal(a, before)


def test_donating_an_array_on_a_producers_memory_leaves_the_producer():
    a = _values((4, 3))
    before = a.copy()
    x = snp.from_dlpack(a)
    y = spmd.jit(lambda c: _rows(4)(c * 2), donate_argnums=0)(x)
    assert x.is_deleted() and not np.shares_memory(np.asarray(y), a)
    np.testing.assert_array_equal(a, before)


def test_a_consumers_view_of_a_loop_result_keeps_its_value():
    # A loop's result is a buffer the loop made; passed to the next loop as its
    # carry, or donated, that buffer must not be written while a consumer views it.
    y = spmd.jit(_rows(4))(snp.zeros((4, 3)) - 1)
    view = np.from_dlpack(y)
    kept = view.copy()
    add = lambda c: lax.fori_loop(0, 4, lambda i, c: c.at[i].add(10.0), c)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(spmd.jit(add)(y)), kept + 10)
    np.testing.assert_array_equal(np.asarray(add(y)), kept + 10)
    spmd.jit(add, donate_argnums=0)(y)
    np.testing.assert_array_equal(view, kept)


@pytest.mark.parametrize("shape", [(128, 256), (1024, 1024)])  # pooled; huge-page backed
def test_a_pooled_receive_buffer_is_not_reused_while_a_consumer_views_it(shape):
    # MPI receive buffers are reused once nothing refers to them (their refcount):
    # a DLPack consumer's view holds a reference through its capsule.
    buffers.clear_buffers()
    try:
        b = buffers.recv_buffer(shape, np.float32)
        first = _addr(b)
        b[...] = 3.0
        x = Array(b, ShapedArray(shape, np.dtype(np.float32)))
        view = np.from_dlpack(x)
        del x, b
        again = buffers.recv_buffer(shape, np.float32)
        assert not np.shares_memory(again, view)
        again[...] = -1.0
        assert (view == 3.0).all()
        del view, again
        assert _addr(buffers.recv_buffer(shape, np.float32)) == first  # freed: reused
    finally:
        buffers.clear_buffers()


# ------------------------------------------------------------- other producers

def test_torch_tensors_share_memory_both_ways():
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    x = snp.from_dlpack(t)
    t[0, 0] = 42.0
    assert float(x[0, 0]) == 42.0
    back = torch.from_dlpack(x)
    assert back.data_ptr() == t.data_ptr()
    np.testing.assert_array_equal(np.asarray(snp.from_dlpack(t.T)), t.T.numpy())
    b = snp.from_dlpack(torch.tensor([True, False]))
    assert b.dtype == np.bool_
    with pytest.raises(DLPackError, match="not C-contiguous"):
        snp.from_dlpack(t.T, copy=False)
    h = torch.arange(4, dtype=torch.float32).to(torch.bfloat16)
    xb = snp.from_dlpack(h)
    assert xb.dtype == dtypes.bfloat16 and _addr(xb) == h.data_ptr()
    hb = torch.from_dlpack(xb)
    assert hb.dtype == torch.bfloat16 and hb.data_ptr() == h.data_ptr()


def test_jax_arrays_cross_both_ways_bfloat16_too():
    # JAX's DLPack (XLA's) reads and writes the capsules: an independent check of
    # the bfloat16 capsules spmd rewrites.  (On the CPU backend; JAX may copy an
    # import whose memory is not aligned as XLA wants, so only values are compared
    # on its side.)
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    cpu = jax.devices("cpu")[0]
    for dtype in (np.float32, np.int32, dtypes.bfloat16):
        if dtype is None:
            continue
        v = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
        j = jax.device_put(jnp.asarray(v), cpu)
        x = snp.from_dlpack(j)
        assert x.dtype == np.dtype(dtype) and _addr(x) == j.unsafe_buffer_pointer()
        np.testing.assert_array_equal(np.asarray(x), v)
        back = jnp.from_dlpack(snp.asarray(v))
        assert back.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(np.asarray(back), v)


class _GpuProducer:
    """A producer in CUDA memory, as the standard has one answer a CPU consumer
    (no GPU here): asked for ``dl_device=(1, 0)`` with ``copy=True``, it hands a host
    copy of its values; asked for anything else, it fails the test."""

    def __init__(self, values):
        self.values, self.asked = values, []

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        self.asked.append(kwargs)
        assert kwargs.get("dl_device") == (1, 0) and kwargs.get("copy") is True, kwargs
        return self.values.copy().__dlpack__(max_version=kwargs.get("max_version"))


@needs_numpy_21
def test_a_gpu_producer_on_the_cpu_path_is_asked_for_a_host_copy():
    g = _GpuProducer(_values((2, 3)))
    with pytest.raises(DLPackError, match="device type 2 memory.*copy=None"):
        snp.from_dlpack(g, copy=False)
    assert g.asked == []  # refused before the producer copied anything
    np.testing.assert_array_equal(np.asarray(snp.from_dlpack(g)), g.values)


def test_cupy_arrays_are_copied_to_the_host_on_the_cpu_path():
    cupy = pytest.importorskip("cupy")
    try:
        g = cupy.arange(4, dtype=cupy.float32)
    except Exception as e:  # cupy installed without a usable GPU
        pytest.skip(f"cupy has no GPU here: {e}")
    if spmd.default_backend() != "cpu":
        pytest.skip("the GPU path shares the CuPy buffer (tests/gpu)")
    np.testing.assert_array_equal(np.asarray(snp.from_dlpack(g)), np.arange(4))
    with pytest.raises(DLPackError, match="copy=None"):
        snp.from_dlpack(g, copy=False)

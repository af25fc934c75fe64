"""A strict stand-in for CuPy on the CPU, to test spmd's GPU code paths without a GPU.

It checks the plumbing, not CuPy itself: its arrays (:class:`ndarray`) wrap numpy
arrays and behave like CuPy's where spmd could go wrong:

- its functions refuse numpy arrays as operands (``TypeError``, as CuPy's
  ``Unsupported type <class 'numpy.ndarray'>``), except ``asarray``/``array``,
  which copy host data to the "device";
- ``np.asarray(x)`` and numpy functions that convert their operands raise
  ``TypeError`` (CuPy refuses implicit device-to-host copies); ``x.get()`` and
  ``asnumpy(x)`` copy to the host;
- reductions and scalar indexing return 0-d arrays, never numpy scalars.

What it cannot check: which functions CuPy lacks or implements differently,
kernels, streams, NCCL.  Those need a GPU (tests/gpu/test_gpu.py).

Use ``install()`` to make ``import cupy`` return this module (``uninstall()`` undoes
it); ``python tests/gpu/fake_cupy.py pytest-args...`` runs pytest with it
installed and ``SPMD_PLATFORM=gpu``.
"""

from __future__ import annotations

import os
import sys
import types

import numpy as _np


def _unwrap(x):
    t = type(x)
    if t is ndarray:
        return x._a
    if t is _np.ndarray:
        raise TypeError(f"Unsupported type {t} (fake cupy: a numpy array reached a device "
                        "function; move it with cupy.asarray first)")
    if t in (list, tuple):
        return t(_unwrap(e) for e in x)
    return x


def _wrap(r):
    t = type(r)
    if t is _np.ndarray:
        return ndarray(r)
    if isinstance(r, _np.generic):  # CuPy returns 0-d arrays, not scalars
        return ndarray(_np.asarray(r))
    if t in (list, tuple):
        return t(_wrap(e) for e in r)
    return r


# FAKE_CUPY_LOG=path: record every module function, ufunc method and array
# attribute used (one name a line), to check them against the real CuPy's namespace.
_LOG = os.environ.get("FAKE_CUPY_LOG")


def _log(name: str) -> None:
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(name + "\n")


def _device_fn(fn, name=None):
    def call(*args, **kwargs):
        if name:
            _log(name)
        return _wrap(fn(*[_unwrap(a) for a in args],
                        **{k: _unwrap(v) for k, v in kwargs.items()}))

    call.__name__ = getattr(fn, "__name__", "fn")
    if isinstance(fn, _np.ufunc):  # CuPy's ufuncs have these methods, for some ufuncs only
        for method in ("at", "accumulate", "reduce", "reduceat", "outer"):
            if fn.__name__ in _UFUNC_METHODS.get(method, (fn.__name__,)):
                impl = _device_fn(getattr(fn, method), f"ufunc.{fn.__name__}.{method}")
            else:
                impl = _unsupported(f"`cupy_{fn.__name__}.{method}` is not supported yet")
            setattr(call, method, impl)
    return call


# Which ufuncs CuPy 14 gives these methods (cupy/_core/_kernel.pyx: `at` needs a
# scatter op; `reduce`/`accumulate` exist for add and multiply).
_UFUNC_METHODS = {"at": ("add", "subtract", "maximum", "minimum"),
                  "accumulate": ("add", "multiply"), "reduce": ("add", "multiply"),
                  "reduceat": ("add",)}


def _unsupported(message):
    def call(*args, **kwargs):
        raise NotImplementedError(message)

    return call


def _forward(obj, name, where="cupy"):
    _log(f"{where}.{name}")
    attr = getattr(obj, name)
    if isinstance(attr, (type, _np.dtype)) or not callable(attr):
        if isinstance(attr, types.ModuleType):
            return _Namespace(attr)
        return _wrap(attr) if type(attr) is _np.ndarray else attr
    return _device_fn(attr)


class _Namespace:
    """A numpy submodule (linalg, fft, ...) with device semantics."""

    def __init__(self, mod):
        self._mod = mod

    def __getattr__(self, name):
        return _forward(self._mod, name, "cupy." + self._mod.__name__.split(".")[-1])


class ndarray:
    """A "device" array: a numpy array that refuses to be read implicitly."""

    __slots__ = ("_a",)
    __array_ufunc__ = None      # numpy operators with a host array defer, then fail
    __array_priority__ = 100    # below spmd's Array and Tracer (1000)

    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed (fake cupy). "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def get(self):
        return self._a.copy()

    def __getattr__(self, name):
        if name.startswith("__"):  # numpy's probes (__array_struct__, ...): no host view
            raise AttributeError(name)
        if name == "data":  # a memory pointer (only .ptr is used)
            return types.SimpleNamespace(ptr=self._a.ctypes.data)
        return _forward(self._a, name, "ndarray")

    def __repr__(self):
        return "fake_cupy." + repr(self._a)

    __str__ = __repr__

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(e) for e in self._a)

    def __getitem__(self, index):
        return _wrap(self._a[_unwrap(index)])

    def __setitem__(self, index, value):
        self._a[_unwrap(index)] = _unwrap(value)

    # Python scalars: CuPy synchronises and converts size-1 arrays.
    def __bool__(self):
        return bool(self._a)

    def __int__(self):
        return int(self._a)

    def __float__(self):
        return float(self._a)

    def __complex__(self):
        return complex(self._a)

    def __index__(self):
        return self._a.__index__()

    def __dlpack__(self, *args, **kwargs):  # pragma: no cover - never used
        raise TypeError("fake cupy arrays do not export dlpack")


def _binary(op):
    def method(self, other):
        if type(other) not in (ndarray, int, float, complex, bool) and \
                not isinstance(other, _np.generic):
            return NotImplemented
        return _wrap(op(self._a, _unwrap(other)))

    return method


def _rbinary(op):
    def method(self, other):
        if type(other) not in (ndarray, int, float, complex, bool) and \
                not isinstance(other, _np.generic):
            if type(other) is _np.ndarray:
                _unwrap(other)  # raises: numpy array operand
            return NotImplemented
        return _wrap(op(_unwrap(other), self._a))

    return method


def _inplace(op):
    def method(self, other):
        op(self._a, _unwrap(other))
        return self

    return method


import operator as _op  # noqa: E402

for _name, _fn in [("add", _op.add), ("sub", _op.sub), ("mul", _op.mul),
                   ("truediv", _op.truediv), ("floordiv", _op.floordiv), ("mod", _op.mod),
                   ("pow", _op.pow), ("matmul", _op.matmul), ("and", _op.and_),
                   ("or", _op.or_), ("xor", _op.xor), ("lshift", _op.lshift),
                   ("rshift", _op.rshift)]:
    setattr(ndarray, f"__{_name}__", _binary(_fn))
    setattr(ndarray, f"__r{_name}__", _rbinary(_fn))
    setattr(ndarray, f"__i{_name}__", _inplace(getattr(_op, f"i{_name}")))
for _name, _fn in [("eq", _op.eq), ("ne", _op.ne), ("lt", _op.lt), ("le", _op.le),
                   ("gt", _op.gt), ("ge", _op.ge)]:
    setattr(ndarray, f"__{_name}__", _binary(_fn))
for _name, _fn in [("neg", _op.neg), ("pos", _op.pos), ("invert", _op.invert),
                   ("abs", abs)]:
    setattr(ndarray, f"__{_name}__", (lambda f: lambda self: _wrap(f(self._a)))(_fn))
ndarray.__hash__ = None


# ------------------------------------------------------------- module surface

def asarray(x, dtype=None, order=None):
    if type(x) is ndarray:
        return x if dtype is None or x.dtype == dtype else ndarray(x._a.astype(dtype))
    return ndarray(_np.array(x, dtype=dtype, copy=True))


def array(x, dtype=None, copy=True, order="K", ndmin=0):
    src = x._a if type(x) is ndarray else x
    return ndarray(_np.array(src, dtype=dtype, copy=True, ndmin=ndmin))


def asnumpy(x, stream=None, order="C", out=None):
    return x._a.copy() if type(x) is ndarray else _np.asarray(x)


def choose(a, choices, out=None, mode="raise"):
    if type(choices) is not ndarray:  # CuPy reads choices.shape
        raise AttributeError(f"'{type(choices).__name__}' object has no attribute 'shape'")
    return ndarray(_np.choose(_unwrap(a), choices._a, mode=mode))


def argsort(a, axis=-1, kind=None):
    return ndarray(_np.argsort(_unwrap(a), axis=axis, kind="stable"))  # CuPy's is stable


def get_array_module(*args):
    return sys.modules[__name__] if any(type(a) is ndarray for a in args) else _np


class _Stream:
    ptr = 0

    def synchronize(self):
        pass


class _Device:
    def __init__(self, device=0):
        self.id = device

    def use(self):
        cuda._current = self.id

    def synchronize(self):
        pass


cuda = types.SimpleNamespace(
    runtime=types.SimpleNamespace(  # FAKE_CUPY_GPUS: how many GPUs it pretends to see
        getDeviceCount=lambda: int(os.environ.get("FAKE_CUPY_GPUS", "1"))),
    Device=_Device, _current=0, get_current_stream=lambda: _Stream(),
    Stream=_Stream)


# -------------------------------------------------------------- a fake NCCL
#
# With FAKE_CUPY_NCCL=1, ``cupy.cuda.nccl`` is this stand-in: communicators of one
# member, or of every rank of an MPI job (the only groups a 2-rank job has), whose
# calls move the bytes behind the device pointers with mpi4py.  It checks what
# spmd.collectives.nccl passes (pointers, counts, datatypes, ops, peers, groups).

_NCCL_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2}
_NCCL_NUMPY = {0: _np.int8, 1: _np.uint8, 2: _np.int32, 3: _np.uint32, 4: _np.int64,
               5: _np.uint64, 6: _np.float16, 7: _np.float32, 8: _np.float64}


def _memory(ptr: int, count: int, datatype: int):
    import ctypes

    nbytes = count * _NCCL_SIZES[datatype]
    raw = _np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
    return raw.view(_NCCL_NUMPY[datatype]) if datatype in _NCCL_NUMPY else raw


class _FakeNccl(types.ModuleType):
    available = True
    NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
    (NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64,
     NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16) = range(10)
    _pending: list = []
    _grouped = [0]

    @staticmethod
    def get_unique_id():
        return tuple(range(-64, 64))

    @classmethod
    def groupStart(cls):
        cls._grouped[0] += 1

    @classmethod
    def groupEnd(cls):
        cls._grouped[0] -= 1
        if cls._grouped[0] == 0:
            ops, cls._pending[:] = list(cls._pending), []
            reqs = []
            for comm, kind, buf, peer in ops:
                if comm._mpi is None:  # one member: a send to oneself meets its recv
                    continue
                reqs.append(comm._mpi.Isend(buf, dest=peer, tag=21) if kind == "send" else
                            comm._mpi.Irecv(buf, source=peer, tag=21))
            for r in reqs:
                r.Wait()
            if ops and ops[0][0]._mpi is None:
                sends = [b for _, k, b, _ in ops if k == "send"]
                recvs = [b for _, k, b, _ in ops if k == "recv"]
                for src, dst in zip(sends, recvs):
                    dst[...] = src

    class NcclCommunicator:
        def __init__(self, ndev, comm_id, rank):
            assert len(comm_id) == 128 and 0 <= rank < ndev
            self._n, self._rank, self._mpi = ndev, rank, None
            if ndev > 1:
                from mpi4py import MPI

                world = MPI.COMM_WORLD
                if world.Get_size() != ndev:
                    raise NotImplementedError("fake NCCL: groups of 1 or of every rank only")
                self._mpi = world.Split(0, rank)

        def _op(self, op):
            from mpi4py import MPI

            return {0: MPI.SUM, 2: MPI.MAX, 3: MPI.MIN}[op]

        def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
            src, dst = _memory(sendbuf, count, datatype), _memory(recvbuf, count, datatype)
            if self._mpi is None:
                dst[...] = src
            else:
                self._mpi.Allreduce(src, dst, op=self._op(op))

        def allGather(self, sendbuf, recvbuf, count, datatype, stream):
            src = _memory(sendbuf, count, datatype)
            dst = _memory(recvbuf, count * self._n, datatype)
            if self._mpi is None:
                dst[...] = src
            else:
                self._mpi.Allgather(src, dst)

        def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
            src = _memory(sendbuf, recvcount * self._n, datatype)
            dst = _memory(recvbuf, recvcount, datatype)
            if self._mpi is None:
                dst[...] = src
            else:
                self._mpi.Reduce_scatter_block(src, dst, op=self._op(op))

        def send(self, sendbuf, count, datatype, peer, stream):
            assert _FakeNccl._grouped[0] > 0 and 0 <= peer < self._n
            _FakeNccl._pending.append((self, "send", _memory(sendbuf, count, datatype), peer))

        def recv(self, recvbuf, count, datatype, peer, stream):
            assert _FakeNccl._grouped[0] > 0 and 0 <= peer < self._n
            _FakeNccl._pending.append((self, "recv", _memory(recvbuf, count, datatype), peer))


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _forward(_np, name)


# ------------------------------------------------------------ installation

_saved: dict = {}


def install() -> None:
    """``import cupy`` gives this module from now on (spmd then takes it for CuPy)."""
    mod = sys.modules[__name__]
    if mod.__spec__ is None:  # run as a script: importlib.util.find_spec needs one
        import importlib.machinery

        mod.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    for name in ("cupy", "cupy.cuda", "cupy.cuda.nccl"):  # (the real ones, if imported)
        _saved.setdefault(name, sys.modules.get(name))
    sys.modules["cupy"] = mod
    # Without FAKE_CUPY_NCCL=1, `from cupy.cuda import nccl` fails: no NCCL.
    sys.modules["cupy.cuda"] = cuda
    sys.modules.pop("cupy.cuda.nccl", None)
    if os.environ.get("FAKE_CUPY_NCCL") == "1":
        cuda.nccl = sys.modules["cupy.cuda.nccl"] = _FakeNccl("cupy.cuda.nccl")
    elif hasattr(cuda, "nccl"):
        del cuda.nccl


def uninstall() -> None:
    for name, old in _saved.items():
        if old is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = old
    _saved.clear()


if __name__ == "__main__":  # pragma: no cover - a developer's tool
    os.environ["SPMD_PLATFORM"] = "gpu"
    sys.modules.setdefault("fake_cupy", sys.modules["__main__"])
    install()
    import pytest

    sys.exit(pytest.main(sys.argv[1:]))

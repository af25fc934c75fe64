"""A strict stand-in for CuPy on the CPU, to test spmd's GPU code paths without a GPU.

It checks the plumbing, not CuPy itself: its arrays (:class:`ndarray`) wrap numpy
arrays and behave like CuPy's where spmd could go wrong:

- its functions refuse numpy arrays as operands (``TypeError``, as CuPy's
  ``Unsupported type <class 'numpy.ndarray'>``), except ``asarray``/``array``,
  which copy host data to the "device";
- ``np.asarray(x)`` and numpy functions that convert their operands raise
  ``TypeError`` (CuPy refuses implicit device-to-host copies); ``x.get()`` and
  ``asnumpy(x)`` copy to the host;
- reductions and scalar indexing return 0-d arrays, never numpy scalars;
- every array lives on one GPU (the current device when it was made,
  ``x.device``); a kernel given an array of another GPU raises ``ValueError``
  (CuPy without peer access), and ``asarray`` copies it to the current GPU;
- it sees ``FAKE_CUPY_GPUS`` GPUs (default 1), or the ones ``CUDA_VISIBLE_DEVICES``
  lists, each with its own PCI bus id (``Device(i).pci_bus_id``), so per-rank
  GPU binding can be simulated;
- ``x.data.ptr`` is a real address; :mod:`tests.gpu.fake_nccl` (``cupy.cuda.nccl``
  when ``FAKE_CUPY_NCCL=1``) accepts only pointers inside a live array of the
  communicator's GPU.

What it cannot check: which functions CuPy lacks or implements differently,
kernels, asynchronous streams, NCCL itself.  Those need a GPU (tests/gpu/test_gpu.py).

Use ``install()`` to make ``import cupy`` return this module (``uninstall()`` undoes
it); ``python tests/gpu/fake_cupy.py pytest-args...`` runs pytest with it
installed and ``SPMD_PLATFORM=gpu``.
"""

from __future__ import annotations

import os
import sys
import types
import weakref

import numpy as _np

# The current device (cupy.cuda.Device(i).use() sets it).
_current = [0]


def _on_current(x):
    if x._dev != _current[0]:  # CuPy's kernels refuse another GPU's arrays (no peer access)
        raise ValueError(f"Array device must be same as the current device: array device = "
                         f"{x._dev} while current = {_current[0]} (fake cupy)")
    return x._a


def _unwrap(x):
    t = type(x)
    if t is ndarray:
        return _on_current(x)
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
    if t is list:
        return [_wrap(e) for e in r]
    if isinstance(r, tuple):  # numpy's QRResult, EighResult, ...: CuPy returns tuples
        return tuple(_wrap(e) for e in r)
    return r


# FAKE_CUPY_LOG=path: record every module function, ufunc method and array
# attribute used (one name a line), to check them against the real CuPy's namespace.
_LOG = os.environ.get("FAKE_CUPY_LOG")


def _log(name: str) -> None:
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(name + "\n")


def _device_fn(fn, name=None, owner=None):
    def call(*args, **kwargs):
        if name:
            _log(name)
        if owner is not None:  # a method of a device array: a kernel on its GPU
            _on_current(owner)
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


def _forward(obj, name, where="cupy", owner=None):
    _log(f"{where}.{name}")
    attr = getattr(obj, name)
    if isinstance(attr, (type, _np.dtype)) or not callable(attr):
        if isinstance(attr, types.ModuleType):
            return _Namespace(attr)
        if type(attr) is _np.ndarray:  # a view (x.T, x.real): on its array's GPU
            return ndarray(attr, owner._dev if owner is not None else None)
        return attr
    return _device_fn(attr, owner=owner)


class _Namespace:
    """A numpy submodule (linalg, fft, ...) with device semantics."""

    def __init__(self, mod):
        self._mod = mod

    def __getattr__(self, name):
        return _forward(self._mod, name, "cupy." + self._mod.__name__.split(".")[-1])


class ndarray:
    """A "device" array: a numpy array that refuses to be read implicitly."""

    __slots__ = ("_a", "_dev", "__weakref__")
    __array_ufunc__ = None      # numpy operators with a host array defer, then fail
    __array_priority__ = 100    # below spmd's Array and Tracer (1000)

    def __init__(self, a, device=None):
        self._a = a
        self._dev = _current[0] if device is None else device

    @property
    def device(self):
        return _Device(self._dev)

    @property
    def data(self):
        """A memory pointer (``.ptr``, ``.device_id``) to the first element."""
        return _pointer(self)

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed (fake cupy). "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def get(self):
        return self._a.copy()

    def __getattr__(self, name):
        if name.startswith("__"):  # numpy's probes (__array_struct__, ...): no host view
            raise AttributeError(name)
        return _forward(self._a, name, "ndarray", owner=self)

    def __repr__(self):
        return "fake_cupy." + repr(self._a)

    __str__ = __repr__

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(e) for e in self._a)

    def __getitem__(self, index):
        r = self._a[_unwrap(index)]  # basic indexing makes a view, on this array's GPU
        return ndarray(r if type(r) is _np.ndarray else _np.asarray(r), self._dev)

    def __setitem__(self, index, value):
        _on_current(self)
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
        return _wrap(op(_on_current(self), _unwrap(other)))

    return method


def _rbinary(op):
    def method(self, other):
        if type(other) not in (ndarray, int, float, complex, bool) and \
                not isinstance(other, _np.generic):
            if type(other) is _np.ndarray:
                _unwrap(other)  # raises: numpy array operand
            return NotImplemented
        return _wrap(op(_unwrap(other), _on_current(self)))

    return method


def _inplace(op):
    def method(self, other):
        op(_on_current(self), _unwrap(other))
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
    setattr(ndarray, f"__{_name}__", (lambda f: lambda self: _wrap(f(_on_current(self))))(_fn))
ndarray.__hash__ = None


# ------------------------------------------------------------- module surface

def asarray(x, dtype=None, order=None):
    """CuPy's: a device array of another GPU is copied to the current one."""
    if type(x) is ndarray:
        if x._dev != _current[0]:
            return ndarray(_np.array(x._a, dtype=dtype, copy=True))
        return x if dtype is None or x.dtype == dtype else ndarray(x._a.astype(dtype))
    _unwrap(x) if type(x) in (list, tuple) else None  # numpy arrays inside lists: refused
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
    ptr = 0  # the legacy default stream, as CuPy's

    def synchronize(self):
        pass


class CUDARuntimeError(RuntimeError):
    pass


def _visible() -> list:
    """The physical GPUs this process sees: CUDA_VISIBLE_DEVICES, else FAKE_CUPY_GPUS."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        out = []
        for item in listed.split(","):
            if not item.strip().isdigit():
                break  # CUDA stops at the first invalid entry
            out.append(int(item))
        return out
    return list(range(int(os.environ.get("FAKE_CUPY_GPUS", "1"))))


class _Device:
    """``cupy.cuda.Device``: ``Device()`` is the current one; a context manager."""

    def __init__(self, device=None):
        self.id = _current[0] if device is None else int(device)
        self._saved: list = []

    def _check(self):
        if not 0 <= self.id < len(_visible()):
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal (fake cupy)")

    def use(self):
        self._check()
        _current[0] = self.id

    def synchronize(self):
        self._check()

    @property
    def pci_bus_id(self) -> str:
        self._check()
        return f"0000:{0x10 + _visible()[self.id]:02X}:00.0"

    def __enter__(self):
        self._check()
        self._saved.append(_current[0])
        _current[0] = self.id
        return self

    def __exit__(self, *exc):
        _current[0] = self._saved.pop()

    def __eq__(self, other):
        return isinstance(other, _Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


def _device_count() -> int:
    return len(_visible())


cuda = types.SimpleNamespace(
    runtime=types.SimpleNamespace(getDeviceCount=_device_count,
                                  getDevice=lambda: _current[0],
                                  deviceGetPCIBusId=lambda i: _Device(i).pci_bus_id,
                                  CUDARuntimeError=CUDARuntimeError),
    Device=_Device, get_current_stream=lambda: _Stream(), Stream=_Stream)


# Allocations whose pointers were taken (``x.data``): start address -> (end, GPU,
# weak reference to the numpy array owning the memory).  The fake NCCL accepts
# only pointers inside one of them, on its communicator's GPU.
_allocations: dict = {}


class _MemoryPointer:
    __slots__ = ("ptr", "device_id", "_keep")

    def __init__(self, ptr, device_id, keep):
        self.ptr, self.device_id, self._keep = ptr, device_id, keep


def _pointer(x: ndarray) -> _MemoryPointer:
    root = x._a
    while isinstance(root.base, _np.ndarray):
        root = root.base
    start = root.ctypes.data
    entry = _allocations.get(start)
    if entry is None or entry[2]() is not root:
        def forget(ref, start=start):
            if _allocations.get(start, (None, None, None))[2] is ref:
                del _allocations[start]

        _allocations[start] = (start + root.nbytes, x._dev, weakref.ref(root, forget))
    return _MemoryPointer(x._a.ctypes.data, x._dev, x)


def allocation_of(ptr: int, nbytes: int):
    """``(GPU, numpy array)`` of the live allocation holding ``[ptr, ptr + nbytes)``,
    or None (used by the fake NCCL)."""
    for start, (end, dev, ref) in list(_allocations.items()):
        root = ref()
        if root is not None and start <= ptr and ptr + nbytes <= end:
            return dev, root
    return None


# ------------------------------------------------------------ ElementwiseKernel

# The CUDA math functions a kernel's operation may call, by their numpy names.
_C_FUNCS = {"exp": _np.exp, "log": _np.log, "log1p": _np.log1p, "expm1": _np.expm1,
            "tanh": _np.tanh, "sqrt": _np.sqrt, "sin": _np.sin, "cos": _np.cos,
            "fabs": _np.abs, "pow": _np.power}
_C_CASTS = {"float": _np.float32, "double": _np.float64}
kernels_built: list = []  # (name, operation) of every ElementwiseKernel made


class ElementwiseKernel:
    """CuPy's ``ElementwiseKernel(in_params, out_params, operation, name)`` for the C
    subset spmd's fused kernels use (statements separated by ``;``: typed locals
    ``float t0 = ...`` and one assignment to each output; literals, typed casts,
    arithmetic, comparisons, ``?:`` and the math functions of ``_C_FUNCS``),
    evaluated with numpy on the stand-in's arrays.  It checks what can go wrong
    before a GPU compiles it: the parameter lists, every name the operation reads,
    that each output is assigned once, the C syntax of this subset and that the
    arguments are arrays of the current GPU with the declared dtypes."""

    def __init__(self, in_params, out_params, operation, name="kernel"):
        self.ins = [self._param(p) for p in in_params.split(",")]
        self.outs = [self._param(p) for p in out_params.split(",")]
        out_names = [n for _, n in self.outs]
        self.statements, assigned = [], []
        for stmt in operation.split(";"):
            target, _, expr = stmt.partition("=")
            words = target.split()
            if len(words) == 2 and words[0] in _C_CASTS:  # a local
                dtype, what = _np.dtype(_C_CASTS[words[0]]), words[1]
            elif len(words) == 1 and words[0] in out_names:
                dtype, what = None, words[0]
                assigned.append(what)
            else:
                raise ValueError(f"fake cupy: {stmt.strip()!r} neither declares a local "
                                 f"nor assigns an output of {out_params!r}")
            if not expr.strip():
                raise SyntaxError(f"fake cupy: nothing assigned in {stmt.strip()!r}")
            self.statements.append((what, dtype, self._tokenize(expr)))
        if sorted(assigned) != sorted(out_names):
            raise ValueError(f"fake cupy: operation must assign each of {out_names} once: "
                             f"{operation!r}")
        self.name = name
        self._run({n: _np.zeros((), d) for d, n in self.ins})  # a syntax check
        kernels_built.append((name, operation))

    @staticmethod
    def _param(text):
        dtype, name = text.split()
        return _np.dtype(dtype), name

    @staticmethod
    def _tokenize(expr):
        import re

        tokens = re.findall(r"\d+\.\d*(?:e[-+]?\d+)?|\d+(?:e[-+]?\d+)?|[A-Za-z_]\w*|"
                            r"<=|>=|==|!=|[-+*/<>?:(),]", expr)
        if "".join(tokens) != "".join(expr.split()):
            raise SyntaxError(f"fake cupy: cannot read the operation {expr!r}")
        return tokens

    def __call__(self, *args):
        ins, outs = args[:len(self.ins)], args[len(self.ins):]
        if len(ins) != len(self.ins) or len(outs) != len(self.outs):
            raise TypeError(f"fake cupy: {self.name} takes {len(self.ins)} inputs and "
                            f"{len(self.outs)} outputs, got {len(args)} arrays")
        env = {}
        for (dtype, name), a in zip(self.ins + self.outs, args):
            if not isinstance(a, ndarray) or a.dtype != dtype:
                raise TypeError(f"fake cupy: {self.name}: {name} must be a {dtype} "
                                f"device array, got {type(a).__name__}")
        for (dtype, name), a in zip(self.ins, ins):
            env[name] = _on_current(a)
        values = self._run(env)
        for (dtype, name), out in zip(self.outs, outs):
            _on_current(out)[...] = _np.asarray(values[name], dtype=dtype)
        return outs[0] if len(outs) == 1 else outs

    def _run(self, env):
        """The outputs' values: the statements in order, a local cast to its type."""
        env, values = dict(env), {}
        for what, dtype, tokens in self.statements:
            value = self._eval(tokens, env)
            if dtype is not None:
                env[what] = _np.asarray(value, dtype=dtype)
            else:
                values[what] = value
        return values

    def _eval(self, tokens, env):
        toks, pos = tokens, [0]

        def peek():
            return toks[pos[0]] if pos[0] < len(toks) else None

        def take(want=None):
            tok = peek()
            if tok is None or (want is not None and tok != want):
                raise SyntaxError(f"fake cupy: expected {want!r} at token {pos[0]}")
            pos[0] += 1
            return tok

        def ternary():
            cond = binary(0)
            if peek() == "?":
                take("?")
                a = ternary()
                take(":")
                b = ternary()
                return _np.where(cond, a, b)
            return cond

        levels = [("<", "<=", ">", ">=", "==", "!="), ("+", "-"), ("*", "/")]
        ops = {"+": _np.add, "-": _np.subtract, "*": _np.multiply, "/": _np.divide,
               "<": _np.less, "<=": _np.less_equal, ">": _np.greater,
               ">=": _np.greater_equal, "==": _np.equal, "!=": _np.not_equal}

        def binary(level):
            if level == len(levels):
                return unary()
            left = binary(level + 1)
            while peek() in levels[level]:
                op = take()
                left = ops[op](left, binary(level + 1))
            return left

        def unary():
            if peek() == "-":
                take()
                return _np.negative(unary())
            return atom()

        def atom():
            tok = take()
            if tok == "(":
                if peek() in _C_CASTS and toks[pos[0] + 1] == ")":
                    cast = _C_CASTS[take()]
                    take(")")
                    return cast(unary())
                value = ternary()
                take(")")
                return value
            if tok in _C_FUNCS:
                take("(")
                args = [ternary()]
                while peek() == ",":
                    take(",")
                    args.append(ternary())
                take(")")
                return _C_FUNCS[tok](*args)
            if tok in ("true", "false"):
                return _np.bool_(tok == "true")
            if tok[0].isdigit():  # an untyped C literal: double, or int
                return _np.float64(tok) if "." in tok or "e" in tok else int(tok)
            if tok not in env:
                raise NameError(f"fake cupy: the operation reads {tok!r}, not a parameter")
            return env[tok]

        value = ternary()
        if peek() is not None:
            raise SyntaxError(f"fake cupy: unread tokens from {peek()!r}")
        return value


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _forward(_np, name)


# ------------------------------------------------------------ installation

_saved: dict = {}


def install() -> None:
    """``import cupy`` gives this module from now on (spmd then takes it for CuPy)."""
    import importlib.machinery

    mod = sys.modules[__name__]
    # importlib.util.find_spec("cupy") (how spmd asks whether CuPy is installed,
    # without importing it) returns the spec of the module in sys.modules.
    _saved.setdefault("__spec__", mod.__spec__)
    mod.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    for name in ("cupy", "cupy.cuda", "cupy.cuda.nccl"):  # (the real ones, if imported)
        _saved.setdefault(name, sys.modules.get(name))
    sys.modules["cupy"] = mod
    # Without FAKE_CUPY_NCCL=1, `from cupy.cuda import nccl` fails: no NCCL.
    sys.modules["cupy.cuda"] = cuda
    sys.modules.pop("cupy.cuda.nccl", None)
    _current[0] = 0
    if os.environ.get("FAKE_CUPY_NCCL") == "1":
        try:
            from tests.gpu import fake_nccl
        except ImportError:  # run as a script from tests/gpu
            import fake_nccl

        cuda.nccl = sys.modules["cupy.cuda.nccl"] = fake_nccl.module()
    elif hasattr(cuda, "nccl"):
        del cuda.nccl


def uninstall() -> None:
    if "__spec__" in _saved:
        sys.modules[__name__].__spec__ = _saved.pop("__spec__")
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

"""The platform of this process's devices (``cpu`` or ``gpu``) and its array module.

- ``SPMD_PLATFORM=gpu`` (or ``spmd-run --platform gpu``, or
  ``spmd.distributed.initialize(platform="gpu")``) asks for GPUs: values live in
  GPU memory as CuPy arrays and programs run on CuPy; without CuPy or without a
  GPU that is an error saying which is missing.
- ``SPMD_PLATFORM=cpu`` asks for (simulated) CPU devices: numpy.
- Unset: GPUs when CuPy is installed and sees one, else CPU.  Without CuPy the
  check costs one ``importlib.util.find_spec``: cupy is never imported on the
  CPU path.

On GPUs each process uses the GPU of its local rank (its index among the ranks
of its node: ``MPI_LOCALRANKID``, ``OMPI_COMM_WORLD_LOCAL_RANK``,
``SLURM_LOCALID``, ..., or per simulated node with ``SPMD_SIMULATE_NODES``,
:mod:`spmd.launch.nodes`), modulo the GPUs it sees; all of a process's devices
(``SPMD_LOCAL_DEVICES``) are simulated on that one GPU.  The GPU is chosen when
the array module is first resolved (``spmd.distributed.initialize`` does it at
once), and CuPy arrays made before on another GPU are copied to it when spmd
takes them.  Collectives between processes go through NCCL
(:mod:`spmd.collectives.nccl`) unless ``SPMD_GPU_BACKEND=mpi`` (or NCCL is
missing), which stages them through host memory and MPI; NCCL cannot put two
ranks on one GPU, so more ranks than GPUs on a node needs the ``mpi`` backend.
Ranks bound to one GPU each by their own ``CUDA_VISIBLE_DEVICES`` are accepted;
NCCL's communicators then check, by PCI bus id, that no two ranks share one.

>>> xp_for("cpu") is np
True
"""

from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np

from spmd.compiler.core import array_module
from spmd.errors import SpmdError
from spmd.launch import nodes, runtime

PLATFORMS = ("cpu", "gpu")
GPU_BACKENDS = ("nccl", "mpi")
INSTALL_CUPY = ("install CuPy for your CUDA version (`nvidia-smi` shows it): "
                "`pip install cupy-cuda12x` (CUDA 12) or `pip install cupy-cuda13x` (CUDA 13)")


class PlatformError(SpmdError, RuntimeError):
    """The requested platform cannot run here (no CuPy, no GPU, too few GPUs)."""


# --------------------------------------------------------------- the decision

def _cupy_installed() -> bool:
    """Whether ``import cupy`` can work, without importing it."""
    return importlib.util.find_spec("cupy") is not None

def requested() -> str | None:
    """The platform asked for (``initialize``, else ``SPMD_PLATFORM``), or None."""
    value = runtime._forced.get("platform") or os.environ.get("SPMD_PLATFORM", "")
    value = value.strip().lower()
    if not value:
        return None
    if value not in PLATFORMS:
        raise PlatformError(f"SPMD_PLATFORM={value!r} is not one of {PLATFORMS}; use 'cpu' "
                            "for (simulated) CPU devices or 'gpu' for CuPy on NVIDIA GPUs, or "
                            "leave it unset to use a GPU when CuPy sees one")
    return value


def gpu_count() -> tuple[bool, int, str]:
    """(CuPy installed, GPUs it sees, why it sees none).  Imports cupy when installed."""
    if not _cupy_installed():
        return False, 0, ""
    try:
        import cupy

        return True, int(cupy.cuda.runtime.getDeviceCount()), ""
    except Exception as e:  # noqa: BLE001 - a missing driver raises CUDA's own types
        return True, 0, f"{type(e).__name__}: {e}"


@functools.lru_cache(maxsize=None)
def current() -> str:
    """This process's platform, decided once: ``'cpu'`` or ``'gpu'``."""
    asked = requested()
    if asked == "cpu":
        return "cpu"
    if asked is None and not _cupy_installed():
        return "cpu"  # the common CPU case: cupy is not even imported
    installed, count, why = gpu_count()
    if asked is None:
        return "gpu" if count > 0 else "cpu"
    if not installed:
        raise PlatformError(f"SPMD_PLATFORM=gpu needs CuPy, which is not installed; "
                            f"{INSTALL_CUPY}. Or run on CPU: SPMD_PLATFORM=cpu")
    if count == 0:
        detail = f" ({why})" if why else ""
        raise PlatformError(f"SPMD_PLATFORM=gpu: CuPy is installed but sees no GPU{detail}; "
                            "check the NVIDIA driver (`nvidia-smi`) and that the CuPy package "
                            "matches its CUDA version (cupy-cuda12x / cupy-cuda13x), or run on "
                            "CPU: SPMD_PLATFORM=cpu")
    return "gpu"


def gpu_backend() -> str:
    """How GPU arrays cross processes: ``'nccl'`` (default when CuPy has NCCL) or
    ``'mpi'`` (staged through host memory; ``SPMD_GPU_BACKEND=mpi`` forces it)."""
    value = os.environ.get("SPMD_GPU_BACKEND", "").strip().lower()
    if value and value not in GPU_BACKENDS:
        raise PlatformError(f"SPMD_GPU_BACKEND={value!r} is not one of {GPU_BACKENDS}; 'nccl' "
                            "runs collectives on the GPUs, 'mpi' stages them through host memory")
    if value == "mpi":
        return "mpi"
    if nccl_available():
        return "nccl"
    if value == "nccl":
        raise PlatformError("SPMD_GPU_BACKEND=nccl but CuPy cannot load NCCL; install it "
                            "(`pip install nvidia-nccl-cu12` or `nvidia-nccl-cu13`, matching "
                            "the CuPy package) or use SPMD_GPU_BACKEND=mpi")
    return "mpi"


def nccl_available() -> bool:
    """Whether CuPy can load NCCL (imports cupy; False without it)."""
    return _probe_nccl()


@functools.lru_cache(maxsize=None)
def _probe_nccl() -> bool:
    if not _cupy_installed():
        return False
    import warnings

    try:
        with warnings.catch_warnings():  # CuPy warns when libnccl is missing: we say it
            warnings.simplefilter("ignore")
            from cupy.cuda import nccl
    except Exception:  # noqa: BLE001 - any failure to load means "not available"
        return False
    return bool(getattr(nccl, "available", False))


# --------------------------------------------------------------- array module

def xp_for(platform: str):
    """The array module of ``platform``: numpy for ``'cpu'``, cupy for ``'gpu'``.

    >>> xp_for("cpu").__name__
    'numpy'
    """
    if platform == "cpu":
        return np
    if platform != "gpu":
        raise PlatformError(f"unknown platform {platform!r}; expected one of {PLATFORMS}")
    try:
        import cupy
    except ImportError as e:
        raise PlatformError(f"the gpu platform needs CuPy, which cannot be imported ({e}); "
                            f"{INSTALL_CUPY}") from None
    array_module.register_device_type(cupy.ndarray, cupy)
    return cupy


def local_rank() -> int:
    """This process's index among the ranks of its node (0 outside MPI; per simulated
    node with ``SPMD_SIMULATE_NODES``: :func:`spmd.launch.nodes.local_rank_size`).

    >>> local_rank() >= 0
    True
    """
    return nodes.local_rank_size()[0]


def gpu_for_rank(rank: int, local_size: int | None, gpus: int, backend: str,
                 bound: bool = False) -> int:
    """The GPU of the rank ``rank`` of its node; checks that NCCL gets one GPU per rank.

    ``bound``: each rank was given its own ``CUDA_VISIBLE_DEVICES`` (so it may see
    fewer GPUs than the node's ranks); then the check is left to the NCCL backend,
    which compares the ranks' PCI bus ids when they first meet.

    >>> gpu_for_rank(1, 2, 2, "nccl"), gpu_for_rank(3, 4, 2, "mpi")
    (1, 1)
    >>> gpu_for_rank(1, 2, 1, "nccl", bound=True)   # CUDA_VISIBLE_DEVICES=<one per rank>
    0
    """
    ranks = max(local_size or 0, rank + 1)
    if backend == "nccl" and ranks > gpus and not bound:
        raise PlatformError(
            f"{ranks if local_size else f'at least {ranks}'} ranks on this node but only "
            f"{gpus} GPU(s): NCCL cannot put two ranks on one GPU. Launch at most {gpus} "
            "rank(s) per node, or set SPMD_GPU_BACKEND=mpi to share GPUs and stage "
            "collectives through host memory")
    return rank % gpus


def select_gpu(cupy) -> int:
    """Make this rank's GPU the current CUDA device; returns its id."""
    gpus = int(cupy.cuda.runtime.getDeviceCount())
    rank, local_size = nodes.local_rank_size()  # (0, None) outside MPI
    backend = gpu_backend() if runtime.launched_by_mpi() else "mpi"
    bound = bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip())
    device = gpu_for_rank(rank, local_size, gpus, backend, bound)
    cupy.cuda.Device(device).use()
    return device


def resolve_array_module():
    """``(module, gpu)``: the array module of this process's devices and, for GPUs, the
    GPU this rank uses (picked now; None for numpy).  The compiler's ARRAY_MODULE
    extension point, filled by spmd._install."""
    xp = xp_for(current())
    return xp, (select_gpu(xp) if xp is not np else None)


def reset() -> None:
    """Decide again on next use (the environment or ``initialize`` changed)."""
    current.cache_clear()
    _probe_nccl.cache_clear()
    array_module.set_current(None)


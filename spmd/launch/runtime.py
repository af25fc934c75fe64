"""The process runtime: detect an MPI launch and describe this process's devices.

Without MPI one process owns ``SPMD_NUM_DEVICES`` simulated devices (default
8).  Under ``mpirun``/``mpiexec``/``srun`` (detected from the environment) each
rank owns ``SPMD_LOCAL_DEVICES`` devices (default 1).  The devices' platform
(``cpu``, or ``gpu`` when asked for or when CuPy sees a GPU) is decided by
:mod:`spmd.launch.platform`; which ranks share a node, by :mod:`spmd.launch.nodes`;
all of it together, by :func:`spmd.launch.process.describe`.  This module reads the
environment only: the modules of the launch layer import it, and it imports none of
them.
"""

from __future__ import annotations

import os

from spmd.errors import DeviceError

# Environment variables that launchers set in every rank, by launcher.
_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
              "SLURM_PROCID")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")

_forced: dict = {}


def launched_by_mpi() -> bool:
    """True when a launcher started this process as one of several ranks."""
    if _forced.get("backend") == "mpi":
        return True
    if _forced.get("backend") == "local":
        return False
    for name in _SIZE_VARS:
        val = os.environ.get(name)
        if val and val.isdigit() and int(val) > 1:
            return True
    return False


def _env_count(name: str, default: int) -> int:
    """A positive device count from the environment variable ``name``."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        n = int(raw)
    except ValueError:
        raise DeviceError(f"{name}={raw!r} is not an integer; set it to a positive number "
                          f"of devices, e.g. {name}=8") from None
    if n < 1:
        raise DeviceError(f"{name}={n} must be at least 1")
    return n


def local_device_count() -> int:
    """This process's device count: as forced, else ``SPMD_LOCAL_DEVICES`` (default 1)
    for an MPI rank, ``SPMD_NUM_DEVICES`` (default 8) for a process alone."""
    if _forced.get("local_devices"):
        return _forced["local_devices"]
    if launched_by_mpi():
        return _env_count("SPMD_LOCAL_DEVICES", 1)
    return _env_count("SPMD_NUM_DEVICES", 8)


def overrides() -> dict:
    """What :func:`force` has set (a copy), to put back with :func:`set_overrides`."""
    return dict(_forced)


def set_overrides(state: dict) -> None:
    """Make the overrides exactly ``state`` (from :func:`overrides`); the mesh layer must
    then forget its cached devices (``spmd.mesh.devices.reset_for_tests``)."""
    _forced.clear()
    _forced.update(state)


def force(backend: str | None = None, local_devices: int | None = None,
          platform: str | None = None) -> None:
    """Override detection (``spmd.distributed.initialize``, which then has the mesh layer
    forget its cached devices)."""
    if backend is not None:
        _forced["backend"] = backend
    if local_devices is not None:
        _forced["local_devices"] = int(local_devices)
    if platform is not None:
        _forced["platform"] = platform

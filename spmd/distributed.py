"""``spmd.distributed``: choose how this process finds its peers and devices.

Usually nothing needs calling: a process started by ``spmd-run``/``mpiexec``/
``srun`` is detected as an MPI rank from its environment, and a plain
``python`` process owns ``SPMD_NUM_DEVICES`` simulated CPU devices.
:func:`initialize` overrides that detection, as ``jax.distributed.initialize``
sets up a multi-process JAX job; call it before the first use of devices.
"""

from __future__ import annotations

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.collectives.mpi import control as mpi_control  # no MPI import: only the counters
from spmd.errors import ArgumentError
from spmd.launch import mpi_init as mpi, runtime
from spmd.mesh.devices import reset_for_tests

_BACKENDS = ("mpi", "local")
_PLATFORMS = ("cpu", "gpu")


def initialize(backend: str | None = None, local_devices: int | None = None,
               platform: str | None = None) -> None:
    """Configure the process runtime, overriding what the environment says.

    Args:
      backend: ``"mpi"`` makes this process an MPI rank even when the launcher
        is not recognised (MPI is initialised now, through mpi4py);
        ``"local"`` makes it a single process owning all devices, even under
        ``mpiexec``. ``None`` keeps the detection.
      local_devices: devices owned by this process (instead of
        ``SPMD_LOCAL_DEVICES`` under MPI, ``SPMD_NUM_DEVICES`` without).
      platform: ``"cpu"`` or ``"gpu"`` (instead of ``SPMD_PLATFORM``).

    The device list is rebuilt on the next ``spmd.devices()``; meshes and arrays
    made before the call keep the devices they had.

    >>> import spmd
    >>> spmd.distributed.initialize(backend="local", local_devices=4)
    >>> spmd.device_count()
    4
    """
    if backend is not None and backend not in _BACKENDS:
        raise ArgumentError(f"spmd.distributed.initialize: backend={backend!r} is not one of "
                            f"{_BACKENDS}; use 'mpi' for a multi-process job, 'local' for one "
                            "process, or None to detect it from the launcher's environment")
    if local_devices is not None:
        if isinstance(local_devices, bool) or not isinstance(local_devices, int) \
                or local_devices < 1:
            raise ArgumentError(f"spmd.distributed.initialize: local_devices={local_devices!r} "
                                "must be a positive int (the number of devices of this process)")
    if platform is not None and platform not in _PLATFORMS:
        raise ArgumentError(f"spmd.distributed.initialize: platform={platform!r} is not one of "
                            f"{_PLATFORMS}")
    if backend == "mpi":
        mpi.world()  # fail now, with the install hint, if mpi4py is missing
    runtime.force(backend=backend, local_devices=local_devices, platform=platform)
    reset_for_tests()  # devices, the platform and its array module are decided again


def collective_time() -> tuple[int, float]:
    """``(calls, seconds)``: the MPI collectives this process has run and the seconds it
    spent in them, waiting for the other ranks included; ``(0, 0.0)`` in a process
    that is not an MPI rank (the simulated devices' collectives are array operations
    inside the compiled program).  The difference of two readings around training
    steps gives the share of step time spent communicating.

    >>> calls0, t0 = spmd.distributed.collective_time()
    >>> ...  # some steps
    >>> calls1, t1 = spmd.distributed.collective_time()
    """
    return mpi_control.collective_time()

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()

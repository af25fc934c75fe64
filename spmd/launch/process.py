"""This process's place in the job: its index, the job's size, its devices, their platform.

The one function the mesh layer asks (:func:`describe`).  It sits above the launch
layer's other modules, which it combines: the environment (:mod:`spmd.launch.runtime`),
MPI (:mod:`spmd.launch.mpi_init`), the nodes (:mod:`spmd.launch.nodes`) and the platform
(:mod:`spmd.launch.platform`).
"""

from __future__ import annotations

from spmd.compiler.core import array_module
from spmd.launch import mpi_init as mpi, nodes, runtime
from spmd.launch.platform import current


def describe() -> tuple[int, int, int, str]:
    """``(process_index, process_count, local_device_count, platform)``.

    >>> from spmd.launch import process
    >>> process.describe()[:2]   # one process, not launched by MPI
    (0, 1)
    """
    if runtime.launched_by_mpi():
        nodes.simulated()  # a bad SPMD_SIMULATE_NODES raises now, on every rank alike
    platform = current()  # raises PlatformError when gpu is asked for and cannot run
    if platform == "gpu":
        array_module.current()  # picks this rank's GPU now (and checks ranks vs GPUs)
    if runtime.launched_by_mpi():
        comm = mpi.world()
        return comm.Get_rank(), comm.Get_size(), runtime.local_device_count(), platform
    return 0, 1, runtime.local_device_count(), platform

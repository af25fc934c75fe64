"""Layer 2: devices and meshes.

In one process without MPI there are ``SPMD_NUM_DEVICES`` simulated CPU devices
(default 8).  Under MPI each rank owns ``SPMD_LOCAL_DEVICES`` devices (default
1) and :func:`devices` is the same global list on every rank.
"""

from spmd.mesh.devices import (Device, device_count, devices, local_device_count,  # noqa: F401
                               local_devices, process_count, process_index)
from spmd.mesh.mesh import AbstractMesh, AxisType, Mesh, make_mesh  # noqa: F401

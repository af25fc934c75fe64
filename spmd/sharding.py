"""``spmd.sharding``: the sharding names in one place (as ``jax.sharding``)."""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.mesh import AbstractMesh, AxisType, Mesh  # noqa: F401
from spmd.shard.arrays.placing import SingleDeviceSharding  # noqa: F401
from spmd.shard.arrays.spec import NamedSharding, P, PartitionSpec  # noqa: F401
from spmd.shard.explicit.mesh_context import (get_abstract_mesh, get_mesh, set_mesh,  # noqa: F401
                                     use_mesh)
from spmd.shard.explicit.types import reshard  # noqa: F401
from spmd.shard.explicit.modes import auto_axes, explicit_axes  # noqa: F401

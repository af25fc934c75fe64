"""spmd: SPMD distributed execution for Python with a JAX-compatible API.

>>> import spmd, spmd.numpy as snp
>>> f = spmd.jit(lambda x: snp.tanh(x) * 2.0)
>>> print(spmd.make_jaxpr(f)(snp.ones(3)))   # doctest: +SKIP
"""

from spmd import config as _config_module
from spmd.config import config  # noqa: F401
from spmd import errors, tree, tree_util  # noqa: F401
from spmd.compiler import ops as _ops  # noqa: F401  (registers the primitives)
from spmd.compiler.array import Array  # noqa: F401
from spmd.compiler.avals import ShapedArray  # noqa: F401
from spmd.compiler.jit import eval_shape, jit, make_jaxpr  # noqa: F401
from spmd import numpy, lax  # noqa: F401
from spmd.autodiff import (grad, hessian, jacfwd, jacrev, jvp, linearize,  # noqa: F401
                           value_and_grad, vjp)
from spmd.vectorize import vmap  # noqa: F401
from spmd.compiler.custom import custom_jvp, custom_vjp  # noqa: F401
from spmd.compiler.remat import checkpoint, checkpoint_policies, remat  # noqa: F401
from spmd.compiler.remat import checkpoint_name  # noqa: F401
from spmd import ad_checkpoint, custom_derivatives, test_util  # noqa: F401

__version__ = "0.1.0"
from spmd import nn  # noqa: F401,E402
from spmd import random  # noqa: F401,E402
from spmd.mesh import (Device, Mesh, device_count, devices, local_device_count,  # noqa: F401
                       local_devices, make_mesh, process_count, process_index)
from spmd.shard.spec import NamedSharding, P, PartitionSpec  # noqa: F401
from spmd.shard.shard_map import shard_map  # noqa: F401
from spmd.shard.pmap import pmap  # noqa: F401,E402
from spmd import shard  # noqa: F401,E402
from spmd.shard.array import (make_array_from_callback,  # noqa: F401,E402
                              visualize_array_sharding)
# device_put also resolves a bare PartitionSpec against the mesh context.
from spmd.shard.mesh_context import device_put, set_mesh  # noqa: F401,E402
from spmd import sharding  # noqa: F401,E402
from spmd.shard.multiprocess import (make_array_from_process_local_data,  # noqa: F401,E402
                                     process_allgather)
from spmd.shard.partition.api import jit  # noqa: F401,E402  (plain or partitioned)
from spmd import distributed  # noqa: F401,E402
from spmd import debug  # noqa: F401,E402
from spmd.launch import platform as _platform  # noqa: F401,E402  (numpy or cupy: see there)
from spmd.config import disable_jit  # noqa: F401,E402
from spmd.compiler.avals import ShapeDtypeStruct  # noqa: F401,E402
from spmd.linear_util import linear_transpose  # noqa: F401,E402
from spmd import scipy  # noqa: F401,E402
from spmd._install import install_extensions as _install_extensions  # noqa: E402

# The compiler's extension points (spmd.compiler.extensions), filled from the layers
# above it in one place.
_install_extensions()

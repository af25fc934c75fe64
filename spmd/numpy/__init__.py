"""``spmd.numpy``: the numpy API over traced and concrete arrays (like ``jax.numpy``).

>>> import spmd.numpy as snp
>>> snp.ones((2, 3)).sum(axis=0)
Array([2., 2., 2.], dtype=float32)
"""

from spmd.numpy._creation import *  # noqa: F401,F403
from spmd.numpy._creation import arange, array, asarray, full, ones, zeros  # noqa: F401
from spmd.numpy._elementwise import *  # noqa: F401,F403
from spmd.numpy._elementwise import abs, round  # noqa: F401
from spmd.numpy._linalg import *  # noqa: F401,F403
from spmd.numpy._reductions import *  # noqa: F401,F403
from spmd.numpy._reductions import max, min, sum  # noqa: F401
from spmd.numpy._shape import *  # noqa: F401,F403
from spmd.numpy._shape_more import *  # noqa: F401,F403
from spmd.numpy._indexing import *  # noqa: F401,F403
from spmd.numpy._indexing import _getitem, _IndexUpdateHelper  # noqa: F401
from spmd.numpy._misc import *  # noqa: F401,F403
from spmd.numpy import _methods
from spmd.numpy import linalg  # noqa: F401,E402

import numpy as _np

from spmd.compiler.array import Array as ndarray  # noqa: F401

# dtype names, as in numpy / jax.numpy.
bool_ = _np.bool_
int8, int16, int32, int64 = _np.int8, _np.int16, _np.int32, _np.int64
uint8, uint16, uint32, uint64 = _np.uint8, _np.uint16, _np.uint32, _np.uint64
float16, float32, float64 = _np.float16, _np.float32, _np.float64
dtype = _np.dtype
pi, e, inf, nan, newaxis = _np.pi, _np.e, _np.inf, _np.nan, None

_methods.install()

"""``spmd.numpy``: the numpy API over traced and concrete arrays (like ``jax.numpy``).

``__all__`` lists the public names: each private module's own ``__all__``, the
dtype names, the constants, ``ndarray`` and ``broadcast_shapes``.

>>> import spmd.numpy as snp
>>> snp.ones((2, 3)).sum(axis=0)
Array([2., 2., 2.], dtype=float32)
"""

import numpy as _np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.compiler.core.array import Array as ndarray
from spmd.numpy import (_calculus, _comparison, _complex, _convolution, _creation, _diagonals,
                        _dtype_queries, _elementwise, _elementwise_composed, _index_tricks,
                        _indexing, _inserting, _joining, _linalg, _methods, _products, _ranges,
                        _reductions, _scalar_types, _shape, _statistics, _take, _tiling)
from spmd.numpy._complex import *  # noqa: F401,F403
from spmd.numpy._creation import *  # noqa: F401,F403
from spmd.numpy._dlpack import from_dlpack  # noqa: F401
from spmd.numpy._elementwise import *  # noqa: F401,F403
from spmd.numpy._indexing import *  # noqa: F401,F403
from spmd.numpy._indexing import _getitem, _IndexUpdateHelper  # noqa: F401
from spmd.numpy._linalg import *  # noqa: F401,F403
from spmd.numpy._comparison import *  # noqa: F401,F403
from spmd.numpy._convolution import *  # noqa: F401,F403
from spmd.numpy._reductions import *  # noqa: F401,F403
from spmd.numpy._shape import *  # noqa: F401,F403
from spmd.numpy._joining import *  # noqa: F401,F403
from spmd.numpy._inserting import *  # noqa: F401,F403
from spmd.numpy._tiling import *  # noqa: F401,F403
from spmd.numpy._take import *  # noqa: F401,F403
from spmd.numpy._diagonals import *  # noqa: F401,F403
from spmd.numpy._ranges import *  # noqa: F401,F403
from spmd.numpy._calculus import *  # noqa: F401,F403
from spmd.numpy._products import *  # noqa: F401,F403
from spmd.numpy._statistics import *  # noqa: F401,F403
from spmd.numpy._elementwise_composed import *  # noqa: F401,F403
from spmd.numpy._dtype_queries import *  # noqa: F401,F403
from spmd.numpy._index_tricks import *  # noqa: F401,F403
from spmd.numpy._util import broadcast_shapes
from spmd.numpy import linalg  # noqa: F401,E402  (spmd.numpy.linalg, a module as in numpy)

# dtype names, as in jax.numpy: each is also a constructor (snp.float32(x) on a
# tracer too); spmd/numpy/_scalar_types.py.
from spmd.numpy._scalar_types import *  # noqa: F401,F403,E402
dtype = _np.dtype
pi, e, inf, nan, newaxis = _np.pi, _np.e, _np.inf, _np.nan, None
# The abstract dtype classes, for issubdtype(x.dtype, snp.floating) and friends.
generic, number, inexact, floating, integer = (_np.generic, _np.number, _np.inexact,
                                               _np.floating, _np.integer)
signedinteger, unsignedinteger, complexfloating = (_np.signedinteger, _np.unsignedinteger,
                                                   _np.complexfloating)

__all__ = [
    *_complex.__all__, *_creation.__all__, *_elementwise.__all__, *_indexing.__all__,
    *_linalg.__all__, *_comparison.__all__, *_convolution.__all__, *_reductions.__all__,
    *_shape.__all__, *_joining.__all__, *_inserting.__all__, *_tiling.__all__, *_take.__all__,
    *_diagonals.__all__, *_ranges.__all__, *_calculus.__all__, *_products.__all__,
    *_statistics.__all__, *_elementwise_composed.__all__, *_dtype_queries.__all__,
    *_index_tricks.__all__,
    "broadcast_shapes", "ndarray", "from_dlpack",
    *_scalar_types.__all__, "dtype",
    "pi", "e", "inf", "nan", "newaxis",
    "generic", "number", "inexact", "floating", "integer", "signedinteger",
    "unsignedinteger", "complexfloating",
]

_methods.install()

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()

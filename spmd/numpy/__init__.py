"""``spmd.numpy``: the numpy API over traced and concrete arrays (like ``jax.numpy``).

``__all__`` lists the public names: each private module's own ``__all__``, the
dtype names, the constants, ``ndarray`` and ``broadcast_shapes``.

>>> import spmd.numpy as snp
>>> snp.ones((2, 3)).sum(axis=0)
Array([2., 2., 2.], dtype=float32)
"""

import numpy as _np

from spmd.compiler.array import Array as ndarray
from spmd.numpy import (_complex, _creation, _elementwise, _index_tricks, _indexing, _linalg,
                        _methods, _misc, _more, _reductions, _shape, _shape_more, _take,
                        _ufuncs_more)
from spmd.numpy._complex import *  # noqa: F401,F403
from spmd.numpy._creation import *  # noqa: F401,F403
from spmd.numpy._elementwise import *  # noqa: F401,F403
from spmd.numpy._indexing import *  # noqa: F401,F403
from spmd.numpy._indexing import _getitem, _IndexUpdateHelper  # noqa: F401
from spmd.numpy._linalg import *  # noqa: F401,F403
from spmd.numpy._misc import *  # noqa: F401,F403
from spmd.numpy._reductions import *  # noqa: F401,F403
from spmd.numpy._shape import *  # noqa: F401,F403
from spmd.numpy._shape_more import *  # noqa: F401,F403
from spmd.numpy._take import *  # noqa: F401,F403
from spmd.numpy._more import *  # noqa: F401,F403
from spmd.numpy._ufuncs_more import *  # noqa: F401,F403
from spmd.numpy._index_tricks import *  # noqa: F401,F403
from spmd.numpy._util import broadcast_shapes
from spmd.numpy import linalg  # noqa: F401,E402  (spmd.numpy.linalg, a module as in numpy)

# dtype names, as in numpy / jax.numpy.
bool_ = _np.bool_
int8, int16, int32, int64 = _np.int8, _np.int16, _np.int32, _np.int64
uint8, uint16, uint32, uint64 = _np.uint8, _np.uint16, _np.uint32, _np.uint64
float16, float32, float64 = _np.float16, _np.float32, _np.float64
complex64, complex128 = _np.complex64, _np.complex128
dtype = _np.dtype
pi, e, inf, nan, newaxis = _np.pi, _np.e, _np.inf, _np.nan, None
# The abstract dtype classes, for issubdtype(x.dtype, snp.floating) and friends.
generic, number, inexact, floating, integer = (_np.generic, _np.number, _np.inexact,
                                               _np.floating, _np.integer)
signedinteger, unsignedinteger, complexfloating = (_np.signedinteger, _np.unsignedinteger,
                                                   _np.complexfloating)

__all__ = [
    *_complex.__all__, *_creation.__all__, *_elementwise.__all__, *_indexing.__all__,
    *_linalg.__all__,
    *_misc.__all__, *_reductions.__all__, *_shape.__all__, *_shape_more.__all__,
    *_take.__all__, *_more.__all__, *_ufuncs_more.__all__, *_index_tricks.__all__,
    "broadcast_shapes", "ndarray",
    "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", "dtype",
    "pi", "e", "inf", "nan", "newaxis",
    "generic", "number", "inexact", "floating", "integer", "signedinteger",
    "unsignedinteger", "complexfloating",
]

_methods.install()

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()

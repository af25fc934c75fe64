"""``spmd.lax``: the primitives' direct bindings (no promotion or broadcasting).

Collectives and control flow are exported here too as they are added.
"""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.compiler.ops.elementwise import (  # noqa: F401
    abs, acos, add, asin, atan, atan2, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, ceil,
    convert as convert_element_type, cos, cosh, div, eq, exp, expm1, floor, ge, gt,
    integer_pow, is_finite, le, log, log1p, logistic, lt, max, min, mul, ne, neg, pow, rem,
    round, rsqrt, select, select_n, sign, sin, sinh, sqrt, sub, tan, tanh)
from spmd.compiler.ops.complex import conj, imag, real  # noqa: F401
from spmd.compiler.ops.complex import make_complex as complex  # noqa: F401,A001
from spmd.compiler.ops.linalg import dot_general  # noqa: F401
from spmd.compiler.ops.reduce import reduce_max, reduce_min, reduce_sum  # noqa: F401
from spmd.compiler.ops.structural import (  # noqa: F401
    broadcast_in_dim, full, iota, reshape, squeeze, transpose)
from spmd.compiler.transforms.ad import stop_gradient  # noqa: F401
from spmd.compiler.ops.indexing import (  # noqa: F401
    dynamic_slice, dynamic_update_slice, gather, scatter)
from spmd.compiler.ops.reduce import argmax, argmin, reduce_and, reduce_or  # noqa: F401
from spmd.compiler.ops.cumulative import (  # noqa: F401
    associative_scan, cummax, cummin, cumprod, cumsum, reduce_prod)
from spmd.compiler.ops.sort import sort, sort_key_val  # noqa: F401
from spmd.compiler.ops.slicing import concatenate, pad, rev, slice, slice_in_dim  # noqa: F401,A004
from spmd.lax.control_flow import cond, fori_loop, map, scan, switch, while_loop  # noqa: F401,A004
from spmd.collectives import (all_gather, all_gather_invariant, all_to_all,  # noqa: F401
                              axis_index, axis_size, pcast, pmax, pmean, pmin, ppermute, psum, psum_scatter, pvary)
from spmd.shard.partition.api import with_sharding_constraint  # noqa: F401,E402
from spmd.compiler.ops.special import digamma, erf, erf_inv, erfc, lgamma, polygamma  # noqa: F401,E402
from spmd.lax._conv import (ConvDimensionNumbers, conv, conv_dimension_numbers,  # noqa: F401,E402
                            conv_general_dilated, conv_with_general_padding, padtype_to_pads)
from spmd.lax._slicing import (approx_max_k, approx_min_k, dynamic_index_in_dim,  # noqa: F401,E402
                               dynamic_slice_in_dim, dynamic_update_slice_in_dim, top_k)

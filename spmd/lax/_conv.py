"""``lax.conv_general_dilated`` and friends: layouts (``dimension_numbers``) and
padding strings over the ``conv_general_dilated`` primitive (which works in the
NC.../OI.../NC... layout).

>>> import numpy as np
>>> from spmd import lax
>>> x = np.ones((1, 5, 5, 2), np.float32)       # NHWC
>>> w = np.ones((3, 3, 2, 4), np.float32)       # HWIO
>>> lax.conv_general_dilated(x, w, (1, 1), "SAME",
...                          dimension_numbers=("NHWC", "HWIO", "NHWC")).shape
(1, 5, 5, 4)
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from spmd.compiler.ops.conv import _dilate, conv as _conv_prim
from spmd.compiler.ops.elementwise import convert
from spmd.compiler.ops.structural import transpose
from spmd.compiler.core.trace import Tracer
from spmd.errors import ArgumentError
from spmd.numpy._util import promote_dtypes


class ConvDimensionNumbers(NamedTuple):
    """Positions of (batch, feature, *spatial) in ``lhs``, (out feature, in feature,
    *spatial) in ``rhs`` and (batch, feature, *spatial) in the output."""
    lhs_spec: tuple
    rhs_spec: tuple
    out_spec: tuple


def conv_dimension_numbers(lhs_shape, rhs_shape, dimension_numbers) -> ConvDimensionNumbers:
    """Normalize ``dimension_numbers`` (None, a ``ConvDimensionNumbers`` or a triple of
    strings such as ``("NHWC", "HWIO", "NHWC")``) to positions.  Spatial dimensions
    pair up by letter, in the order the ``rhs`` string lists them."""
    nd = len(lhs_shape)
    if len(rhs_shape) != nd:
        raise ArgumentError(f"conv_general_dilated: lhs and rhs ranks differ ({lhs_shape} and "
                            f"{rhs_shape})")
    if dimension_numbers is None:
        ident = tuple(range(nd))
        return ConvDimensionNumbers(ident, ident, ident)
    if isinstance(dimension_numbers, ConvDimensionNumbers):
        return dimension_numbers
    try:
        lhs, rhs, out = dimension_numbers
    except (TypeError, ValueError):
        raise ArgumentError(f"conv_general_dilated: dimension_numbers={dimension_numbers!r} "
                            "must be None, a ConvDimensionNumbers or three strings") from None
    if not all(isinstance(s, str) for s in (lhs, rhs, out)):
        return ConvDimensionNumbers(tuple(lhs), tuple(rhs), tuple(out))
    for spec, need, what in ((lhs, "NC", "lhs"), (rhs, "OI", "rhs"), (out, "NC", "out")):
        if len(spec) != nd or len(set(spec)) != nd or any(c not in spec for c in need):
            raise ArgumentError(f"conv_general_dilated: the {what} spec {spec!r} must name "
                                f"{nd} distinct dimensions including {need[0]!r} and "
                                f"{need[1]!r}")
    spatial = [c for c in rhs if c not in "OI"]
    for spec, what in ((lhs, "lhs"), (out, "out")):
        if sorted(c for c in spec if c not in "NC") != sorted(spatial):
            raise ArgumentError(f"conv_general_dilated: the {what} spec {spec!r} and the rhs "
                                f"spec {rhs!r} name different spatial dimensions")
    return ConvDimensionNumbers(
        (lhs.index("N"), lhs.index("C")) + tuple(lhs.index(c) for c in spatial),
        (rhs.index("O"), rhs.index("I")) + tuple(rhs.index(c) for c in spatial),
        (out.index("N"), out.index("C")) + tuple(out.index(c) for c in spatial))


def padtype_to_pads(in_shape, window_shape, window_strides, padding: str) -> list:
    """``(lo, hi)`` per spatial dimension for ``"VALID"``, ``"SAME"`` or ``"SAME_LOWER"``
    (``SAME``: the output has ``ceil(in / stride)`` elements, the extra padding at
    the end; ``SAME_LOWER`` puts it at the start)."""
    p = padding.upper()
    if p == "VALID":
        return [(0, 0)] * len(in_shape)
    if p not in ("SAME", "SAME_LOWER"):
        raise ArgumentError(f"conv_general_dilated: padding={padding!r} must be 'VALID', "
                            "'SAME', 'SAME_LOWER' or a sequence of (low, high) pairs")
    pads = []
    for n, k, s in zip(in_shape, window_shape, window_strides):
        out = -(-n // s)
        total = max((out - 1) * s + k - n, 0)
        small, big = total // 2, total - total // 2
        pads.append((small, big) if p == "SAME" else (big, small))
    return pads


def _static_ints(v, n, what):
    if v is None:
        return (1,) * n
    if isinstance(v, Tracer):
        raise ArgumentError(f"conv_general_dilated: {what} must be static ints")
    v = tuple(int(i) for i in (v if isinstance(v, (tuple, list)) else (v,) * n))
    if len(v) != n:
        raise ArgumentError(f"conv_general_dilated: {what}={v} needs {n} entries (one per "
                            "spatial dimension)")
    return v


def conv_general_dilated(lhs, rhs, window_strides: Sequence[int], padding,
                         lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
                         feature_group_count: int = 1, batch_group_count: int = 1,
                         precision=None, preferred_element_type=None):
    """General N-d convolution, as ``jax.lax.conv_general_dilated`` (``precision`` is
    accepted and ignored: numpy computes in the operands' dtype)."""
    x, w = promote_dtypes(lhs, rhs, fname="spmd.lax.conv_general_dilated")
    if preferred_element_type is not None:
        x, w = convert(x, preferred_element_type), convert(w, preferred_element_type)
    dn = conv_dimension_numbers(x.shape, w.shape, dimension_numbers)
    nsp = x.ndim - 2
    strides = _static_ints(window_strides, nsp, "window_strides")
    lhs_dil = _static_ints(lhs_dilation, nsp, "lhs_dilation")
    rhs_dil = _static_ints(rhs_dilation, nsp, "rhs_dilation")
    x, w = transpose(x, dn.lhs_spec), transpose(w, dn.rhs_spec)
    if isinstance(padding, str):
        window = [_dilate(k, d) for k, d in zip(w.shape[2:], rhs_dil)]
        pads = padtype_to_pads(x.shape[2:], window, strides, padding)
    else:
        try:
            pads = [(int(lo), int(hi)) for lo, hi in padding]
        except (TypeError, ValueError):
            raise ArgumentError(f"conv_general_dilated: padding={padding!r} must be a string "
                                "or a sequence of (low, high) pairs") from None
    out = _conv_prim(x, w, strides, pads, lhs_dil, rhs_dil, feature_group_count, batch_group_count)
    return transpose(out, tuple(int(i) for i in np.argsort(dn.out_spec)))


def conv(lhs, rhs, window_strides, padding, precision=None,
         preferred_element_type=None):
    """Convolution in the NC.../OI.../NC... layout, as ``jax.lax.conv``."""
    return conv_general_dilated(lhs, rhs, window_strides, padding, precision=precision,
                                preferred_element_type=preferred_element_type)


def conv_with_general_padding(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                              precision=None, preferred_element_type=None):
    """``conv_general_dilated`` in the default layout (``jax.lax.conv_with_general_padding``)."""
    return conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                precision=precision,
                                preferred_element_type=preferred_element_type)

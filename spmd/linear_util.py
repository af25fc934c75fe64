"""``linear_transpose``: the transpose of a linear function, without evaluating it.

``fun`` is traced once on the avals of ``primals`` (arrays or
``ShapeDtypeStruct``: only their shapes and dtypes matter) and the traced
program is transposed by the primitives' transpose rules (``backward_pass``),
as reverse mode does with its linear part.  A ``fun`` that is not linear in its
inputs (a product of two inputs, a non-linear function of one) raises.

>>> import numpy as np, spmd
>>> f_t = spmd.linear_transpose(lambda x: 2.0 * x[::-1], np.zeros(3, np.float32))
>>> f_t(np.array([1.0, 2.0, 3.0], np.float32))
(Array([6., 4., 2.], dtype=float32),)
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd import tree_util
from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad import backward_pass, zeros_for
from spmd.compiler.transforms.ad_util import Zero
from spmd.compiler.core.avals import abstract_arg_aval, tangent_aval
from spmd.compiler.core.jit import flatten_outputs
from spmd.compiler.core.trace import get_aval, trace_to_program
from spmd.errors import ArgumentError, SpmdError
from spmd.numpy._util import to_array


class NotLinearError(SpmdError, TypeError):
    """``linear_transpose`` was given a function that is not linear in its inputs."""


def _aval(x):
    a = abstract_arg_aval(x)
    return get_aval(x) if a is None else a


def linear_transpose(fun: Callable, *primals, reduce_axes=()) -> Callable:
    """The transpose of the linear ``fun`` at inputs shaped like ``primals``:
    ``f_t(ct)`` returns a tuple with one cotangent per primal (the output's
    structure in, the inputs' structure out)."""
    if reduce_axes:
        raise ArgumentError("linear_transpose: reduce_axes is not supported (JAX removed "
                            "it); reduce the cotangent explicitly")
    leaves, in_tree = tree_util.tree_flatten(primals)
    avals = [_aval(x) for x in leaves]
    for i, a in enumerate(avals):
        if not dtypes.is_inexact(a.dtype):
            raise ArgumentError(f"linear_transpose: input {i} has dtype {a.dtype}; a linear "
                                "function's inputs must be floating point")
    box: list = []

    def flat(*xs):
        out = fun(*tree_util.tree_unflatten(in_tree, list(xs)))
        outs, out_tree = flatten_outputs(out, f"linear_transpose({_name(fun)})")
        box[:] = [out_tree]
        return outs

    closed = trace_to_program(flat, avals)
    out_tree = box[0]
    out_avals = closed.out_avals
    lin_avals = [tangent_aval(a) for a in avals]

    def transposed(ct):
        ct_leaves, ct_tree = tree_util.tree_flatten(ct)
        if ct_tree != out_tree:
            raise ArgumentError(f"linear_transpose({_name(fun)}): the cotangent's structure "
                                f"{ct_tree} differs from the output's {out_tree}")
        cts = []
        for i, (c, a) in enumerate(zip(ct_leaves, out_avals)):
            got = get_aval(c)
            if got.shape != a.shape or (got.dtype != a.dtype and not got.weak_type):
                raise ArgumentError(f"linear_transpose({_name(fun)}): cotangent {i} has type "
                                    f"{got.str_short()}, the output has type {a.str_short()}")
            cts.append(np.asarray(c, a.dtype) if not hasattr(c, "aval") else c)
        try:
            res = backward_pass(closed.program, closed.consts, lin_avals, cts)
        except (NotImplementedError, AssertionError) as e:
            raise NotLinearError(
                f"linear_transpose({_name(fun)}): the function is not linear in its inputs "
                f"({str(e) or 'a product of two of its inputs'}); pass a linear function") from None
        res = [zeros_for(a) if isinstance(r, Zero) else to_array(r) for r, a in zip(res, lin_avals)]
        return tuple(tree_util.tree_unflatten(in_tree, res))

    return transposed


def _name(f) -> str:
    return getattr(f, "__name__", type(f).__name__)

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()

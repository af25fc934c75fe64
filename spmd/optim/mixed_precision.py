"""Mixed precision: bfloat16 compute, float32 master weights, float32 gradient reduction.

The recipe (docs/training.md, "Mixed precision"):

1. the parameters, and the optimizer's state made from them, stay float32 (the
   *master weights*: an update of 1e-4 on a weight of 1 would vanish in bfloat16,
   whose spacing there is 2**-7);
2. each step casts them to bfloat16 and runs the model's forward and backward in
   bfloat16 (every op computes in float32 and rounds its result, as on XLA's CPU);
3. the cotangent of that cast is the cast back, so the gradients arrive in float32,
   and their reduction over the data-parallel axis sums float32 values: nothing is
   rounded to bfloat16 between the devices' partial sums;
4. the optimizer updates the float32 master weights.

:func:`value_and_grad` is steps 2 and 3 for a loss function; :func:`cast_floating`
is the cast of a pytree's floating leaves.

Inside ``shard_map``, step 3 needs care: replicated (``P()``) parameters meet the
batch's varying values *after* the cast, so the implicit ``pvary`` is on the
bfloat16 copy, and its transpose, a ``psum``, would reduce the gradients in bfloat16
(rounded once, then converted).  ``axis_name=`` marks the float32 parameters varying
before the cast, so each device's gradient stays its own, and averages the float32
gradients (and the loss) with ``lax.pmean`` over the axis.

>>> import spmd.optim as optim
>>> step_grads = optim.mixed_precision.value_and_grad(loss_fn, axis_name="data")  # doctest: +SKIP
>>> loss, grads = step_grads(params, batch)  # float32 both, averaged over "data"  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import spmd.numpy as snp
from spmd import lax, tree_util
from spmd.autodiff import value_and_grad as _value_and_grad
from spmd.compiler.core import dtypes
from spmd.optim._base import OptimError

_F32 = np.dtype(np.float32)


def _dtype_of(x) -> np.dtype:
    # (An array's or tracer's own dtype; Python scalars through numpy.)
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def cast_floating(tree: Any, dtype) -> Any:
    """``tree`` with every floating leaf converted to ``dtype`` (integer, bool and
    complex leaves as they are).

    >>> cast_floating({"w": np.ones(2, np.float32), "step": np.int32(3)},
    ...               snp.bfloat16)["w"].dtype  # doctest: +SKIP
    dtype(bfloat16)
    """
    target = np.dtype(dtype)

    def cast(x):
        d = _dtype_of(x)
        return snp.asarray(x).astype(target) if dtypes.is_float(d) else x

    return tree_util.tree_map(cast, tree)


def _check_master(params) -> None:
    leaves, _ = tree_util.tree_flatten_with_path(params)
    for path, x in leaves:
        d = _dtype_of(x)
        if dtypes.is_float(d) and d != _F32:
            raise OptimError(
                f"mixed_precision.value_and_grad: the master weight at "
                f"{tree_util.keystr(path)} has dtype {d}; keep master weights in float32 "
                "(the compute copy is made each step), e.g. "
                "params = optim.mixed_precision.cast_floating(params, np.float32)")


def value_and_grad(loss_fn: Callable, compute_dtype=None, *, has_aux: bool = False,
                   axis_name=None) -> Callable:
    """``f(params, *args, **kwargs) -> (loss, grads)``: ``loss_fn`` run on ``params``'
    floating leaves cast to ``compute_dtype`` (bfloat16 by default), its loss returned
    in float32, and the gradients with respect to the float32 ``params`` (float32:
    the cast's cotangent is the cast back).  With ``has_aux``, ``((loss, aux), grads)``
    as :func:`spmd.value_and_grad` gives.  ``axis_name`` (inside ``shard_map``: the
    data-parallel mesh axis or axes): the loss and gradients averaged over it in
    float32 (see the module's docstring).  Floating parameters other than float32
    raise :class:`OptimError` (the master weights must be float32).

    >>> f = value_and_grad(lambda p, x: snp.mean((x @ p["w"]) ** 2))  # doctest: +SKIP
    >>> loss, grads = f({"w": np.ones((4, 2), np.float32)}, x)   # doctest: +SKIP
    >>> grads["w"].dtype                                          # doctest: +SKIP
    dtype('float32')
    """
    compute = np.dtype(dtypes.bfloat16 if compute_dtype is None else compute_dtype)
    if not dtypes.is_float(compute):
        raise OptimError(f"mixed_precision.value_and_grad: compute_dtype={compute} must be "
                         "a float dtype, e.g. snp.bfloat16")

    def loss_in_f32(params, *args, **kwargs):
        out = loss_fn(cast_floating(params, compute), *args, **kwargs)
        loss, aux = out if has_aux else (out, None)
        loss = snp.asarray(loss).astype(_F32)
        return (loss, aux) if has_aux else loss

    def run(params, *args, **kwargs):
        _check_master(params)
        if axis_name is None:
            return _value_and_grad(loss_in_f32, has_aux=has_aux)(params, *args, **kwargs)
        # Varying before the cast: the gradients' reduction is the pmean below, on
        # float32 values, not the transpose of a pvary of the bfloat16 copy.
        params = lax.pvary(params, axis_name)
        out, grads = _value_and_grad(loss_in_f32, has_aux=has_aux)(params, *args, **kwargs)
        if has_aux:
            out = (lax.pmean(out[0], axis_name), out[1])
        else:
            out = lax.pmean(out, axis_name)
        return out, lax.pmean(grads, axis_name)

    return run

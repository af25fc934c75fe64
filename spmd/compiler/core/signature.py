"""A jitted call's signature: its arguments flattened into leaves, and the key of each.

:func:`spmd.compiler.core.jit.lookup` keys a jit's call plans on what these
functions produce: :func:`walk` flattens the common arguments (tuples, lists,
dicts and None around numpy arrays, spmd Arrays and scalars) straight into the
key; anything else goes through :func:`flatten` (optree) and :func:`leaf_key`.

>>> leaves, toks = [], []
>>> walk((np.ones(3), 2.0), leaves, toks)
True
>>> toks
[<class 'tuple'>, 2, ((3,), dtype('float64')), <class 'float'>]
"""

from __future__ import annotations

import functools

import numpy as np
import optree

from spmd import tree_util
from spmd.compiler.core import array_module as _am
from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import abstract_arg_aval
from spmd.compiler.core.trace import get_aval
from spmd.errors import StaticArgumentError

def norm_argnums(argnums, n_params, fname, what) -> tuple[int, ...]:
    if argnums is None:
        return ()
    if isinstance(argnums, int):
        argnums = (argnums,)
    out = []
    for i in argnums:
        if not isinstance(i, int):
            raise StaticArgumentError(f"jit({fname}): {what} entries must be ints, got {i!r}")
        if n_params is not None and not -n_params <= i < n_params:
            raise StaticArgumentError(
                f"jit({fname}): {what}={i} is out of range for a function of {n_params} "
                "positional parameters")
        out.append(i % n_params if n_params is not None and i < 0 else i)
    return tuple(sorted(set(out)))


flatten = functools.partial(optree.tree_flatten, none_is_leaf=False,
                             namespace=tree_util.NAMESPACE)
NDARRAY = np.ndarray
NO_STATIC = ((), ())
EMPTY: dict = {}
SCALAR_TYPES = frozenset({bool, int, float, complex})


def leaf_key(x, upper=None):
    """The part of a call's fast key for a leaf that is not an exact numpy array.

    spmd Arrays give their aval (its hash is precomputed); Arrays of an upper
    layer's type ``upper(x)`` where given; Python and numpy scalars their type,
    which fixes their dtype and weak type; anything else (ndarray subclasses,
    tracers) a 3-tuple with its type and aval, which never equals the
    ``(shape, dtype)`` pair of a numpy array.
    """
    t = type(x)
    if t is Array:
        return x.aval
    if upper is not None and isinstance(x, Array):
        return upper(x)
    if t in SCALAR_TYPES or isinstance(x, np.generic):
        return t
    if _am.is_device_array(x):  # a cupy array: like a numpy array's key, with its type
        return (t, x.shape, x.dtype)
    return (t, arg_aval(x), None)


def arg_aval(x):
    """The aval of an argument: a value's, or an abstract one's (ShapeDtypeStruct)."""
    a = abstract_arg_aval(x)
    return get_aval(x) if a is None else a


def upper_token(x):
    """The compiler's key token for an Array of an upper layer's type."""
    return (type(x), x.aval)


def walk(x, leaves: list, toks: list, upper=upper_token) -> bool:
    """Flatten ``x`` if it is built of tuples, lists, dicts and None around
    numpy arrays, spmd Arrays and scalars: append its leaves to ``leaves`` and
    a prefix encoding of its structure and leaf keys to ``toks``.

    False when anything else is met (a registered node, a tracer, a device
    array, an unsortable dict): the caller then takes the general path.  On
    these arguments it is twice as fast as ``optree`` plus the leaf keys, and
    the token tuple is the cache key itself (no treedef to hash).  Tokens:
    ``tuple``/``list`` then the length; ``(dict, sorted keys)``; ``None``;
    a leaf's key as in :func:`leaf_key` (an Array of an upper layer's type:
    ``upper(leaf)``, by default ``(its type, its aval)``; the shard layer's jit adds
    the placement).  No leaf key equals a node token,
    so two token tuples are equal only for equal structures and leaf keys.
    """
    t = type(x)
    if t is tuple or t is list:
        toks.append(t)
        toks.append(len(x))
        for c in x:
            if type(c) is NDARRAY:  # the common leaves, without a call
                leaves.append(c)
                toks.append((c.shape, c.dtype))
            elif isinstance(c, Array):
                leaves.append(c)
                toks.append(c.aval if type(c) is Array else upper(c))
            elif type(c) in SCALAR_TYPES:
                leaves.append(c)
                toks.append(type(c))
            elif not walk(c, leaves, toks, upper):
                return False
        return True
    if t is NDARRAY:
        leaves.append(x)
        toks.append((x.shape, x.dtype))
        return True
    if t is Array:
        leaves.append(x)
        toks.append(x.aval)
        return True
    if t is dict:
        try:
            keys = sorted(x)  # optree's order of a dict's children
        except TypeError:
            return False
        toks.append((dict, tuple(keys)))
        for k in keys:
            if not walk(x[k], leaves, toks, upper):
                return False
        return True
    if x is None:  # an empty node (none_is_leaf=False)
        toks.append(None)
        return True
    if t in SCALAR_TYPES or isinstance(x, np.generic):
        leaves.append(x)
        toks.append(t)
        return True
    if isinstance(x, Array):  # an upper layer's array type
        leaves.append(x)
        toks.append(upper(x))
        return True
    return False

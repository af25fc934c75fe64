"""The gradient-transformation interface (optax's): ``init`` and ``update``.

An optimizer is a pair of pure functions over pytrees:

- ``init(params) -> state``
- ``update(grads, state, params=None) -> (updates, new_state)``

and ``apply_updates(params, updates)`` adds the updates to the parameters.
Everything is made of ``spmd.numpy`` operations leaf by leaf, so it traces under
``jit``, differentiates, and shards like the parameters it follows: the state of
a parameter sharded over ``'data'`` is computed from that parameter's blocks
and placed like it (ZeRO), with no gathering.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from spmd import tree_util
import spmd.numpy as snp

Params = Any
Updates = Any
OptState = Any


class GradientTransformation(NamedTuple):
    """``init(params) -> state`` and ``update(grads, state, params=None) -> (updates,
    state)``.

    >>> opt = spmd.optim.sgd(0.1)
    >>> state = opt.init(params)
    >>> updates, state = opt.update(grads, state, params)
    >>> params = spmd.optim.apply_updates(params, updates)
    """

    init: Callable[[Params], OptState]
    update: Callable[..., tuple[Updates, OptState]]


class EmptyState(NamedTuple):
    """The state of a stateless transformation."""


class OptimError(ValueError):
    """A bad optimizer argument: a negative rate, a mask of another structure, ..."""


def stateless(fn: Callable[[Updates, Params], Updates]) -> GradientTransformation:
    """A transformation without state from ``fn(updates, params) -> updates``."""
    return GradientTransformation(lambda params: EmptyState(),
                                  lambda updates, state, params=None: (fn(updates, params), state))


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Apply ``transforms`` in order; the state is the tuple of their states.

    >>> opt = chain(clip_by_global_norm(1.0), scale_by_adam(), scale_by_learning_rate(1e-3))
    """
    for i, t in enumerate(transforms):
        if not isinstance(t, GradientTransformation):
            raise OptimError(f"chain: argument {i} is a {type(t).__name__}, not a "
                             "GradientTransformation (build one with spmd.optim's functions)")

    def init(params):
        return tuple(t.init(params) for t in transforms)

    def update(updates, state, params=None):
        if len(state) != len(transforms):
            raise OptimError(f"chain: the state has {len(state)} parts for "
                             f"{len(transforms)} transformations; was it made by this "
                             "optimizer's init?")
        new_state = []
        for t, s in zip(transforms, state):
            updates, s = t.update(updates, s, params)
            new_state.append(s)
        return updates, tuple(new_state)

    return GradientTransformation(init, update)


def apply_updates(params: Params, updates: Updates) -> Params:
    """``params + updates`` leaf by leaf, in each parameter's dtype.

    >>> params = apply_updates(params, updates)
    """
    def add(p, u):
        if u is None:
            return p
        return snp.asarray(p + u).astype(snp.asarray(p).dtype)

    return tree_util.tree_map(add, params, updates, is_leaf=lambda x: x is None)


def abs_sq(x) -> Any:
    """``|x|**2`` elementwise, real: ``x * x``, or ``Re(x * conj(x))`` for complex ``x``
    (``x * x`` of a complex number is not its squared magnitude)."""
    x = snp.asarray(x)
    return snp.real(x * snp.conj(x)) if snp.iscomplexobj(x) else x * x


def global_norm(tree) -> Any:
    """The Euclidean norm of all leaves together: ``sqrt(sum(|x| ** 2))``."""
    leaves = [x for x in tree_util.tree_leaves(tree) if x is not None]
    if not leaves:
        return snp.asarray(0.0, snp.float32)
    return snp.sqrt(sum(snp.sum(abs_sq(x).astype(snp.float32)) for x in leaves))


def check_same_structure(what: str, tree, reference, ref_name: str = "params") -> None:
    """Raise naming the differing paths when ``tree`` and ``reference`` differ."""
    t1 = tree_util.tree_structure(tree)
    t2 = tree_util.tree_structure(reference)
    if t1 == t2:
        return
    p1 = {tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(tree)[0]}
    p2 = {tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(reference)[0]}
    only1, only2 = sorted(p1 - p2)[:5], sorted(p2 - p1)[:5]
    raise OptimError(f"{what} has another pytree structure than {ref_name}: only in {what}: "
                     f"{only1 or 'none'}; only in {ref_name}: {only2 or 'none'}")


def safe_int32_increment(count):
    """``count + 1``, saturating at the largest int32 rather than wrapping negative."""
    big = np.iinfo(np.int32).max
    return snp.where(count < big, count + 1, big).astype(snp.int32)

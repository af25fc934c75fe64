"""A NumPy-style stateful generator over functional keys (JEP 28845).

``stateful_rng(seed)`` holds a base key and a counter; each draw uses the key
``fold_in(base_key, counter)`` and advances the counter, so a program reads like
NumPy's ``default_rng`` while every number is still a pure function of
(seed, counter, position) and the same on every mesh.

The counter is state, held by the generator on the host.  Eagerly a draw takes
the count and advances it.  In a function being compiled (``jit``, and the
bodies of ``shard_map``, ``scan``, ``while_loop``, ``cond``) a draw becomes the
effectful primitive ``rng_counter``, which the compiled program runs on every
call: it reads the generator's current count and advances it, so each call of
a jitted function (and each iteration of a loop) gets new numbers, exactly the
ones the same sequence of eager draws would give.  Under ``vmap`` the count is
read once for the whole batch (every entry gets the same key, as eagerly); to
give each entry its own stream, ``vmap`` over ``rng.split(n)``.

A generator is also a pytree (base key, count): passed *as an argument* through
a transformation, its count becomes a traced value that the function advances
functionally, and the generator it returns carries the new count.

``split(n)`` gives a batch of ``n`` generators to ``vmap`` over (one base key
and counter each); ``spawn(n)`` a list of ``n`` independent generators.
"""

from __future__ import annotations

import operator
import threading

import numpy as np

import spmd.numpy as snp
from spmd.compiler.ops.threefry import rng_counter
from spmd.compiler.core.trace import dynamic_trace
from spmd.errors import ArgumentError, SpmdError
from spmd.random.keys import PRNGKeyArray, fold_in, key as make_key, split as split_key
from spmd.random.samplers import normal, randint, uniform
from spmd.tree_util import register_pytree_node


class StatefulTraceError(SpmdError, RuntimeError):
    """A generator closed over by a function being compiled was asked for numbers."""


def _size(size, *params):
    if size is None:
        return tuple(np.broadcast_shapes(*(np.shape(p) for p in params)))
    if isinstance(size, (int, np.integer)):
        return (operator.index(size),)
    return tuple(operator.index(s) for s in size)


class _Counter:
    """The host-side count of a generator; ``take`` returns it and advances it (under a
    lock: threads drawing at once get different counts).  Compiled programs hold it
    as the parameter of ``rng_counter``, which calls ``take`` on every run."""

    _made = [0]

    def __init__(self, start: int = 0):
        self.value = int(start)
        self._lock = threading.Lock()
        # A name by creation order (no memory address): the same on every process.
        _Counter._made[0] += 1
        self._name = f"counter#{_Counter._made[0]}"

    def take(self) -> int:
        with self._lock:
            v = self.value
            self.value = v + 1
        return v

    def __repr__(self):
        return self._name


class StatefulPRNG:
    """A generator: ``key()``, ``random``, ``uniform``, ``normal``, ``integers``,
    ``split``, ``spawn``.

    >>> rng = stateful_rng(0)
    >>> a, b = rng.normal(size=3), rng.normal(size=3)   # different numbers
    """

    def __init__(self, base_key: PRNGKeyArray, counter=0):
        self._base_key = base_key
        # A host counter (the generator's own state), or a traced/array counter when
        # the generator was passed through a transformation as a pytree.
        self._counter = _Counter(counter) if isinstance(counter, (int, np.integer)) \
            else counter

    def __repr__(self):
        return f"StatefulPRNG(base_key={self._base_key!r}, counter={self.count!r})"

    @property
    def count(self):
        """How many keys were drawn (an int, or a traced value inside a transformation)."""
        c = self._counter
        return c.value if isinstance(c, _Counter) else c

    def _next_count(self):
        c = self._counter
        if isinstance(c, _Counter):
            if dynamic_trace() is not None:
                # Compiled: the program reads and advances the counter on each run.
                return rng_counter(c)
            return c.take()
        self._counter = c + 1  # traced (or array) counter: the program advances it
        return c

    def key(self, shape=()):
        """A fresh key (``fold_in(base_key, counter)``), or ``split`` of it into ``shape``."""
        k = fold_in(self._base_key, self._next_count())
        shape = _size(shape)
        return split_key(k, shape) if shape else k

    def random(self, size=None, dtype=None):
        """Uniform floats in [0, 1)."""
        return uniform(self.key(), _size(size), dtype)

    def uniform(self, low=0.0, high=1.0, size=None, *, dtype=None):
        """Uniform floats in [low, high)."""
        return uniform(self.key(), _size(size, low, high), dtype, minval=low, maxval=high)

    def normal(self, loc=0.0, scale=1.0, size=None, *, dtype=None):
        """Normal floats with mean ``loc`` and standard deviation ``scale``."""
        z = normal(self.key(), _size(size, loc, scale), dtype)
        return (snp.asarray(loc) + snp.asarray(scale) * z).astype(z.dtype)

    def integers(self, low, high=None, size=None, *, dtype=None):
        """Integers in [low, high) (``[0, low)`` when ``high`` is None)."""
        if high is None:
            low, high = 0, low
        return randint(self.key(), _size(size, low, high), low, high, dtype)

    def split(self, num) -> "StatefulPRNG":
        """A batch of ``num`` generators (leading axes) to pass through ``vmap``."""
        shape = _size(num)
        if not shape:
            raise ArgumentError("StatefulPRNG.split: num must be an int or a non-empty shape")
        return StatefulPRNG(self.key(shape), np.zeros(shape, np.int32))

    def spawn(self, n_children: int) -> list["StatefulPRNG"]:
        """``n_children`` independent generators."""
        if isinstance(n_children, bool) or not isinstance(n_children, (int, np.integer)) \
                or n_children < 0:
            raise ArgumentError(f"StatefulPRNG.spawn: n_children={n_children!r} must be a "
                                "non-negative int")
        return [StatefulPRNG(k, 0) for k in self.key((int(n_children),))] \
            if n_children else []


def _flatten(g):
    return (g._base_key, g.count), None


def _unflatten(_, children):
    return StatefulPRNG(children[0], children[1])


register_pytree_node(StatefulPRNG, _flatten, _unflatten)


def stateful_rng(seed=None) -> StatefulPRNG:
    """A stateful generator seeded by an integer (fresh OS entropy when ``seed`` is None),
    or built on an existing typed key.

    >>> rng = stateful_rng(42)
    >>> x = rng.uniform(size=(2, 3))
    """
    if seed is None:
        if dynamic_trace() is not None:
            raise StatefulTraceError("stateful_rng() inside a function being compiled needs "
                                     "an explicit seed")
        seed = int(np.random.SeedSequence().entropy & np.iinfo(np.int64).max)
    if isinstance(seed, PRNGKeyArray) and seed.shape:
        raise ArgumentError(f"stateful_rng: a key array of shape {seed.shape} was given; pass "
                            "one key (or StatefulPRNG.split for a batch of generators)")
    base = seed if isinstance(seed, PRNGKeyArray) else make_key(seed)
    return StatefulPRNG(base, 0)

"""``spmd.random``: JAX's counter-based Threefry PRNG, bit for bit, the same on every mesh.

Keys are values: ``split`` and ``fold_in`` derive new ones, samplers read them
and never change them (JEP 263).  ``key(seed)`` makes a typed key (JEP 9263),
``PRNGKey(seed)`` the legacy ``uint32[2]`` one; every function takes both.  A
sample's value depends only on the key and its position in the global array
(JAX's ``jax_threefry_partitionable`` layout), so a sharded result equals the
unsharded one and each device computes only its own block.  ``stateful_rng``
is the NumPy-style generator of JEP 28845.  See ``docs/random.md``.

>>> import spmd
>>> k = spmd.random.key(0)
>>> k1, k2 = spmd.random.split(k)
>>> x = spmd.random.normal(k1, (3,))
"""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.random import distributions as _distributions
from spmd.random import keys as _keys
from spmd.random import samplers as _samplers
from spmd.random.keys import (PRNGKey, PRNGKeyArray, clone, fold_in, key,  # noqa: F401
                              key_data, key_impl, split, wrap_key_data)
from spmd.random.sharded import with_out_sharding as _with_out_sharding
from spmd.random.stateful import StatefulPRNG, StatefulTraceError, stateful_rng  # noqa: F401

# The samplers, each with JAX's out_sharding= argument (spmd.random.sharded).
bits = _with_out_sharding(_keys.bits)
(bernoulli, categorical, choice, exponential, gumbel, laplace, logistic, normal, permutation,
 rademacher, randint, shuffle, truncated_normal, uniform) = (
    _with_out_sharding(getattr(_samplers, n)) for n in (
        "bernoulli", "categorical", "choice", "exponential", "gumbel", "laplace", "logistic",
        "normal", "permutation", "rademacher", "randint", "shuffle", "truncated_normal",
        "uniform"))
(beta, dirichlet, gamma, loggamma, multivariate_normal, orthogonal, poisson) = (
    _with_out_sharding(getattr(_distributions, n)) for n in (
        "beta", "dirichlet", "gamma", "loggamma", "multivariate_normal", "orthogonal",
        "poisson"))

__all__ = ["PRNGKey", "PRNGKeyArray", "bernoulli", "beta", "bits", "categorical", "choice",
           "clone", "dirichlet", "exponential", "fold_in", "gamma", "gumbel", "key", "key_data",
           "key_impl", "laplace", "loggamma", "logistic", "multivariate_normal", "normal",
           "orthogonal", "permutation", "poisson", "rademacher", "randint", "shuffle", "split",
           "StatefulPRNG", "StatefulTraceError", "stateful_rng", "truncated_normal", "uniform",
           "wrap_key_data"]

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()

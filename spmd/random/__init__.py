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

from spmd.random.keys import (PRNGKey, PRNGKeyArray, bits, clone, fold_in,  # noqa: F401
                              key, key_data, key_impl, split, wrap_key_data)
from spmd.random.distributions import (beta, dirichlet, gamma, loggamma,  # noqa: F401
                                       multivariate_normal, orthogonal, poisson)
from spmd.random.samplers import (bernoulli, categorical, choice, exponential,  # noqa: F401
                                  gumbel, laplace, logistic, normal, permutation,
                                  rademacher, randint, shuffle, truncated_normal, uniform)

__all__ = ["PRNGKey", "PRNGKeyArray", "bernoulli", "beta", "bits", "categorical", "choice",
           "clone", "dirichlet", "exponential", "fold_in", "gamma", "gumbel", "key", "key_data",
           "key_impl", "laplace", "loggamma", "logistic", "multivariate_normal", "normal",
           "orthogonal", "permutation", "poisson", "rademacher", "randint", "shuffle", "split",
           "truncated_normal", "uniform", "wrap_key_data"]

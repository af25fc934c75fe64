"""The data-parallel SGD step of a tanh MLP, in the two forms users write: one
definition for ``bench_mpi.py`` (2 ranks), ``bench_data_parallel.py`` (8
simulated devices) and ``tests/mpi/test_combine_mpi.py``.

- ``grad outside``: ``value_and_grad`` of a ``shard_map``'ed loss whose local
  losses are ``lax.pmean``'ed (the JAX tutorial's form);
- ``grad inside``: a jitted ``shard_map`` whose body takes ``value_and_grad`` of
  the local loss and ``lax.pmean``s each gradient (the form DDP-style code has;
  ``check_vma=False``: with typed axes the gradient of an invariant parameter
  is already the sum over devices, and its ``pmean`` would give the sum);
- ``1 device``: ``value_and_grad`` of the plain loss, no ``shard_map``.

Each step maps ``(params, x, y)`` to ``(new params, loss)``, or to ``(new params,
grads, loss)`` with ``with_grads=True``; ``params`` is a list of ``(w, b)``.

>>> steps = make_steps(spmd.make_mesh((2,), ("i",)), "i")   # doctest: +SKIP
>>> new, loss = steps["grad inside"](make_params(), *make_batch(256))   # doctest: +SKIP
"""

from __future__ import annotations

import functools

import numpy as np

SIZES = (784, 512, 512, 10)
LR = 0.01


def make_params(sizes=SIZES, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Float32 ``[(w, b), ...]`` of an MLP with layer widths ``sizes``."""
    rng = np.random.default_rng(seed)
    return [((rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32),
             (0.1 * rng.standard_normal(n)).astype(np.float32))
            for m, n in zip(sizes[:-1], sizes[1:])]


def make_batch(rows: int, sizes=SIZES, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and one-hot labels of ``rows`` examples."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, sizes[0])).astype(np.float32)
    return x, np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], rows)]


def local_loss(params, x, y):
    """Mean softmax cross-entropy of the MLP on the rows it is given."""
    import spmd
    import spmd.numpy as snp

    *hidden, (w_out, b_out) = params
    for w, b in hidden:
        x = snp.tanh(x @ w + b)
    return -snp.mean(snp.sum(y * spmd.nn.log_softmax(x @ w_out + b_out), axis=-1))


def sgd(params, grads, lr: float = LR):
    return [(w - lr * gw, b - lr * gb) for (w, b), (gw, gb) in zip(params, grads)]


def make_steps(mesh, axis: str, lr: float = LR, with_grads: bool = False) -> dict:
    """Fresh jitted steps ``{"1 device", "grad outside", "grad inside"}`` over the mesh
    axis ``axis`` (compiled with the configuration current at their first call)."""
    import spmd
    from spmd import P, lax

    def result(new, grads, value):
        return (new, grads, value) if with_grads else (new, value)

    n_out = 3 if with_grads else 2

    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P(axis), P(axis)),
                       out_specs=P())
    def dp_loss(params, x, y):
        return lax.pmean(local_loss(params, x, y), axis)

    @spmd.jit
    def one(params, x, y):
        value, grads = spmd.value_and_grad(local_loss)(params, x, y)
        return result(sgd(params, grads, lr), grads, value)

    @spmd.jit
    def outside(params, x, y):
        value, grads = spmd.value_and_grad(dp_loss)(params, x, y)
        return result(sgd(params, grads, lr), grads, value)

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P(axis), P(axis)),
                       out_specs=(P(),) * n_out, check_vma=False)
    def inside(params, x, y):
        value, grads = spmd.value_and_grad(local_loss)(params, x, y)
        grads = [(lax.pmean(gw, axis), lax.pmean(gb, axis)) for gw, gb in grads]
        return result(sgd(params, grads, lr), grads, lax.pmean(value, axis))

    return {"1 device": one, "grad outside": outside, "grad inside": inside}

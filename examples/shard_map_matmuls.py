"""The matrix multiplications of JEP 14273 (``shard_map``), each checked against numpy.

Run with ``python examples/shard_map_matmuls.py`` (8 simulated devices: the
default ``SPMD_NUM_DEVICES``).  Each program prints one line ``<name>: ok ...``
after comparing its result with ``a @ b`` computed by numpy; the end prints the
per-device program of ``matmul_basic`` and of its gradient.

The programs, on a ``(4, 2)`` mesh ``('i', 'j')`` or an ``(8,)`` mesh ``('i',)``:

- ``matmul_basic``: ``a`` split into ``(i, j)`` blocks, ``b`` into ``j`` row
  blocks; each device multiplies its blocks and ``psum`` over ``'j'`` adds the
  partial products, so the result is split by rows over ``'i'`` only.
- ``matmul_reduce_scatter``: the same, but ``psum_scatter`` leaves each device
  of a ``'j'`` group one column block of the sum: the result is split ``(i, j)``.
- ``matmul_allgather``: rows of both operands split over ``'i'``; each device
  gathers the whole ``rhs`` with ``all_gather(..., tiled=True)``.
- ``collective_matmul``: the JEP's ``collective_matmul_allgather_lhs_non_contracting``:
  instead of gathering ``lhs`` up front, each device multiplies the ``lhs`` block
  it holds, passes it to its left neighbour with ``ppermute`` and writes the
  partial product into its slice of the output, inside ``lax.fori_loop``, so
  communication can overlap compute.
"""

from __future__ import annotations

import functools

import numpy as np

import spmd
import spmd.numpy as snp
from spmd import P, lax

mesh_2d = spmd.make_mesh((4, 2), ("i", "j"))
mesh_1d = spmd.make_mesh((8,), ("i",))


@functools.partial(spmd.shard_map, mesh=mesh_2d, in_specs=(P("i", "j"), P("j", None)),
                   out_specs=P("i", None))
def matmul_basic(a_block, b_block):
    """c = a @ b with a: P('i', 'j') and b: P('j', None); c: P('i', None)."""
    # a_block: f32[2, 8], b_block: f32[8, 4] for a: f32[8, 16], b: f32[16, 4]
    c_partialsum = snp.dot(a_block, b_block)
    return lax.psum(c_partialsum, "j")  # c_block: f32[2, 4]


@functools.partial(spmd.shard_map, mesh=mesh_2d, in_specs=(P("i", "j"), P("j", None)),
                   out_specs=P("i", "j"))
def matmul_reduce_scatter(a_block, b_block):
    """c = a @ b, leaving each device one (i, j) block of c (reduce-scatter over 'j')."""
    c_partialsum = snp.matmul(a_block, b_block)  # f32[2, 4]
    return lax.psum_scatter(c_partialsum, "j", scatter_dimension=1, tiled=True)  # f32[2, 2]


@functools.partial(spmd.shard_map, mesh=mesh_1d, in_specs=(P("i", None), P("i", None)),
                   out_specs=P("i", None))
def matmul_allgather(lhs_block, rhs_block):
    """c = lhs @ rhs with the rows of both split over 'i': gather rhs, multiply locally."""
    rhs = lax.all_gather(rhs_block, "i", tiled=True)
    return lhs_block @ rhs


def collective_matmul_allgather_lhs_non_contracting(lhs, rhs):
    """The per-device body: lhs: P('i', None) row blocks, rhs: P(None, 'i') column blocks.

    Device k starts with lhs block k and, at step s, holds block (k + s) mod n:
    it multiplies it by its rhs columns, writes the product into rows
    ``((k + s) mod n) * chunk`` of its output columns and passes the block left.
    """
    axis_name = "i"
    axis_size = mesh_1d.shape[axis_name]
    axis_index = lax.axis_index(axis_name)
    chunk_size = lhs.shape[0]

    def f(i, carry):
        accum, lhs = carry
        update = lhs @ rhs  # the matmul for one chunk
        # A circular shift to the left: while it is in flight the next step's
        # inputs are not needed yet, so communication can overlap compute.
        lhs = lax.ppermute(lhs, axis_name,
                           perm=[(j, (j - 1) % axis_size) for j in range(axis_size)])
        # device 0 computes chunks 0, 1, ...; device 1 computes chunks 1, 2, ...
        update_index = (((axis_index + i) % axis_size) * chunk_size, 0)
        accum = lax.dynamic_update_slice(accum, update, update_index)
        return accum, lhs

    # The accumulator differs between devices from the first update on: mark it
    # varying so that the loop carry keeps one type (JEP 17111; JAX requires
    # this, spmd's loops would also infer it).
    accum = lax.pvary(snp.zeros((chunk_size * axis_size, rhs.shape[1]), dtype=lhs.dtype),
                      axis_name)
    accum, lhs = lax.fori_loop(0, axis_size - 1, f, (accum, lhs))
    # The last chunk, without a ppermute after it.
    update = lhs @ rhs
    update_index = (((axis_index + axis_size - 1) % axis_size) * chunk_size, 0)
    return lax.dynamic_update_slice(accum, update, update_index)


collective_matmul = spmd.jit(spmd.shard_map(
    collective_matmul_allgather_lhs_non_contracting, mesh=mesh_1d,
    in_specs=(P("i", None), P(None, "i")), out_specs=P(None, "i")))


def operands(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


def check(name: str, fn, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Run ``fn`` eagerly and jitted, compare both with numpy, print one line."""
    expected = a.astype(np.float64) @ b.astype(np.float64)
    eager = np.asarray(fn(a, b))
    jitted = np.asarray(spmd.jit(fn)(a, b))
    np.testing.assert_allclose(eager, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(jitted, expected, rtol=1e-4, atol=1e-4)
    print(f"{name}: ok {a.shape} @ {b.shape} -> {jitted.shape}")
    return jitted


def main() -> None:
    a, b = operands(8, 16, 4)  # the JEP's shapes
    check("matmul_basic", matmul_basic, a, b)
    c = matmul_basic(a, b)
    print(f"  output sharding: {c.sharding}")
    a, b = operands(8, 16, 8)
    check("matmul_reduce_scatter", matmul_reduce_scatter, a, b)
    a, b = operands(32, 64, 16)
    check("matmul_allgather", matmul_allgather, a, b)
    a, b = operands(32, 16, 64)
    check("collective_matmul", collective_matmul, a, b)

    a, b = operands(8, 16, 4)
    print("\nThe per-device program of matmul_basic (inside shard_map[program=...]):")
    print(spmd.make_jaxpr(matmul_basic)(a, b))
    loss = lambda a, b: snp.sum(matmul_basic(a, b) ** 2)  # noqa: E731
    print("\nIts gradient: the backward body holds one psum, over 'i', for b's cotangent:")
    print(spmd.make_jaxpr(spmd.grad(loss, argnums=(0, 1)))(a, b))


if __name__ == "__main__":
    main()

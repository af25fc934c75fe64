"""Tracing from several Python threads at once.

The trace state (active transformations, program builders, named axes in scope)
is per thread, as in JAX; the compile caches are shared and safe under
concurrent use.  A shared trace stack made concurrent traces see each other's
transformations: ConcretizationError or "a traced value escaped" in about half
of the runs of the first test below.
"""

import threading

import numpy as np

import spmd
import spmd.numpy as snp
from spmd import P, lax

N_THREADS = 4
ROUNDS = 40


def _run_threads(work):
    """Run ``work(thread_index)`` in N_THREADS threads started together; re-raise the
    first failure."""
    errors: list = []
    barrier = threading.Barrier(N_THREADS)

    def target(t):
        try:
            barrier.wait()
            work(t)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append((t, e))

    threads = [threading.Thread(target=target, args=(t,)) for t in range(N_THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        t, e = errors[0]
        raise AssertionError(f"thread {t} failed ({len(errors)} threads failed): {e!r}") from e


def test_threads_trace_new_jitted_functions_at_once():
    def work(t):
        x = np.arange(6, dtype=np.float32).reshape(2, 3) + t
        for r in range(ROUNDS):
            c = np.float32(r + t)
            f = spmd.jit(lambda x: snp.tanh(x * c).sum(axis=0) + c)  # a new trace each time
            np.testing.assert_allclose(np.asarray(f(x)), np.tanh(x * c).sum(axis=0) + c,
                                       rtol=1e-5)
            g = spmd.grad(lambda w: snp.sum(snp.sin(w * c)))(x)
            np.testing.assert_allclose(np.asarray(g), c * np.cos(x * c), rtol=1e-4, atol=1e-5)
            v = spmd.vmap(spmd.jit(lambda row: row @ row + c))(x)
            np.testing.assert_allclose(np.asarray(v), (x * x).sum(axis=1) + c, rtol=1e-5)

    _run_threads(work)


def test_threads_share_one_jitted_function():
    f = spmd.jit(lambda x, y: (x * y).sum(axis=-1))

    def work(t):
        for r in range(ROUNDS):
            n = 1 + (r + t) % 5  # shapes that meet in the cache from several threads
            x = np.full((n, 3), t + 1, np.float32)
            y = np.full((n, 3), r, np.float32)
            np.testing.assert_array_equal(np.asarray(f(x, y)), np.full(n, 3.0 * (t + 1) * r))

    _run_threads(work)


def test_threads_trace_shard_maps_over_different_meshes():
    # The named axes in scope are per thread too: a psum traced in one thread under
    # an 8-device mesh must not see another thread's 2-device mesh.
    devs = spmd.devices()
    meshes = [spmd.make_mesh((8,), ("i",)), spmd.make_mesh((2,), ("i",), devices=devs[:2]),
              spmd.make_mesh((4,), ("i",), devices=devs[:4]),
              spmd.make_mesh((2, 4), ("i", "j"))]

    def work(t):
        mesh = meshes[t]
        n = mesh.shape["i"]
        for r in range(ROUNDS // 2):
            f = spmd.jit(spmd.shard_map(lambda x: lax.psum(x * np.float32(r), "i"), mesh=mesh,
                                        in_specs=P(), out_specs=P()))
            x = np.ones(3, np.float32)
            np.testing.assert_array_equal(np.asarray(f(x)), np.full(3, n * r, np.float32))

    _run_threads(work)

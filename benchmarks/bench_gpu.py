"""On a GPU: psum through NCCL against raw NCCL; a jitted MLP step against CuPy.

Measured in one process on one GPU (``SPMD_PLATFORM=gpu``), variants interleaved;
each sample is a loop of calls followed by one device synchronisation, so a
sample times the work queued on the GPU, not only its launch:

- ``psum_nccl[4 MiB]``, ``psum_nccl[256 MiB]``: a float32 all-reduce over a
  1-member NCCL communicator (the only one a single GPU allows).  ``raw NCCL``
  is CuPy's ``NcclCommunicator.allReduce`` on preallocated buffers (the floor);
  ``spmd psum`` is the path a ``psum`` across processes takes: a jitted program
  whose collective the process group lowered to the ``nccl`` primitive
  (argument handling, the generated code, a fresh result buffer, the call).
  Goal: ratio <= 1.10 at 256 MiB.  (With one member NCCL copies the buffer:
  this measures spmd's overhead around NCCL, not NCCL's bandwidth between GPUs.)
- ``train_step_gpu[batch=4096]``: one SGD step of the 784-512-512-10 tanh MLP of
  ``bench_train.py`` in float32, ``spmd.jit(value_and_grad)`` against the same
  step written by hand in CuPy (forward, textbook backward, update).  Goal:
  ratio <= 1.15.  Also (diagnostic) ``jax.jit`` of the same step on the same
  GPU when JAX with a GPU backend is installed (``XLA_PYTHON_CLIENT_PREALLOCATE``
  is set to false first, so that JAX leaves the GPU's memory to CuPy).
- ``dp_train_step_gpu[batch=2048]``: the data-parallel steps of
  ``bench_data_parallel.py`` (8 simulated devices, all on the one GPU: the
  gradient of a ``shard_map``'ed loss, and ``shard_map`` of the whole step with
  ``pmean`` of the gradients) against the same step on 1 device (goals as on the
  CPU: ``bench_data_parallel.GOALS``).

NCCL missing is a skip of the psum rows, printed; with ``SPMD_REQUIRE_NCCL=1``
(``benchmarks/gpu_check.sh`` sets it) it is an error.

Run: ``SPMD_PLATFORM=gpu python benchmarks/run.py gpu`` (``benchmarks/gpu_check.sh``
does, on a GPU machine); skipped without CuPy or a GPU.
"""

from __future__ import annotations

import functools
import gc
import os

import numpy as np

# JAX (for the diagnostic row) must not take 75% of the GPU's memory at import.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from common import calibrate, row

import spmd


def skip_reason() -> str | None:
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda12x / cupy-cuda13x)"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no GPU"
    except Exception as e:  # noqa: BLE001 - CUDA's own error types
        return f"CuPy sees no GPU ({type(e).__name__})"
    if os.environ.get("SPMD_PLATFORM", "gpu") != "gpu":
        return "SPMD_PLATFORM is not gpu"
    return None


def _interleave_gpu(variants: dict, *, repeats: int, target_s: float) -> dict:
    """Like common.interleave, with a device synchronisation closing every sample."""
    import cupy as cp
    from common import clock

    sync = cp.cuda.get_current_stream().synchronize

    def synced(fn):
        def run():
            fn()
            sync()
        return run

    names = list(variants)
    for name in names:
        for _ in range(3):
            synced(variants[name])()
    number = {n: calibrate(synced(variants[n]), target_s) for n in names}
    times: dict = {n: [] for n in names}
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                fn = variants[name]
                sync()
                t0 = clock()
                for _ in range(number[name]):
                    fn()
                sync()
                times[name].append((clock() - t0) / number[name])
    finally:
        gc.enable()
    return times


# ------------------------------------------------------------------ psum

def _bench_psum(mib: int, goal: float | None, repeats: int) -> list[dict]:
    import cupy as cp
    from cupy.cuda import nccl as cnccl

    from spmd.collectives import nccl
    from spmd.collectives.process_group import ProcessGroup

    n = mib * 1024 * 1024 // 4
    x_host = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
    x = cp.asarray(x_host)
    comm = nccl.communicator((0,))
    out = cp.empty_like(x)
    stream = cp.cuda.get_current_stream().ptr

    def raw():
        comm.allReduce(x.data.ptr, out.data.ptr, n, cnccl.NCCL_FLOAT32, cnccl.NCCL_SUM, stream)

    pg = ProcessGroup(("i",), (1,), ("i",), (0,), (0,), 0)  # the group a psum over "i" uses
    assert pg.comm is nccl, "the process group did not choose NCCL"
    psum = spmd.jit(lambda v: pg.all_reduce(v, "sum")[0])
    got = psum(x)
    assert type(got.value) is cp.ndarray
    np.testing.assert_array_equal(cp.asnumpy(got.value[0, :1000]), x_host[0, :1000])
    del got
    times = _interleave_gpu({"raw NCCL": raw, "spmd psum": lambda: psum(x)},
                            repeats=repeats, target_s=0.01)
    name = f"psum_nccl[{mib} MiB]"
    return [row(name, "raw NCCL", times["raw NCCL"], unit="us"),
            row(name, "spmd psum", times["spmd psum"], baseline="raw NCCL", goal_ratio=goal,
                unit="us", note="1-member communicator; jitted psum lowered to nccl")]


# -------------------------------------------------------------- MLP step

def _step_cupy(params, x, y, lr):
    """The floor: bench_train.step_numpy run with CuPy as the array module."""
    import cupy as cp
    from bench_train import step_numpy

    return step_numpy(params, x, y, xp=cp, lr=lr)


def _bench_step(batch: int, goal: float, repeats: int) -> list[dict]:
    import cupy as cp

    from bench_train import LR, make_batch, make_params, step_spmd

    rng = np.random.default_rng(3)
    params_host = make_params()
    x_host, y_host = make_batch(batch, rng)
    params = [(cp.asarray(w), cp.asarray(b)) for w, b in params_host]
    x, y = cp.asarray(x_host), cp.asarray(y_host)
    jf = spmd.jit(step_spmd)
    loss_j, new_j = jf(params, x, y)
    loss_c, new_c = _step_cupy(params, x, y, LR)
    np.testing.assert_allclose(float(loss_j), float(loss_c), rtol=1e-4)
    for (wj, bj), (wc, bc) in zip(new_j, new_c):
        np.testing.assert_allclose(np.asarray(wj), cp.asnumpy(wc), rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(np.asarray(bj), cp.asnumpy(bc), rtol=1e-3, atol=1e-5)
    variants = {"cupy": lambda: _step_cupy(params, x, y, LR),
                "spmd.jit": lambda: jf(params, x, y)}
    jax_call, why_not = _jax_step(params_host, x_host, y_host, LR)
    if jax_call is not None:
        np.testing.assert_allclose(float(jax_call()[0]), float(loss_c), rtol=1e-3)
        variants["jax.jit"] = jax_call
    else:
        print(f"bench_gpu: no jax.jit row: {why_not}")
    times = _interleave_gpu(variants, repeats=repeats, target_s=0.02)
    name = f"train_step_gpu[batch={batch}]"
    rows = [row(name, "cupy", times["cupy"]),
            row(name, "spmd.jit", times["spmd.jit"], baseline="cupy", goal_ratio=goal)]
    if "jax.jit" in times:
        rows.append(row(name, "jax.jit", times["jax.jit"], baseline="cupy",
                        note="the same step in jax.numpy on the same GPU (diagnostic)"))
    return rows


def _jax_step(params_host, x_host, y_host, lr):
    """``jax.jit`` of the same step on JAX's GPU (or why it cannot run here)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        return None, f"JAX is not installed ({e})"
    if jax.default_backend() != "gpu" and os.environ.get("BENCH_GPU_JAX_ANY_BACKEND") != "1":
        return None, f"JAX has no GPU backend (it has {jax.default_backend()!r})"

    def loss(params, x, y):
        *hidden, (w, b) = params
        for wh, bh in hidden:
            x = jnp.tanh(x @ wh + bh)
        logp = jax.nn.log_softmax(x @ w + b)
        return -jnp.mean(jnp.sum(y * logp, axis=-1))

    @jax.jit
    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return value, jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)

    params = jax.device_put([tuple(p) for p in params_host])
    x, y = jax.device_put(x_host), jax.device_put(y_host)

    def call():
        return jax.block_until_ready(step(params, x, y))

    return call, None


def _bench_dp(repeats: int, batch: int = 2048) -> list[dict]:
    """8 simulated devices on the one GPU against 1: bench_data_parallel's steps
    (the gradient of a shard_map'ed loss, and the gradient inside shard_map)."""
    import cupy as cp

    import bench_data_parallel as dp

    mesh = spmd.make_mesh((dp.N_DEVICES,), ("batch",))
    steps = dp.make_steps(mesh)  # {"1 device", "grad outside", "grad inside"}
    params_host = dp.make_params()
    x_host, y_host = dp.make_batch(batch)
    params = [(cp.asarray(w), cp.asarray(b)) for w, b in params_host]
    x, y = cp.asarray(x_host), cp.asarray(y_host)
    want = spmd.tree_util.tree_leaves(dp.step_numpy(params_host, x_host, y_host))
    for step in steps.values():
        for g, w in zip(spmd.tree_util.tree_leaves(step(params, x, y)), want):
            assert type(g.value) is cp.ndarray
            np.testing.assert_allclose(np.asarray(g), w, rtol=2e-3, atol=2e-4)
    times = _interleave_gpu({k: functools.partial(f, params, x, y) for k, f in steps.items()},
                            repeats=repeats, target_s=0.02)
    name = f"dp_train_step_gpu[batch={batch}]"
    goal = dp.GOALS.get(batch)
    return [row(name, "1 device", times["1 device"], note="spmd.jit(value_and_grad) on 1 GPU"),
            row(name, "8 devices, grad outside", times["grad outside"], baseline="1 device",
                goal_ratio=goal, note="grad of a shard_map'ed loss: 8 simulated devices, 1 GPU"),
            row(name, "8 devices, grad inside", times["grad inside"], baseline="1 device",
                goal_ratio=goal, note="shard_map of the step, pmean of the gradients")]


def run(quick: bool = False) -> list[dict]:
    from spmd.launch import platform

    if platform.current() != "gpu":
        raise RuntimeError("bench_gpu: the devices are not GPUs; set SPMD_PLATFORM=gpu")
    scale = 3 if quick else 1
    rows = []
    if platform.nccl_available():
        rows += _bench_psum(4, None, repeats=30 // scale)
        rows += _bench_psum(256, 1.10, repeats=30 // scale)
    elif os.environ.get("SPMD_REQUIRE_NCCL") == "1":
        raise RuntimeError("bench_gpu: CuPy cannot load NCCL (SPMD_REQUIRE_NCCL=1): install "
                           "nvidia-nccl-cu12 / nvidia-nccl-cu13 matching the CuPy package")
    else:
        print("bench_gpu: CuPy cannot load NCCL: the psum rows are skipped")
    rows += _bench_step(4096, 1.15, repeats=30 // scale)
    rows += _bench_dp(repeats=20 // scale)
    return rows


if __name__ == "__main__":
    import sys

    from common import summarize, table

    print(table(summarize(run(quick="--quick" in sys.argv))))

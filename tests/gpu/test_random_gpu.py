"""spmd.random on a GPU: the array-module (CuPy) Threefry rounds give the host's numbers.

Skipped without CuPy and a GPU; ``SPMD_GPU_TESTS_ON_FAKE=1`` runs them on the CPU
stand-in for CuPy (``tests/gpu/fake_cupy.py``), which checks the code paths.
"""

from __future__ import annotations

import numpy as np

import spmd
from spmd import NamedSharding, P
from spmd import random as sr


def _host_values():
    k = sr.key(42)
    return k, {"bits": np.asarray(sr.bits(k, (3, 5))),
               "normal": np.asarray(sr.normal(k, (64,))),
               "randint": np.asarray(sr.randint(k, (16,), -5, 9)),
               "split": np.asarray(sr.key_data(sr.split(k, 3)))}


def test_samplers_on_the_gpu_equal_the_host_values(gpu, runtime_env):
    runtime_env(SPMD_PLATFORM="cpu")
    _, want = _host_values()
    runtime_env(SPMD_PLATFORM="gpu")
    k = sr.key(42)
    got = {"bits": sr.bits(k, (3, 5)), "normal": sr.normal(k, (64,)),
           "randint": sr.randint(k, (16,), -5, 9), "split": sr.key_data(sr.split(k, 3))}
    for name, v in got.items():
        assert type(v.value).__module__.split(".")[0] in ("cupy", "tests"), type(v.value)
        if name == "normal":
            np.testing.assert_allclose(np.asarray(v), want[name], rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(np.asarray(v), want[name], err_msg=name)


def test_sharded_normals_on_eight_devices_of_one_gpu(gpu):
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    f = lambda k: sr.normal(k, (16, 8))  # noqa: E731
    g = spmd.jit(f, out_shardings=NamedSharding(mesh, P("i", "j")))
    np.testing.assert_allclose(np.asarray(g(sr.key(1))), np.asarray(f(sr.key(1))),
                               rtol=1e-6, atol=1e-6)

"""``spmd.debug.print`` inside a shard_map on a job of several processes: each process
prints the values of its own devices, in device order."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
from spmd import P, lax  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def test_each_process_prints_its_devices(capsys):
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    f = spmd.shard_map(lambda b: (spmd.debug.print("dev {} has {} of {}", lax.axis_index("i"),
                                                   b, lax.psum(b, "i")), b)[1],
                       mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    x = np.arange(n, dtype=np.float32)
    for run in (f, spmd.jit(f)):
        run(x)
        mine = [k for k, d in enumerate(mesh.devices.flat)
                if d.process_index == spmd.process_index()]
        total = x.sum()
        assert capsys.readouterr().out.splitlines() == [
            f"dev {k} has {x[k:k + 1]} of {np.array([total])}" for k in mine]

"""``pmap`` on a job of several processes: each process passes its local values (one
entry per local device along the mapped axis), collectives span every process, and
each process gets back its own slices, as in JAX's multi-process pmap."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
from spmd import lax  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _global():
    """The job's whole input: one row of 3 per device; this process holds its rows."""
    n = spmd.device_count()
    return np.arange(n * 3, dtype=np.float32).reshape(n, 3) + 1


def _local(g):
    loc = spmd.local_device_count()
    me = spmd.process_index()
    return g[me * loc:(me + 1) * loc]


def test_pmap_collectives_span_the_processes():
    g = _global()
    f = spmd.pmap(lambda v, w: (lax.psum(v, "i"), v * w + lax.axis_index("i"),
                                lax.pmax(v, "i")),
                  axis_name="i", in_axes=(0, None), out_axes=(0, 0, None))
    s, y, m = f(_local(g), np.float32(2.0))
    loc = spmd.local_device_count()
    first = spmd.process_index() * loc
    np.testing.assert_allclose(s, np.broadcast_to(g.sum(0), (loc, 3)))
    np.testing.assert_allclose(y, 2 * _local(g) + np.arange(first, first + loc)[:, None])
    np.testing.assert_allclose(np.asarray(m), g.max(0))


def test_pmap_grouped_and_out_axes():
    g = _global()
    n = spmd.device_count()
    groups = [list(range(0, n, 2)), list(range(1, n, 2))]
    f = spmd.pmap(lambda v: lax.psum(v, "i", axis_index_groups=groups), axis_name="i",
                  in_axes=1, out_axes=1)
    out = f(_local(g).T)  # the mapped axis second
    want = np.stack([g[grp].sum(0) for grp in groups])[np.arange(n) % 2]
    np.testing.assert_allclose(out, _local(want).T)


def test_pmap_size_must_match_local_devices():
    from spmd.shard.maps.pmap import PmapError

    loc = spmd.local_device_count()
    with pytest.raises(PmapError, match=f"one entry per local device \\({loc}\\), got "
                                        f"{loc + 1}"):
        spmd.pmap(lambda v: v)(np.ones((loc + 1, 2), np.float32))
    with pytest.raises(PmapError, match="pmap takes concrete values"):
        spmd.jit(spmd.pmap(lambda v: v))(np.ones((loc, 2), np.float32))

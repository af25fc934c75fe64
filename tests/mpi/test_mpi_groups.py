"""Collectives with ``axis_index_groups`` across processes, against numpy per device.

The grouped collectives are built from the plain ones (``spmd.collectives.groups``);
this checks that the constant tables and per-device lookups agree with each
process's devices on a multi-process mesh.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import RefMesh, make_mesh, run_per_device, values  # noqa: E402

from spmd import lax  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

CASES = [("1d", "i"), ("2d", ("a", "b")), ("2dT", ("b", "a"))]


def _groups(n):
    """Two groups when the axis has an even size: the even and the odd indices, reversed."""
    if n % 2:
        return [list(range(n))]
    return [list(range(0, n, 2))[::-1], list(range(1, n, 2))]


def _members(ref, c, axes, groups):
    everyone = ref.group(c, axes)
    k = ref.index(c, axes)
    row = next(g for g in groups if k in g)
    return [everyone[i] for i in row], row.index(k)


@pytest.mark.parametrize("kind,axes", CASES)
def test_grouped_reductions_and_gathers(kind, axes):
    mesh = make_mesh(kind)
    ref = RefMesh.of(mesh)
    groups = _groups(ref.size(axes))
    k = len(groups[0])
    x = values((mesh.size * k * 2, 3), np.float32, seed=1)
    blocks = ref.split_rows(x)

    def check(body, per_device):
        got = run_per_device(mesh, body, x)
        want = ref.stack({c: per_device(c, [blocks[d] for d in _members(ref, c, axes,
                                                                        groups)[0]],
                                        _members(ref, c, axes, groups)[1])
                          for c in ref.coords()})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    check(lambda b: lax.psum(b, axes, axis_index_groups=groups),
          lambda c, ms, p: sum(ms))
    check(lambda b: lax.pmax(b, axes, axis_index_groups=groups),
          lambda c, ms, p: np.max(np.stack(ms), 0))
    check(lambda b: lax.all_gather(b, axes, axis_index_groups=groups, tiled=True),
          lambda c, ms, p: np.concatenate(ms, 0))
    check(lambda b: lax.psum_scatter(b, axes, axis_index_groups=groups, tiled=True),
          lambda c, ms, p: np.split(sum(ms), k, 0)[p])
    check(lambda b: lax.all_to_all(b, axes, 0, 1, axis_index_groups=groups, tiled=True),
          lambda c, ms, p: np.concatenate([np.split(m, k, 0)[p] for m in ms], 1))

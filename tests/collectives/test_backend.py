"""The declared backend interfaces (spmd/collectives/backend.py): the groups and the
transports implement their Protocols, and the one table of transport kinds drives
both the transport primitives' shapes and their dispatch."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import spmd  # noqa: F401  (the collectives and their backends)
from spmd.collectives import backend, mpi, nccl
from spmd.collectives.backend import KINDS, Group, Transport, run
from spmd.collectives.local import LocalGroup
from spmd.collectives.process_group import ProcessGroup
from spmd.compiler.core.avals import ShapedArray


def _params(fn) -> list:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _groups():
    return [LocalGroup(("i", "j"), (2, 2), ("i",)),
            ProcessGroup(("i",), (2,), ("i",), (0,), (0, 1), 0)]


@pytest.mark.parametrize("group", _groups(), ids=["local", "process"])
def test_groups_implement_the_group_protocol(group):
    assert isinstance(group, Group)
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ppermute",
                 "axis_index", "scale"):
        assert _params(getattr(type(group), name)) == _params(getattr(Group, name)), name


@pytest.mark.parametrize("module", [mpi, nccl], ids=["mpi.py", "nccl.py"])
def test_transports_implement_the_transport_protocol(module):
    assert isinstance(module, Transport)
    for k in KINDS.values():
        args = _params(getattr(module, k.op))
        assert args[:2] == ["x", "ranks"] and set(k.params) <= set(args), (k.op, args)


@pytest.mark.parametrize("prim", [mpi.mpi_p, nccl.nccl_p], ids=["mpi.py", "nccl.py"])
def test_transport_shapes_come_from_the_kinds_table(prim):
    x = ShapedArray((4, 6), np.dtype(np.float32))
    ranks = (0, 1, 2, 3)
    for name, k in KINDS.items():
        out = prim.abstract_eval(x, kind=name, ranks=ranks, op="sum")
        assert out.shape == tuple(k.shape(x.shape, len(ranks)))
    assert prim.abstract_eval(x, kind="allgather", ranks=ranks).shape == (4, 4, 6)
    with pytest.raises(ValueError, match=r"unknown transport kind 'bcast'; the kinds are "
                                         r"\['allgather', 'allreduce', 'alltoall'"):
        prim.abstract_eval(x, kind="bcast", ranks=ranks)


def test_run_dispatches_each_kind_with_its_parameters():
    seen = []

    class Recorder:
        def __getattr__(self, op):
            return lambda x, ranks, **kw: seen.append((op, ranks, kw)) or x

    params = {"op": "sum", "dst": 1, "src": 0, "what": "psum"}
    for name in KINDS:
        run(Recorder(), name, np.zeros(2), (0, 1), params)
    assert seen == [
        ("allreduce", (0, 1), {"op": "sum", "what": "psum"}),
        ("allgather", (0, 1), {"what": "psum"}),
        ("reduce_scatter", (0, 1), {"op": "sum", "what": "psum"}),
        ("alltoall", (0, 1), {"what": "psum"}),
        ("sendrecv", (0, 1), {"dst": 1, "src": 0, "what": "psum"}),
    ]
    with pytest.raises(ValueError, match="unknown transport kind"):
        backend.run(Recorder(), "gather", np.zeros(2), (0, 1), params)


def test_transport_jvp_refuses_nonlinear_reductions():
    from spmd.compiler.transforms.ad_util import Zero

    x = np.ones(3, np.float32)
    with pytest.raises(NotImplementedError, match=r"mpi reduce_scatter\(max\) is not "
                                                  "differentiable"):
        mpi.mpi_p.jvp((x,), (Zero(ShapedArray((3,), np.dtype(np.float32))),),
                      kind="reduce_scatter", ranks=(0,), op="max")

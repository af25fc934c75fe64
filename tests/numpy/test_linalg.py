"""dot, matmul (and @), einsum, tensordot, outer against numpy."""

import operator
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import F32, I32, check, mode, rand, same  # noqa: E402,F401

import spmd.numpy as snp  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5

DOT_SHAPES = [
    ((3,), (3,)),            # inner product -> ()
    ((2, 3), (3, 4)),        # matrix-matrix
    ((2, 3), (3,)),          # matrix-vector
    ((3,), (3, 4)),          # vector-matrix
    ((2, 3, 4), (4, 5)),     # N-d . 2-d
    ((2, 3, 4), (5, 4, 6)),  # N-d . M-d: sum over a[-1], b[-2]
]
DTYPE_PAIRS = [((F32, F32), F32), ((I32, I32), I32), ((I32, F32), F32)]


@pytest.mark.parametrize("dtypes,want", DTYPE_PAIRS, ids=["f32", "i32", "i32-f32"])
@pytest.mark.parametrize("shapes", DOT_SHAPES, ids=str)
def test_dot(mode, shapes, dtypes, want):
    a, b = rand(shapes[0], dtypes[0], 1), rand(shapes[1], dtypes[1], 2)
    check(snp.dot, np.dot, a, b, mode=mode, dtype=want, rtol=RTOL, atol=ATOL)


MATMUL_SHAPES = [
    ((2, 3), (3, 4)),
    ((3,), (3, 4)),             # vector-matrix
    ((2, 3), (3,)),             # matrix-vector
    ((3,), (3,)),               # vector-vector -> ()
    ((5, 2, 3), (5, 3, 4)),     # batched
    ((5, 2, 3), (3, 4)),        # batched with a broadcast matrix
    ((3,), (5, 3, 4)),          # vector with a batch of matrices
    ((5, 2, 3), (3,)),
    ((2, 1, 3, 4), (5, 4, 2)),  # broadcast batch dims -> (2, 5, 3, 2)
    ((2, 3), (5, 3, 4)),        # a matrix with a batch: y's batch moves ahead of x's rows
    ((1, 2, 3), (4, 1, 3, 2)),  # size-1 batch dims on both sides
    ((4, 1, 2, 3), (4, 5, 3, 2)),
    ((2, 1, 2, 3), (1, 3, 3, 4)),
    ((1, 1, 2, 3), (1, 3, 4)),
    ((6, 5, 2, 3), (6, 1, 3, 4)),
]


@pytest.mark.parametrize("dtypes,want", DTYPE_PAIRS, ids=["f32", "i32", "i32-f32"])
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("how", ["matmul", "@"])
def test_matmul(mode, how, shapes, dtypes, want):
    a, b = rand(shapes[0], dtypes[0], 3), rand(shapes[1], dtypes[1], 4)
    if how == "@":
        same(operator.matmul, a, b, mode=mode, dtype=want, rtol=RTOL, atol=ATOL)
    else:
        check(snp.matmul, np.matmul, a, b, mode=mode, dtype=want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("xs,ys,batch", [((16, 8, 4), (4, 6), ()),
                                          ((3, 16, 8, 4), (4, 6), ()),
                                          ((8, 4), (5, 4, 6), ()),
                                          ((3, 1, 8, 4), (3, 5, 4, 6), ((0,), (0,)))])
def test_matmul_broadcasts_nothing(xs, ys, batch):
    """A batch dim only one operand has is one of its free dims: ``(b, t, d) @ (d, h)``
    is one product of the operands as they are, never a product with a broadcast
    copy of the weight (one GEMM per batch element)."""
    import spmd

    closed = spmd.make_jaxpr(snp.matmul)(np.zeros(xs, np.float32), np.zeros(ys, np.float32))
    names = [e.primitive.name for e in closed.jaxpr.eqns]
    assert "broadcast_in_dim" not in names
    dot = next(e for e in closed.jaxpr.eqns if e.primitive.name == "dot_general")
    assert dot.params["dimension_numbers"][1] == (batch or ((), ()))


@pytest.mark.parametrize("shapes", MATMUL_SHAPES[4:], ids=str)
def test_matmul_gradients(shapes):
    import spmd

    a, b = rand(shapes[0], F32, 5), rand(shapes[1], F32, 6)
    spmd.test_util.check_grads(lambda x, y: snp.sum(snp.tanh(snp.matmul(x, y))), (a, b),
                               order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


EINSUM = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),              # implicit output
    ("ba,bc", [(3, 2), (3, 4)]),              # implicit output, sorted letters -> "ac"
    ("ij,kj", [(2, 3), (4, 3)]),              # implicit output -> "ik"
    ("bij,bjk->bik", [(5, 2, 3), (5, 3, 4)]),
    ("bij,bkj->bik", [(5, 2, 3), (5, 4, 3)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),  # several operands
    ("i,ij,j->", [(3,), (3, 4), (4,)]),
    ("i,i->", [(4,), (4,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->ji", [(2, 3)]),
    ("ij->i", [(2, 3)]),
    ("ij->", [(2, 3)]),
    ("ij,ij->ij", [(2, 3), (2, 3)]),
    ("...ij,...jk->...ik", [(5, 2, 3), (5, 3, 4)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
    ("ii->i", [(3, 3)]),                      # diagonal
    ("ii", [(3, 3)]),                         # trace (implicit output)
    ("bii->b", [(2, 3, 3)]),
]


@pytest.mark.parametrize("spec,shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum(mode, spec, shapes):
    args = [rand(s, F32, 10 + i) for i, s in enumerate(shapes)]
    check(lambda *xs: snp.einsum(spec, *xs), lambda *xs: np.einsum(spec, *xs),
          *args, mode=mode, dtype=F32, rtol=RTOL, atol=ATOL)


def test_einsum_int(mode):
    a, b = rand((2, 3), I32, 20), rand((3, 4), I32, 21)
    check(lambda x, y: snp.einsum("ij,jk->ik", x, y),
          lambda x, y: np.einsum("ij,jk->ik", x, y), a, b, mode=mode, dtype=I32)


TENSORDOT = [
    (1, (2, 3), (3, 4)),
    (2, (2, 3, 4), (3, 4, 5)),
    (0, (2,), (3,)),
    (([1, 0], [0, 1]), (3, 2, 4), (2, 3, 5)),
    (((2,), (0,)), (2, 3, 4), (4, 5)),
    ((1, 0), (2, 3), (3, 4)),
]


@pytest.mark.parametrize("axes,sa,sb", TENSORDOT, ids=[str(t[0]) for t in TENSORDOT])
def test_tensordot(mode, axes, sa, sb):
    a, b = rand(sa, F32, 30), rand(sb, F32, 31)
    check(lambda x, y: snp.tensordot(x, y, axes=axes),
          lambda x, y: np.tensordot(x, y, axes=axes), a, b,
          mode=mode, dtype=F32, rtol=RTOL, atol=ATOL)


def test_tensordot_default_axes(mode):
    a, b = rand((2, 3, 4), F32, 32), rand((3, 4, 5), F32, 33)
    check(snp.tensordot, np.tensordot, a, b, mode=mode, dtype=F32, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("sa,sb", [((3,), (4,)), ((2, 2), (3,)), ((), (3,))], ids=str)
def test_outer(mode, sa, sb):
    a, b = rand(sa, F32, 40), rand(sb, F32, 41)
    check(snp.outer, np.outer, a, b, mode=mode, dtype=F32, rtol=RTOL, atol=ATOL)


def test_outer_int(mode):
    a, b = rand((3,), I32, 42), rand((2,), I32, 43)
    check(snp.outer, np.outer, a, b, mode=mode, dtype=I32)

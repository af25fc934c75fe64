"""The partition rule of conv_general_dilated: batch and feature splits keep the
convolution local (or leave one reduction of the pending sum), values match the
unpartitioned convolution."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd import NamedSharding as NS

RNG = np.random.default_rng(0)
COLLECTIVES = {"psum", "psum_scatter", "all_gather", "all_to_all", "pmax", "pmin", "ppermute"}


@pytest.fixture(scope="module")
def mesh42():
    return spmd.make_mesh((4, 2), ("data", "model"))


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _collectives(lowered):
    return sorted(e.primitive.name for e in lowered.program.program.eqns
                  if e.primitive.name in COLLECTIVES)


def _conv(x, w, groups=1):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", feature_group_count=groups)


def _check(f, args, in_specs, mesh, out_spec=None, collectives=()):
    pj = spmd.jit(f, in_shardings=tuple(NS(mesh, s) for s in in_specs),
                  out_shardings=None if out_spec is None else NS(mesh, out_spec))
    lo = pj.lower(*args)
    assert _collectives(lo) == sorted(collectives), lo.as_text()
    got = pj(*args)
    for g, w in zip(spmd.tree_util.tree_leaves(got), spmd.tree_util.tree_leaves(f(*args))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)
    return got


def test_batch_and_output_feature_splits_need_no_communication(mesh42):
    x, w = _x(8, 4, 6, 6), _x(6, 4, 3, 3)
    out = _check(_conv, [x, w], [P("data"), P("model")], mesh42)
    assert out.sharding == NS(mesh42, P("data", "model"))


def test_input_feature_split_leaves_one_reduction(mesh42):
    x, w = _x(8, 4, 6, 6), _x(6, 4, 3, 3)
    out = _check(_conv, [x, w], [P("data", "model"), P(None, "model")], mesh42,
                 out_spec=P("data"), collectives=["psum"])
    assert out.sharding == NS(mesh42, P("data"))


def test_grouped_convolution_splits_whole_groups(mesh42):
    x, w = _x(8, 4, 6, 6), _x(8, 1, 3, 3)  # depthwise with channel multiplier 2
    out = _check(lambda a, b: _conv(a, b, groups=4), [x, w], [P("data", "model"),
                                                               P("model")], mesh42)
    assert out.sharding == NS(mesh42, P("data", "model"))


def test_channels_last_layout_keeps_batch_split(mesh42):
    x, w = _x(8, 6, 6, 4), _x(3, 3, 4, 2)
    f = lambda a, b: lax.conv_general_dilated(a, b, (2, 2), "SAME",  # noqa: E731
                                              dimension_numbers=("NHWC", "HWIO", "NHWC"))
    out = _check(f, [x, w], [P("data"), P()], mesh42)
    assert out.sharding.spec[0] == "data"


def test_data_parallel_gradient_is_one_psum_per_weight(mesh42):
    x, w1, w2 = _x(8, 3, 6, 6), _x(4, 3, 3, 3), _x(2, 4, 3, 3)

    def loss(w1, w2, x):
        h = snp.tanh(_conv(x, w1))
        return (_conv(h, w2) ** 2).mean()

    g = spmd.jit(spmd.grad(loss, argnums=(0, 1)),
                 in_shardings=(NS(mesh42, P()), NS(mesh42, P()), NS(mesh42, P("data"))))
    lo = g.lower(w1, w2, x)
    assert _collectives(lo) == ["psum", "psum"], lo.as_text()
    for a, b in zip(g(w1, w2, x), spmd.grad(loss, argnums=(0, 1))(w1, w2, x)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)

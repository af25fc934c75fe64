"""``spmd.debug.print`` (when the code runs, in order, per device and per batch element)
and ``spmd.debug.visualize_array_sharding``, checked on captured output."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax
from spmd.errors import ArgumentError


def _lines(capsys):
    return capsys.readouterr().out.splitlines()


def test_eager_and_under_jit_each_run(capsys):
    spmd.debug.print("eager {} {x} {s}", np.arange(3), x=5, s="txt")
    assert _lines(capsys) == ["eager [0 1 2] 5 txt"]

    @spmd.jit
    def f(x):
        spmd.debug.print("first {}", x * 2)
        y = x + 1
        spmd.debug.print("second {:.1f}", snp.sum(y))
        return y

    f(np.ones(2, np.float32))
    f(np.full(2, 2.0, np.float32))  # the cached program prints again
    assert _lines(capsys) == ["first [2. 2.]", "second 4.0", "first [4. 4.]", "second 6.0"]
    # Identical prints are not merged, and prints whose results nobody uses stay.
    g = spmd.jit(lambda x: (spmd.debug.print("a {}", x), spmd.debug.print("a {}", x), x)[2])
    g(np.float32(1.0))
    assert _lines(capsys) == ["a 1.0", "a 1.0"]


def test_per_device_in_shard_map(capsys):
    mesh = spmd.make_mesh((4,), ("i",))

    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    def f(b):
        spmd.debug.print("device {i}: {b} total {t}", i=lax.axis_index("i"), b=b,
                         t=lax.psum(b, "i"))
        spmd.debug.print("replicated {}", 7)  # printed by every device
        return b

    x = np.arange(8, dtype=np.float32)
    want = [f"device {k}: {x[2 * k:2 * k + 2]} total [12. 16.]" for k in range(4)]
    for run in (f, spmd.jit(f)):
        run(x)
        out = _lines(capsys)
        assert [line for line in out if line.startswith("device")] == want
        assert out.count("replicated 7") == 4
    # A 2-d mesh prints in row-major device order.
    mesh2 = spmd.make_mesh((2, 2), ("i", "j"))
    spmd.shard_map(lambda b: (spmd.debug.print("{} {}", lax.axis_index("i"),
                                               lax.axis_index("j")), b)[1],
                   mesh=mesh2, in_specs=P("i"), out_specs=P("i"))(x)
    assert _lines(capsys) == ["0 0", "0 1", "1 0", "1 1"]
    # A body whose results are unused still prints under jit.
    spmd.jit(lambda x: (spmd.shard_map(lambda b: (spmd.debug.print("dead {}", b), b)[1],
                                       mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x),
                        x)[1])(np.arange(4.0))
    assert _lines(capsys) == ["dead [0.]", "dead [1.]", "dead [2.]", "dead [3.]"]


def test_vmap_loops_and_grad(capsys):
    spmd.vmap(lambda v, w: spmd.debug.print("v={} w={}", v, w), in_axes=(0, None))(
        np.arange(3), np.int32(9))
    assert _lines(capsys) == ["v=0 w=9", "v=1 w=9", "v=2 w=9"]
    spmd.vmap(spmd.vmap(lambda v: spmd.debug.print("{}", v)))(np.arange(4).reshape(2, 2))
    assert _lines(capsys) == ["0", "1", "2", "3"]

    def body(c, x):
        spmd.debug.print("step {} {}", c, x)
        return c + x, c

    spmd.jit(lambda xs: lax.scan(body, 0.0, xs))(np.arange(3.0))
    assert _lines(capsys) == ["step 0.0 0.0", "step 0.0 1.0", "step 1.0 2.0"]
    # grad prints the primal value once, eagerly and under jit.
    f = spmd.grad(lambda x: (spmd.debug.print("x={}", x), x * x)[1])
    assert float(f(3.0)) == 6.0 and _lines(capsys) == ["x=3.0"]
    assert float(spmd.jit(f)(3.0)) == 6.0 and _lines(capsys) == ["x=3.0"]


def test_under_jit_with_shardings_the_global_value_prints_once(capsys):
    mesh = spmd.make_mesh((4,), ("i",))
    f = spmd.jit(lambda x: (spmd.debug.print("x={}", x * 2), x + 1)[1],
                 in_shardings=NamedSharding(mesh, P("i")))
    np.testing.assert_allclose(np.asarray(f(np.arange(8.0))), np.arange(8.0) + 1)
    assert _lines(capsys) == [f"x={np.arange(8.0) * 2}"]


def test_errors():
    with pytest.raises(ArgumentError, match="fmt must be a format string"):
        spmd.debug.print(3)


def test_visualize_array_sharding(capsys):
    mesh = spmd.make_mesh((4,), ("i",))
    text = spmd.debug.visualize_array_sharding(
        spmd.device_put(np.zeros(8), NamedSharding(mesh, P("i"))))
    assert "CPU 0" in text and "CPU 3" in text
    assert text == spmd.visualize_array_sharding(
        spmd.device_put(np.zeros(8), NamedSharding(mesh, P("i"))))

"""custom_vjp / custom_jvp rules whose outputs do not match the function's types.

A bwd returning a cotangent of the wrong shape used to be broadcast into the
gradient (16 where the derivative is 4); now every (co)tangent a user rule
returns is checked against the primal's type, and a mismatch is an error naming
the argument position (and pytree path), the expected and the returned type.
"""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.transforms.custom import CustomRuleError
from spmd.compiler.core.dtypes import float0


def _square_with_bwd(bwd):
    @spmd.custom_vjp
    def f(x):
        return x ** 2

    f.defvjp(lambda x: (x ** 2, x), bwd)
    return f


def test_reported_case_wrong_shape_four_times_too_big():
    f = _square_with_bwd(lambda x, g: (4 * snp.ones((2, 2)) * x * g,))
    with pytest.raises(CustomRuleError, match=r"f32\[2,2\] for args\[0\].*primal has type "
                                              r"f32\[\].*must have type f32\[\]"):
        spmd.grad(f)(2.0)


def test_wrong_dtype():
    f = _square_with_bwd(lambda x, g: ((2 * x * g).astype(np.float16),))
    with pytest.raises(CustomRuleError, match=r"f16\[\] for args\[0\]"):
        spmd.grad(f)(np.float32(2.0))


def test_wrong_structure_names_the_argument():
    @spmd.custom_vjp
    def f(params):
        return params["w"] * params["b"]

    f.defvjp(lambda p: (f(p), p), lambda p, g: ({"w": g * p["b"]},))
    with pytest.raises(CustomRuleError, match="argument 0 with structure"):
        spmd.grad(f)({"w": np.float32(2), "b": np.float32(3)})


def test_wrong_shape_inside_a_pytree_names_its_path():
    @spmd.custom_vjp
    def f(params):
        return (params["w"] * params["b"]).sum()

    def bwd(p, g):
        return ({"b": g * p["w"], "w": snp.zeros(5)},)

    f.defvjp(lambda p: (f(p), p), bwd)
    params = {"w": np.ones(3, np.float32), "b": np.ones(3, np.float32)}
    with pytest.raises(CustomRuleError, match=r"bwd bwd returned a cotangent of type f32\[5\] "
                                              r"for args\[0\]\['w'\]"):
        spmd.grad(f)(params)


def test_wrong_number_of_cotangents():
    f = _square_with_bwd(lambda x, g: (g, g))
    with pytest.raises(CustomRuleError, match="2 cotangents for 1 arguments"):
        spmd.grad(f)(2.0)


def test_right_outputs_still_work_including_none_and_python_scalars():
    f = _square_with_bwd(lambda x, g: (2 * x * g,))
    assert float(spmd.grad(f)(3.0)) == 6.0

    @spmd.custom_vjp
    def h(x, n):
        return x * n

    h.defvjp(lambda x, n: (x * n, n), lambda n, g: (g * n, None))
    assert float(spmd.grad(h)(2.0, 3)) == 3.0
    # Zeros of an integer input's own dtype stand for "no derivative".
    h.defvjp(lambda x, n: (x * n, n), lambda n, g: (g * n, snp.zeros((), np.int32)))
    assert float(spmd.grad(h)(2.0, 3)) == 3.0
    # A weakly typed Python scalar is cast to the input's dtype.
    h.defvjp(lambda x, n: (x * n, n), lambda n, g: (1.0, None))
    out = spmd.grad(h)(np.float32(2.0), 3)
    assert out.dtype == np.float32 and float(out) == 1.0


def test_custom_jvp_tangent_of_the_wrong_shape():
    @spmd.custom_jvp
    def f(x):
        return x * 2

    f.defjvp(lambda p, t: (f(*p), snp.ones(3) * t[0]))
    with pytest.raises(CustomRuleError, match=r"tangent of type f32\[3\] for output 0"):
        spmd.grad(f)(2.0)
    with pytest.raises(CustomRuleError, match=r"tangent of type f32\[3\] for output 0"):
        spmd.jvp(f, (np.float32(2),), (np.float32(1),))


def test_custom_jvp_primal_of_the_wrong_type():
    @spmd.custom_jvp
    def f(x):
        return x * 2

    f.defjvp(lambda p, t: (snp.ones(2), t[0]))
    with pytest.raises(CustomRuleError, match=r"primal output of type f32\[2\] at output 0"):
        spmd.jvp(f, (np.float32(2),), (np.float32(1),))


def test_custom_jvp_with_an_integer_argument_gets_float0_tangents():
    seen = []

    @spmd.custom_jvp
    def f(x, n):
        return x * n

    @f.defjvp
    def f_jvp(p, t):
        seen.append(t[1].dtype)
        return f(*p), t[0] * p[1]

    assert float(spmd.grad(f)(2.0, 3)) == 3.0
    assert seen and seen[0] == float0


def _weighted_with_bwd(bwd):
    """f(p) = sum(p["a"] * p["b"][0] + p["b"][1]) with the given bwd rule."""
    @spmd.custom_vjp
    def f(p):
        return snp.sum(p["a"] * p["b"][0] + p["b"][1])

    f.defvjp(lambda p: (f(p), p), bwd)
    return f


PARAMS = {"a": np.arange(3, dtype=np.float32) + 1,
          "b": (np.full(3, 2.0, np.float32), np.float32(5.0))}


def test_none_for_a_subtree_of_an_argument_is_a_zero_cotangent():
    # JAX's rule: None may stand for any subtree of an argument's cotangent.
    def bwd(p, g):
        return ({"a": None, "b": (g * p["a"], None)},)

    got = spmd.grad(_weighted_with_bwd(bwd))(PARAMS)
    np.testing.assert_array_equal(np.asarray(got["a"]), np.zeros(3, np.float32))
    np.testing.assert_array_equal(np.asarray(got["b"][0]), PARAMS["a"])
    assert got["b"][1].dtype == np.float32 and float(got["b"][1]) == 0.0

    def bwd_whole(p, g):  # None for the whole tuple subtree
        return ({"a": g * p["b"][0], "b": None},)

    got = spmd.jit(spmd.grad(_weighted_with_bwd(bwd_whole)))(PARAMS)
    np.testing.assert_array_equal(np.asarray(got["a"]), PARAMS["b"][0])
    np.testing.assert_array_equal(np.asarray(got["b"][0]), np.zeros(3, np.float32))
    assert float(got["b"][1]) == 0.0


def test_none_subtrees_under_vmap_of_grad():
    def bwd(p, g):
        return ({"a": g * p["b"][0], "b": (None, g * 3)},)

    f = _weighted_with_bwd(bwd)
    batch = spmd.tree_util.tree_map(lambda x: np.stack([x, 2 * x]), PARAMS)
    got = spmd.vmap(spmd.grad(f))(batch)
    np.testing.assert_array_equal(np.asarray(got["a"]), batch["b"][0])
    np.testing.assert_array_equal(np.asarray(got["b"][0]), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(np.asarray(got["b"][1]), np.full(2, 3.0, np.float32))  # g * 3, g = 1


def test_non_none_leaf_in_place_of_a_subtree_is_a_structure_error():
    # A single array where the argument has a (tuple) subtree: ambiguous, refused.
    f = _weighted_with_bwd(lambda p, g: ({"a": g * p["b"][0], "b": g},))
    with pytest.raises(CustomRuleError, match=r"argument 0 with structure.*None for a zero"):
        spmd.grad(f)(PARAMS)
    # Missing keys stay an error (None must be written, not left out).
    f = _weighted_with_bwd(lambda p, g: ({"a": None},))
    with pytest.raises(CustomRuleError, match="argument 0 with structure"):
        spmd.grad(f)(PARAMS)


def test_none_inside_a_registered_pytree_argument():
    from spmd.tree_util import register_dataclass
    import dataclasses

    @register_dataclass
    @dataclasses.dataclass
    class Layer:
        w: object
        b: object

    @spmd.custom_vjp
    def f(layer):
        return snp.sum(layer.w * 2.0 + layer.b)

    f.defvjp(lambda layer: (f(layer), None), lambda _, g: (Layer(w=snp.ones(2) * g * 2.0, b=None),))
    got = spmd.grad(f)(Layer(np.ones(2, np.float32), np.ones(2, np.float32)))
    np.testing.assert_array_equal(np.asarray(got.w), np.full(2, 2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(got.b), np.zeros(2, np.float32))

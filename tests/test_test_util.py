"""spmd.test_util.check_grads: it must catch wrong derivatives, complex ones included
(it once cast complex inputs and outputs to float64, checking only the real axis)."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.test_util import check_grads

Z = np.array([0.3 + 0.2j, -0.5 - 0.4j, 0.25 + 0.1j], np.complex64)


def _conj_with_rule(rule):
    @spmd.custom_jvp
    def f(z):
        return snp.conj(z)

    f.defjvp(lambda primals, tangents: (f(primals[0]), rule(tangents[0])))
    return f


def test_complex_derivatives_pass_when_right():
    check_grads(snp.sin, (Z,), order=2)
    check_grads(lambda z: snp.sum(snp.abs(z) ** 2), (Z,), order=2)
    check_grads(_conj_with_rule(snp.conj), (Z,), order=1)
    check_grads(lambda z: snp.real(z) * 2.0, (Z,), order=1)  # complex in, real out
    check_grads(lambda x: x * (1 + 2j), (np.array([0.5, 1.5]),), order=1)  # real in, complex out


@pytest.mark.parametrize("modes", [("fwd",), ("rev",)])
def test_a_derivative_wrong_off_the_real_axis_is_caught(modes):
    # d conj(z) = conj(dz): a rule returning dz agrees on real directions only.
    with pytest.raises(AssertionError, match="check_grads"):
        check_grads(_conj_with_rule(lambda t: t), (Z,), order=1, modes=modes)


def test_a_wrong_imaginary_output_is_caught():
    # Real input, complex output: the rule's real part is right, its imaginary part is not.
    @spmd.custom_jvp
    def f(x):
        return x * (1 + 2j)

    f.defjvp(lambda primals, tangents: (f(primals[0]), tangents[0] * (1 + 0j)))
    with pytest.raises(AssertionError, match="check_grads"):
        check_grads(f, (np.array([0.5, 1.5]),), order=1, modes=("fwd",))


def test_real_functions_unchanged():
    check_grads(lambda x: snp.sum(x ** 3), (np.array([1.0, 2.0]),), order=2)
    with pytest.raises(AssertionError, match="check_grads"):
        check_grads(_conj_with_rule(lambda t: 2 * t), (np.array([1.0, 2.0]),), order=1)

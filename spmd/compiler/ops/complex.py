"""Complex numbers: ``real``, ``imag``, ``conj`` and ``complex``.

The elementwise primitives handle complex operands in their own rules
(:mod:`spmd.compiler.ops.elementwise`: ``abs`` is the modulus, ``convert_element_type``
refuses to drop an imaginary part); those rules call this module's ``real`` and
``conj`` when they run.

Transposes follow JAX's convention: every linear map is transposed as a map
over the reals with the bilinear pairing ``<a, b> = Re(a) Re(b) - Im(a) Im(b)``
summed, i.e. without conjugating.  So ``real``'s transpose is ``ct -> ct + 0j``,
``imag``'s is ``ct -> -i ct``, ``conj``'s is ``conj``, and multiplying by a
constant transposes to multiplying by the same (unconjugated) constant.  With a
real output and a cotangent of 1 this makes ``grad(f)(x + iy) = df/dx - i df/dy``,
which is what ``jax.grad`` returns.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import is_undefined, Zero
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops.elementwise_eval import binary_aval
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind
from spmd.errors import DTypeError
from spmd.compiler import ops  # sibling families, read at call time (rules build each other's ops)


def _part(name, np_name, out_complex: bool, real_ok: bool):
    """An elementwise complex primitive computed by ``xp.<np_name>``."""
    p = Primitive(name, traits=())
    p.def_impl(lambda xp, x: getattr(xp, np_name)(x))

    @p.def_abstract_eval
    def aval(x):
        if not dtypes.is_complex(x.dtype) and not (real_ok and dtypes.is_float(x.dtype)):
            raise DTypeError(f"{name}: operand dtype {x.dtype} is not complex; "
                             f"snp.{np_name} accepts real arrays too")
        out = x.dtype if out_complex else dtypes.real_dtype(x.dtype)
        return ShapedArray(x.shape, out, x.weak_type)

    p.def_emit(lambda ins: f"xp.{np_name}({ins[0]})")
    p.def_batch(lambda args, dims: (bind(p, args[0]), dims[0]))
    p.def_jvp(lambda primals, tangents: (bind(p, primals[0]),
                                         _linear_tangent(p, tangents[0], primals[0])))
    p.linear = True
    return p


def _linear_tangent(p, t, x):
    if isinstance(t, Zero):
        return Zero(ew._aval(bind(p, x)).update(weak_type=False))
    return bind(p, t)


real_p = _part("real", "real", out_complex=False, real_ok=False)
imag_p = _part("imag", "imag", out_complex=False, real_ok=False)
conj_p = _part("conj", "conjugate", out_complex=True, real_ok=False)


def real(x):
    """The real part of a complex array (lax level)."""
    return bind(real_p, x)


def imag(x):
    """The imaginary part of a complex array (lax level)."""
    return bind(imag_p, x)


def conj(x):
    """The complex conjugate of a complex array (lax level)."""
    return bind(conj_p, x)


# ---------------------------------------------------- complex(re, im)

complex_p = Primitive("complex", traits=())


@complex_p.def_impl
def _complex_impl(xp, x, y):
    out = xp.empty(xp.broadcast_shapes(x.shape, y.shape), dtypes.complex_dtype(x.dtype))
    out.real, out.imag = x, y
    return out


@complex_p.def_abstract_eval
def _complex_aval(x, y):
    if not dtypes.is_float(x.dtype) or dtypes.is_narrow_float(x.dtype) or x.dtype == np.float16:
        raise DTypeError(f"complex: operand dtype {x.dtype} must be float32 or float64 "
                         "(convert the parts first with .astype)")
    a = binary_aval("complex", x, y)
    return a.update(dtype=dtypes.complex_dtype(x.dtype))


complex_p.def_emit(lambda ins: None)
complex_p.def_batch(ew._batch_elementwise(complex_p))


def make_complex(x, y):
    """``x + 1j * y`` from two real arrays of one float dtype (lax ``complex``)."""
    return bind(complex_p, x, y)


def _complex_jvp(primals, tangents):
    x, y = primals
    out = make_complex(x, y)
    tx, ty = tangents
    if isinstance(tx, Zero) and isinstance(ty, Zero):
        return out, Zero(ew._aval(out).update(weak_type=False))
    ra = _real_aval(out)
    tx, ty = (_zeros(ra) if isinstance(t, Zero) else ew._shaped(t, ra) for t in (tx, ty))
    return out, make_complex(tx, ty)


def _zeros(aval):
    return ops.structural.full(aval.shape, 0, aval.dtype)


def _real_aval(out):
    av = ew._aval(out)
    return av.update(dtype=dtypes.real_dtype(av.dtype), weak_type=False)


def _complex_transpose(ct, x, y):
    # complex(x, y) = x + i y; transposed under the unconjugated pairing.
    outs = []
    for operand, part in ((x, lambda c: real(c)), (y, lambda c: ew.neg(imag(c)))):
        if not is_undefined(operand):
            outs.append(None)
        elif isinstance(ct, Zero):
            outs.append(Zero(operand.aval))
        else:
            outs.append(ew._sum_to_shape(part(ct), operand.aval.shape))
    return outs


complex_p.def_jvp(_complex_jvp)
complex_p.def_transpose(_complex_transpose)


real_p.def_transpose(lambda ct, x: [Zero(x.aval) if isinstance(ct, Zero)
                                    else make_complex(ct, ew._full_like(ct, 0))])
imag_p.def_transpose(lambda ct, x: [Zero(x.aval) if isinstance(ct, Zero)
                                    else make_complex(ew._full_like(ct, 0), ew.neg(ct))])
conj_p.def_transpose(lambda ct, x: [Zero(x.aval) if isinstance(ct, Zero) else conj(ct)])

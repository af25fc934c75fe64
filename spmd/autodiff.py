"""The differentiation API on pytrees: jvp, linearize, vjp, grad, jacobians."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd import tree_util
from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad import LinearFunction, jvp_flat, linearize_flat, stop_gradient, zeros_for
from spmd.compiler.transforms.ad_util import Zero, instantiate
from spmd.compiler.core.avals import tangent_aval
from spmd.compiler.core.jit import flatten_outputs
from spmd.compiler.ops.elementwise import convert
from spmd.compiler.ops.structural import full, reshape, transpose
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError, SpmdError
from spmd.numpy._util import to_array
from spmd.shard.call.tracebacks import api_boundary
from spmd.shard.explicit import types as explicit
from spmd.vectorize import vmap


class GradientError(SpmdError, TypeError):
    """A bad use of grad/vjp/jvp (non-scalar output, integer input, bad argnums...)."""


class TangentVaryingError(SpmdError, ValueError):
    """Inside ``shard_map``: ``linearize``'s ``f_jvp`` got a tangent that varies along
    other mesh axes than its primal (JAX's ValueError): the linear map was built for
    the primal's type."""


def _flat_fun(fun, in_tree, fname, out_tree_box):
    def flat(*leaves):
        args = tree_util.tree_unflatten(in_tree, leaves)
        out = fun(*args)
        leaves_out, out_tree = flatten_outputs(out, fname)
        out_tree_box[:] = [out_tree]
        return leaves_out

    return flat


def _name(f) -> str:
    return getattr(f, "__name__", type(f).__name__)


@api_boundary
def jvp(fun: Callable, primals: Sequence, tangents: Sequence, has_aux: bool = False):
    """Forward mode: ``(fun(*primals), J @ tangents)``.

    >>> jvp(lambda x: x * x, (3.0,), (1.0,))
    (Array(9., dtype=float32, weak_type=True), Array(6., dtype=float32))
    """
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise GradientError(f"jvp({_name(fun)}): primals and tangents must be tuples or lists, "
                            f"got {type(primals).__name__} and {type(tangents).__name__}")
    p_leaves, p_tree = tree_util.tree_flatten(tuple(primals))
    t_leaves, t_tree = tree_util.tree_flatten(tuple(tangents))
    if p_tree != t_tree:
        raise GradientError(f"jvp({_name(fun)}): primals and tangents have different "
                            f"structures: {p_tree} vs {t_tree}")
    for i, (p, t) in enumerate(zip(p_leaves, t_leaves)):
        if np.shape(p) != np.shape(t):
            raise GradientError(f"jvp({_name(fun)}): tangent {i} has shape {np.shape(t)}, its "
                                f"primal has shape {np.shape(p)}")
    box: list = []
    f = _aux_as_output(fun) if has_aux else fun
    flat = _flat_fun(f, p_tree, f"jvp({_name(fun)})", box)
    tangents_in = [_tangent_in(p, t) for p, t in zip(p_leaves, t_leaves)]
    out_p, out_t = jvp_flat(flat, p_leaves, tangents_in)
    out_t = [zeros_for(t.aval) if isinstance(t, Zero) else t for t in out_t]
    if not has_aux:
        return tree_util.tree_unflatten(box[0], out_p), tree_util.tree_unflatten(box[0], out_t)
    out_tree, aux_tree = box[0].children()
    n = out_tree.num_leaves
    return (tree_util.tree_unflatten(out_tree, out_p[:n]),
            tree_util.tree_unflatten(out_tree, out_t[:n]),
            tree_util.tree_unflatten(aux_tree, out_p[n:]))


def _tangent_in(p, t):
    av = get_aval(p)
    if not dtypes.is_inexact(av.dtype):
        return Zero(tangent_aval(av))
    _check_no_imag_loss(t, av, "jvp: tangent")
    return convert(to_array(t), av.dtype)


def _stop_aux(aux):
    return stop_gradient(aux)


@api_boundary
def linearize(fun: Callable, *primals):
    """``(fun(*primals), f_jvp)`` where ``f_jvp(*tangents)`` is the linear map (evaluated
    without re-running the non-linear part)."""
    p_leaves, p_tree = tree_util.tree_flatten(tuple(primals))
    box: list = []
    flat = _flat_fun(fun, p_tree, f"linearize({_name(fun)})", box)
    diff = [dtypes.is_inexact(get_aval(p).dtype) for p in p_leaves]
    out_p, lin = linearize_flat(flat, p_leaves, diff, eager=True)
    out_tree = box[0]

    def f_jvp(*tangents):
        t_leaves, t_tree = tree_util.tree_flatten(tuple(tangents))
        if t_tree != p_tree:
            raise GradientError(f"linearize: tangents' structure {t_tree} differs from the "
                                f"primals' {p_tree}")
        ts = [_tangent_in(p, t) for p, t, d in zip(p_leaves, t_leaves, diff) if d]
        for i, (p, t) in enumerate(zip([p for p, d in zip(p_leaves, diff) if d], ts)):
            _check_tangent_varying(p, t, i)
        return tree_util.tree_unflatten(out_tree, lin.jvp(ts))

    return tree_util.tree_unflatten(out_tree, out_p), f_jvp


def _check_tangent_varying(primal, tangent, i):
    """A tangent passed to ``linearize``'s ``f_jvp`` must vary along the mesh axes its
    primal varies along (inside ``shard_map``), as in JAX: the linear map was traced
    for the primal's type, and a tangent of another type would be summed or copied
    wrongly.  Raises :class:`TangentVaryingError` naming the ``pcast`` that fixes it."""
    p_vma, t_vma = get_aval(primal).vma, get_aval(tangent).vma
    if p_vma == t_vma:
        return
    fixes = []
    if t_vma - p_vma:
        fixes.append(f"applying `lax.pcast(..., {tuple(sorted(t_vma - p_vma))}, "
                     "to='varying')` to the primal value passed to `linearize`")
    if p_vma - t_vma:
        fixes.append(f"applying `lax.pcast(..., {tuple(sorted(p_vma - t_vma))}, "
                     "to='varying')` to the tangent passed to the `f_jvp` that "
                     "`linearize` returned")
    raise TangentVaryingError(
        f"linearize: f_jvp's tangent {i} varies along mesh axes {sorted(t_vma)}, but its "
        f"primal varies along {sorted(p_vma)}; they must match. Fix it by "
        + " and ".join(fixes))


@api_boundary
def vjp(fun: Callable, *primals, has_aux: bool = False):
    """``(fun(*primals), f_vjp)``; ``f_vjp(ct)`` returns one cotangent per primal.

    Integer and bool inputs get float0 cotangents (as in JAX).
    """
    p_leaves, p_tree = tree_util.tree_flatten(tuple(primals))
    box: list = []
    # With has_aux the aux values are extra (undifferentiated) outputs of the
    # traced function, so that they leave the trace as values, not tracers.
    f = _aux_as_output(fun) if has_aux else fun
    flat = _flat_fun(f, p_tree, f"vjp({_name(fun)})", box)
    diff = [dtypes.is_inexact(get_aval(p).dtype) for p in p_leaves]
    # On explicit axes: the function is traced with its arguments' types, and the
    # replay of its primal part trusts them (spmd.shard.explicit.types).
    with explicit.trusted():
        out_p, lin = linearize_flat(explicit.retyped(flat, p_leaves), p_leaves, diff,
                                    eager=True)
    out_tree = box[0]
    aux = None
    if has_aux:
        out_tree, aux_tree = out_tree.children()
        n_aux = aux_tree.num_leaves
        aux = tree_util.tree_unflatten(aux_tree, out_p[len(out_p) - n_aux:])
        out_p = out_p[:len(out_p) - n_aux]
        lin.out_zero = lin.out_zero[:len(out_p)] + [True] * n_aux

    pullback = _Pullback(_name(fun), lin, out_tree, [get_aval(o) for o in out_p], p_tree,
                         p_leaves, diff)
    # A pytree whose leaves are the residuals (as JAX's): it may be passed through jit,
    # scan or a custom_vjp's residuals, and is rebuilt there around traced residuals.
    f_vjp = tree_util.Partial(pullback, list(lin.residuals))
    out = tree_util.tree_unflatten(out_tree, out_p)
    return (out, f_vjp, aux) if has_aux else (out, f_vjp)


class _Pullback:
    """``vjp``'s backward function without its residuals (the leaves of the
    ``tree_util.Partial`` that ``vjp`` returns, which calls this with them first)."""

    def __init__(self, name, lin, out_tree, out_avals, p_tree, p_leaves, diff):
        self.name, self.lin, self.out_tree, self.out_avals = name, lin, out_tree, out_avals
        self.p_tree, self.diff = p_tree, diff
        # The primals' avals and explicit types (each cotangent takes its primal's).
        self.p_avals = [get_aval(p) for p in p_leaves]
        self.p_types = [p if explicit.type_of(p) is not None else None for p in p_leaves]

    def __call__(self, residuals, ct):
        lin = self.lin
        if residuals is not lin.residuals:
            lin = LinearFunction(lin.program, list(residuals), lin.in_avals, lin.out_avals,
                                 lin.out_zero)
        ct_leaves, ct_tree = tree_util.tree_flatten(ct)
        if ct_tree != self.out_tree:
            raise GradientError(f"vjp({self.name}): the cotangent's structure {ct_tree} "
                                f"differs from the output's {self.out_tree}")
        for i, (c, o) in enumerate(zip(ct_leaves, self.out_avals)):
            if np.shape(c) != o.shape:
                raise GradientError(f"vjp({self.name}): cotangent {i} has shape "
                                    f"{np.shape(c)}, the output has shape {o.shape}")
        cts = [_ct_in(c, o) for c, o in zip(ct_leaves, self.out_avals)]
        cts += [None] * (len(lin.out_zero) - len(cts))  # aux outputs: no cotangent
        # On explicit axes the backward pass's own products may be ambiguous (a weight's
        # gradient contracts a split batch): they are left to the partitioner, and each
        # cotangent takes its primal's sharding, as in JAX.
        with explicit.trusted():
            cts_in = iter(lin.transpose(cts))
        res = []
        for av, p, d in zip(self.p_avals, self.p_types, self.diff):
            tav = tangent_aval(av)
            ct_p = zeros_for(tav) if not d else _materialize(next(cts_in), tav)
            res.append(explicit.like_primal(ct_p, p) if d and p is not None else ct_p)
        return tree_util.tree_unflatten(self.p_tree, res)


def _aux_as_output(fun):
    def f(*args):
        out = fun(*args)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise GradientError(f"{_name(fun)} was marked has_aux=True, so it must return a "
                                f"pair (output, aux); it returned {type(out).__name__}"
                                + (f" of length {len(out)}" if isinstance(out, (tuple, list))
                                   else ""))
        return (out[0], _stop_aux(out[1]))

    return f


def _ct_in(c, av):
    if not dtypes.is_inexact(av.dtype):
        return Zero(tangent_aval(av))
    _check_no_imag_loss(c, av, "vjp: cotangent")
    c = to_array(c)
    # A cotangent of the right dtype is taken as it is (a weak-typed one too, as in
    # JAX): converting it would only add an equation to the backward program.
    return c if get_aval(c).dtype == av.dtype else convert(c, av.dtype)


def _check_no_imag_loss(v, aval, what):
    """A complex tangent for a real primal would lose its imaginary part: refuse it."""
    if np.iscomplexobj(v) and not dtypes.is_complex(aval.dtype):
        raise GradientError(f"{what} has dtype {get_aval(v).dtype} but its primal is real "
                            f"({aval.dtype}); pass a real value (e.g. snp.real(t))")


def _materialize(ct, aval):
    return zeros_for(aval) if isinstance(ct, Zero) else ct


def _check_argnums(fun, argnums, nargs, fname):
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    for a in nums:
        if not isinstance(a, int) or not -nargs <= a < nargs:
            raise ArgumentError(f"{fname}({_name(fun)}): argnums={argnums} is out of range for "
                                f"a call with {nargs} positional argument(s)")
    return single, tuple(a % nargs for a in nums)


def value_and_grad(fun: Callable, argnums=0, has_aux: bool = False, allow_int: bool = False,
                   holomorphic: bool = False):
    """A function returning ``(fun(*args), gradient w.r.t. args[argnums])``.

    With ``allow_int=True`` integer and bool arguments are allowed; their
    gradients are float0 zeros (as in JAX).

    Complex inputs follow JAX's convention: for a real-valued ``fun`` of ``z = x + iy``
    the gradient is ``df/dx - i df/dy`` (the conjugate of the steepest-ascent
    direction; step with ``z - lr * conj(g)``).  With ``holomorphic=True`` the
    output and the inputs must be complex and the result is the complex derivative
    ``f'(z)``.

    >>> value_and_grad(lambda x: (x ** 2).sum())(np.ones(3, np.float32))  # doctest: +SKIP
    """
    fname = "grad"

    @api_boundary
    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        single, nums = _check_argnums(fun, argnums, len(args), fname)
        for i in nums:
            for path, leaf in tree_util.tree_flatten_with_path(args[i])[0]:
                dt = get_aval(leaf).dtype
                if holomorphic and not dtypes.is_complex(dt):
                    raise GradientError(
                        f"grad({_name(fun)}, holomorphic=True): argument "
                        f"{i}{tree_util.keystr(path)} has dtype {dt}; holomorphic "
                        "differentiation needs complex inputs (convert with "
                        ".astype(np.complex64))")
                if not dtypes.is_inexact(dt) and not allow_int:
                    raise GradientError(
                        f"grad({_name(fun)}): argument {i}{tree_util.keystr(path)} has dtype "
                        f"{dt}; grad requires floating-point inputs. Convert it with "
                        ".astype(np.float32), exclude it with argnums, or pass allow_int=True "
                        "(its gradient is then a float0 zero)")

        def f_of_diff(*diff_args):
            full = list(args)
            for i, a in zip(nums, diff_args):
                full[i] = a
            return fun(*full, **kwargs)

        res = vjp(f_of_diff, *[args[i] for i in nums], has_aux=has_aux)
        out, f_vjp = res[0], res[1]
        leaves = tree_util.tree_leaves(out)
        if len(leaves) != 1 or np.shape(leaves[0]) != ():
            shapes = [np.shape(x) for x in leaves]
            raise GradientError(f"grad({_name(fun)}): the function must return a scalar "
                                f"(shape ()), it returned shape(s) {shapes}; reduce it (e.g. "
                                ".sum()) or use vjp/jacrev for non-scalar outputs")
        dt = get_aval(leaves[0]).dtype
        if holomorphic and not dtypes.is_complex(dt):
            raise GradientError(f"grad({_name(fun)}, holomorphic=True): the output has dtype "
                                f"{dt}; a holomorphic function returns a complex value")
        if not holomorphic and not dtypes.is_float(dt):
            hint = (" (for a complex output pass holomorphic=True, or differentiate a real "
                    "part: snp.real(f(z)) or snp.abs(f(z)))" if dtypes.is_complex(dt) else "")
            raise GradientError(f"grad({_name(fun)}): the output has dtype {dt}; grad needs a "
                                "real floating-point output" + hint)
        g = f_vjp(full((), 1.0, dt))
        g = g[0] if single else g
        if has_aux:
            return (out, res[2]), g
        return out, g

    return wrapped


def grad(fun: Callable, argnums=0, has_aux: bool = False, allow_int: bool = False,
         holomorphic: bool = False):
    """The gradient of a scalar-valued ``fun`` w.r.t. ``args[argnums]`` (``allow_int``,
    ``holomorphic`` and complex inputs: see :func:`value_and_grad`).

    >>> grad(lambda x: (x * x).sum())(np.array([1.0, 2.0], np.float32))
    Array([2., 4.], dtype=float32)
    """
    vg = value_and_grad(fun, argnums, has_aux, allow_int, holomorphic)

    @api_boundary
    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        (out, g) = vg(*args, **kwargs)
        return (g, out[1]) if has_aux else g

    return wrapped


def _basis(x):
    """The standard basis of ``x``'s space, shaped ``(size, *x.shape)`` (a constant)."""
    av = get_aval(x)
    n = int(np.prod(av.shape))
    return np.eye(n, dtype=av.dtype).reshape((n,) + av.shape)


def _with_args(fun, args, nums):
    def f_diff(*d):
        full = list(args)
        for i, a in zip(nums, d):
            full[i] = a
        return fun(*full)

    return f_diff


def jacfwd(fun: Callable, argnums=0, has_aux: bool = False, holomorphic: bool = False):
    """Jacobian by forward mode: one vmapped jvp per input leaf over its basis.

    The result has the output's structure; each leaf has shape ``out.shape + in.shape``.
    Complex inputs need ``holomorphic=True`` (as in JAX): the result is then ``f'(z)``.
    """
    @api_boundary
    def jac(*args):
        single, nums = _check_argnums(fun, argnums, len(args), "jacfwd")
        diff = tuple(args[i] for i in nums)
        _check_holomorphic(fun, "jacfwd", "input", tree_util.tree_leaves(diff), holomorphic)
        f_diff = _with_args(fun, args, nums)
        leaves, tree = tree_util.tree_flatten(diff)
        per_input = []
        for i, x in enumerate(leaves):
            def push(t, i=i):
                ts = [t if j == i else np.zeros(np.shape(l), get_aval(l).dtype)
                      for j, l in enumerate(leaves)]
                return jvp(f_diff, diff, tree_util.tree_unflatten(tree, ts))[1]

            outs = vmap(push)(_basis(x))  # leaves: (k, *out_shape)

            def fix(o, x=x):
                nd = len(np.shape(o)) - 1
                moved = transpose(o, tuple(range(1, nd + 1)) + (0,))
                return reshape(moved, np.shape(o)[1:] + np.shape(x))

            per_input.append(tree_util.tree_map(fix, outs))
        return _assemble(per_input, tree, single)

    return jac


def jacrev(fun: Callable, argnums=0, has_aux: bool = False, holomorphic: bool = False):
    """Jacobian by reverse mode: one vmapped vjp per output leaf over its basis.

    Complex outputs need ``holomorphic=True`` (as in JAX): the result is then ``f'(z)``.
    """
    @api_boundary
    def jac(*args):
        single, nums = _check_argnums(fun, argnums, len(args), "jacrev")
        diff = tuple(args[i] for i in nums)
        if holomorphic:
            _check_holomorphic(fun, "jacrev", "input", tree_util.tree_leaves(diff), True)
        out, f_vjp = vjp(_with_args(fun, args, nums), *diff)
        out_leaves, out_tree = tree_util.tree_flatten(out)
        _check_holomorphic(fun, "jacrev", "output", out_leaves, holomorphic)
        in_leaves, in_tree = tree_util.tree_flatten(diff)
        per_output = []
        for j, o in enumerate(out_leaves):
            def pull(c, j=j):
                cts = [c if k == j else np.zeros(np.shape(l), get_aval(l).dtype)
                       for k, l in enumerate(out_leaves)]
                return tree_util.tree_leaves(f_vjp(tree_util.tree_unflatten(out_tree, cts)))

            g = vmap(pull)(_basis(o))  # each: (k_out, *in_shape)
            parts = [reshape(gl, np.shape(o) + np.shape(x)) for gl, x in zip(g, in_leaves)]
            t = tree_util.tree_unflatten(in_tree, parts)
            per_output.append(t[0] if single else t)
        return tree_util.tree_unflatten(out_tree, per_output)

    return jac


def _check_holomorphic(fun, fname, what, leaves, holomorphic):
    """JAX's rule: complex values in a Jacobian need ``holomorphic=True``, which in
    turn needs every one of them complex (a real-to-complex map has no f'(z))."""
    for k, leaf in enumerate(leaves):
        dt = get_aval(leaf).dtype
        if holomorphic and not dtypes.is_complex(dt):
            raise GradientError(f"{fname}({_name(fun)}, holomorphic=True): {what} {k} has "
                                f"dtype {dt}; holomorphic Jacobians need complex {what}s")
        if not holomorphic and dtypes.is_complex(dt):
            raise GradientError(f"{fname}({_name(fun)}): {what} {k} has complex dtype {dt}; "
                                "pass holomorphic=True for a holomorphic function, or split "
                                "it into real and imaginary parts")


def _assemble(per_input, in_tree, single):
    """Regroup per-input-leaf Jacobians into output-structure -> input-structure."""
    out_tree = tree_util.tree_structure(per_input[0])
    per_in_leaves = [tree_util.tree_leaves(p) for p in per_input]
    result = []
    for k in range(out_tree.num_leaves):
        t = tree_util.tree_unflatten(in_tree, [p[k] for p in per_in_leaves])
        result.append(t[0] if single else t)
    return tree_util.tree_unflatten(out_tree, result)


def hessian(fun: Callable, argnums=0, holomorphic: bool = False):
    """``jacfwd(jacrev(fun))`` (``holomorphic``: as for :func:`jacfwd`)."""
    return jacfwd(jacrev(fun, argnums, holomorphic=holomorphic), argnums,
                  holomorphic=holomorphic)

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()

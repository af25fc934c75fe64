"""User-defined derivative rules: ``custom_jvp`` and ``custom_vjp`` (JEP 2026 / 4008).

Each is a higher-order primitive whose parameter is the traced function; its
jvp rule calls the user's rule instead of differentiating the body.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from spmd import tree_util
from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import Zero, instantiate, is_undefined
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.ir import ClosedProgram
from spmd.compiler.core.jit import executable_for, flatten_outputs
from spmd.compiler.core.program_vma import call_types, call_vma
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.array import Array
from spmd.compiler.core.trace import (Tracer, bind, eval_program, get_aval, hoist_traced_consts,
                                 trace_to_program)
from spmd.errors import SpmdError
from spmd.compiler.transforms.array_ops import OPS
from spmd.compiler.transforms.batching import batch_flat, broadcast_batch, vmap_at_level


class CustomRuleError(SpmdError, TypeError):
    """A custom_jvp/custom_vjp rule is missing or returns the wrong structure."""


class CustomRuleVaryingError(CustomRuleError, ValueError):
    """A custom rule's (co)tangent varies over other mesh axes than its primal."""


def _trace(fun, leaves, tree, what):
    box: list = []

    def flat(*xs):
        outs, out_tree = flatten_outputs(fun(*tree_util.tree_unflatten(tree, xs)), what)
        box.append(out_tree)
        return outs

    closed, hoisted = hoist_traced_consts(trace_to_program(flat, [get_aval(x) for x in leaves]))
    return closed, box[0], hoisted


def _split_closure(primals, tangents, num_consts, kind):
    """The explicit arguments' primals and tangents, after checking that no value the
    function closed over (the first ``num_consts`` operands) is being differentiated:
    the user's rule says nothing about them, so their derivative would silently be
    zero (JAX raises the same error)."""
    for t in tangents[:num_consts]:
        if not isinstance(t, Zero) and dtypes.is_inexact(get_aval(t).dtype):
            raise CustomRuleError(
                f"differentiation of a {kind} function with respect to a value it closes "
                f"over: the {kind} rule only says how to differentiate with respect to the "
                "function's explicit arguments. Pass the closed-over value to the function "
                "as an argument (and handle it in the rule)")
    return primals[num_consts:], tangents[num_consts:]


def _impl(xp, *args, program, **_):
    return executable_for(program, xp)(*args)


def _batch_via_vmap(prim, wrap_params):
    """Batch rule: move every batch axis to 0 and map the body and the rules, at a
    level named like this one (collectives inside keep seeing its axes)."""
    def rule(args, dims, *, program, _axis_data, **params):
        level, size = _axis_data
        args = [broadcast_batch(a, d, size) for a, d in zip(args, dims)]
        n_out = len(program.out_avals)
        closed = trace_to_program(
            lambda *a: batch_flat(lambda *b: eval_program(program, *b), a, [0] * len(a), size,
                                  level, [0] * n_out),
            [get_aval(a) for a in args])
        new_params = wrap_params(params, level, size)
        outs = bind(prim, *args, program=closed, **new_params)
        return outs, [0] * len(outs)

    prim.def_batch(rule)
    prim.def_vma(call_vma)
    prim.rules.manual_types = call_types
    prim.rules.batch_needs_axis = True


# --------------------------------------------------------------- custom_jvp

class SymbolicZero:
    """A zero tangent passed to (or returned by) a ``custom_jvp`` rule defined with
    ``symbolic_zeros=True``: it has the tangent's ``shape`` and ``dtype`` but no data.

    >>> SymbolicZero(ShapedArray((2,), np.float32)).shape
    (2,)
    """

    __slots__ = ("aval",)

    def __init__(self, aval: ShapedArray):
        self.aval = aval

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: self.aval.ndim)

    def instantiate(self):
        """A real zero array of this tangent's type."""
        return instantiate(Zero(self.aval))

    def __repr__(self):
        return f"SymbolicZero({self.aval.str_short()})"


def zero_from_primal(x, symbolic_zeros: bool = True):
    """The zero tangent of the primal ``x`` (a :class:`SymbolicZero`, or zeros)."""
    z = SymbolicZero(tangent_aval(get_aval(x)))
    return z if symbolic_zeros else z.instantiate()


class CustomVJPPrimal:
    """What the ``fwd`` of a ``custom_vjp`` defined with ``symbolic_zeros=True``
    receives for each argument leaf: its ``value`` and whether it is ``perturbed``
    (differentiated; when False its cotangent is not needed and may be None).

    >>> p = CustomVJPPrimal(np.float32(2.0), False)
    >>> p.value, p.perturbed
    (2.0, False)
    """

    __slots__ = ("value", "perturbed")

    def __init__(self, value, perturbed: bool):
        self.value = value
        self.perturbed = bool(perturbed)

    def __repr__(self):
        return f"CustomVJPPrimal(value={self.value!r}, perturbed={self.perturbed})"



custom_jvp_call_p = Primitive("custom_jvp_call", traits=(), multiple_results=True,
                              higher_order=True)
custom_jvp_call_p.def_impl(_impl)
custom_jvp_call_p.def_abstract_eval(lambda *avals, program, jvp, **_: program.out_avals)
# Operands: the values the function closed over (``num_consts``), then its arguments.
custom_jvp_call_p.rules.inline = None  # kept as one equation until differentiated


@custom_jvp_call_p.def_jvp
def _custom_jvp_rule(primals, tangents, *, program, jvp, in_tree, out_tree, num_consts,
                     symbolic_zeros=False):
    primals, tangents = _split_closure(primals, tangents, num_consts, "custom_jvp")
    if symbolic_zeros:  # the rule sees which tangents are zero (SymbolicZero)
        tangents = [SymbolicZero(t.aval) if isinstance(t, Zero) else t for t in tangents]
    else:
        tangents = [_rule_tangent(t) for t in tangents]
    p_tree = tree_util.tree_unflatten(in_tree, primals)
    t_tree = tree_util.tree_unflatten(in_tree, tangents)
    res = jvp(tuple(p_tree), tuple(t_tree))
    if not (isinstance(res, (tuple, list)) and len(res) == 2):
        raise CustomRuleError("custom_jvp rule must return a pair (primal_out, tangent_out)")
    out_p, tree_p = tree_util.tree_flatten(res[0])
    out_t, tree_t = tree_util.tree_flatten(res[1])
    if tree_p != out_tree or tree_t != out_tree:
        raise CustomRuleError(f"custom_jvp rule returned structures {tree_p} and {tree_t}; the "
                              f"function returns {out_tree}")
    rule = f"custom_jvp rule {_rule_name(jvp)}"
    checked = []
    for i, (p, t, aval) in enumerate(zip(out_p, out_t, program.out_avals)):
        got = get_aval(p)
        if got.shape != aval.shape or got.dtype != aval.dtype:
            raise CustomRuleError(
                f"{rule} returned a primal output of type {got.str_short()} at output {i}; "
                f"the function returns {aval.str_short()} there")
        checked.append(_checked_tangent(t, got, f"output {i}", rule))
    return out_p, checked


def _jvp_batch_params(params, level, size):
    return {**params, "jvp": vmap_at_level(params["jvp"], level, size)}


_batch_via_vmap(custom_jvp_call_p, _jvp_batch_params)


class custom_jvp:
    """A function with a user-defined jvp rule.

    >>> @custom_jvp
    ... def f(x):
    ...     return snp.sin(x)
    >>> @f.defjvp
    ... def f_jvp(primals, tangents):
    ...     (x,), (t,) = primals, tangents
    ...     return f(x), snp.cos(x) * t
    """

    def __init__(self, fun: Callable, nondiff_argnums: tuple = ()):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.jvp = None
        self.symbolic_zeros = False

    def defjvp(self, jvp: Callable, symbolic_zeros: bool = False) -> Callable:
        """Set the rule ``jvp(primals, tangents) -> (primal_out, tangent_out)``.  With
        ``symbolic_zeros=True`` the tangents of unperturbed inputs arrive as
        :class:`SymbolicZero` (skip their work), and the rule may return one for an
        output whose tangent is zero."""
        self.jvp = jvp
        self.symbolic_zeros = bool(symbolic_zeros)
        return jvp

    def defjvps(self, *jvps: Callable | None) -> None:
        """One rule per argument: ``jvps[i](tangent_i, primal_out, *primals)`` gives
        argument ``i``'s contribution to the output tangent (None: no contribution).

        >>> f.defjvps(lambda t, ans, x, y: t * y, lambda t, ans, x, y: t * x)  # doctest: +SKIP
        """
        if self.nondiff_argnums:
            raise CustomRuleError(f"custom_jvp function {self.__name__}: defjvps cannot be "
                                  "used with nondiff_argnums; use defjvp")

        def jvp(primals, tangents):
            if len(jvps) != len(primals):
                raise CustomRuleError(
                    f"custom_jvp function {self.__name__} was given {len(jvps)} rule(s) by "
                    f"defjvps but called with {len(primals)} argument(s); give one rule (or "
                    "None) per argument")
            out = self(*primals)
            total = None
            for rule, t in zip(jvps, tangents):
                if rule is None or isinstance(t, SymbolicZero):
                    continue
                part = rule(t, out, *primals)
                total = part if total is None else tree_util.tree_map(
                    lambda a, b: a + b, total, part)
            if total is None:
                total = tree_util.tree_map(lambda o: SymbolicZero(tangent_aval(get_aval(o))),
                                           out)
            return out, total

        self.defjvp(jvp, symbolic_zeros=True)

    def __call__(self, *args):
        if self.jvp is None:
            raise CustomRuleError(f"custom_jvp function {self.__name__} has no jvp rule; "
                                  "define one with @f.defjvp")
        nd = self.nondiff_argnums
        static = [args[i] for i in nd]
        dyn = tuple(a for i, a in enumerate(args) if i not in nd)

        def fun(*d):
            full, it = [], iter(d)
            for i in range(len(args)):
                full.append(args[i] if i in nd else next(it))
            return self.fun(*full)

        jvp = functools.partial(self.jvp, *static) if nd else self.jvp
        leaves, in_tree = tree_util.tree_flatten(dyn)
        closed, out_tree, hoisted = _trace(lambda *a: fun(*a), leaves, in_tree, self.__name__)
        outs = bind(custom_jvp_call_p, *hoisted, *leaves, program=closed, jvp=jvp,
                    in_tree=in_tree, out_tree=out_tree, num_consts=len(hoisted),
                    symbolic_zeros=self.symbolic_zeros)
        return tree_util.tree_unflatten(out_tree, outs)


# --------------------------------------------------------------- custom_vjp

custom_vjp_call_p = Primitive("custom_vjp_call", traits=(), multiple_results=True,
                              higher_order=True)
custom_vjp_call_p.def_impl(_impl)
custom_vjp_call_p.def_abstract_eval(lambda *avals, program, **_: program.out_avals)

# The linear stand-in a custom_vjp leaves in a linearized program: its
# transpose is the user's bwd.  It cannot run forward (as in JAX).
custom_lin_p = Primitive("custom_lin", traits=(), multiple_results=True, linear=True)


@custom_lin_p.def_impl
def _custom_lin_impl(xp, *args, **params):
    raise CustomRuleError("forward-mode differentiation (jvp/linearize) of a custom_vjp "
                          "function is not supported; use custom_jvp, or reverse mode")


custom_lin_p.def_abstract_eval(lambda *avals, out_avals, **_: list(out_avals))
# The tangents have the types of the outputs they belong to.
custom_lin_p.def_vma(lambda *avals, out_avals, **_: [a.vma for a in out_avals])
custom_lin_p.rules.manual_types = lambda *avals, out_avals, **_: [
    (a.unreduced, a.reduced) for a in out_avals]


@custom_lin_p.def_transpose
def _custom_lin_transpose(cts, *args, num_res, bwd, in_tree, res_tree, out_tree, out_avals,
                          in_avals, tangent_pos, symbolic_zeros=False):
    res = tree_util.tree_unflatten(res_tree, list(args[:num_res]))
    # With symbolic_zeros the rule sees which output cotangents are zero (as in JAX).
    cts = [(SymbolicZero(c.aval) if symbolic_zeros else instantiate(c))
           if isinstance(c, Zero) else c for c in cts]
    ct_tree = tree_util.tree_unflatten(out_tree, cts)
    got = bwd(res, ct_tree)
    if not isinstance(got, (tuple, list)):
        raise CustomRuleError(f"custom_vjp bwd must return a tuple with one cotangent per "
                              f"differentiable argument, got {type(got).__name__}")
    n_args = in_tree.num_children
    if len(got) != n_args:
        raise CustomRuleError(f"custom_vjp bwd returned {len(got)} cotangents for {n_args} "
                              "arguments")
    cts_in = []
    avals = iter(in_avals)
    for pos, (g, sub) in enumerate(zip(got, in_tree.children())):
        arg_avals = [next(avals) for _ in range(sub.num_leaves)]
        cts_in.extend(_argument_cotangents(g, sub, arg_avals, pos, bwd))
    return [None] * num_res + [cts_in[i] for i in tangent_pos]


def _argument_cotangents(g, sub, arg_avals: list, pos: int, bwd) -> list:
    """The flat cotangents of argument ``pos`` (structure ``sub``) from ``bwd``'s ``g``.

    As in JAX, ``None`` stands for a zero cotangent of any subtree of the argument
    (``{"a": None, "b": g_b}`` for a dict argument), not only of the whole argument.
    """
    # None is a leaf of g here, so g's structure must be a prefix of the argument's.
    paths_leaves, g_tree = tree_util.tree_flatten_with_path(g, is_leaf=lambda x: x is None)
    try:
        covered = g_tree.flatten_up_to(tree_util.tree_unflatten(sub, arg_avals))
    except ValueError:
        covered = None
    if covered is None or any(leaf is not None and not isinstance(part, ShapedArray)
                              for (_, leaf), part in zip(paths_leaves, covered)):
        raise CustomRuleError(
            f"custom_vjp bwd {_rule_name(bwd)} returned a cotangent for argument {pos} "
            f"with structure {tree_util.tree_structure(g)}; the argument has structure "
            f"{sub}. Return one cotangent per argument, shaped like the argument (None for "
            "a zero, of the whole argument or of any subtree of it)")
    out = []
    for (path, leaf), part in zip(paths_leaves, covered):
        where = f"args[{pos}]{tree_util.keystr(path)}"
        if leaf is None:  # a zero for every leaf of the subtree it stands in for
            out.extend(Zero(tangent_aval(a)) for a in tree_util.tree_leaves(part))
        else:
            out.append(_checked_cotangent(leaf, part, where, bwd))
    return out


def _rule_name(fn) -> str:
    fn = getattr(fn, "func", fn)  # a functools.partial (nondiff_argnums)
    return getattr(fn, "__name__", None) or type(fn).__name__


def _checked_cotangent(ct, aval, where: str, bwd):
    return _checked_tangent(ct, aval, where, f"custom_vjp bwd {_rule_name(bwd)}", "cotangent")


def _checked_tangent(ct, aval, where: str, rule: str, kind: str = "tangent"):
    """``ct`` as the (co)tangent of a value of type ``aval``, or an error naming
    the value: a (co)tangent of another shape or dtype would silently corrupt every
    derivative downstream of it (JAX checks the same)."""
    want = tangent_aval(aval)
    if ct is None or isinstance(ct, (Zero, SymbolicZero)):
        return Zero(want)
    if isinstance(ct, np.ndarray) and ct.dtype == dtypes.float0:
        got = ShapedArray(ct.shape, dtypes.float0)
    else:
        got = get_aval(ct)
    if want.dtype == dtypes.float0:
        # No derivative flows through integer or boolean values: any zero-like value
        # of the right shape stands for "none" (float0, or zeros of the value's dtype).
        if got.shape == want.shape:
            return Zero(want)
    elif got.shape == want.shape and (got.dtype == want.dtype or got.weak_type):
        if isinstance(ct, Tracer) and want.vma - got.vma:
            _varying_mismatch(got, want, where, rule, kind)
        if got.dtype != want.dtype or got.weak_type or not isinstance(ct, (Tracer, Array)):
            # A Python scalar, numpy value or weakly typed value: an array of the type.
            ct = OPS.convert(ct, want.dtype, False)
        return ct
    raise CustomRuleError(
        f"{rule} returned a {kind} of type {got.str_short()} for {where}, whose primal has "
        f"type {aval.str_short()}: the {kind} must have type {want.str_short()} (the "
        "primal's shape, and its dtype for floating values). Fix the rule's output there "
        "(reduce any broadcast dimensions, cast the dtype)")


def _varying_mismatch(got, want, where, rule, kind):
    """Inside shard_map a (co)tangent invariant along mesh axes its primal varies along
    is refused, as JAX does: it would serve as every device's own value there, and it
    usually means a collective too many in the rule (a ``psum`` of an invariant value
    multiplies it by the axis size).  (One varying along more axes than its primal is
    summed over them: see docs/jax_differences.md.)"""
    fewer = tuple(sorted(want.vma - got.vma))
    raise CustomRuleVaryingError(
        f"{rule} returned a {kind} for {where} that varies over mesh axes "
        f"{sorted(got.vma)}, whose primal varies over {sorted(want.vma)}, which doesn't "
        f"match expected type {want.str_short()}. If the value is right as it is on "
        f"every device, apply lax.pcast(..., {fewer!r}, to='varying') to it; otherwise "
        "look in the rule for a psum or all_gather too many")


def _rule_tangent(t):
    """A tangent as a custom rule receives it: symbolic zeros of integer values are
    numpy float0 zeros (as in JAX); other zeros are real arrays."""
    if isinstance(t, Zero) and t.aval.dtype == dtypes.float0:
        return np.zeros(t.aval.shape, dtypes.float0)
    return instantiate(t)


@custom_lin_p.def_jvp
def _custom_lin_jvp(primals, tangents, **params):
    raise CustomRuleError("higher-order forward-mode differentiation of a custom_vjp function "
                          "is not supported")


custom_lin_p.def_batch(lambda args, dims, **p: (_ for _ in ()).throw(
    CustomRuleError("vmap of a linearized custom_vjp function is not supported; vmap the "
                    "gradient computation instead")))


@custom_vjp_call_p.def_jvp
def _custom_vjp_jvp(primals, tangents, *, program, fwd, bwd, in_tree, out_tree, num_consts,
                    symbolic_zeros=False):
    primals, tangents = _split_closure(primals, tangents, num_consts, "custom_vjp")
    args = tree_util.tree_unflatten(in_tree, primals)
    if symbolic_zeros:  # fwd learns which argument leaves are differentiated
        res = fwd(*args, perturbed=tuple(not isinstance(t, Zero) for t in tangents))
    else:
        res = fwd(*args)
    if not (isinstance(res, (tuple, list)) and len(res) == 2):
        raise CustomRuleError("custom_vjp fwd must return a pair (output, residuals)")
    out, residuals = res
    if symbolic_zeros:
        _no_primal_objects(out, residuals)
    out_leaves, tree = tree_util.tree_flatten(out)
    if tree != out_tree:
        raise CustomRuleError(f"custom_vjp fwd returned output structure {tree}; the function "
                              f"returns {out_tree}")
    res_leaves, res_tree = tree_util.tree_flatten(residuals)
    in_avals = tuple(get_aval(p) for p in primals)
    # Integer and boolean inputs have float0 tangents, which carry nothing: only the
    # floating inputs' tangents are operands of the linear stand-in.
    tangent_pos = tuple(i for i, a in enumerate(in_avals) if dtypes.is_inexact(a.dtype))
    tangents = [instantiate(tangents[i]) for i in tangent_pos]
    out_avals = tuple(tangent_aval(get_aval(o)) for o in out_leaves)
    out_t = bind(custom_lin_p, *res_leaves, *tangents, num_res=len(res_leaves), bwd=bwd,
                 in_tree=in_tree, res_tree=res_tree, out_tree=out_tree, out_avals=out_avals,
                 in_avals=in_avals, tangent_pos=tangent_pos, symbolic_zeros=symbolic_zeros)
    return out_leaves, out_t


def _no_primal_objects(out, residuals):
    for what, tree in (("output", out), ("residuals", residuals)):
        if any(isinstance(x, CustomVJPPrimal) for x in tree_util.tree_leaves(tree)):
            raise CustomRuleError(
                f"custom_vjp fwd (symbolic_zeros=True) returned a CustomVJPPrimal in its "
                f"{what}; it receives each argument as CustomVJPPrimal(value, perturbed): "
                "return x.value (or values computed from it) instead")


def _vjp_batch_params(params, level, size):
    if params.get("symbolic_zeros"):
        return {**params, "fwd": _vmap_fwd_flags(params["fwd"], level, size),
                "bwd": _vmap_with_zeros(params["bwd"], level, size)}
    return {**params, "fwd": vmap_at_level(params["fwd"], level, size),
            "bwd": vmap_at_level(params["bwd"], level, size)}


def _vmap_fwd_flags(fwd, level, size):
    """A symbolic-zeros ``fwd(*args, perturbed=...)`` mapped over axis 0 of its args."""
    def mapped(*args, perturbed):
        return vmap_at_level(functools.partial(fwd, perturbed=perturbed), level, size)(*args)
    return mapped


def _vmap_with_zeros(bwd, level, size):
    """A symbolic-zeros ``bwd`` mapped over axis 0 of its args: the SymbolicZero
    cotangents it receives stay symbolic (one example's type); those it returns become
    zeros (a mapped function returns arrays)."""
    def is_zero(x):
        return isinstance(x, SymbolicZero)

    def mapped(*args):
        leaves, tree = tree_util.tree_flatten(args, is_leaf=is_zero)
        zeros = {i: SymbolicZero(x.aval.update(shape=x.aval.shape[1:]))
                 for i, x in enumerate(leaves) if is_zero(x)}

        def inner(*arrays):
            it = iter(arrays)
            full = [zeros[i] if i in zeros else next(it) for i in range(len(leaves))]
            out = bwd(*tree_util.tree_unflatten(tree, full))
            return tree_util.tree_map(lambda x: x.instantiate() if is_zero(x) else x, out,
                                      is_leaf=is_zero)
        return vmap_at_level(inner, level, size)(
            *[x for i, x in enumerate(leaves) if i not in zeros])
    return mapped


def _primal_objects(fwd, nondiff: tuple):
    """``fwd`` called with each differentiable argument leaf as a CustomVJPPrimal
    (``symbolic_zeros=True``); ``perturbed`` has one flag per such leaf, in order."""
    def wrapped(*args, perturbed):
        flags = iter(perturbed)
        full = [a if i in nondiff else tree_util.tree_map(
            lambda x: CustomVJPPrimal(x, next(flags)), a) for i, a in enumerate(args)]
        return fwd(*full)
    return wrapped


_batch_via_vmap(custom_vjp_call_p, _vjp_batch_params)


class custom_vjp:
    """A function with user-defined forward and backward passes.

    >>> @custom_vjp
    ... def f(x):
    ...     return snp.sin(x)
    >>> f.defvjp(lambda x: (snp.sin(x), snp.cos(x)), lambda c, g: (c * g,))
    """

    def __init__(self, fun: Callable, nondiff_argnums: tuple = ()):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.fwd = self.bwd = None
        self.symbolic_zeros = False

    def defvjp(self, fwd: Callable, bwd: Callable, symbolic_zeros: bool = False,
               optimize_remat: bool = False) -> None:
        """Set ``fwd(*args) -> (out, residuals)`` and ``bwd(residuals, ct) -> cts``.

        ``optimize_remat`` is accepted and has no effect: it lets JAX recompute
        ``fwd`` inside ``checkpoint`` instead of saving its residuals, an
        optimisation that does not change any value.

        With ``symbolic_zeros=True`` (JAX's semantics) ``fwd`` receives each
        argument leaf as a :class:`CustomVJPPrimal` (``.value``, ``.perturbed``), and
        ``bwd`` receives a :class:`SymbolicZero` for each output cotangent that is
        zero; ``bwd`` may return ``None`` or a ``SymbolicZero`` for a zero cotangent.

        >>> f.defvjp(lambda x: (f(x.value), x.value), lambda r, g: (g * r,),
        ...          symbolic_zeros=True)                        # doctest: +SKIP
        """
        if not callable(fwd) or not callable(bwd):
            bad = "fwd" if not callable(fwd) else "bwd"
            raise CustomRuleError(f"custom_vjp {self.__name__}: defvjp's {bad} must be a "
                                  f"function, got {type(fwd if bad == 'fwd' else bwd).__name__}")
        self.fwd, self.bwd = fwd, bwd
        self.symbolic_zeros = bool(symbolic_zeros)
        self.optimize_remat = bool(optimize_remat)

    def __call__(self, *args):
        if self.fwd is None:
            raise CustomRuleError(f"custom_vjp function {self.__name__} has no rules; define "
                                  "them with f.defvjp(fwd, bwd)")
        nd = self.nondiff_argnums
        static = [args[i] for i in nd]
        dyn = tuple(a for i, a in enumerate(args) if i not in nd)

        def with_static(fn):
            def g(*d, **kw):
                full, it = [], iter(d)
                for i in range(len(args)):
                    full.append(args[i] if i in nd else next(it))
                return fn(*full, **kw)
            return g

        fwd = _primal_objects(self.fwd, nd) if self.symbolic_zeros else self.fwd

        bwd = functools.partial(self.bwd, *static) if nd else self.bwd
        leaves, in_tree = tree_util.tree_flatten(dyn)
        closed, out_tree, hoisted = _trace(with_static(self.fun), leaves, in_tree,
                                           self.__name__)
        outs = bind(custom_vjp_call_p, *hoisted, *leaves, program=closed,
                    fwd=with_static(fwd), bwd=bwd, in_tree=in_tree, out_tree=out_tree,
                    num_consts=len(hoisted), symbolic_zeros=self.symbolic_zeros)
        return tree_util.tree_unflatten(out_tree, outs)

"""User-defined derivative rules: ``custom_jvp`` and ``custom_vjp`` (JEP 2026 / 4008).

Each is a higher-order primitive whose parameter is the traced function; its
jvp rule calls the user's rule instead of differentiating the body.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from spmd import tree_util
from spmd.compiler.ad_util import Zero, instantiate, is_undefined
from spmd.compiler.avals import tangent_aval
from spmd.compiler.ir import ClosedProgram
from spmd.compiler.jit import call_vma, executable_for, flatten_outputs
from spmd.compiler.primitives import Primitive
from spmd.compiler.trace import bind, eval_program, get_aval, trace_to_program
from spmd.errors import SpmdError


class CustomRuleError(SpmdError, TypeError):
    """A custom_jvp/custom_vjp rule is missing or returns the wrong structure."""


def _trace(fun, leaves, tree, what):
    box: list = []

    def flat(*xs):
        outs, out_tree = flatten_outputs(fun(*tree_util.tree_unflatten(tree, xs)), what)
        box.append(out_tree)
        return outs

    closed = trace_to_program(flat, [get_aval(x) for x in leaves])
    return closed, box[0]


def _impl(xp, *args, program, **_):
    return executable_for(program, xp)(*args)


def _batch_via_vmap(prim, wrap_params):
    """Batch rule: move every batch axis to 0 and map the body and the rules, at a
    level named like this one (collectives inside keep seeing its axes)."""
    def rule(args, dims, *, program, _axis_data, **params):
        from spmd.compiler.batching import batch_flat, broadcast_batch

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
    prim.rules["batch_needs_axis"] = True


# --------------------------------------------------------------- custom_jvp

custom_jvp_call_p = Primitive("custom_jvp_call", multiple_results=True, higher_order=True)
custom_jvp_call_p.def_impl(_impl)
custom_jvp_call_p.def_abstract_eval(lambda *avals, program, jvp, **_: program.out_avals)
custom_jvp_call_p.rules["inline"] = None  # kept as one equation until differentiated


@custom_jvp_call_p.def_jvp
def _custom_jvp_rule(primals, tangents, *, program, jvp, in_tree, out_tree):
    tangents = [instantiate(t) for t in tangents]
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
    return out_p, out_t


def _jvp_batch_params(params, level, size):
    from spmd.compiler.batching import vmap_at_level

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

    def defjvp(self, jvp: Callable) -> Callable:
        self.jvp = jvp
        return jvp

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
        closed, out_tree = _trace(lambda *a: fun(*a), leaves, in_tree, self.__name__)
        outs = bind(custom_jvp_call_p, *leaves, program=closed, jvp=jvp, in_tree=in_tree,
                    out_tree=out_tree)
        return tree_util.tree_unflatten(out_tree, outs)


# --------------------------------------------------------------- custom_vjp

custom_vjp_call_p = Primitive("custom_vjp_call", multiple_results=True, higher_order=True)
custom_vjp_call_p.def_impl(_impl)
custom_vjp_call_p.def_abstract_eval(lambda *avals, program, **_: program.out_avals)

# The linear stand-in a custom_vjp leaves in a linearized program: its
# transpose is the user's bwd.  It cannot run forward (as in JAX).
custom_lin_p = Primitive("custom_lin", multiple_results=True, linear=True)


@custom_lin_p.def_impl
def _custom_lin_impl(xp, *args, **params):
    raise CustomRuleError("forward-mode differentiation (jvp/linearize) of a custom_vjp "
                          "function is not supported; use custom_jvp, or reverse mode")


custom_lin_p.def_abstract_eval(lambda *avals, out_avals, **_: list(out_avals))
# The tangents have the types of the outputs they belong to.
custom_lin_p.def_vma(lambda *avals, out_avals, **_: [a.vma for a in out_avals])


@custom_lin_p.def_transpose
def _custom_lin_transpose(cts, *args, num_res, bwd, in_tree, res_tree, out_tree, out_avals,
                          in_avals):
    res = tree_util.tree_unflatten(res_tree, list(args[:num_res]))
    cts = [instantiate(c) if isinstance(c, Zero) else c for c in cts]
    ct_tree = tree_util.tree_unflatten(out_tree, cts)
    got = bwd(res, ct_tree)
    if not isinstance(got, (tuple, list)):
        raise CustomRuleError(f"custom_vjp bwd must return a tuple with one cotangent per "
                              f"differentiable argument, got {type(got).__name__}")
    n_args = in_tree.num_children
    if len(got) != n_args:
        raise CustomRuleError(f"custom_vjp bwd returned {len(got)} cotangents for {n_args} "
                              "arguments")
    flat = []
    for g, sub in zip(got, in_tree.children()):
        if g is None:
            flat.extend([None] * sub.num_leaves)
        else:
            flat.extend(tree_util.tree_leaves(g))
    cts_in = [Zero(tangent_aval(a)) if c is None else c for c, a in zip(flat, in_avals)]
    return [None] * num_res + cts_in


@custom_lin_p.def_jvp
def _custom_lin_jvp(primals, tangents, **params):
    raise CustomRuleError("higher-order forward-mode differentiation of a custom_vjp function "
                          "is not supported")


custom_lin_p.def_batch(lambda args, dims, **p: (_ for _ in ()).throw(
    CustomRuleError("vmap of a linearized custom_vjp function is not supported; vmap the "
                    "gradient computation instead")))


@custom_vjp_call_p.def_jvp
def _custom_vjp_jvp(primals, tangents, *, program, fwd, bwd, in_tree, out_tree):
    res = fwd(*tree_util.tree_unflatten(in_tree, primals))
    if not (isinstance(res, (tuple, list)) and len(res) == 2):
        raise CustomRuleError("custom_vjp fwd must return a pair (output, residuals)")
    out, residuals = res
    out_leaves, tree = tree_util.tree_flatten(out)
    if tree != out_tree:
        raise CustomRuleError(f"custom_vjp fwd returned output structure {tree}; the function "
                              f"returns {out_tree}")
    res_leaves, res_tree = tree_util.tree_flatten(residuals)
    tangents = [instantiate(t) for t in tangents]
    out_avals = tuple(tangent_aval(get_aval(o)) for o in out_leaves)
    in_avals = tuple(get_aval(p) for p in primals)
    out_t = bind(custom_lin_p, *res_leaves, *tangents, num_res=len(res_leaves), bwd=bwd,
                 in_tree=in_tree, res_tree=res_tree, out_tree=out_tree, out_avals=out_avals,
                 in_avals=in_avals)
    return out_leaves, out_t


def _vjp_batch_params(params, level, size):
    from spmd.compiler.batching import vmap_at_level

    return {**params, "fwd": vmap_at_level(params["fwd"], level, size),
            "bwd": vmap_at_level(params["bwd"], level, size)}


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

    def defvjp(self, fwd: Callable, bwd: Callable) -> None:
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args):
        if self.fwd is None:
            raise CustomRuleError(f"custom_vjp function {self.__name__} has no rules; define "
                                  "them with f.defvjp(fwd, bwd)")
        nd = self.nondiff_argnums
        static = [args[i] for i in nd]
        dyn = tuple(a for i, a in enumerate(args) if i not in nd)

        def with_static(fn):
            def g(*d):
                full, it = [], iter(d)
                for i in range(len(args)):
                    full.append(args[i] if i in nd else next(it))
                return fn(*full)
            return g

        bwd = functools.partial(self.bwd, *static) if nd else self.bwd
        leaves, in_tree = tree_util.tree_flatten(dyn)
        closed, out_tree = _trace(with_static(self.fun), leaves, in_tree, self.__name__)
        outs = bind(custom_vjp_call_p, *leaves, program=closed, fwd=with_static(self.fwd),
                    bwd=bwd, in_tree=in_tree, out_tree=out_tree)
        return tree_util.tree_unflatten(out_tree, outs)

"""A fused elementwise kernel (:class:`spmd.compiler.engine.fusion.Kernel`) on CuPy: one
``ElementwiseKernel``, so a group is one launch instead of one per equation.

:func:`c_operation` renders the kernel's nodes as C statements over its inputs
``x0, x1, ...``: a node read twice (or read and also a result) is a local ``t0, t1,
...`` computed once, each result one assignment to an output parameter (``out``, or
``out0, out1, ...``).  The ops are CUDA's math functions, overloaded for float and
double as CuPy's own ufuncs call them; CUDA may contract ``a * b + c`` into one fused
multiply-add, so a GPU kernel's numbers can differ from the unfused ones by float
rounding.  The CuPy stand-in of ``tests/gpu`` reads this C subset and evaluates it
with numpy, so the rendering is tested without a GPU.
"""

from __future__ import annotations

import numpy as np

_BOOL = np.dtype(bool)

# The C forms of the kernel ops (CUDA's math functions, overloaded for float and
# double as CuPy's own ufuncs call them).
_C = {"add": "({0} + {1})", "subtract": "({0} - {1})", "multiply": "({0} * {1})",
      "divide": "({0} / {1})", "negative": "(-{0})", "power": "pow({0}, {1})",
      "exp": "exp({0})", "log": "log({0})", "log1p": "log1p({0})", "expm1": "expm1({0})",
      "tanh": "tanh({0})", "sqrt": "sqrt({0})", "sin": "sin({0})", "cos": "cos({0})",
      "absolute": "fabs({0})", "less": "({0} < {1})", "less_equal": "({0} <= {1})",
      "greater": "({0} > {1})", "greater_equal": "({0} >= {1})", "equal": "({0} == {1})",
      "not_equal": "({0} != {1})"}
_C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double", _BOOL: "bool"}


def out_names(kernel) -> list:
    """The CuPy kernel's output parameters: ``out``, or ``out0, out1, ...``."""
    n = len(kernel.outputs)
    return ["out"] if n == 1 else [f"out{j}" for j in range(n)]


def c_operation(kernel) -> str:
    """The kernel as C statements over inputs ``x0, x1, ...``: a shared node is a
    local ``t0, t1, ...``, each output one assignment (:func:`out_names`).

    >>> c_operation(kernel)  # doctest: +SKIP
    'out = ((x0 * ((float)2.0)) + tanh(x1))'
    """
    names = {k: f"t{n}" for n, k in enumerate(kernel.shared())}

    def arg(a) -> str:
        if a[0] == "in":
            return f"x{a[1]}"
        if a[0] == "const":
            v = a[1]
            if v.dtype == _BOOL:
                return "true" if bool(v) else "false"
            return f"(({_C_TYPES[v.dtype]}){float(v)!r})"
        return names.get(a[1]) or expr(a[1])

    def expr(k) -> str:
        op, _, params, node_args, dtype = kernel.nodes[k]
        xs = [arg(a) for a in node_args]
        t = _C_TYPES[np.dtype(dtype)]
        if op == "where":  # select_n(pred, on_false, on_true)
            return f"({xs[0]} ? {xs[2]} : {xs[1]})"
        if op == "rsqrt":  # as its impl: 1 / sqrt(x)
            return f"(({t})1 / sqrt({xs[0]}))"
        if op == "integer_pow":  # as its impl: x * x for 2, else pow
            y = params["y"]
            return f"({xs[0]} * {xs[0]})" if y == 2 else f"pow({xs[0]}, ({t}){y})"
        return _C[op].format(*xs)

    lets = [f"{_C_TYPES[np.dtype(kernel.nodes[k][4])]} {names[k]} = {expr(k)}"
            for k in names]
    outs = [f"{o} = {names.get(k) or expr(k)}" for o, k in zip(out_names(kernel),
                                                              kernel.outputs)]
    return "; ".join(lets + outs)


def elementwise_kernel(xp, kernel):
    """The kernel as one compiled ``xp.ElementwiseKernel``: ``run(*inputs)`` returns its
    results, new arrays."""
    ins = ", ".join(f"{d.name} x{i}" for i, d in enumerate(kernel.in_dtypes))
    outs = ", ".join(f"{d.name} {o}" for d, o in zip(kernel.out_dtypes, out_names(kernel)))
    name = "spmd_fused_" + format(hash(kernel) & 0xFFFFFFFF, "08x")
    compiled = xp.ElementwiseKernel(ins, outs, c_operation(kernel), name)
    shape, dtypes = kernel.shape, kernel.out_dtypes

    def run(*args):
        results = [xp.empty(shape, d) for d in dtypes]
        compiled(*args, *results)
        return results

    return run

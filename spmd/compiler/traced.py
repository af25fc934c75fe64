"""``jit(f).trace(*args)``: the traced stage of JAX's ahead-of-time API
(trace -> lower -> compile).

>>> t = spmd.jit(lambda x: x * 2).trace(spmd.ShapeDtypeStruct((3,), np.float32))
>>> t.out_info
f32[3]
>>> print(t.lower().as_text())  # doctest: +SKIP
"""

from __future__ import annotations

from spmd import tree_util


class Traced:
    """A function traced for one argument signature (values or ``ShapeDtypeStruct``).

    ``jaxpr``: the traced program (dead equations removed), ``out_info``: the
    output avals in the output's structure, ``in_avals``: the flat argument
    avals, ``lower()``: the optimised program (``.as_text()``, ``.compile()``).
    """

    def __init__(self, entry, name: str, in_avals):
        self._entry = entry
        self.fun_name = name
        self.in_avals = tuple(in_avals)

    @property
    def jaxpr(self):
        from spmd.compiler.passes import dce

        return dce(self._entry.closed)

    @property
    def out_info(self):
        return tree_util.tree_unflatten(self._entry.out_tree, list(self._entry.out_avals))

    def lower(self):
        from spmd.compiler.jit import Lowered

        return Lowered(self._entry, self.fun_name)

    def __repr__(self):
        return f"<Traced {self.fun_name}: {self.in_avals} -> {self.out_info}>"

"""The stages of JAX's ahead-of-time API for ``jit``: ``jit(f).trace(*args)`` ->
:class:`Traced` -> ``.lower()`` -> :class:`Lowered` -> ``.compile()`` -> :class:`Compiled`.

>>> t = spmd.jit(lambda x: x * 2).trace(spmd.ShapeDtypeStruct((3,), np.float32))
>>> t.out_info
f32[3]
>>> print(t.lower().as_text())  # doctest: +SKIP
"""

from __future__ import annotations

from spmd import tree_util
from spmd.compiler.core.ir import ClosedProgram
from spmd.compiler.core.trace import get_aval, to_array_value, wrap_value
from spmd.compiler.passes.pipeline import dce, lower_for_execution


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
        return dce(self._entry.closed)

    @property
    def out_info(self):
        return tree_util.tree_unflatten(self._entry.out_tree, list(self._entry.out_avals))

    def lower(self):
        return Lowered(self._entry, self.fun_name)

    def __repr__(self):
        return f"<Traced {self.fun_name}: {self.in_avals} -> {self.out_info}>"


class Lowered:
    """A traced and optimised program: ``.as_text()`` prints it."""

    def __init__(self, entry, name: str):
        self._entry = entry
        self.name = name

    @property
    def program(self) -> ClosedProgram:
        return self._entry.optimized

    def as_text(self, executed: bool = False) -> str:
        """The optimised program; ``executed=True``: the program that runs, after
        lowering for execution (``shard_map`` inlined for this backend, collectives
        combined: e.g. ``mpi[..., what='psum x7 combined (2680872 bytes)']``)."""
        return str(self._executed() if executed else self._entry.optimized)

    def _executed(self) -> ClosedProgram:
        """The program that runs (an upper layer's jit may run another: its own)."""
        return lower_for_execution(self._entry.optimized)

    def compile(self) -> "Compiled":
        return Compiled(self._entry)

    def __str__(self):
        return self.as_text()


class Compiled:
    """The generated code of a lowered program (``.source`` shows it)."""

    def __init__(self, entry):
        self._entry = entry

    @property
    def source(self) -> str:
        return self._entry.exe.source

    def as_text(self) -> str:
        return self.source

    def __call__(self, *leaves):
        avals = [get_aval(x) for x in leaves]
        outs = self._entry.exe(*[to_array_value(x, a) for x, a in zip(leaves, avals)])
        return tree_util.tree_unflatten(
            self._entry.out_tree, [wrap_value(o, a) for o, a in zip(outs, self._entry.out_avals)])

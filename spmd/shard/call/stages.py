"""The stages of JAX's ahead-of-time API for ``spmd.jit``: ``jit(f).trace(*args)`` ->
:class:`Traced` -> ``.lower()`` -> :class:`Lowered` -> ``.compile()`` -> :class:`Compiled`.

One set for every jit: a jit with shardings (its entry holds ``partitioned``, the
partitioner's result) traces to its global program and its outputs' shardings, and
lowers to the per-device program with why each inserted collective is there; a plain
jit lowers to its optimised program.

>>> t = spmd.jit(lambda x: x * 2).trace(spmd.ShapeDtypeStruct((3,), np.float32))
>>> t.out_info
f32[3]
>>> print(t.lower().as_text())  # doctest: +SKIP
"""

from __future__ import annotations

from spmd import tree_util
from spmd.compiler.core.avals import ShapeDtypeStruct
from spmd.compiler.core.ir import ClosedProgram
from spmd.compiler.core.trace import get_aval, to_array_value, wrap_value
from spmd.compiler.passes.pipeline import cse, dce, inline_calls, lower_for_execution
from spmd.errors import SpmdError
from spmd.shard.arrays.spec import NamedSharding
# (A module: it imports the partitioner, whose package imports this module.)
from spmd.shard.call import route as routing
from spmd.shard.call.spread import spread_equation


def _partitioned(entry) -> bool:
    return getattr(entry, "partitioned", None) is not None


class Traced:
    """A function traced for one argument signature (values or ``ShapeDtypeStruct``).

    ``jaxpr``: the traced program (dead equations removed; with shardings, the
    function's global program); ``out_info``: the output avals in the output's
    structure (with shardings, a ``ShapeDtypeStruct`` per output with the sharding its
    result will have); ``in_avals``: the flat argument avals; ``lower()``: the
    :class:`Lowered` program.
    """

    def __init__(self, entry, name: str, in_avals):
        self._entry = entry
        self.fun_name = name
        self.in_avals = tuple(in_avals)

    @property
    def jaxpr(self) -> ClosedProgram:
        e = self._entry
        return dce(e.traced if _partitioned(e) else e.closed)

    @property
    def out_info(self):
        e = self._entry
        if not _partitioned(e):
            return tree_util.tree_unflatten(e.out_tree, list(e.out_avals))
        outs = [ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type,
                                 sharding=NamedSharding(e.mesh, s))
                for a, s in zip(e.out_avals, e.out_specs)]
        return tree_util.tree_unflatten(e.out_tree, outs)

    def lower(self) -> "Lowered":
        return Lowered(self._entry, self.fun_name)

    def __repr__(self):
        part = " (partitioned)" if _partitioned(self._entry) else ""
        return f"<Traced {self.fun_name}{part}: {self.in_avals} -> {self.out_info}>"


class Lowered:
    """A traced and optimised program: ``.as_text()`` prints it.  With shardings it is
    the per-device program the partitioner made (``in_specs``, ``out_specs``,
    ``bytes_sent``, ``collectives()``: why each inserted collective is there)."""

    def __init__(self, entry, name: str):
        self._entry = entry
        self.name = name
        if _partitioned(entry):
            self.in_specs = entry.partitioned.in_specs
            self.out_specs = entry.partitioned.out_specs

    @property
    def program(self) -> ClosedProgram:
        if _partitioned(self._entry):
            # No constant folding: collectives (axis_index of an inserted slice) only run
            # inside the shard_map this program is the body of.
            return dce(cse(inline_calls(self._entry.partitioned.body)))
        return self._entry.optimized

    @property
    def bytes_sent(self) -> int:
        """Bytes each device sends per call (from the collectives the partitioner
        inserted; none without shardings)."""
        return sum(n.bytes_sent for n in self._notes())

    def collectives(self) -> list:
        """``(collective, reason, bytes sent)`` of each collective the partitioner inserted."""
        return [(n.collective, n.reason, n.bytes_sent) for n in self._notes()]

    def _notes(self) -> list:
        return list(self._entry.partitioned.notes) if _partitioned(self._entry) else []

    def as_text(self, executed: bool = False) -> str:
        """The program; ``executed=True`` (without shardings): the program that runs,
        after lowering for execution (``shard_map`` inlined for this backend, or over
        processes the per-process program; collectives combined: e.g.
        ``mpi[..., what='psum x7 combined (2680872 bytes)']``)."""
        e = self._entry
        if not _partitioned(e):
            return str(self._executed() if executed else e.optimized)
        head = [f"# per-device program on {e.mesh}",
                f"# in_specs:  {list(self.in_specs)}", f"# out_specs: {list(self.out_specs)}",
                f"# bytes sent per device per call: {self.bytes_sent}"]
        for n in e.partitioned.notes:
            head.append(f"# {n.collective}: needed by {n.reason} ({n.bytes_sent} bytes)")
        return "\n".join(head) + "\n" + str(self.program)

    def _executed(self) -> ClosedProgram:
        # A program holding a shard_map over processes runs, in this process, its
        # per-process program (partitioned over that shard_map's mesh).
        optimized = self._entry.optimized
        eqn = spread_equation(optimized)
        if eqn is None:
            return lower_for_execution(optimized)
        return routing.executed_program(optimized, eqn.params["mesh"],
                                        leading=self._entry.hoisted)

    def compile(self) -> "Compiled":
        if _partitioned(self._entry):
            raise SpmdError(f"jit({self.name}) with shardings: .compile() is not available; "
                            "call the jitted function, or read .as_text() for its per-device "
                            "program")
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

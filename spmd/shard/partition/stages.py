"""The ahead-of-time stages of a partitioned ``jit``: ``.trace(...)`` ->
:class:`PartitionedTraced` -> ``.lower()`` -> :class:`PartitionedLowered`.

The traced stage is the function's global program and its outputs' shapes and
shardings; the lowered stage is the per-device program the partitioner made, with
why each inserted collective is there.

>>> t = step.trace(ShapeDtypeStruct((8, 4), np.float32, sharding=s))  # doctest: +SKIP
>>> t.out_info                                                          # doctest: +SKIP
ShapeDtypeStruct(shape=(8, 4), dtype=float32, sharding=NamedSharding(...))
"""

from __future__ import annotations

from spmd import tree_util
from spmd.compiler.core.avals import ShapeDtypeStruct
from spmd.compiler.core.ir import ClosedProgram
from spmd.shard.arrays.spec import NamedSharding
from spmd.compiler.passes.pipeline import cse, dce, inline_calls


class PartitionedTraced:
    """A partitioned jit traced for one argument signature.

    ``jaxpr``: the function's global program (dead equations removed); ``out_info``:
    a ``ShapeDtypeStruct`` per output, with the sharding its result will have;
    ``in_avals``: the flat argument avals; ``lower()``: the per-device program.
    """

    def __init__(self, entry, name: str, in_avals):
        self._entry = entry
        self.fun_name = name
        self.in_avals = tuple(in_avals)

    @property
    def jaxpr(self) -> ClosedProgram:
        return dce(self._entry.traced)

    @property
    def out_info(self):
        e = self._entry
        outs = [ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type,
                                 sharding=NamedSharding(e.mesh, s))
                for a, s in zip(e.out_avals, e.out_specs)]
        return tree_util.tree_unflatten(e.out_tree, outs)

    def lower(self) -> "PartitionedLowered":
        return PartitionedLowered(self._entry)

    def __repr__(self):
        return f"<Traced {self.fun_name} (partitioned): {self.in_avals} -> {self.out_info}>"


class PartitionedLowered:
    """The per-device program of a partitioned jit, with why each collective is there."""

    def __init__(self, entry):
        self._entry = entry
        self.in_specs = entry.partitioned.in_specs
        self.out_specs = entry.partitioned.out_specs

    @property
    def program(self) -> ClosedProgram:
        # No constant folding: collectives (axis_index of an inserted slice) only run
        # inside the shard_map this program is the body of.
        return dce(cse(inline_calls(self._entry.partitioned.body)))

    @property
    def bytes_sent(self) -> int:
        """Bytes each device sends per call (from the inserted collectives)."""
        return sum(n.bytes_sent for n in self._entry.partitioned.notes)

    def collectives(self) -> list:
        return [(n.collective, n.reason, n.bytes_sent) for n in self._entry.partitioned.notes]

    def as_text(self) -> str:
        notes = self._entry.partitioned.notes
        head = [f"# per-device program on {self._entry.mesh}",
                f"# in_specs:  {list(self.in_specs)}", f"# out_specs: {list(self.out_specs)}",
                f"# bytes sent per device per call: {self.bytes_sent}"]
        for n in notes:
            head.append(f"# {n.collective}: needed by {n.reason} ({n.bytes_sent} bytes)")
        return "\n".join(head) + "\n" + str(self.program)

    def __str__(self):
        return self.as_text()

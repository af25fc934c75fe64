"""Values written straight into their slab of a flat ``concatenate`` buffer.

See :class:`FlatWrites`; the code generator (:mod:`spmd.compiler.engine.codegen`)
asks it where each value goes.
"""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.core.ir import Var
from spmd.compiler.engine.annotations import Alloc, Code, SlabCopy
from spmd.compiler.ops.slicing import concatenate_p
from spmd.compiler.ops.structural import reshape_p


class FlatWrites:
    """Operands of a ``concatenate`` of contiguous slabs written straight into its buffer.

    Combining collectives (:mod:`spmd.compiler.passes.combine`) packs the gradients
    into one flat buffer: ``concatenate(reshape(g1), reshape(g2), ...)``.  A
    hand-written step has each gradient's matmul or sum write into its slice
    of that buffer (``out=``); so does the generated code, for every operand
    ``g`` produced in this program and read only by its ``reshape``: the
    buffer is allocated before the first of them is produced, ``g``'s
    equation writes into a view of its slice (or copies into it, where its
    code cannot write into a given array), and the ``concatenate`` only copies
    the operands that were not written so (used elsewhere too, or inputs).
    The same holds for any concatenation whose operands are contiguous slabs of
    the result (every dimension before the joined one of size 1): the gradient of
    stacked layers' weights, each layer's product written into its slab.
    """

    def __init__(self, eqns, live_out, uses):
        self.views: dict = {}    # g -> (concatenate output, start, stop)
        self.copies: dict = {}   # concatenate equation -> [(operand, start, stop)] to copy
        self.alloc: dict = {}    # equation index -> concatenate outputs to allocate there
        # (Kept: spmd.compiler.passes.accumulate plans on the same maps.)
        self.producer = producer = {o: (i, e) for i, e in enumerate(eqns) for o in e.outputs}
        self.live = live = {a for a in live_out if isinstance(a, Var)}
        for e in eqns:
            if e.primitive is not concatenate_p:
                continue
            d, shape = e.params["dimension"], e.outputs[0].aval.shape
            if any(n != 1 for n in shape[:d]):
                continue
            inner = math.prod(shape[d + 1:])  # elements per index of the joined dimension
            written, copied, at, first = [], [], 0, None
            for p in e.inputs:
                size = p.aval.shape[d] * inner
                g = self._source(p, producer, uses, live)
                if g is None:
                    copied.append((p, at, at + size))
                else:
                    written.append((g, at, at + size))
                    idx = producer[g][0]
                    first = idx if first is None else min(first, idx)
                at += size
            if written:
                buf = e.outputs[0]
                for g, a, b in written:
                    self.views[g] = (buf, a, b)
                self.copies[e] = copied
                self.alloc.setdefault(first, []).append(buf)

    @staticmethod
    def _source(p, producer, uses, live):
        """The value ``g`` whose ``reshape`` is operand ``p``, when ``g`` may be
        written into the buffer."""
        if not isinstance(p, Var) or uses.get(p) != 1 or p not in producer:
            return None
        r = producer[p][1]
        if r.primitive is not reshape_p or not isinstance(r.inputs[0], Var):
            return None
        g = r.inputs[0]
        if uses.get(g) != 1 or g in live or g not in producer or g.aval.dtype != p.aval.dtype:
            return None
        made = producer[g][1]
        if len(made.outputs) != 1 or made.primitive.multiple_results or \
                made.primitive.effectful or not g.aval.ndim or "view" in made.primitive.traits:
            return None
        return g

    def write_into(self, buf, name, names) -> None:
        """Have the slabs of ``buf`` written into the existing buffer ``name`` (of its
        shape and dtype) instead of a new one (:mod:`spmd.compiler.passes.accumulate`)."""
        for bufs in self.alloc.values():
            if buf in bufs:
                bufs.remove(buf)
        names[buf] = name

    def allocate(self, i, names, gen, const) -> list:
        """The :class:`Alloc` of the flat buffers the values from equation ``i`` on
        are written into."""
        steps = []
        for buf in self.alloc.get(i, ()):
            names[buf] = next(gen)
            a = buf.aval
            shape = a.shape[0] if a.ndim == 1 else tuple(a.shape)
            steps.append(Alloc(names[buf], shape, const(np.dtype(a.dtype))))
        return steps

    @staticmethod
    def _flat(buf, name) -> str:
        return name if buf.aval.ndim == 1 else Code(f"{name}.reshape(-1)", (name,))

    def pack(self, eqn, names, atom) -> list | None:
        """For a planned ``concatenate``: the copies of the operands not written in
        place into its buffer; other equations: None."""
        copied = self.copies.get(eqn)
        if copied is None:
            return None
        out = eqn.outputs[0]
        buf = self._flat(out, names[out])
        steps = []
        for p, a, b in copied:
            src = atom(p)
            steps.append(SlabCopy(buf, a, b, src if out.aval.ndim == 1 else
                                  Code(f"xp.reshape({src}, -1)", (src,))))
        return steps

    def view(self, eqn, names) -> Code | None:
        """The code of the view ``eqn``'s result goes into, or None."""
        if len(eqn.outputs) != 1:
            return None
        hit = self.views.get(eqn.outputs[0])
        if hit is None:
            return None
        buf, a, b = hit
        return Code(f"{self._flat(buf, names[buf])}[{a}:{b}].reshape("
                    f"{tuple(eqn.outputs[0].aval.shape)!r})", (names[buf],))

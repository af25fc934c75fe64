"""Recompute cheap elementwise values where they are read again much later, instead
of keeping them in memory in between.

A training step's program is its forward pass followed by its backward pass, and
the backward reads many of the forward's intermediate values: GELU's tanh
approximation leaves ``x**2``, ``x**3``, the tanh and their sums, each as large as
the MLP's hidden activations, alive from the forward to the backward of their
layer.  When such a value is an elementwise function of values that are alive at
its late reads anyway (GELU's input is: the backward reads it too), this pass
computes it again just before its first late read and lets the forward's copy die
after its early reads.  The recomputation then usually has one reader, the
backward's elementwise chain, and :mod:`spmd.compiler.engine.fusion` computes it inside
that chain's kernel, block by block: it never takes a whole buffer.  XLA does the
same by duplicating elementwise producers into their consumers' fusions.

The results are the same bits: the same numpy functions on the same operands.

Which values, precisely (all on the top level of a program lowered for execution):

- a value is *late-read* when one of its reads comes more than :data:`GAP`
  equations after the previous read (or its definition); the reads from there on
  are its late reads;
- it is *recomputable* at a point when it is made by an elementwise equation (one
  that may join a kernel: ``rules.kernel_op``) whose operands are, at that
  point, alive anyway (their last read is later; program inputs and constants
  always are) or recomputable in turn, within :data:`MAX_CHAIN` equations;
- the late-read values recomputable at each of their late reads are recomputed:
  once before the first for the readers outside kernels, and once for each reader
  that joins a kernel; the others are kept as before.

``spmd.config.recompute_elementwise`` (``SPMD_RECOMPUTE_ELEMENTWISE=0``) turns it
off.  Measured on the transformer example's step
(``docs/history/2026-12-05-engine-rounds.md``, "The engine, third round").

>>> lowered = recompute_elementwise(lowered)  # doctest: +SKIP
"""

from __future__ import annotations

import math

from spmd.compiler.engine.fusion import OP_NS, _kernel_op
from spmd.compiler.core.ir import ClosedProgram, Eqn, Program, Var

# A read this many equations after the previous one (or the definition) is late.
GAP = 32
# Values smaller than this (elements) are left alone: the memory they hold is small.
MIN_ELEMENTS = 1 << 16
# At most this many equations are recomputed for one late-read value.
MAX_CHAIN = 12


# With ``views=True``, values smaller than this (a layer norm's row statistics) count
# as alive wherever they are defined: keeping them longer costs little.
SMALL_ELEMENTS = 1 << 14
# With ``views``, the equations recomputed besides elementwise ones (by their traits).
_VIEWS = frozenset(("broadcast", "same_order"))


def _eligible(eqn, views: bool = False) -> bool:
    if views and not _VIEWS.isdisjoint(eqn.primitive.traits) and \
            len(eqn.outputs) == 1:
        return True
    return _kernel_op(eqn, 0) is not None and not eqn.primitive.rules.never_recompute


def recompute_elementwise(closed: ClosedProgram, views: bool = False) -> ClosedProgram:
    """``closed`` with late-read elementwise values recomputed at their late reads
    (see the module docstring).  With ``views`` (when row kernels compute the late
    readers: :mod:`spmd.compiler.engine.rows`), broadcasts and reshapes are recomputed too,
    and small values are kept alive for it: a layer norm's backward then recomputes
    ``x - mean`` from ``x`` and the row means inside its loop instead of reading a
    saved copy (memory, not arithmetic, is what such a loop costs)."""
    program = closed.program
    plan = _Recomputation(program, views)
    split = plan.late_splits()
    if not split:
        return closed
    dropped = plan.settle(split)
    if not dropped:
        return closed
    out = plan.rewrite(split, dropped)
    # The forward's copies read only late are now dead: the caller removes them (dce).
    return ClosedProgram(Program(program.in_vars, out, program.out_atoms), closed.consts)


class _Recomputation:
    """Where each eligible value of a program is read, and which of them can be
    recomputed at their late reads."""

    def __init__(self, program: Program, views: bool):
        self.eqns, self.views = eqns, views = program.eqns, views
        self.producer: dict = {}  # eligible value -> index of its equation
        self.reads: dict = {}     # value -> indices of the equations reading it
        for i, e in enumerate(eqns):
            for a in e.inputs:
                if isinstance(a, Var):
                    self.reads.setdefault(a, []).append(i)
            if _eligible(e, views):
                self.producer[e.outputs[0]] = i
        self.outputs = {a for a in program.out_atoms if isinstance(a, Var)}
        self.last = {v: r[-1] for v, r in self.reads.items()}
        self.last.update((v, len(eqns)) for v in self.outputs)  # alive to the end
        self.defined = {o for e in eqns for o in e.outputs}

    def late_splits(self) -> dict:
        """``{value: index of its first late read}`` of the large eligible values."""
        split = {}
        for v, i in self.producer.items():
            if v in self.outputs or v not in self.reads or \
                    math.prod(v.aval.shape) < MIN_ELEMENTS:
                continue
            prev = i
            for r in self.reads[v]:
                if r - prev > GAP:
                    split[v] = r
                    break
                prev = r
        return split

    def alive(self, a, at, dropped) -> bool:
        """``a`` is in memory at equation ``at`` without this pass's help (literals,
        program inputs and constants always are)."""
        if not isinstance(a, Var) or a not in self.defined:
            return True
        if self.views and math.prod(a.aval.shape) < SMALL_ELEMENTS:
            return True
        # With views, a value read up to GAP equations before is kept that much longer
        # (a layer norm's x - mean, read by its backward just before 2 (x - mean)).
        return a not in dropped and self.last.get(a, -1) >= at - (GAP if self.views else 0)

    def chain(self, v, at, dropped, budget) -> int | None:
        """How many equations recompute ``v`` at ``at`` (None: it cannot be)."""
        if v not in self.producer or _kernel_op(self.eqns[self.producer[v]], 0) in OP_NS:
            return None
        count = 1
        for a in self.eqns[self.producer[v]].inputs:
            if self.alive(a, at, dropped):
                continue
            k = self.chain(a, at, dropped, budget - count)
            if k is None:
                return None
            count += k
            if count > budget:
                return None
        return count

    def settle(self, split) -> set:
        """The values of ``split`` dropped: each late read can recompute them."""
        # Every late read needs its recomputation there (a reader joining a kernel gets
        # its own), so each is checked: an operand alive at the first may be dead later.
        late_reads = {v: sorted({r for r in self.reads[v] if r >= split[v]}) for v in split}
        dropped = set(split)
        changed = True
        while changed:  # dropping fewer values only keeps more alive: this settles
            changed = False
            # In program order: which values stay dropped can depend on the order they
            # are checked in (two that each need the other), and every process must make
            # the same program (a set's order follows the values' ids, which differ by
            # process).
            for v in sorted(dropped, key=self.producer.__getitem__):
                if any(self.chain(v, r, dropped, MAX_CHAIN) is None for r in late_reads[v]):
                    dropped.discard(v)
                    changed = True
        return dropped

    def rewrite(self, split, dropped) -> list:
        """The equations, each late read of a dropped value reading its recomputation."""
        out: list = []
        shared: dict = {}

        def ensure(v, at, private):
            """A recomputation of ``v`` at ``at``: its own for a reader that joins a
            kernel (which then computes it inside, with no buffer of its own), else one
            shared by the other late readers."""
            if not private and v in shared:
                return shared[v]
            e = self.eqns[self.producer[v]]
            # The operands recomputed here have one reader, this equation: a kernel's.
            ins = [a if self.alive(a, at, dropped) else ensure(a, at, True)
                   for a in e.inputs]
            new = Var(v.aval)
            out.append(Eqn(e.primitive, ins, [new], e.params, e.source_info))
            if not private:
                shared[v] = new
            return new

        for i, e in enumerate(self.eqns):
            late = [k for k, a in enumerate(e.inputs)
                    if isinstance(a, Var) and a in dropped and i >= split[a]]
            if late:
                private = _eligible(e, self.views)
                ins = list(e.inputs)
                for k in late:
                    ins[k] = ensure(ins[k], i, private)
                e = Eqn(e.primitive, ins, e.outputs, e.params, e.source_info)
            out.append(e)
        return out

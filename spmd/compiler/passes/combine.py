"""Collective combining: independent all-reduces become one, over a flat buffer.

A data-parallel step all-reduces every gradient separately (one ``psum`` or
``pmean`` per parameter, plus the loss).  Each call pays a fixed cost and a
synchronisation of all ranks; one call over all the gradients pays it once.
This pass finds, in a program lowered for execution, collectives that

- a primitive declares combinable (``rules.combine_key(eqn)`` returns a
  key; equal keys and equal dtypes may be combined: e.g. the ``mpi``
  primitive's all-reduces over the same ranks with the same operation),
- do not depend on one another's results, and
- have no other effectful equation (another collective) between them,

and replaces each such group by: every operand flattened and concatenated into
one buffer, one collective over it, and each result sliced back out and
reshaped.  The combined equation's parameters come from the primitive's
``rules.combine_params(eqns, nbytes)`` (the ``mpi`` primitive names the
members and the bytes in its ``what``, so the printed program shows them).
Equations that read a member's result and sat between members move after the
combined collective; nothing else moves, so collectives keep their relative
order.  Every process must decide alike, or ranks would all-reduce buffers of
different sizes: the decisions depend only on the sequence of effectful
equations and the data dependences between them, which the backends keep the
same on every process (a member of a ``ppermute`` without partners still issues
its empty exchange, see ``ProcessGroup.ppermute``).  A group is
closed before it would exceed ``bucket_bytes``, as PyTorch DDP's buckets and
XLA's all-reduce combiner do.

Example (two gradients over the same ranks)::

    b = mpi[kind='allreduce', ranks=(0, 1), op='sum', what='psum'] a
    d = mpi[kind='allreduce', ranks=(0, 1), op='sum', what='psum'] c

becomes::

    e = reshape a;  f = reshape c;  g = concatenate e f
    h = mpi[kind='allreduce', ..., what='psum x2 combined (1024 bytes)'] g
    b = reshape (slice h);  d = reshape (slice h)
"""

from __future__ import annotations

import math

from spmd.compiler.core.ir import ClosedProgram, Eqn, Program, Var
from spmd.compiler.ops.slicing import concatenate_p, slice_p
from spmd.compiler.ops.structural import reshape_p

# The largest combined buffer (bytes): PyTorch DDP's default bucket is 25 MiB;
# above 16 MiB the mpi backend runs reduce-scatter + all-gather, which is the
# faster algorithm there anyway.
DEFAULT_BUCKET_BYTES = 32 * 1024 * 1024


def combine_collectives(closed: ClosedProgram, bucket_bytes: int = DEFAULT_BUCKET_BYTES
                        ) -> ClosedProgram:
    """Combine independent collectives with equal keys into one per bucket.

    ``bucket_bytes <= 0`` disables the pass.  Example::

        combined = combine_collectives(lowered_program, bucket_bytes=25 << 20)
    """
    program = closed.program
    if bucket_bytes <= 0 or sum(_key(e) is not None for e in program.eqns) < 2:
        return closed
    out: list = []
    group = _Group()

    def close():
        out.extend(group.emit())
        group.reset()

    for eqn in program.eqns:
        key = _key(eqn)
        if key is not None:
            nbytes = _nbytes(eqn)
            if not group.accepts(eqn, key, nbytes, bucket_bytes):
                close()
            group.add(eqn, key, nbytes)
            continue
        if group.tainted_by(eqn):
            if eqn.primitive.effectful:  # it must wait for the group, and stay in order
                close()
                out.append(eqn)
            else:
                group.delay(eqn)
            continue
        if eqn.primitive.effectful:
            close()
        out.append(eqn)
    close()
    return ClosedProgram(Program(program.in_vars, out, program.out_atoms), closed.consts)


def _key(eqn):
    rule = eqn.primitive.rules.combine_key
    if rule is None or len(eqn.inputs) != 1 or len(eqn.outputs) != 1:
        return None
    key = rule(eqn)
    if key is None or not isinstance(eqn.inputs[0], Var):
        return None
    a, o = eqn.inputs[0].aval, eqn.outputs[0].aval
    if a.shape != o.shape or a.dtype != o.dtype:  # only shape-preserving collectives
        return None
    return (eqn.primitive, key, a.dtype)


def _nbytes(eqn) -> int:
    a = eqn.inputs[0].aval
    return math.prod(a.shape) * a.dtype.itemsize


class _Group:
    """The open group: its members, the values that depend on their results, and the
    equations held back until the combined collective has run."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.members: list = []
        self.key = None
        self.nbytes = 0
        self.tainted: set = set()
        self.delayed: list = []

    def accepts(self, eqn, key, nbytes, limit) -> bool:
        if not self.members:
            return True
        return (key == self.key and self.nbytes + nbytes <= limit
                and not self.tainted_by(eqn))

    def add(self, eqn, key, nbytes):
        self.members.append(eqn)
        self.key = key
        self.nbytes += nbytes
        self.tainted.update(eqn.outputs)

    def tainted_by(self, eqn) -> bool:
        return bool(self.tainted) and any(isinstance(a, Var) and a in self.tainted
                                          for a in eqn.inputs)

    def delay(self, eqn):
        self.delayed.append(eqn)
        self.tainted.update(eqn.outputs)

    def emit(self) -> list:
        """The group's equations: the members (combined when there are several), then
        the held-back equations."""
        if len(self.members) < 2:
            return self.members + self.delayed
        return _combined(self.members, self.nbytes) + self.delayed


def _combined(members: list, nbytes: int) -> list:
    eqns, flats = [], []
    for m in members:
        x = m.inputs[0]
        size = math.prod(x.aval.shape)
        flat = Var(x.aval.update(shape=(size,)))
        eqns.append(Eqn(reshape_p, [x], [flat], {"new_sizes": (size,)}, m.source_info))
        flats.append(flat)
    total = sum(f.aval.shape[0] for f in flats)
    buf = Var(flats[0].aval.update(shape=(total,)))
    eqns.append(Eqn(concatenate_p, flats, [buf], {"dimension": 0}))
    first = members[0]
    params = first.primitive.rules.combine_params(members, nbytes)
    reduced = Var(buf.aval)
    eqns.append(Eqn(first.primitive, [buf], [reduced], params, first.source_info))
    at = 0
    for m, f in zip(members, flats):
        size = f.aval.shape[0]
        piece = Var(f.aval)
        eqns.append(Eqn(slice_p, [reduced], [piece], {"start_indices": (at,),
                                                       "limit_indices": (at + size,),
                                                       "strides": None}))
        # The member's own output variable now holds the reshaped piece, so later
        # equations (already referring to it) need no renaming.
        eqns.append(Eqn(reshape_p, [piece], [m.outputs[0]],
                        {"new_sizes": tuple(m.outputs[0].aval.shape)}))
        at += size
    return eqns

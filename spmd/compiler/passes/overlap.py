"""Overlap of gradient reduction with the backward pass: nonblocking buckets.

A data-parallel step all-reduces every gradient.  Combined into one blocking
collective after the backward pass (:mod:`spmd.compiler.passes.combine`), the
reduction waits for the last gradient, and every rank idles in it while the
slowest one catches up.  PyTorch DDP and Horovod instead start a bucket's
reduction as soon as its gradients exist and wait only where the result is
first needed, so the backward pass of the earlier layers runs meanwhile.

This pass does that for collectives whose primitive can start one without
waiting (``rules.start(xp, x, **params)`` returns a request with ``test()``
and ``wait()``; the ``mpi`` backend's all-reduce has one).  Within each stretch
of the program between other effectful equations:

1. the combinable collectives (equal ``combine_key``, see
   :mod:`spmd.compiler.passes.combine`) are sorted by when their operand is produced
   and cut into buckets of at most ``bucket_bytes`` (a larger one alone);
2. each bucket becomes ``collective_start`` (its members' operands
   concatenated into one flat buffer, as combining does) placed right after its
   last operand is produced, and ``collective_wait`` placed after every
   equation that does not need a bucket's result;
3. the equations that need results run in the order of the buckets they
   need, so the first bucket's updates run while later buckets travel.

The generated code calls ``test()`` on the started requests after every
equation that follows (:mod:`spmd.compiler.engine.codegen`): the MPI library of the
PyPI ``mpich`` wheel moves data only inside MPI calls, and those calls are its
chance to.  The order of collectives is decided by the program alone, so every
process (running the same program) issues them in the same order.  A bucket
whose wait would directly follow its start stays one blocking call.

Example (two gradients, the second produced after more work)::

    collective_start[collective=mpi, tag=0, ...] g2    # right after g2 exists
    h = dot_general ...                                # runs while g2 travels
    collective_start[collective=mpi, tag=1, ...] g1
    r2 = collective_wait[tag=0] g2
    r1 = collective_wait[tag=1] g1
"""

from __future__ import annotations

import math

from spmd.compiler.passes.combine import _combined, _key, _nbytes
from spmd.compiler.core.ir import ClosedProgram, Eqn, Program, Var
from spmd.compiler.core.primitives import Primitive

# The bucket size when overlapping (spmd.config.overlap_bucket_bytes): small
# enough that a model's last layers' gradients start travelling while earlier
# layers still run backward, large enough that a call's fixed cost (tens of
# microseconds) is small against its transfer; below the size from which the
# mpi backend splits an all-reduce into reduce-scatter + all-gather (started,
# only the reduce-scatter overlaps: the all-gather runs in the wait).  PyTorch
# DDP's first bucket is 1 MiB.
DEFAULT_OVERLAP_BUCKET_BYTES = 2 * 1024 * 1024
# A bucket this large starts rather than wait for its next member through heavy
# equations (more than the next member's own): the transfer overlaps them.
MIN_EARLY_BYTES = 256 * 1024

collective_start_p = Primitive("collective_start", traits=(), multiple_results=True,
                               effectful=True)
collective_wait_p = Primitive("collective_wait", traits=(), effectful=True)


@collective_start_p.def_impl
def _start_impl(xp, x, *, collective, tag, **params):
    return collective.rules.start(xp, x, **params)


@collective_start_p.def_abstract_eval
def _start_aval(x, *, collective, tag, **params):
    return []


@collective_wait_p.def_impl
def _wait_impl(xp, x, *, tag, what=None):  # (the code generator calls the request)
    raise NotImplementedError("collective_wait runs only in generated code, which calls "
                              "the request returned by its collective_start")


@collective_wait_p.def_abstract_eval
def _wait_aval(x, *, tag, what=None):
    return x


def _not_differentiable(*args, **params):
    raise NotImplementedError("collective_start/collective_wait appear only in programs "
                              "lowered for execution, which are never transformed")


for _p in (collective_start_p, collective_wait_p):
    _p.def_jvp(_not_differentiable)
    _p.def_transpose(_not_differentiable)
    _p.def_batch(_not_differentiable)
collective_start_p.rules.starts = True
collective_wait_p.rules.waits = True


# Equations that touch this many elements are "heavy": the overlap pass starts a
# large enough bucket rather than wait for its next member through them.
# (A ``view`` primitive, see spmd.compiler.core.primitives.TRAITS, is never heavy.)
HEAVY_ELEMENTS = 1 << 14


def _heavy(eqn) -> bool:
    if "view" in eqn.primitive.traits:
        return False
    return any(math.prod(a.aval.shape) >= HEAVY_ELEMENTS
               for a in list(eqn.inputs) + list(eqn.outputs) if hasattr(a.aval, "shape"))


def overlap_collectives(closed: ClosedProgram, bucket_bytes: int) -> ClosedProgram:
    """Start combinable collectives in buckets as early as their operands allow and
    wait where their results are first needed (see the module docstring).

    ``bucket_bytes <= 0`` disables the pass.  Example::

        overlapped = overlap_collectives(lowered_program, 2 << 20)
    """
    program = closed.program
    if bucket_bytes <= 0 or not any(_startable(e) for e in program.eqns):
        return closed
    out, stretch, tags = [], [], [0]
    for eqn in program.eqns:
        if eqn.primitive.effectful and not _startable(eqn):
            out += _schedule(stretch, bucket_bytes, tags)
            out.append(eqn)
            stretch = []
        else:
            stretch.append(eqn)
    out += _schedule(stretch, bucket_bytes, tags)
    if tags[0] == 0:
        return closed
    return ClosedProgram(Program(program.in_vars, out, program.out_atoms), closed.consts)


def _startable(eqn) -> bool:
    return eqn.primitive.rules.start is not None and (_key(eqn) is not None or _alone(eqn))


def _alone(eqn) -> bool:
    """A collective started on its own, never combined with another (a send-receive:
    ``rules.starts_alone(eqn)``)."""
    rule = eqn.primitive.rules.starts_alone
    return rule is not None and bool(rule(eqn))


def _buckets(members, ready, bucket_bytes, work) -> list:
    """Members sorted by when their operand exists, cut into buckets per key: at
    ``bucket_bytes``, and where a bucket of :data:`MIN_EARLY_BYTES` or more would
    otherwise wait for the next member through heavy equations (``work[i]``: how
    many precede position ``i``) that it could overlap instead."""
    order = sorted(range(len(members)), key=lambda i: (ready[members[i]], i))
    open_: dict = {}
    done = []
    for i in order:
        m = members[i]
        key, size = (m if _alone(m) else _key(m)), _nbytes(m)  # (alone: a key of its own)
        b = open_.get(key)
        if b is not None and (b[1] + size > bucket_bytes or (
                b[1] >= MIN_EARLY_BYTES and work[ready[m]] - work[b[2]] > 1)):
            done.append(b)
            b = None
        if b is None:
            b = open_[key] = [[], 0, -1]
        b[0].append(m)
        b[1] += size
        b[2] = max(b[2], ready[m])
    done += open_.values()
    # Started in the order their last operand is produced (ties: program order).
    done.sort(key=lambda b: (max(ready[m] for m in b[0]), members.index(b[0][0])))
    return [b[0] for b in done]


def _schedule(eqns: list, bucket_bytes: int, tags: list) -> list:
    """One stretch without other effectful equations, rescheduled (see the module)."""
    members = [e for e in eqns if _startable(e)]
    if not members:
        return eqns
    is_member = set(members)
    pos = {o: i for i, e in enumerate(eqns) for o in e.outputs}
    member_outs = {m.outputs[0] for m in members}
    # A member that needs another member's result cannot start early: leave the
    # stretch as it is (combining, which runs next, handles such chains).
    needs: set = set(member_outs)
    for e in eqns:
        if any(isinstance(a, Var) and a in needs for a in e.inputs):
            if e in is_member:
                return eqns
            needs.update(e.outputs)
    ready = {m: pos.get(m.inputs[0], -1) for m in members}
    # work[i]: heavy equations (the code generator's test points) up to position i
    work, count = [], 0
    for e in eqns:
        count += not _startable(e) and _heavy(e)
        work.append(count)
    work.append(0)  # work[-1]: an operand from before the stretch
    buckets = _buckets(members, ready, bucket_bytes, work)
    # The bucket each result comes from; then, per equation, the last bucket it needs.
    bucket_of = {m.outputs[0]: k for k, b in enumerate(buckets) for m in b}
    level: dict = {}
    later: list = [[] for _ in buckets]
    first: list = []
    starts: dict = {}  # position of the last operand's producer -> bucket numbers
    for k, b in enumerate(buckets):
        starts.setdefault(max(ready[m] for m in b), []).append(k)
    pieces = [_pieces(b, tags) for b in buckets]
    head = [s for k in starts.get(-1, []) for s in pieces[k][0]]
    for i, e in enumerate(eqns):
        if e in is_member:
            continue
        lv = max((level.get(a, bucket_of.get(a, -1)) for a in e.inputs
                  if isinstance(a, Var)), default=-1)
        for o in e.outputs:
            level[o] = lv
        (first if lv < 0 else later[lv]).append(e)
        if lv < 0:
            for k in starts.get(i, []):
                first.extend(pieces[k][0])
    out = head + first
    for k in range(len(buckets)):
        out += pieces[k][1] + later[k]
    return _blocking_where_nothing_between(out)


def _pieces(bucket: list, tags: list) -> tuple[list, list]:
    """``(start equations, wait equations)`` of one bucket: operands packed into one
    flat buffer (when several), the start; the wait, the results unpacked."""
    nbytes = sum(_nbytes(m) for m in bucket)
    if len(bucket) == 1:
        m = bucket[0]
        eqns, buf, reduced, params = [], m.inputs[0], m.outputs[0], dict(m.params)
        unpack: list = []
    else:
        eqns = _combined(bucket, nbytes)
        at = next(i for i, e in enumerate(eqns) if e.primitive is bucket[0].primitive)
        coll = eqns[at]
        eqns, unpack = eqns[:at], eqns[at + 1:]
        buf, reduced, params = coll.inputs[0], coll.outputs[0], coll.params
    tag = tags[0]
    tags[0] += 1
    first = bucket[0]
    start = Eqn(collective_start_p, [buf], [],
                {"collective": first.primitive, **params, "tag": tag}, first.source_info)
    wait = Eqn(collective_wait_p, [buf], [reduced],
               {"tag": tag, "what": params.get("what")}, first.source_info)
    return eqns + [start], [wait] + unpack


def _blocking_where_nothing_between(eqns: list) -> list:
    """A start directly followed by its wait (nothing to overlap) becomes the blocking
    collective again, which costs one call instead of two."""
    out = []
    for e in eqns:
        prev = out[-1] if out else None
        if (e.primitive is collective_wait_p and prev is not None
                and prev.primitive is collective_start_p
                and prev.params["tag"] == e.params["tag"]):
            out.pop()
            params = {k: v for k, v in prev.params.items() if k not in ("collective", "tag")}
            out.append(Eqn(prev.params["collective"], prev.inputs, e.outputs, params,
                           prev.source_info))
            continue
        out.append(e)
    return out

"""The call plan: how one call signature of a program runs on placed values.

Every eager call on placed values ends here (``docs/architecture.md``, "The one
call path"): a jitted call (:mod:`spmd.shard.call.jit`), a jit with in/out shardings,
an eager operation on a sharded array (:mod:`spmd.shard.partition.placed_ops`), an
eager ``jit`` equation with sharded operands (:mod:`spmd.shard.call.dispatch`).
:func:`spmd.shard.call.route.route` decides which plan a call gets and keeps it,
keyed on what decides the route -- the program, each leaf's type and aval, and
for a placed leaf its sharding and whether it holds blocks or the whole value --
so a plan is built once from the first call of its key and then called as it is
(a jit keeps it under its own call key too): no guard re-checks what the key
holds, and nothing is recorded and replayed.

A plan is one of:

- **over processes** (the mesh is spread over processes): the program is
  partitioned with the leaves' shardings, and each call reads every leaf as the
  per-process program wants it (this process's blocks, a whole value, or a
  reshard for a leaf placed otherwise) and places the results by the out specs;
- **whole values here** (every device of the mesh is this process's): the
  compiled program runs on the whole values and its results carry the shardings
  that propagation chose (:func:`unplaced`: left unplaced, where the partitioner
  cannot take the program and the caller said so).

>>> plan = build(part, program, mesh, leaves)    # doctest: +SKIP
>>> outs = plan.run(leaves)
"""

from __future__ import annotations

import operator

import numpy as np

from spmd.compiler.core import array_module
from spmd.compiler.core.array import Array
from spmd.compiler.core.ir import ClosedProgram
from spmd.compiler.core.jit import executable_for
from spmd.compiler.core.trace import get_aval, to_array_value, wrap_value
from spmd.shard.maps import stacked as execute
from spmd.shard.arrays.multiprocess import reshard
from spmd.shard.arrays.sharded import holds_full_value, placement_token, ShardedArray
from spmd.shard.arrays.spec import NamedSharding

# How a plan reads each argument (written out per leaf in the plan's generated ``run``).
BLOCKS, WHOLE, AS_IS, CONVERT, RESHARD, VALUE = range(6)


# The part of a plan's key for an Array of the shard layer: its placement token
# (spmd.shard.arrays.sharded.placement_token: its type, aval, sharding and whether it holds
# blocks or the whole value), read without a Python call.
token = operator.attrgetter("_token")


def leaf_token(x):
    """What decides how a plan reads leaf ``x``: a placed Array's placement token, a
    numpy array's shape and dtype, else its type and aval (a plan built for one
    token never reads a leaf of another)."""
    if isinstance(x, ShardedArray):
        return x._token
    if type(x) is np.ndarray:
        return (np.ndarray, x.shape, x.dtype)
    return (type(x), get_aval(x))


class Plan:
    """One call signature's route; ``plan(leaves)`` (or ``plan.run(leaves)``, without
    the method frame) runs it and returns the results as Arrays (see the module
    docstring).  ``run`` is generated for the plan: each leaf's read, the call and
    each result's construction written out, nothing decided per call."""

    __slots__ = ("fn", "fixed", "lead", "steps", "results", "mesh", "run", "source")

    def __init__(self, fn, fixed: list, lead: tuple, steps: tuple, results, mesh,
                 outs=None, fix=None):
        self.fn = fn            # the generated function
        self.fixed = fixed      # leading constants passed as they are
        self.lead = lead        # leading constants read on every call: (object, how, what)
        self.steps = steps      # per leaf: (how, what)
        self.results = results  # raw outputs -> Arrays (when ``outs`` is None)
        self.mesh = mesh
        # outs: per output (aval, sharding, split, token), built inline; fix(o, aval):
        # an output that is not an ndarray of its dtype.
        self.run, self.source = _generate(fn, fixed, lead, steps, results, outs, fix)

    def __call__(self, leaves) -> list:
        return self.run(leaves)


def _generate(fn, fixed, lead, steps, results, outs, fix):
    """The source and function of a plan's ``run`` (see :class:`Plan`)."""
    ns = {"_fn": fn, "_read": _read, "_asarray": _asarray, "_SA": ShardedArray,
          "_nd": np.ndarray, "_results": results, "_fix": fix}
    lines, args = ["def run(leaves):"], []
    for i, c in enumerate(fixed):
        ns[f"_f{i}"] = c
        args.append(f"_f{i}")
    for i, (c, how, what) in enumerate(lead):
        ns[f"_c{i}"], ns[f"_cw{i}"] = c, what
        lines.append(f"    c{i} = _read(_c{i}, {how}, _cw{i})")
        args.append(f"c{i}")
    if steps:
        lines.append(f"    {''.join(f'x{i}, ' for i in range(len(steps)))}= leaves")
    for i, (how, what) in enumerate(steps):
        ns[f"_w{i}"] = what
        if how == AS_IS:
            args.append(f"x{i}")
        elif how == CONVERT:  # a scalar or another dtype: numpy's conversion (C)
            args.append(f"_asarray(x{i}, _w{i})")
        elif how in (BLOCKS, WHOLE):  # the buffer; a donated Array raises in _read
            field = "_blocks" if how == BLOCKS else "_value"
            lines.append(f"    r{i} = x{i}.{field} if not x{i}._deleted else "
                         f"_read(x{i}, {how}, None)")
            args.append(f"r{i}")
        else:
            lines.append(f"    r{i} = _read(x{i}, {how}, _w{i})")
            args.append(f"r{i}")
    call = f"_fn({', '.join(args)})"
    if outs is None:
        lines.append(f"    return _results({call})")
    elif not outs:
        lines += [f"    {call}", "    return []"]
    else:
        lines.append(f"    {''.join(f'o{j}, ' for j in range(len(outs)))}= {call}")
        made = []
        for j, (aval, sharding, split, token) in enumerate(outs):
            ns[f"_a{j}"], ns[f"_s{j}"], ns[f"_t{j}"], ns[f"_d{j}"] = \
                aval, sharding, token, aval.dtype
            lines.append(f"    if o{j}.__class__ is not _nd or o{j}.dtype is not _d{j}: "
                         f"o{j} = _fix(o{j}, _a{j})")
            made.append(f"_SA(None, _a{j}, _s{j}, o{j}, _t{j})" if split
                        else f"_SA(o{j}, _a{j}, _s{j}, None, _t{j})")
        lines.append(f"    return [{', '.join(made)}]")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<spmd:call plan>", "exec"), ns)
    return ns["run"], source


_asarray = np.asarray


def _read(x, how, what):
    """What the program reads of argument ``x`` (raises for a donated Array)."""
    if how == AS_IS:
        return x
    if how == BLOCKS:
        return x.local_blocks()
    if how == WHOLE:
        return x.value
    if how == RESHARD:
        y = reshard(x, what, "an input")
        return y.local_blocks() if y._value is None else y.value
    if how == CONVERT:
        return _asarray(x, what)
    return to_array_value(x, what)  # VALUE: ``what`` is the aval


def _step(x, host: bool) -> tuple:
    """How a plan reads an argument like ``x`` that it takes as a whole value."""
    if isinstance(x, ShardedArray):
        return (WHOLE, None) if x._value is not None else (VALUE, x.aval)
    aval = get_aval(x)
    if not host or isinstance(x, Array):  # (to_array_value moves host values to GPUs)
        return (VALUE, aval)
    if type(x) is np.ndarray and x.dtype == aval.dtype:
        return (AS_IS, None)
    return (CONVERT, aval.dtype)


def _on_host() -> bool:
    return array_module.current() is np and not array_module.on_device[0]


def build(part, whole_program: ClosedProgram, mesh, leaves) -> Plan:
    """The plan of a program partitioned as ``part`` over ``mesh`` for leaves like
    ``leaves``: over processes, each process runs its own blocks (:func:`over_processes`);
    in one process the whole values are here and ``whole_program`` runs on them, its
    results placed by the partition's out specs (:func:`whole_values`).  The one place
    that chooses between the two."""
    if mesh.is_multi_process:
        return over_processes(part.body, part.in_specs, part.out_specs, mesh, leaves)
    return whole_values(whole_program, mesh, part.out_specs, leaves)


def over_processes(body: ClosedProgram, in_specs, out_specs, mesh, leaves) -> Plan:
    """The plan running the per-device program ``body`` over ``mesh`` (spread over
    processes) for leaves like ``leaves``, placed by ``in_specs`` and ``out_specs`` (the
    program's constants lead, replicated)."""
    program, in_specs, args = execute.with_consts(body, in_specs, leaves)
    n = len(args) - len(leaves)
    wants = execute._in_shardings(mesh, in_specs)
    host = _on_host()
    steps, kinds = [], []
    for x, want in zip(args, wants):
        if isinstance(x, ShardedArray) and x._value is None:
            if x._sharding is want or x._sharding == want:
                steps.append((BLOCKS, None))
                kinds.append("blocks")
            else:  # placed otherwise: resharded on every call (a collective)
                steps.append((RESHARD, want))
                kinds.append("whole" if holds_full_value(want) else "blocks")
            continue
        kinds.append("whole")
        steps.append(_step(x, host))
    fixed, lead = [], []
    for c, step in zip(args[:n], steps[:n]):
        if step[0] == AS_IS and not lead:
            fixed.append(c)
        else:  # read on every call: an Array's buffer may be donated meanwhile
            lead.append((c,) + step)
    exe_plan = execute.plan_for(program, mesh, in_specs, tuple(out_specs), tuple(kinds))
    return Plan(exe_plan.exe.fn, fixed, tuple(lead), tuple(steps[n:]), None, mesh,
                exe_plan.outs, _fix_block)


def _fix_block(o, aval):
    """A per-process program's output that is not an ndarray of its dtype (a numpy
    scalar, a CuPy array) as an array of it."""
    if np.ndim(o) == 0:
        return execute._scalar_as(o, aval.dtype)
    return o.astype(aval.dtype, copy=False)


def whole_values(closed: ClosedProgram, mesh, out_specs, leaves) -> Plan:
    """The plan running ``closed`` compiled on whole values (every block of ``mesh`` is
    this process's), its results placed by ``out_specs``."""
    host = _on_host()
    steps = tuple(_step(x, host) for x in leaves)
    outs = tuple((a, s, False, placement_token(ShardedArray, a, s, False))
                 for a, s in zip(closed.out_avals, (NamedSharding(mesh, s) for s in out_specs)))
    return Plan(executable_for(closed).fn, [], (), steps, None, mesh, outs,
                lambda o, aval: wrap_value(o, aval).value)


def unplaced(closed: ClosedProgram, leaves, wrappers=None) -> Plan:
    """The plan running ``closed`` compiled on whole values with its results left as
    the program makes them: unplaced, or placed by their equation's own rule
    (``wrappers``: a ``shard_map`` result keeps its out specs)."""
    host = _on_host()
    steps = tuple(_step(x, host) for x in leaves)
    avals = tuple(closed.out_avals)
    wrappers = wrappers or (None,) * len(avals)

    def results(outs):
        return [a if w is None else w(a) for a, w in zip(map(wrap_value, outs, avals), wrappers)]

    return Plan(executable_for(closed).fn, [], (), steps, results, None)

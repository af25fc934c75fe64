"""Eager ``shard_map``: the body runs on every device's concrete blocks.

A ``shard_map`` called outside any transformation does not trace its body into
a program: it runs the Python body once, operation by operation, on the
concrete blocks of every device at once, under one batch level standing for
the mesh (as the local backend runs bodies).  Values in the body are real, as
in JAX's eager shard_map:

- ``print(x)``, ``str``, ``repr`` and ``format`` show each device's block,
  labelled with its device and mesh coordinates (JAX's format); across
  processes each process shows its own devices;
- a value converts to a Python ``bool``/``int``/``float`` when it is the same on
  every device (a ``psum`` result, say), so a Python ``if`` on it works; one
  that differs between devices raises an error naming two devices that
  disagree.  Across processes the processes compare digests of their blocks,
  so all of them take the same branch or all raise.

Under ``jit`` (or any transformation) the body is traced once instead, and a
branch on a value needs ``lax.cond``, as in JAX.

With ``check_vma`` the values carry varying-axes types, computed operation by
operation by the same rules as in a traced body (so ``grad`` inside the body
sums over devices where JEP 17111 says so), and outputs are checked on them as
under ``jit``.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from spmd import tree_util
from spmd.collectives import mpi
from spmd.compiler.core.array_module import to_host
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.ir import ClosedProgram, Program
from spmd.compiler.core.jit import flatten_outputs
from spmd.compiler.core.trace import full_raise, get_aval, is_eager, to_array_value, Tracer
from spmd.errors import TracerBoolConversionError
from spmd.shard.arrays.multiprocess import reshard
from spmd.shard.arrays.sharded import ShardedArray, from_whole
from spmd.shard.arrays.spec import NamedSharding, global_shape
from spmd.shard.call.fingerprint import agree_text, mesh_line
from spmd.shard.explicit.mesh_context import in_body
from spmd.shard.maps.args import _as_global, _check_out, _spec_leaves
from spmd.shard.maps.manual_axes import _check_manual_spec
from spmd.shard.maps.stacked import local_positions, run_stacked, stack_input, unstack_output


def can_run_eagerly(vals) -> bool:
    """True when a shard_map call is eager: no transformation active, no traced input."""
    return is_eager() and not any(isinstance(v, Tracer) for v in vals)


class EagerMesh:
    """The hook of the concrete batch level (``NamedAxes.concrete``): what a body
    value is on each device of this process, how it prints, and whether it is the
    same on every device of the mesh (across processes, by comparing digests)."""

    def __init__(self, mesh, local, typed: bool):
        self.mesh = mesh
        self.typed = typed  # values carry varying-axes types (check_vma)
        self.main = None  # the batch level the body runs at (set when it starts)
        self.local = local  # this process's flat mesh positions; None: all (one process)
        self.positions = tuple(range(mesh.size)) if local is None else tuple(local)
        # Across processes: the operations run so far, one line each, which the
        # processes agree on before any data moves (see :meth:`agree`).
        self.log: list[str] = []
        self.ranks = tuple(sorted({d.process_index for d in mesh.devices.flat}))

    def before(self, prim, tracers, params, communicates: bool) -> None:
        """Called before each operation of the body.  Across processes it is logged,
        and before one that communicates the processes agree on the log: processes
        that took different paths (rank-dependent Python, other shapes) raise
        ProgramMismatchError naming the first difference, instead of pairing the
        wrong collectives (the eager counterpart of a compiled program's
        fingerprint)."""
        if self.local is None:
            return
        self.log.append(_op_line(prim, [t.aval for t in tracers], params))
        if communicates:
            self.agree()

    def agree(self, *extra: str) -> None:
        if self.local is not None:
            agree_text("\n".join(self.log + list(extra)), self.ranks)

    def blocks(self, tracer) -> list:
        """This process's devices' blocks of ``tracer`` (host arrays, mesh order)."""
        v = np.asarray(to_host(getattr(tracer.val, "value", tracer.val)))
        if tracer.bdim is None:
            return [v] * len(self.positions)
        v = np.moveaxis(v, tracer.bdim, 0)
        return [v[k] for k in range(v.shape[0])]

    def text(self, tracer, spec: str = "") -> str:
        """Each device's block, as JAX prints a value of an eager shard_map body."""
        mesh = self.mesh
        names = f"({', '.join(map(str, mesh.axis_names))},)"
        flat = list(mesh.devices.flat)
        parts = []
        for pos, block in zip(self.positions, self.blocks(tracer)):
            coords = tuple(int(i) for i in np.unravel_index(pos, mesh.devices.shape))
            shown = format(block[()] if block.ndim == 0 else block, spec) if spec else str(block)
            parts.append(f"On {flat[pos]!r} at mesh coordinates {names} = {coords}:\n{shown}\n")
        return "\n".join(parts)

    def digests(self, tracer) -> np.ndarray:
        """One digest of every device's block, mesh order (agreed across processes)."""
        out = np.zeros((self.mesh.size, 16), np.uint8)
        for pos, block in zip(self.positions, self.blocks(tracer)):
            data = np.ascontiguousarray(block).tobytes() + str(block.dtype).encode()
            out[pos] = np.frombuffer(hashlib.blake2b(data, digest_size=16).digest(), np.uint8)
        if self.local is None:
            return out
        procs = [d.process_index for d in self.mesh.devices.flat]
        ranks = tuple(sorted(set(procs)))
        rows = mpi.allgather(out, ranks, what="the eager shard_map's value check", control=True)
        return np.stack([rows[ranks.index(procs[p])][p] for p in range(self.mesh.size)])

    def value(self, tracer, what: str):
        """The value of ``tracer`` when it is the same on every device of the mesh."""
        self.agree(f"{what} of {tracer.aval}")
        # A value whose type is invariant is the same everywhere by construction.
        if tracer.bdim is not None and (tracer.vma is None or tracer.vma):
            d = self.digests(tracer)
            differ = [k for k in range(1, len(d)) if not np.array_equal(d[k], d[0])]
            if differ:
                raise TracerBoolConversionError(
                    f"{what} of a value inside an eager shard_map that differs between "
                    f"devices (devices 0 and {differ[0]} in mesh order disagree); branch on a "
                    "value that is the same on every device (e.g. after lax.psum), or use "
                    "lax.cond")
        # The same everywhere: this process's first block (or the unstacked value).
        return tracer.val if tracer.bdim is None else self.blocks(tracer)[0]


def run_eagerly(f, mesh, vals, specs, dyn, leaves, in_tree, out_specs, check_vma, manual,
                fname):
    """Run ``f`` on every device's concrete blocks; the global outputs, placed."""
    multi = mesh.is_multi_process
    local = local_positions(mesh) if multi else None
    hook = EagerMesh(mesh, local, check_vma)
    if multi:  # the processes agree on the call before any data moves
        hook.log += [mesh_line(mesh), "inputs: " + ", ".join(str(get_aval(v)) for v in vals),
                     f"in_specs: {list(specs)}", f"check_vma: {check_vma}"]
        hook.agree()
        stacked = [_local_blocks(v, s, mesh, local) for v, s in zip(vals, specs)]
    else:
        # Split the whole values (one process holds them): the splitting is data
        # movement of this call, not the program's operations on placed (typed) values.
        stacked = [stack_input(v.as_plain() if isinstance(v, ShardedArray) else v, s, mesh)
                   for v, s in zip(vals, specs)]
    scope = dict(mesh.shape) if manual is None else {a: mesh.shape[a] for a in manual}
    vmas = [frozenset(a for a in s.mesh_axes if a in scope) if check_vma else None
            for s in specs]
    out: list = []  # the outputs' tree and specs

    def body(trace, tracers):
        hook.main = trace.main
        with in_body(mesh, manual, eager=True):
            full = list(leaves)
            for i, t in zip(dyn, tracers):
                full[i] = t
            outs = f(*tree_util.tree_unflatten(in_tree, full))
            out_leaves, out_tree = flatten_outputs(outs, fname)
            results = [full_raise(trace, x) for x in out_leaves]
            out[:] = [out_tree, _checked_out_specs(results, outs, out_specs, hook, mesh,
                                                   check_vma, manual, fname)]
        return results

    raw = run_stacked(body, mesh, stacked, local=local, concrete=hook, scope=scope,
                      track_vma=check_vma, manual=True, dynamic=True, vmas=vmas)
    out_tree, specs_out = out
    return tree_util.tree_unflatten(out_tree, [
        _placed_output(v, d, s, mesh, local) for (v, d), s in zip(raw, specs_out)])


def _checked_out_specs(results, outs, out_specs, hook, mesh, check_vma, manual, fname):
    """The flat out specs of an eager body's ``outs``, checked against their types (the
    processes agree on them first)."""
    if callable(out_specs):
        out_specs = out_specs()
    out_spec_paths = _spec_leaves(out_specs, outs, "out_specs", fname)
    hook.agree("outputs: " + ", ".join(str(t.aval) for t in results),
               f"out_specs: {[s for s, _ in out_spec_paths]}")
    for t, (spec, path) in zip(results, out_spec_paths):
        if manual is not None:
            _check_manual_spec(spec, manual, f"out_specs{path}", fname)
        _check_out(t.aval, spec, path, mesh, check_vma, fname)
    return [s for s, _ in out_spec_paths]


def _placed_output(v, d, spec, mesh, local):
    """An eager body's output as an Array placed by ``spec``: from the whole value in one
    process; across processes, this process's blocks of a split output, or the whole
    value of a replicated one."""
    s = NamedSharding(mesh, spec)
    if local is None:
        out = _as_global(unstack_output(v, d, spec, mesh))  # a constant output may be numpy
        return from_whole(out.value, out.aval, s)
    aval = get_aval(v)
    block = aval.shape if d is None else aval.shape[:d] + aval.shape[d + 1:]
    g = ShapedArray(global_shape(spec, mesh, block), aval.dtype, aval.weak_type)
    v = unstack_output(v, d, spec, mesh, local)
    if not spec.mesh_axes:  # replicated: every device holds the whole value
        return ShardedArray(to_array_value(v, g), g, s)
    return ShardedArray(None, g, s, to_array_value(v, get_aval(v)))


def _local_blocks(x, spec, mesh, local):
    """(this process's blocks of input ``x`` stacked, 0), or (x, None) when replicated:
    an Array spread over processes is first placed by ``spec`` (as a compiled call
    would), a whole value is cut."""
    if isinstance(x, ShardedArray) and x._value is None:
        want = NamedSharding(mesh, spec)
        if x._sharding != want:
            x = reshard(x, want, "an input")
        if x._value is None:
            return x.local_blocks(), 0
    # A whole value (an Array replicated over the processes included) enters as its
    # plain buffer: operations on a placed Array inside the body would dispatch as
    # SPMD programs of their own, and the body's collectives cannot.
    return stack_input(to_array_value(x, get_aval(x)), spec, mesh, local)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _op_line(prim, avals, params) -> str:
    """One operation as the processes compare it: the same on every process that runs
    the same operation (no object addresses; programs as printed)."""
    def show(v):
        if isinstance(v, (ClosedProgram, Program)):
            return str(v)
        if callable(v) and hasattr(v, "__qualname__"):
            return v.__qualname__
        return _ADDRESS.sub("", repr(v))

    shown = ", ".join(f"{k}={show(v)}" for k, v in sorted(params.items())
                      if not k.startswith("_"))
    return f"{prim.name}[{shown}] {' '.join(map(str, avals))}"

"""The one stacked runner: a ``shard_map`` body run on every device at once.

The per-device program runs under one batch level that stands for every mesh
axis (:class:`spmd.compiler.transforms.batching.NamedAxes`): an input split over some mesh
axes becomes a stacked array with one block per device (row-major device
order); an input replicated over the whole mesh stays one unstacked array.
The collectives' batching rules do the communication
(:mod:`spmd.collectives.local`).  :func:`run_stacked` is that level, for every
caller:

- a compiled body on one process (:func:`local_program`): every device of the
  mesh, traced once into a program over global arrays and compiled like any
  jitted program;
- a compiled body on a mesh spread over processes (:func:`process_program`):
  this process's devices only; the program reads this process's blocks of each
  input (the blocks an Array spread over processes holds, stacked, or slices of
  a whole value) and returns this process's blocks of each output, which become
  the outputs' Arrays as they are (no buffer of a global shape is made);
- an eager body (:func:`spmd.shard.maps.on_blocks.run_eagerly`): either of the
  two, on concrete blocks, at a level marked concrete.

Inputs enter by :func:`stack_input` and outputs leave by :func:`unstack_output`,
for all devices (``local=None``) or this process's (``local``: their flat mesh
positions, :func:`local_positions`).

>>> raw = run_stacked(lambda trace, xs: [x * 2 for x in xs], mesh,
...                   [stack_input(x, P("i"), mesh)])          # doctest: +SKIP
"""

from __future__ import annotations

import weakref

import numpy as np

from spmd.collectives import local as _local_backend
from spmd.collectives.layout import ProcessLayout
from spmd.collectives.primitives import as_summands, psum_p
from spmd.compiler.transforms.batching import BatchTrace, BatchTracer, NamedAxes, move_to_front
from spmd.compiler.core.ir import ClosedProgram
from spmd.compiler.core.jit import executable_for
from spmd.compiler.ops.slicing import concatenate, slice as lax_slice, slice_in_dim
from spmd.compiler.ops.structural import broadcast_in_dim, reshape, transpose
from spmd.compiler.core.trace import (eval_program, extend_axis_env, full_raise, get_aval, new_main,
                                 trace_to_program)
from spmd.compiler.core import array_module
from spmd.compiler.core.avals import ShapedArray
from spmd.errors import SpreadOverProcessesError
from spmd.launch.timeline import recorder as _timeline
from spmd.mesh import process_index
from spmd.shard.call.fingerprint import agree
from spmd.shard.arrays.sharded import ShardedArray, placement_token
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec

_programs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def local_program(program: ClosedProgram, mesh, in_specs, out_specs) -> ClosedProgram:
    """A program over global arrays that runs ``program`` on every device of ``mesh``."""
    per = _programs.get(program)
    if per is None:
        per = _programs[program] = {}
    # (Stacked while a trace is on, its collectives are marked: another program.)
    key = (mesh, tuple(in_specs), tuple(out_specs), _timeline.ACTIVE is not None)
    hit = per.get(key)
    if hit is None:
        if mesh.is_multi_process:
            # Calls run such programs partitioned over the mesh (dispatch.py); only
            # compiling one for this process alone gets here.
            raise SpreadOverProcessesError(
                f"a shard_map over the mesh {mesh!r}, spread over processes, in a "
                "program compiled for this process alone: it runs only as part of a "
                "program partitioned over its mesh, each process computing its own "
                "blocks. Call the jitted function itself (not .lower(...).compile()), "
                "with its arguments placed on that mesh or as numpy values")
        in_avals = [a.update(shape=_global(a.shape, s, mesh), vma=frozenset(),
                             reduced=frozenset())
                    for a, s in zip(program.in_avals, in_specs)]
        hit = trace_to_program(
            lambda *xs: run_program(program, mesh, in_specs, out_specs, xs), in_avals)
        per[key] = hit
    return hit


def executable(program: ClosedProgram, mesh, in_specs, out_specs, xp=np):
    return executable_for(local_program(program, mesh, in_specs, out_specs), xp)


def _global(block, spec, mesh):
    return tuple(s * (mesh.axis_size(spec.axes_of(d)) if spec.axes_of(d) else 1)
                 for d, s in enumerate(block))


def run_stacked(body, mesh, stacked, *, local=None, concrete=None, scope=None,
                track_vma: bool = False, manual: bool = False, dynamic: bool = False,
                vmas=None) -> list:
    """Run ``body(trace, tracers)`` at one batch level standing for the devices of
    ``mesh`` (all of them, or this process's ``local`` ones), on ``stacked`` inputs
    (``(value, 0)`` stacked blocks or ``(value, None)`` one replicated value, see
    :func:`stack_input`); the outputs as ``(value, batch dim or None)``.

    ``concrete``: the hook of an eager body's level (``NamedAxes.concrete``);
    ``scope``: the axes in scope (default: all of the mesh's), with ``track_vma``
    and ``manual`` as :func:`extend_axis_env` takes them; ``vmas``: each input's
    varying axes (an eager body's typed values; then replicated inputs are tracers
    too)."""
    layout = None if local is None else ProcessLayout(
        local, tuple(d.process_index for d in mesh.devices.flat), process_index())
    level = NamedAxes(mesh.axis_names, mesh.axis_sizes, layout, concrete=concrete)
    n = mesh.size if local is None else len(local)
    # While a trace is on, the collectives of this level are marked (spmd.collectives.local).
    noted = _timeline.ACTIVE is not None and local is None
    if noted:
        _local_backend.STACKED[id(level)] = tuple(d.id for d in mesh.devices.flat)
    try:
        with new_main(BatchTrace, (level, n), dynamic=dynamic) as main, \
                extend_axis_env(dict(mesh.shape) if scope is None else scope,
                                track_vma=track_vma, main=main, manual=manual):
            trace = BatchTrace(main)
            if vmas is None:
                tracers = [BatchTracer(trace, v, d) if d is not None else v
                           for v, d in stacked]
            else:
                tracers = [BatchTracer(trace, v, d, vma)
                           for (v, d), vma in zip(stacked, vmas)]
            outs = [full_raise(trace, o) for o in body(trace, tracers)]
            return [(o.val, o.bdim) for o in outs]
    finally:
        if noted:
            _local_backend.STACKED.pop(id(level), None)


def run_program(program, mesh, in_specs, out_specs, args, local=None, kinds=None) -> list:
    """Run ``program`` stacked on the devices of ``mesh`` (``local``: this process's;
    ``kinds``: how each input comes, see :func:`process_program`): the outputs, global
    values, or as this process holds them (:func:`unstack_output`)."""
    kinds = kinds or ("whole",) * len(args)
    stacked = [(x, 0) if k == "blocks" else stack_input(x, s, mesh, local)
               for x, s, k in zip(args, in_specs, kinds)]

    def body(trace, tracers):
        return _summed_out(eval_program(program, *_summands_in(tracers, in_specs)), out_specs)

    raw = run_stacked(body, mesh, stacked, local=local)
    return [unstack_output(v, d, s, mesh, local) for (v, d), s in zip(raw, out_specs)]


def local_positions(mesh) -> tuple[int, ...]:
    """The flat mesh positions of this process's devices."""
    me = process_index()
    return tuple(i for i, d in enumerate(mesh.devices.flat) if d.process_index == me)


def stack_input(x, spec, mesh, local=None):
    """``(blocks of x stacked, 0)``, or ``(x, None)`` when replicated: the blocks of
    every device (``local=None``) or of this process's devices at flat positions
    ``local``, of the global value ``x``."""
    return to_blocks(x, spec, mesh) if local is None else _my_blocks(x, spec, mesh, local)


def unstack_output(v, d, spec, mesh, local=None):
    """An output ``v`` (stacked along ``d``, or None: the same on every device) as the
    global value whose blocks, placed by ``spec``, are the devices' values
    (``local=None``), or as this process holds it (:func:`_local_out`)."""
    return from_blocks(v, d, spec, mesh) if local is None else _local_out(v, d, spec, len(local))


# An unreduced value outside a body is its sum (an Array holds the value): entering a
# body whose in_spec is unreduced along some axes, device 0 along them holds it and the
# others zeros (summands of it); leaving one whose out_spec is, it is summed.
def _summands_in(xs, specs):
    return [as_summands(x, tuple(sorted(s.unreduced))) if s.unreduced else x
            for x, s in zip(xs, specs)]


def _summed_out(outs, specs):
    return [psum_p.bind(o, axes=tuple(sorted(s.unreduced))) if s.unreduced else o
            for o, s in zip(outs, specs)]


def to_blocks(x, spec, mesh):
    """(stacked blocks with the device axis first, 0) — or (x, None) when replicated."""
    if not spec.mesh_axes:
        return x, None
    shape = tuple(get_aval(x).shape)
    split_shape, pos = [], {}
    for d, s in enumerate(shape):
        axes = spec.axes_of(d)
        for a in axes:
            pos[a] = len(split_shape)
            split_shape.append(mesh.shape[a])
        split_shape.append(s // (mesh.axis_size(axes) if axes else 1))
    block = tuple(s for i, s in enumerate(split_shape) if i not in pos.values())
    used = [a for a in mesh.axis_names if a in pos]
    rest = [i for i in range(len(split_shape)) if i not in pos.values()]
    xt = transpose(reshape(x, tuple(split_shape)), tuple(pos[a] for a in used) + tuple(rest))
    k = len(mesh.axis_names)
    if len(used) < k:  # replicated over the other mesh axes: every device gets a copy
        dims = tuple(mesh.axis_names.index(a) for a in used) + tuple(range(k, k + len(block)))
        xt = broadcast_in_dim(xt, mesh.axis_sizes + block, dims)
    return reshape(xt, (mesh.size,) + block), 0


def from_blocks(v, d, spec, mesh):
    """The global value whose blocks, placed by ``spec``, are the devices' values."""
    if d is None:  # the same block on every device: repeat it along the split dims
        block = tuple(get_aval(v).shape)
        out = v
        for dim in range(len(block)):
            axes = spec.axes_of(dim)
            if not axes:
                continue
            m = mesh.axis_size(axes)
            cur = tuple(get_aval(out).shape)
            expanded = cur[:dim] + (m,) + cur[dim:]
            out = broadcast_in_dim(out, expanded, tuple(i for i in range(len(expanded))
                                                       if i != dim))
            out = reshape(out, cur[:dim] + (m * cur[dim],) + cur[dim + 1:])
        return out
    v = move_to_front(v, d)
    block = tuple(get_aval(v).shape[1:])
    k = len(mesh.axis_names)
    v = reshape(v, mesh.axis_sizes + block)
    # Mesh axes the spec leaves out hold equal blocks (checked by the vma types): keep one.
    for i in reversed(range(k)):
        if mesh.axis_names[i] not in spec.mesh_axes:
            v = slice_in_dim(v, 0, 1, axis=i)
    kept = [a for a in mesh.axis_names if a in spec.mesh_axes]
    v = reshape(v, tuple(mesh.shape[a] for a in kept) + block)
    order, shape = [], []
    for dim, s in enumerate(block):
        axes = spec.axes_of(dim)
        order += [kept.index(a) for a in axes] + [len(kept) + dim]
        shape.append(s * (mesh.axis_size(axes) if axes else 1))
    return reshape(transpose(v, tuple(order)), tuple(shape))


# ------------------------------------------------------ multi-process meshes
#
# On a mesh spread over processes each process stacks only its own devices.  An
# input comes either as this process's blocks, stacked in mesh order ("blocks":
# an Array spread over processes whose sharding is the input's spec), or as a
# whole value this process holds ("whole": numpy inputs, replicated Arrays), of
# which the program slices its blocks.  Outputs split over mesh axes leave as
# stacked blocks; replicated ones as the whole value.

def process_program(program: ClosedProgram, mesh, in_specs, out_specs,
                    kinds: tuple) -> ClosedProgram:
    """The program this process runs for ``program`` on its devices of ``mesh``;
    ``kinds[i]`` is ``"blocks"`` or ``"whole"`` (see above).  Cached per program."""
    per = _programs.get(program)
    if per is None:
        per = _programs[program] = {}
    key = ("process", mesh, tuple(in_specs), tuple(out_specs), kinds,
           _timeline.ACTIVE is not None)
    hit = per.get(key)
    if hit is None:
        local = local_positions(mesh)
        global_avals = [a.update(shape=_global(a.shape, s, mesh), vma=frozenset(),
                                 reduced=frozenset())
                        for a, s in zip(program.in_avals, in_specs)]
        in_avals = [a.update(shape=(len(local),) + b.shape, vma=frozenset(), reduced=frozenset())
                    if k == "blocks" else g
                    for a, b, g, k in zip(global_avals, program.in_avals, global_avals, kinds)]
        hit = trace_to_program(
            lambda *xs: run_program(program, mesh, in_specs, out_specs, xs, local, kinds),
            in_avals)
        # The per-device program and the global types are the same on every rank.
        # Cached only once agreed: after a mismatch, a retry agrees again.
        agree(program, global_avals, in_specs, out_specs, mesh)
        per[key] = hit
    return hit


def _block_index(spec, mesh, shape, flat_pos):
    device = mesh.devices.flat[flat_pos]
    return NamedSharding(mesh, spec).device_index(device, shape)


def _my_blocks(x, spec, mesh, local):
    """This process's devices' blocks of global ``x``, stacked (or x when replicated)."""
    if not spec.mesh_axes:
        return x, None
    shape = tuple(get_aval(x).shape)
    blocks = []
    for f in local:
        idx = _block_index(spec, mesh, shape, f)
        start = tuple(sl.start or 0 for sl in idx)
        stop = tuple(s if sl.stop is None else sl.stop for sl, s in zip(idx, shape))
        b = lax_slice(x, start, stop)
        blocks.append(reshape(b, (1,) + tuple(get_aval(b).shape)))
    return (concatenate(blocks, 0) if len(blocks) > 1 else blocks[0]), 0


def _local_out(v, d, spec, n_local):
    """An output as this process holds it: its devices' blocks stacked (split specs)
    or the whole value (replicated specs)."""
    if not spec.mesh_axes:  # replicated: every device holds the whole value
        if d is None:
            return v
        v = move_to_front(v, d)
        return reshape(slice_in_dim(v, 0, 1, axis=0), tuple(get_aval(v).shape[1:]))
    if d is None:  # the same block on every device of this process
        block = tuple(get_aval(v).shape)
        return broadcast_in_dim(v, (n_local,) + block, tuple(range(1, 1 + len(block))))
    return move_to_front(v, d)


class _Plan:
    """What a call plan over processes (:func:`spmd.shard.call.plan.over_processes`) needs
    for one program, mesh, specs and input kinds: the compiled per-process program and
    the outputs' global avals, shardings, representations and placement tokens."""

    __slots__ = ("exe", "outs")

    def __init__(self, program, mesh, in_specs, out_specs, kinds):
        self.exe = executable_for(process_program(program, mesh, in_specs, out_specs, kinds))
        self.outs = []
        for a, spec, s in zip(program.out_avals, out_specs, _in_shardings(mesh, out_specs)):
            aval = ShapedArray(_global(a.shape, spec, mesh), a.dtype, a.weak_type)
            split = bool(spec.mesh_axes)
            self.outs.append((aval, s, split, placement_token(ShardedArray, aval, s, split)))


def plan_for(program: ClosedProgram, mesh, in_specs: tuple, out_specs: tuple,
             kinds: tuple) -> _Plan:
    """The cached :class:`_Plan` of ``program`` (constants already made leading
    arguments, see :func:`with_consts`) for these specs and input kinds."""
    per = _plans.get(program)
    if per is None:
        per = _plans[program] = {}
    key = (mesh, in_specs, out_specs, kinds)
    plan = per.get(key)
    if plan is None:
        plan = per[key] = _Plan(program, mesh, in_specs, out_specs, kinds)
    return plan


def with_consts(program: ClosedProgram, in_specs, args) -> tuple:
    """``(program, in_specs, args)`` with the program's constants as leading
    replicated inputs (the per-process program takes them as arguments)."""
    n = len(program.consts)
    if not n:
        return program, tuple(in_specs), list(args)
    return (_unclosed(program), (_REPLICATED,) * n + tuple(in_specs),
            list(program.consts) + list(args))


_plans: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_sharding_cache: dict = {}


def _in_shardings(mesh, in_specs: tuple) -> tuple:
    """One NamedSharding per spec (cached: the same objects every call, for inputs and
    outputs alike, so that an input placed by a previous call is recognised by
    identity)."""
    key = (mesh, in_specs)
    hit = _sharding_cache.get(key)
    if hit is None:
        if len(_sharding_cache) > 4096:
            _sharding_cache.clear()
        hit = _sharding_cache[key] = tuple(NamedSharding(mesh, s) for s in in_specs)
    return hit


def _replicated():
    return PartitionSpec()


_REPLICATED = _replicated()


def _scalar_as(o, dtype):
    """A 0-d output as a 0-d array of ``dtype``, where it is (a numpy scalar becomes a
    numpy array; a CuPy array stays on its GPU: CuPy refuses ``np.asarray`` of it)."""
    if array_module.is_device_array(o):
        return o if o.dtype == dtype else o.astype(dtype)
    return np.asarray(o, dtype)


def _unclosed(program: ClosedProgram) -> ClosedProgram:
    """``program`` with its constants as leading arguments (cached per program, so
    that the per-process programs built from it are cached too)."""
    hit = _unclosed_cache.get(program)
    if hit is None:
        hit = _unclosed_cache[program] = ClosedProgram(program.program, [])
    return hit


_unclosed_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

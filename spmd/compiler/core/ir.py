"""The intermediate representation: typed SSA programs.

A :class:`Program` is a list of equations over variables.  Each :class:`Eqn`
applies one primitive to input atoms (variables or literals) with static
parameters and defines fresh output variables.  Higher-order primitives carry
:class:`ClosedProgram` s in their parameters.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import numpy as np

from spmd.compiler.core.avals import ShapedArray


class Var:
    """A program variable; identity is the object, names are given when printing."""

    __slots__ = ("aval", "suffix")
    _count = itertools.count()

    def __init__(self, aval: ShapedArray, suffix: str = ""):
        self.aval = aval
        self.suffix = suffix

    def __repr__(self):
        return f"Var({self.aval})"


class Literal:
    """A scalar constant written inline in a program."""

    __slots__ = ("val", "aval")

    def __init__(self, val, aval: ShapedArray):
        self.val = val
        self.aval = aval

    def __repr__(self):
        return f"Literal({self.val!r})"


Atom = Var | Literal


class SourceInfo(NamedTuple):
    """Where in user code an equation was traced (file, line, function)."""

    file: str
    line: int
    function: str

    def __str__(self):
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} ({self.function})"


class Eqn:
    """``outs = primitive[params] *inputs``."""

    __slots__ = ("primitive", "inputs", "outputs", "params", "source_info")

    def __init__(self, primitive, inputs, outputs, params, source_info=None):
        self.primitive = primitive
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.params = dict(params)
        self.source_info = source_info

    def replace(self, **kw) -> "Eqn":
        new = Eqn(self.primitive, self.inputs, self.outputs, self.params, self.source_info)
        for k, v in kw.items():
            setattr(new, k, v)
        return new

    def __repr__(self):
        return f"Eqn({self.primitive.name}, {len(self.inputs)} in, {len(self.outputs)} out)"


class Program:
    """A typed SSA program: ``lambda in_vars. let eqns in out_atoms``."""

    __slots__ = ("in_vars", "eqns", "out_atoms", "effects")

    def __init__(self, in_vars, eqns, out_atoms):
        self.in_vars = list(in_vars)
        self.eqns = list(eqns)
        self.out_atoms = list(out_atoms)

    # JAX-compatible names, so that code written against jaxprs reads naturally.
    invars = property(lambda self: self.in_vars)
    outvars = property(lambda self: self.out_atoms)

    @property
    def in_avals(self):
        return [v.aval for v in self.in_vars]

    @property
    def out_avals(self):
        return [a.aval for a in self.out_atoms]

    def __str__(self):
        return pp_program(self)

    __repr__ = __str__


class ClosedProgram:
    """A program together with the values of its leading constant inputs.

    ``program.in_vars[:len(consts)]`` are bound to ``consts``; the rest are the
    arguments.  ``.jaxpr`` is the open program (JAX's name).
    """

    __slots__ = ("program", "consts", "__weakref__")

    def __init__(self, program: Program, consts=()):
        self.program = program
        self.consts = list(consts)

    jaxpr = property(lambda self: self.program)
    eqns = property(lambda self: self.program.eqns)

    @property
    def in_avals(self):
        return self.program.in_avals[len(self.consts):]

    @property
    def out_avals(self):
        return self.program.out_avals

    def __str__(self):
        return pp_program(self.program, n_consts=len(self.consts))

    __repr__ = __str__


# ------------------------------------------------------------------ printing

def _letters():
    for n in itertools.count(1):
        for combo in itertools.product("abcdefghijklmnopqrstuvwxyz", repeat=n):
            yield "".join(combo)


class Namer:
    """Names variables as they are first printed; ``types`` (``id(var) -> str``)
    overrides a variable's printed type (an upper layer's view of it: the shard
    layer's explicit sharding types, ``f32[8@x,4]``)."""

    def __init__(self, types=None):
        self.names: dict = {}
        self.gen = _letters()
        self.types = types or {}

    def binder(self, v) -> str:
        """``name:type`` of a variable where it is bound."""
        return f"{self(v)}:{self.types.get(id(v)) or v.aval.str_short()}"

    def __call__(self, v) -> str:
        if isinstance(v, Literal):
            return _fmt_literal(v.val)
        name = self.names.get(id(v))
        if name is None:
            name = self.names[id(v)] = next(self.gen) + v.suffix
        return name


def _fmt_literal(val) -> str:
    val = np.asarray(val)
    if val.shape == ():
        return str(val[()])  # numpy prints the shortest repr of its own dtype
    return f"<{val.dtype}{list(val.shape)}>"


def _fmt_param(v, namer, indent) -> str:
    if isinstance(v, ClosedProgram):
        v = v.program
    if isinstance(v, Program):
        inner = pp_program(v, indent=indent + 4, namer=namer).rstrip()
        return "\n" + inner + "\n" + " " * (indent + 2)
    if isinstance(v, np.dtype):
        return str(v)
    if isinstance(v, (tuple, list)) and any(isinstance(x, (Program, ClosedProgram)) for x in v):
        return "(" + ", ".join(_fmt_param(x, namer, indent) for x in v) + ")"
    if callable(v) and hasattr(v, "__name__"):
        return v.__name__
    return repr(v)


def pp_eqn(eqn: Eqn, namer, indent: int = 2) -> str:
    outs = " ".join(namer.binder(o) for o in eqn.outputs) or "_"
    params = ""
    shown = {k: v for k, v in eqn.params.items() if not k.startswith("_")}
    if shown:
        params = "[" + ", ".join(f"{k}={_fmt_param(v, namer, indent)}" for k, v in shown.items()) + "]"
    ins = " ".join(namer(a) for a in eqn.inputs)
    return " " * indent + f"{outs} = {eqn.primitive.name}{params} {ins}".rstrip()


def pp_program(p: Program, indent: int = 0, namer=None, n_consts: int = 0) -> str:
    """Print one equation per line, JAX style."""
    namer = namer or Namer()
    pad = " " * indent

    def binders(vs):
        return " ".join(namer.binder(v) for v in vs)

    head = f"{pad}{{ lambda {binders(p.in_vars[:n_consts])}; {binders(p.in_vars[n_consts:])}. let"
    lines = [head] + [pp_eqn(e, namer, indent + 4) for e in p.eqns]
    outs = ", ".join(namer(a) for a in p.out_atoms)
    lines.append(f"{pad}  in ({outs}) }}")
    return "\n".join(lines)

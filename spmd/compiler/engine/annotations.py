"""What the code generator decided for each equation, as typed records; rendered last.

:func:`spmd.compiler.engine.codegen.emit_eqns` plans first: it walks the equations
once, asks the rules and the buffer plan (:mod:`spmd.compiler.engine.buffers`) what
each one calls, which buffer its result goes into and which values it takes over,
and records the answers here.  Rendering (:func:`render`) then turns the records into
lines of source, and nothing decides anything from the text it renders.

Example::

    >>> render([Assign(("v2",), False, Call("xp.add", ("v0", "v1"), out="v0"))])
    ['v2 = xp.add(v0, v1, out=v0)']
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(slots=True)
class Call:
    """What an equation's line calls: a function by name (``fn``: a primitive's bound
    impl put in the namespace, or an ``xp`` ufunc) with ``args``, or the code
    ``template`` of a primitive's emit rule, taken as it is.  ``out``: the buffer it
    writes its result into (a keyword ``out=``); ``outs``: the buffers (or None, a new
    one) of each of several results (``out=(...)``, :func:`buffers.results_into`)."""

    fn: str | None
    args: tuple = ()
    out: str | None = None
    outs: tuple | None = None
    template: str | None = None

    def code(self) -> str:
        if self.fn is None:
            if self.out is None:
                return self.template
            # A reduction's call given the buffer as its last keyword.
            return f"{self.template[:-1]}, out={self.out})"
        kw = "" if self.out is None else f", out={self.out}"
        if self.outs is not None:
            kw = f", out=({', '.join(b or 'None' for b in self.outs)},)"
        return f"{self.fn}({', '.join(self.args)}{kw})"


@dataclasses.dataclass(slots=True)
class Assign:
    """One equation's line: its results named ``outs`` (a tuple unpacked where the
    primitive has several), ``call``, a ``note`` shown after it; ``copy_into``, a
    buffer the result is copied into (its code cannot write into it); ``tests``, the
    started requests to let progress after it."""

    outs: tuple
    multiple: bool
    call: Call
    note: str = ""
    copy_into: str | None = None
    tests: tuple = ()

    def lines(self) -> list:
        lhs = ((", ".join(self.outs) + ",") if self.outs else "_") if self.multiple \
            else self.outs[0]
        out = [f"{lhs} = {self.call.code()}{self.note}"]
        if self.copy_into is not None:
            out.append(f"{self.copy_into}[...] = {self.outs[0]}")
        out.extend(f"{h}.test()" for h in self.tests)
        return out


@dataclasses.dataclass(slots=True)
class Alloc:
    """A flat buffer allocated before the first value written into it."""

    name: str
    shape: object  # an int (one dimension) or a tuple
    dtype: str     # the namespace name of its dtype

    def lines(self) -> list:
        return [f"{self.name} = xp.empty({self.shape}, dtype={self.dtype})"]


@dataclasses.dataclass(slots=True)
class SlabCopy:
    """An operand copied into its slab ``[start:stop]`` of a flat buffer (code ``buf``)."""

    buf: str
    start: int
    stop: int
    src: str

    def lines(self) -> list:
        return [f"{self.buf}[{self.start}:{self.stop}] = {self.src}"]


@dataclasses.dataclass(slots=True)
class Compact:
    """A broadcast left to the ufunc that reads it: its operand, reshaped to ``shape``
    (None: as it is)."""

    out: str
    src: str
    shape: tuple | None

    def lines(self) -> list:
        if self.shape is None:
            return [f"{self.out} = {self.src}"]
        return [f"{self.out} = {self.src}.reshape({self.shape!r})"]


@dataclasses.dataclass(slots=True)
class Start:
    """A collective started: its request kept in ``handle``."""

    handle: str
    fn: str
    args: tuple
    note: str

    def lines(self) -> list:
        return [f"{self.handle} = {self.fn}({', '.join(self.args)}){self.note}"]


@dataclasses.dataclass(slots=True)
class Wait:
    """The wait for the request ``handle``, its result named ``out``."""

    out: str
    handle: str
    note: str

    def lines(self) -> list:
        return [f"{self.out} = {self.handle}.wait(){self.note}"]


def render(steps) -> list:
    """The lines of source of the planned ``steps``, in order."""
    return [ln for step in steps for ln in step.lines()]

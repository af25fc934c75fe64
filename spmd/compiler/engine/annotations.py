"""What the code generator decided for each equation, as typed records; rendered last.

:func:`spmd.compiler.engine.codegen.emit_eqns` plans first: it walks the equations
once, asks the rules and the buffer plan (:mod:`spmd.compiler.engine.buffers`) what
each one calls, which buffer its result goes into and which values it takes over,
and records the answers here.  Rendering (:func:`render`) then turns the records into
lines of source, each with the value names it mentions and binds (:class:`Line`, which
:func:`spmd.compiler.engine.codegen.release_dead_names` reads), and nothing decides
anything from the text it renders.

Example::

    >>> [ln.text for ln in render([Assign(("v2",), False,
    ...                                   Call("xp.add", ("v0", "v1"), out="v0"))])]
    ['v2 = xp.add(v0, v1, out=v0)']
"""

from __future__ import annotations

import dataclasses


class Code(str):
    """The source of an expression for a buffer, with the value names it mentions
    (``v3[0:128].reshape((8, 16))`` mentions ``v3``): planned beside the text, so
    that nothing reads the text back.  A plain string is a name itself."""

    def __new__(cls, text: str, names):
        self = super().__new__(cls, text)
        self.names = tuple(names)
        return self


def mentioned(code) -> tuple:
    """The value names ``code`` (a :class:`Code`, or a name) mentions."""
    return code.names if isinstance(code, Code) else (code,)


@dataclasses.dataclass(slots=True)
class Line:
    """A line of source, the names it mentions (reads, or writes into) and the names it
    binds (assigns)."""

    text: str
    mentions: tuple = ()
    binds: tuple = ()


@dataclasses.dataclass(slots=True)
class Call:
    """What an equation's line calls: a function by name (``fn``: a primitive's bound
    impl put in the namespace, or an ``xp`` ufunc) with ``args``, or the code
    ``template`` of a primitive's emit rule, taken as it is (made from ``args``, the
    operands it reads).  ``out``: the buffer it writes its result into (a keyword
    ``out=``); ``outs``: the buffers (or None, a new one) of each of several results
    (``out=(...)``, :func:`buffers.results_into`); ``writes``: the buffer a template's
    code writes into (its rule was given it)."""

    fn: str | None
    args: tuple = ()
    out: str | None = None
    outs: tuple | None = None
    template: str | None = None
    writes: str | None = None  # the buffer a template's code writes into, if any

    def mentions(self) -> tuple:
        """Its operands' and buffers' names (a template's code mentions its ``args``)."""
        got = [n for a in self.args for n in mentioned(a)]
        for b in (self.out, self.writes):
            if b is not None:
                got += mentioned(b)
        got += [n for b in self.outs or () if b is not None for n in mentioned(b)]
        return tuple(got)

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
        if self.multiple:
            lhs = (", ".join(self.outs) + ",") if self.outs else "_"
        else:
            lhs = self.outs[0]
        # A line of several results binds each of them too: a fused kernel's or a
        # loop's results are released after their last read, as any other value.
        out = [Line(f"{lhs} = {self.call.code()}{self.note}",
                    self.call.mentions() + self.outs, self.outs)]
        if self.copy_into is not None:
            out.append(Line(f"{self.copy_into}[...] = {self.outs[0]}",
                            mentioned(self.copy_into) + self.outs[:1]))
        out.extend(Line(f"{h}.test()") for h in self.tests)
        return out


@dataclasses.dataclass(slots=True)
class Alloc:
    """A flat buffer allocated before the first value written into it."""

    name: str
    shape: object  # an int (one dimension) or a tuple
    dtype: str     # the namespace name of its dtype

    def lines(self) -> list:
        return [Line(f"{self.name} = xp.empty({self.shape}, dtype={self.dtype})",
                     (self.name,), (self.name,))]


@dataclasses.dataclass(slots=True)
class SlabCopy:
    """An operand copied into its slab ``[start:stop]`` of a flat buffer (code ``buf``)."""

    buf: str
    start: int
    stop: int
    src: str

    def lines(self) -> list:
        return [Line(f"{self.buf}[{self.start}:{self.stop}] = {self.src}",
                     mentioned(self.buf) + mentioned(self.src))]


@dataclasses.dataclass(slots=True)
class Compact:
    """A broadcast left to the ufunc that reads it: its operand, reshaped to ``shape``
    (None: as it is)."""

    out: str
    src: str
    shape: tuple | None

    def lines(self) -> list:
        text = f"{self.out} = {self.src}" if self.shape is None else \
            f"{self.out} = {self.src}.reshape({self.shape!r})"
        return [Line(text, (self.out, self.src), (self.out,))]


@dataclasses.dataclass(slots=True)
class Start:
    """A collective started: its request kept in ``handle``."""

    handle: str
    fn: str
    args: tuple
    note: str

    def lines(self) -> list:
        return [Line(f"{self.handle} = {self.fn}({', '.join(self.args)}){self.note}",
                     self.args)]


@dataclasses.dataclass(slots=True)
class Wait:
    """The wait for the request ``handle``, its result named ``out``."""

    out: str
    handle: str
    note: str

    def lines(self) -> list:
        return [Line(f"{self.out} = {self.handle}.wait(){self.note}", (self.out,),
                     (self.out,))]


def render(steps) -> list:
    """The lines of source (:class:`Line`) of the planned ``steps``, in order."""
    return [ln for step in steps for ln in step.lines()]

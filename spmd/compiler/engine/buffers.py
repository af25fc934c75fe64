"""Which buffers the generated code owns alone, and may therefore write into.

The code generator (:mod:`spmd.compiler.engine.codegen`) writes a result into an operand's
buffer (a ufunc's ``out=``), updates an operand in place (``rules.in_place``:
``dynamic_update_slice``, ``scatter``), recycles dead buffers, and hands operands
over to a ``cond``'s branches (``rules.donated_impl``) only where nothing else can
see the buffer: a value made by this code (a ufunc's or a ``fresh_result``
primitive's result) or donated to it (a loop's carry), with no later reader and no
live view.  These are the rules it asks; ``docs/architecture.md`` ("Updates in
place") says why each is needed, and ``tests/compiler/test_in_place.py`` has a case
that fails without each.
"""

from __future__ import annotations

from spmd.compiler.core.ir import Var


def read_counts(eqns, live_out) -> dict:
    """How many times each variable is read by ``eqns``, program outputs (``live_out``)
    counting once more: a value with one read is read by that equation alone."""
    uses: dict = {}
    for eqn in eqns:
        for a in eqn.inputs:
            if isinstance(a, Var):
                uses[a] = uses.get(a, 0) + 1
    for a in live_out:
        if isinstance(a, Var):
            uses[a] = uses.get(a, 0) + 1
    return uses


def results_into(eqn, rule, owned, uses, dead, names) -> tuple | None:
    """The ``out=(...)`` of a call: the buffers a primitive with several fresh results
    writes them into (``rules.results_into(j, **params)``: the operands result ``j``
    may overwrite), as a ufunc writes into a dead or dying buffer: an operand this
    code owns alone and never reads again, else a dead value's buffer; else ``None``
    (it allocates); None where all are (no ``out=``).  Without it a fused kernel's
    results were new allocations where the unfused code wrote in place: a step's heap
    grew by 380 MiB."""
    taken, bufs = set(), []
    for j, o in enumerate(eqn.outputs):
        buf = None
        for k in rule(j, **eqn.params):
            a = eqn.inputs[k]
            if a not in taken and alone(a, owned, uses, dead) and \
                    (a.aval.shape, a.aval.dtype) == (o.aval.shape, o.aval.dtype):
                taken.add(a)
                dead.handed_on.add(a)
                buf = names[a]
                break
        bufs.append(buf or (dead.take(o.aval) if o.aval.ndim else None))
    return None if all(b is None for b in bufs) else tuple(bufs)


def reusable_input(eqn, owned, uses):
    """An input whose buffer the equation's ufunc may overwrite, or ``None``.

    Hand-written numpy gets this for free: ``x @ w + b`` adds into the matmul's
    temporary (numpy elides temporaries whose reference count is 1), which the
    generated code's named values defeat.  So the code generator does it
    explicitly, with ``out=``, for an input that

    - was produced in this program by a ufunc or a ``fresh_result``
      primitive, so that no argument, constant or view shares its buffer;
    - has this equation as its only use (so no view of it exists either, and
      nothing reads it afterwards) and is not a program output;
    - has the result's shape and dtype.
    """
    out = eqn.outputs[0].aval
    for a in eqn.inputs:
        if (isinstance(a, Var) and a in owned and uses.get(a) == 1
                and a.aval.shape == out.shape and a.aval.dtype == out.dtype):
            return a
    return None


def alone(a, owned, uses, dead) -> bool:
    """Whether ``a``'s buffer is this code's alone and its one reader is the equation
    at hand (so nothing reads it afterwards, and no view of it exists)."""
    return (isinstance(a, Var) and a in owned and uses.get(a) == 1 and a.aval.ndim > 0
            and a not in dead.aliased and a not in dead.handed_on)


def updatable_operand(eqn, owned, uses, dead):
    """Operand 0 of a primitive with an ``in_place`` rule (``dynamic_update_slice``,
    ``scatter``) when its buffer may be updated rather than copied: owned by this code
    (made here, or donated), with this equation its only reader (so it is no output
    and no view of it exists), of the result's shape and dtype."""
    if eqn.primitive.rules.in_place is None or not eqn.inputs:
        return None
    x, out = eqn.inputs[0], eqn.outputs[0].aval
    if not (isinstance(x, Var) and x.aval.shape == out.shape and x.aval.dtype == out.dtype):
        return None
    return x if takeable(x, eqn, owned, uses, dead) else None


def takeable(a, eqn, owned, uses, dead) -> bool:
    """Whether ``eqn`` may take ``a``'s buffer over (update it in place, or hand it to a
    ``cond``'s or a loop's programs to update): :func:`alone`, or read before (a slot
    taken out of a buffer, then the buffer updated) but still this code's own: this
    is its last reader, it reads it once, and every view of it read so far is dead."""
    if alone(a, owned, uses, dead):
        return True
    return (isinstance(a, Var) and a in owned and a.aval.ndim > 0
            and sum(b is a for b in eqn.inputs) == 1 and dead.remaining.get(a) == 1
            and a not in dead.handed_on
            and all(dead.remaining.get(v, 0) == 0 for v in dead.views.get(a, ())))


class DeadBuffers:
    """Buffers of values that nothing reads any more, by (shape, dtype).

    A fresh result (a ufunc's, a matmul's) is written into one of them with
    ``out=`` rather than into a new allocation: fewer and smaller heap
    peaks, so fewer page faults (a training step on large batches otherwise
    grows and trims the heap by tens of megabytes per call), as a careful
    numpy user reusing temporaries gets.  A value's buffer becomes dead at
    its last use when it is owned (see :func:`reusable_input`), is not an
    output, was not handed on (written in place by a later value) and every
    equation that read it returns a new array (no view of it can exist).
    """

    def __init__(self, eqns, live_out):
        self.remaining = read_counts(eqns, live_out)
        self.aliased: set = set()  # read by code that may return a view of it
        self.handed_on: set = set()  # its buffer now holds a later value
        self.keep: set = set()  # never recycled (donated arguments)
        self.free: dict = {}
        # value -> the values that may be views of its buffer (read by code that may
        # return a view of it, or of one of them): it may be updated in place once
        # they are all dead.
        self.views: dict = {}
        self.owners: dict = {}  # value -> the values whose buffer it may be a view of

    def take(self, aval) -> str | None:
        names = self.free.get((aval.shape, aval.dtype))
        return names.pop() if names else None

    def release_inputs(self, eqn, names, owned, never_aliases: bool,
                       aliasing=None) -> None:
        """The equation has read its inputs.  Its results may share the buffers of
        all of them unless ``never_aliases`` (of none), or, with ``aliasing`` (per
        result, the positions of the inputs it may share: a ``cond`` whose branches
        return views of some operands only), of those."""
        outs = eqn.outputs
        for k, a in enumerate(eqn.inputs):
            if not isinstance(a, Var):
                continue
            sharing = () if never_aliases else outs if aliasing is None else \
                [o for o, ks in zip(outs, aliasing) if k in ks]
            if sharing:
                self.aliased.add(a)
                for owner in (a, *self.owners.get(a, ())):
                    self.views.setdefault(owner, set()).update(sharing)
                for o in sharing:
                    self.owners.setdefault(o, set()).update((a, *self.owners.get(a, ())))
            self.remaining[a] -= 1
            if (self.remaining[a] == 0 and a in owned and a not in self.aliased
                    and a not in self.handed_on and a not in self.keep and a.aval.ndim):
                self.free.setdefault((a.aval.shape, a.aval.dtype), []).append(names[a])


class Ownership:
    """What :func:`emit_eqns` learned of the buffers: the donated arguments its code
    writes into (``consumed``), and which values own their buffer alone."""

    def __init__(self, owned, dead, donated):
        self.owned, self.dead, self.donated = owned, dead, frozenset(donated)

    @property
    def consumed(self) -> set:
        """The donated arguments whose buffer now holds a later value."""
        return self.dead.handed_on & self.donated

    def aliases(self, a, args) -> frozenset:
        """The positions among ``args`` (the program's arguments) whose buffers output
        ``a`` may share: the argument itself, or one it may be a view of."""
        if not isinstance(a, Var):
            return frozenset()
        owners = self.dead.owners.get(a, ())
        return frozenset(k for k, v in enumerate(args) if v is a or v in owners)

    def exclusive(self, a, outs) -> bool:
        """Whether output ``a``'s buffer is referenced by nothing else: made (or
        donated) here, never read by code that may return a view of it, and not
        returned twice."""
        return (isinstance(a, Var) and a in self.owned and a not in self.dead.aliased
                and sum(o is a for o in outs) == 1)

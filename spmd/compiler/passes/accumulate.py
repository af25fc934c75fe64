"""Products added into the buffer of the value they are summed with: ``acc + x @ y``
as one BLAS call.

Summing gradients over microbatches or loop steps (``acc = acc + x.T @ g``: a pipeline
stage's weight gradients, a ``fori_loop`` of gradient accumulation) costs, written as
a product and an add, a new buffer for the product, written and read back, and the
accumulator read and written: three passes over memory that the product alone does
not make.  BLAS's ``gemm`` computes ``C = alpha A B + beta C``; with ``beta = 1`` it
adds each block of the product into ``C`` as it makes it.  A hand-written numpy step
cannot ask for that (``np.matmul`` has no ``beta``); the generated code does, through
the CBLAS entry points of numpy's own OpenBLAS (so its thread count and holds apply).

Measured (one rank of two, one BLAS thread each; four ``(64, 1024)^T @ (64, 1024)``
products into a 16 MiB accumulator, the caches cold as in a pipeline tick): 7.4-8.3 ms
as products and an add, 6.5 ms accumulated, as fast as the products alone into a new
buffer (6.4 ms).

:class:`Accumulations` finds where this applies (see its docstring);
:func:`spmd.compiler.engine.gemm.gemm_into` makes the call.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.engine.annotations import Code
from spmd.compiler.engine.buffers import alone
from spmd.compiler.engine.gemm import GEMM_DTYPES
from spmd.compiler.core.ir import Var
from spmd.compiler.ops.elementwise import add_p
from spmd.compiler.ops.linalg import dot_general_p
from spmd.compiler.ops.structural import reshape_p

# A sum smaller than this (elements) stays a product and an add: the product's buffer
# is then in cache, and the add costs less than the foreign call's setup.
MIN_ELEMENTS = 1 << 14


class _Group:
    """One sum ``acc + total`` whose ``total`` is made by ``products`` (one product, or
    the slabs of a ``concatenate`` (``buf``) that :class:`~spmd.compiler.engine.flat_writes.
    FlatWrites` has every product write into)."""

    __slots__ = ("acc", "total", "products", "first", "buf", "view", "decided")

    def __init__(self, acc, total, products, first, buf, view=None):
        self.acc, self.total, self.products, self.first, self.buf = \
            acc, total, products, first, buf
        self.view = view  # the product's shape, where a reshape gives it acc's
        self.decided = None  # at the first product: whether acc's buffer takes them


class Accumulations:
    """The sums ``acc + total`` (``add``) whose ``total`` is made only by products that
    can write into ``acc``'s buffer instead, accumulating (:func:`gemm_into`).

    ``total`` is one ``dot_general`` result (or its ``reshape`` adding or removing
    leading axes of one), or a ``concatenate`` of slabs each written by a
    ``dot_general`` (the gradients of weights stacked over layers), read by the sum
    alone; ``acc`` is read by the sum alone, exists before the first product, and has
    the sum's shape and dtype (float32 or float64, at least :data:`MIN_ELEMENTS`).
    Whether its buffer may take the products is decided when the first one is emitted
    (:meth:`decide`): the code must own it alone then (made here or donated: a loop's
    carry).  The sum then names ``acc``'s buffer and emits nothing.  Only numpy, and
    products of one matrix (no batch of several, which the engine's threads share).
    """

    def __init__(self, eqns, uses, flat, xp):
        self._by_first: dict = {}
        self._by_product: dict = {}
        self._by_sum: dict = {}
        if xp is not np:
            return
        producer, live = flat.producer, flat.live  # (the program's, as FlatWrites read it)
        concats = {e.outputs[0]: e for e in flat.copies}
        for e in eqns:
            if e.primitive is add_p and len(e.inputs) == 2:
                group = self._plan(e, producer, live, uses, flat, concats)
                if group is not None:
                    self._by_sum[e] = group
                    self._by_first.setdefault(group.first, []).append(group)
                    for p in group.products:
                        self._by_product[p] = group

    @staticmethod
    def _plan(e, producer, live, uses, flat, concats):
        out = e.outputs[0].aval
        if np.dtype(out.dtype) not in GEMM_DTYPES or out.size < MIN_ELEMENTS:
            return None
        for acc, total in (e.inputs, e.inputs[::-1]):
            if not (isinstance(acc, Var) and isinstance(total, Var)) or acc is total or \
                    any(v.aval.shape != out.shape or v.aval.dtype != out.dtype
                        for v in (acc, total)) or \
                    any(uses.get(v) != 1 or v in live for v in (acc, total)):
                continue
            view = None
            if total in concats:
                if flat.copies[concats[total]]:
                    continue  # a slab is copied in: not all of it products
                made = [producer[g][1] for g, (buf, _, _) in flat.views.items()
                        if buf is total]
                buf = total
            elif total in producer and total not in flat.views:
                made, buf = [producer[total][1]], None
                g = made[0].inputs[0] if made[0].primitive is reshape_p else None
                if g is not None:
                    # A product given leading axes of one (a stage's gradient of its
                    # (1, ...) block of stacked weights): written into acc's buffer
                    # seen in the product's shape, always a view.
                    if not (isinstance(g, Var) and g in producer and uses.get(g) == 1
                            and g not in live and g not in flat.views
                            and _squeezed(g.aval.shape) == _squeezed(out.shape)):
                        continue
                    made, view = [producer[g][1]], tuple(g.aval.shape)
            else:
                continue
            if not made or not all(_accumulates(p) for p in made):
                continue
            first = min(producer[p.outputs[0]][0] for p in made)
            if acc in producer and producer[acc][0] >= first:
                continue  # made after the first product: its buffer is not there yet
            return _Group(acc, total, made, first, buf, view)
        return None

    def decide(self, i, names, owned, uses, dead, flat) -> None:
        """At equation ``i``: decide the groups whose first product it is (``acc``'s
        buffer this code's alone), the slabs of a decided group's ``concatenate``
        going into ``acc``'s buffer rather than a new one."""
        for g in self._by_first.get(i, ()):
            g.decided = g.acc in names and alone(g.acc, owned, uses, dead)
            if g.decided and g.buf is not None:
                flat.write_into(g.buf, names[g.acc], names)

    def target(self, eqn, names, flat) -> str | None:
        """The buffer (code) a decided product accumulates into, or None."""
        g = self._by_product.get(eqn)
        if g is None or not g.decided:
            return None
        if g.buf is not None:
            return flat.view(eqn, names)
        if g.view is None:
            return names[g.acc]
        return Code(f"{names[g.acc]}.reshape({g.view!r})", (names[g.acc],))

    def emit_sum(self, eqn, names, owned, dead) -> bool:
        """A decided sum: its result is ``acc``'s buffer, which holds it already (True);
        otherwise False, and the sum is emitted as usual."""
        g = self._by_sum.get(eqn)
        if g is None or not g.decided:
            return False
        out = eqn.outputs[0]
        names[out] = names[g.acc]
        owned.add(out)
        dead.handed_on.update((g.acc, g.total))  # their buffer holds the result now
        dead.release_inputs(eqn, names, owned, never_aliases=True)
        return True


def _squeezed(shape) -> tuple:
    """``shape`` without its leading axes of one."""
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _accumulates(eqn) -> bool:
    """Whether ``eqn`` is a product whose emitted code can accumulate (a form
    :func:`gemm_into` takes: one matrix, not a batch of several)."""
    if eqn.primitive is not dot_general_p or len(eqn.outputs) != 1:
        return False
    emit = eqn.primitive.rules.emit_avals
    avals = [a.aval for a in eqn.inputs]
    return emit(["a", "b"], avals, xp=np, out="o", accumulate=True, **eqn.params) is not None

"""How ``scan`` and ``while`` run: a Python loop generated per arity around the
body's compiled code, and which carries it gives buffers of their own.

Each iteration is one call of the compiled body with named arguments (no
per-iteration list building).  Carries are donated to the body
(:func:`spmd.compiler.engine.codegen.compile_program`): where its code updates one in place
(a ``dynamic_update_slice`` or scatter on it, an elementwise result written into it)
the loop gives it a buffer of its own once, instead of the whole-buffer copy each
iteration made (a fori_loop writing row i of an n-row array copied it n times).

That buffer is a copy of the initial value, unless the code around the loop hands
the initial value over (``rules.donated_impl``: a value it made, reads nowhere
else and has no view of; e.g. the previous loop's carry, as a pipeline's runs of
ticks pass their gradient sums on): then the loop takes that buffer, and its
results are the caller's own in turn (a 16 MiB gradient sum was copied at the start
of each of a pipeline step's two or three loops).
"""

from __future__ import annotations

# (kind, arity, copied, recopied) -> the generated loop function
_LOOPS: dict = {}


def _names(prefix, n):
    return [f"{prefix}{k}" for k in range(n)]


def _unpack(names, value) -> str:
    return f"{', '.join(names)}, = {value}" if names else ""


def _loop_fn(kind, *arity):
    key = (kind,) + arity
    fn = _LOOPS.get(key)
    if fn is None:
        src = _scan_src(*arity) if kind == "scan" else _while_src(*arity)
        ns: dict = {}
        exec(compile(src, f"<spmd:{kind}_loop>", "exec"), ns)
        fn = _LOOPS[key] = ns["loop"]
    return fn


def _scan_src(nc, ncar, nx, ny, own=(), recopy=()):
    c, h, x, y, v = (_names(p, n) for p, n in
                     (("c", nc), ("h", ncar), ("x", nx), ("y", ny), ("v", ny)))
    call = f"body({', '.join(c + h + [f'{xk}[i]' for xk in x])})"
    lines = ["def loop(body, order, args, ys):", "    " + _unpack(c + h + x, "args"),
             *_copies(h, own, "    "), "    " + _unpack(y, "ys"), "    for i in order:",
             "        " + (_unpack(h + v, call) or call), *_copies(h, recopy, "        ")]
    lines += [f"        {yk}[i] = {vk}" for yk, vk in zip(y, v)]
    lines.append(f"    return [{', '.join(h)}]")
    return "\n".join(ln for ln in lines if ln.strip()) + "\n"


def _while_src(ncc, nbc, ncar, own=(), recopy=()):
    cc, bc, h = _names("a", ncc), _names("b", nbc), _names("h", ncar)
    body = f"body({', '.join(bc + h)})"
    lines = ["def loop(cond, body, args):", "    " + _unpack(cc + bc + h, "args"),
             *_copies(h, own, "    "), f"    while cond({', '.join(cc + h)})[0]:",
             "        " + (_unpack(h, body) or body), *_copies(h, recopy, "        "),
             f"    return [{', '.join(h)}]"]
    return "\n".join(ln for ln in lines if ln.strip()) + "\n"


def _copies(h, which, indent) -> list:
    return [f"{indent}{h[k]} = {h[k]}.copy()" for k in which]


# Only the carries the loop gives a buffer of its own (a copy, or the caller's handed
# over) are donated: a carry donated but neither would be the caller's buffer, and a
# body passing it through to a carry it updates would write there (a jvp's tangent
# carries, swapped each step, did: a silent wrong tangent, found by the suite).  A
# donated carry the body returns in a buffer something else may reference (an input
# passed through, a view, a constant, a result returned twice) is copied again before
# the next iteration.
def donated_body(program, xp, first: int, n: int):
    """``(body, own, recopy)``: the body's code with the carries it updates donated
    (its arguments ``first`` to ``first + n``), the carries the loop gives buffers of
    their own before the loop (``own``: all the donated ones) and copies after every
    iteration (``recopy``)."""
    # (inner: core.jit imports the pass pipeline, which loads spmd.compiler.ops)
    from spmd.compiler.core.jit import executable_for

    carries = tuple(range(first, first + n))
    probe = executable_for(program, xp, donated=carries)
    donated = tuple(sorted(probe.consumed))
    # A probe that writes into no carry is the body as it is: its claims of exclusive
    # results are never read (nothing is copied).  Only a proper subset is compiled
    # again, so that no carry the loop leaves the caller's counts as exclusive.
    body = probe if donated in (carries, ()) else \
        executable_for(program, xp, donated=donated)
    own = tuple(k - first for k in donated)
    return body, own, tuple(k for k in own if not body.exclusive[k])


def _taken(own, given, first: int):
    """The carries among ``own`` whose initial value the caller handed over (``given``:
    positions among the equation's inputs, the carries from ``first``), and the
    others, which the loop copies."""
    taken = tuple(k for k in own if first + k in given)
    return taken, tuple(k for k in own if k not in taken)


def scan_runner(xp, program, num_consts: int, num_carry: int, length: int,
                reverse: bool, given=frozenset()):
    """``(impl, consumed, exclusive)`` of a scan: ``impl(*operands)``; the operand
    positions whose buffers it writes into (the carries at ``given`` it takes); and for
    each result whether its buffer is the caller's alone (the carries the loop owns,
    and the stacked ``ys``, made here)."""
    body, own, recopy = donated_body(program, xp, num_consts, num_carry)
    taken, copied = _taken(own, given, num_consts)
    y_avals = program.out_avals[num_carry:]
    nx = len(program.in_avals) - num_consts - num_carry
    loop = _loop_fn("scan", num_consts, num_carry, nx, len(y_avals), copied, recopy)
    order = range(length - 1, -1, -1) if reverse else range(length)
    fn = getattr(body, "fn", body)

    def impl(*args):
        ys = [xp.empty((length,) + a.shape, dtype=a.dtype) for a in y_avals]
        return loop(fn, order, args, ys) + ys

    # (What tests read: the carries copied before the loop; and the body's program,
    # whose compiled code the jit layer caches for as long as the program lives.)
    impl.copied, impl.programs = copied, (program,)
    exclusive = tuple(k in own for k in range(num_carry)) + (True,) * len(y_avals)
    return impl, frozenset(num_consts + k for k in taken), exclusive


def while_runner(xp, cond_program, body_program, cond_nconsts: int, body_nconsts: int,
                 given=frozenset()):
    """:func:`scan_runner` for a ``while`` loop (its results: the final carries)."""
    # (inner: core.jit imports the pass pipeline, which loads spmd.compiler.ops)
    from spmd.compiler.core.jit import executable_for

    cond = executable_for(cond_program, xp)
    n_carry = len(body_program.out_avals)
    body, own, recopy = donated_body(body_program, xp, body_nconsts, n_carry)
    first = cond_nconsts + body_nconsts
    taken, copied = _taken(own, given, first)
    loop = _loop_fn("while", cond_nconsts, body_nconsts, n_carry, copied, recopy)
    cond_fn, body_fn = getattr(cond, "fn", cond), getattr(body, "fn", body)

    def impl(*args):
        return loop(cond_fn, body_fn, args)

    impl.copied, impl.programs = copied, (cond_program, body_program)
    exclusive = tuple(k in own for k in range(n_carry))
    return impl, frozenset(first + k for k in taken), exclusive

"""Every rule of a primitive is set by the module that creates the primitive.

A rule set on another module's primitive (``other_p.def_jvp(...)``,
``other_p.rules.x = ...``) works only if that module is imported after the
owner, and replaces the owner's rule without a trace in the owner's file.  This
test imports the whole package in a fresh interpreter with :class:`Primitive` and
:class:`Rules` watched: each primitive remembers the module whose code created it,
and every rule set on it later must come from the same module.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

# The watcher, run in a fresh interpreter: the instrumentation must be in place
# before any primitive exists.
_WATCH = textwrap.dedent('''
    import json, sys
    from spmd.compiler.core import primitives as P

    RULES = ("impl", "abstract_eval", "jvp", "transpose", "batch", "vma", "emit",
             "unreduced")
    owner, owner_of_rules, found = {}, {}, []

    def caller():
        """The module whose top-level code runs now (the innermost import), and its
        line: a factory of another module (elementwise's ``unary``) called there
        works for it; a rule set later, from a function, counts as this script's."""
        f = sys._getframe(2)
        while f.f_code.co_name != "<module>":
            f = f.f_back
        return f.f_globals.get("__name__"), f.f_lineno

    init, setattr_prim = P.Primitive.__init__, P.Primitive.__setattr__
    setattr_rules = P.Rules.__setattr__

    def watched_init(self, name, **kw):
        owner[id(self)] = (name, caller()[0])
        init(self, name, **kw)
        owner_of_rules[id(self.rules)] = owner[id(self)]

    def watched_setattr(self, attr, value):
        if attr in RULES and id(self) in owner:
            check(owner[id(self)], attr)
        setattr_prim(self, attr, value)

    def watched_rules_setattr(self, attr, value):
        if id(self) in owner_of_rules:
            check(owner_of_rules[id(self)], "rules." + attr)
        setattr_rules(self, attr, value)

    def check(name_module, attr):
        name, module = name_module
        by, line = caller()
        if by != module:
            found.append(f"{name}.{attr}: set in {by}:{line}, created in {module}")

    P.Primitive.__init__ = watched_init
    P.Primitive.__setattr__ = watched_setattr
    P.Rules.__setattr__ = watched_rules_setattr

    import spmd, spmd.numpy, spmd.lax, spmd.random, spmd.shard, spmd.autodiff  # noqa
    import spmd.compiler.ops, spmd.collectives.mpi, spmd.host, spmd.nn  # noqa
    import spmd.parallel, spmd.optim, spmd.scipy, spmd.checkpointing  # noqa
    print(json.dumps({"primitives": len(owner), "found": found}))
''')


# Known cases, each to move into its primitive's module; the list only shrinks (a
# case fixed must leave it), and is empty.
KNOWN: set = set()


def _watch() -> dict:
    # From the repository's root, so that the interpreter imports this checkout's spmd.
    root = pathlib.Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _WATCH], capture_output=True, text=True,
                         check=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_each_rule_is_set_where_its_primitive_is_created():
    got = _watch()
    assert got["primitives"] > 100, got  # the watcher saw the package's primitives
    found = {f.split(":")[0] + ": set in " + f.split(" set in ")[1].split(":")[0]: f
             for f in got["found"]}
    new = sorted(f for k, f in found.items() if k not in KNOWN)
    assert not new, "rules set outside their primitive's module:\n" + "\n".join(new)
    assert set(found) >= KNOWN, f"fixed, drop from KNOWN: {sorted(KNOWN - set(found))}"

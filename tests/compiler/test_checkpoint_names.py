"""checkpoint_name, the name-based checkpoint policies, saved_residuals and
print_saved_residuals (JAX's ad_checkpoint API)."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P
from spmd import NamedSharding as NS
from spmd.ad_checkpoint import (checkpoint_name, checkpoint_policies as pol,
                                print_saved_residuals, saved_residuals)
from spmd.errors import ArgumentError

RNG = np.random.default_rng(0)
W = (RNG.standard_normal((4, 4)) * 0.5).astype(np.float32)
X = RNG.standard_normal((2, 4)).astype(np.float32)


def layer(w, x):
    h = checkpoint_name(snp.sin(x @ w), "h")
    g = checkpoint_name(snp.cos(h @ w), "g")
    return snp.sum(snp.tanh(g))


def _sources(policy):
    f = spmd.checkpoint(layer, policy=policy)
    return [src for _, src in saved_residuals(f, W, X)]


def _named(sources):
    return sorted(s.split("'")[1] for s in sources if s.startswith("named"))


def _computed(sources):
    return [s for s in sources if not s.startswith(("named", "from the argument"))]


PLAIN = spmd.grad(layer, argnums=(0, 1))(W, X)


@pytest.mark.parametrize("policy,named,computed", [
    (pol.save_only_these_names("h"), ["h"], False),
    (pol.save_only_these_names("h", "g"), ["g", "h"], False),
    (pol.save_any_names_but_these("h"), ["g"], False),
    (pol.save_anything_except_these_names("g"), ["h"], True),
    (pol.save_from_both_policies(pol.save_only_these_names("g"), pol.dots_saveable), ["g"], True),
    (pol.save_and_offload_only_these_names(names_which_can_be_saved=["h"],
                                           names_which_can_be_offloaded=["g"]), ["g", "h"],
     False),
    (pol.nothing_saveable, [], False),
])
def test_policies_save_the_named_values(policy, named, computed):
    sources = _sources(policy)
    assert _named(sources) == named, sources
    assert bool(_computed(sources)) == computed, sources
    assert "from the argument w" in sources and "from the argument x" in sources
    f = spmd.checkpoint(layer, policy=policy)
    for got, want in zip(spmd.grad(f, argnums=(0, 1))(W, X), PLAIN):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(spmd.jit(spmd.grad(f, argnums=(0, 1)))(W, X), PLAIN):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_saving_a_name_avoids_recomputing_it():
    def recomputed(policy, prim):
        prog = spmd.jit(spmd.grad(spmd.checkpoint(layer, policy=policy))).lower(W, X).program
        remats = [e for e in prog.eqns if e.primitive.name == "remat"]
        return sum(1 for r in remats for e in r.params["program"].program.eqns
                   if e.primitive.name == prim)

    # Without saving, h = sin(x @ w) and sin(h @ w) (the derivative of cos) are
    # recomputed; with h saved only the latter is (x @ w is still recomputed for
    # sin's derivative cos(x @ w): it was not named).
    assert recomputed(pol.nothing_saveable, "sin") == 2
    assert recomputed(pol.save_only_these_names("h"), "sin") == 1
    assert recomputed(pol.save_only_these_names("h"), "name") == 1  # only 'g'



def test_checkpoint_name_is_the_identity_elsewhere():
    x = np.arange(3.0, dtype=np.float32)
    out = checkpoint_name({"a": x, "b": (x * 2,)}, "t")
    assert np.asarray(out["b"][0]).tolist() == [0.0, 2.0, 4.0]
    assert float(spmd.grad(lambda v: checkpoint_name(v * v, "sq").sum())(x)[2]) == 4.0
    _, t = spmd.jvp(lambda v: checkpoint_name(snp.sin(v), "s"), (x,), (np.ones(3, np.float32),))
    np.testing.assert_allclose(t, np.cos(x), rtol=1e-6)
    np.testing.assert_allclose(spmd.vmap(lambda v: checkpoint_name(v + 1, "p"))(x), x + 1)
    assert "name[name='sq']" in str(spmd.make_jaxpr(lambda v: checkpoint_name(v * v, "sq"))(x))
    with pytest.raises(ArgumentError, match="str"):
        checkpoint_name(x, 3)


def test_checkpoint_name_keeps_a_sharding():
    mesh = spmd.make_mesh((4, 2), ("data", "model"))
    f = spmd.jit(lambda v: checkpoint_name(snp.tanh(v), "t") * 2,
                 in_shardings=(NS(mesh, P("data", "model")),))
    x = RNG.standard_normal((8, 4)).astype(np.float32)
    lo = f.lower(x)
    assert not lo.collectives(), lo.as_text()
    out = f(x)
    assert out.sharding == NS(mesh, P("data", "model"))
    np.testing.assert_allclose(out, np.tanh(x) * 2, rtol=1e-6)


def test_print_saved_residuals(capsys):
    print_saved_residuals(lambda x: snp.sin(snp.sin(x)).sum(), np.ones(3, np.float32))
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(ln.startswith("f32[3] output of cos from ") for ln in lines)
    print_saved_residuals(spmd.checkpoint(layer, policy=pol.save_only_these_names("h")), W, X)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:2] == ["f32[4,4] from the argument w", "f32[2,4] from the argument x"]
    assert lines[2].startswith("f32[2,4] named 'h' from ")


def test_residual_sources_name_pytree_arguments_by_path():
    def predict(params, x):
        for i, (w, b) in enumerate(params):
            x = checkpoint_name(snp.sin(w @ x + b), f"layer{i}")
        return x.sum()

    params = [(W, X[0]), (W, X[1])]
    f = spmd.checkpoint(predict, policy=pol.save_only_these_names("layer0"))
    sources = [src for _, src in saved_residuals(f, params, X[0])]
    assert "from the argument params[0][0]" in sources
    assert "from the argument params[1][1]" in sources
    assert _named(sources) == ["layer0"]

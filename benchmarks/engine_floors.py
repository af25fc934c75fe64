"""The transformer step of ``examples/train_transformer.py`` as users would write it
in JAX + optax and in PyTorch: the engines spmd is measured against.

Same model and maths as the example (pre-norm blocks, layer norm eps 1e-5, causal
attention with the 1/sqrt(head_dim) scale through each library's attention function
(``jax.nn.dot_product_attention``, as the example calls spmd's), tanh-approximated GELU as
``spmd.nn.gelu``, output weights tied to the token embedding, mean next-symbol
cross-entropy) and the same optimizer (AdamW, b1=0.9, b2=0.99, eps=1e-8,
weight decay 0.01 on parameters with ndim > 1 only, learning rate
``warmup_cosine_decay_schedule(0, lr, warmup, max(steps, warmup + 1),
end_value=lr / 10)`` evaluated at the number of updates done before, so the first
update has rate 0).

Both start from parameters given as a dict of numpy arrays in the example's layout::

    {"tok": (vocab, d), "pos": (context, d), "lnf": (g, b),
     "blocks": [{"ln1": (g, b), "ln2": (g, b), "wqkv": (d, 3, heads, head_dim),
                 "wo": (heads, head_dim, d), "w1": (d, 4d), "b1": (4d,),
                 "w2": (4d, d), "b2": (d,)}, ...]}

(e.g. ``tree_map(np.asarray, T.init_params(cfg, T.param_specs(cfg, False), mesh, 0))``),
so their losses can be compared with spmd's step by step.  ``cfg`` is a dict with
``d_model, heads, layers, context, vocab``.

    import engine_floors as ef
    ef.jax_available(), ef.torch_available()      # None, or why it cannot be used
    step, state = ef.make_jax_step(cfg, params_np, None, lr, warmup, steps)    # jax.jit, 1 device
    step, state = ef.make_jax_step(cfg, params_np, (4, 2), lr, warmup, steps)  # shard_map, data x model
    step, state = ef.make_torch_step(cfg, params_np, lr, warmup, steps)        # eager, CPU
    state, loss = step(state, batch)   # batch: int (B, context + 1) numpy; loss: a float
    ef.params_numpy(state)             # the current parameters, in the layout above

JAX: the mesh version is one ``jax.jit(jax.shard_map(...))`` with the example's
PartitionSpecs over ``('data', 'model')`` (Megatron split of heads and MLP hidden
units, ``psum`` over 'model' after ``wo`` and ``w2``, ``pmean`` of the loss over
'data', ``value_and_grad`` inside the shard_map, optax's AdamW applied to each
device's blocks).  It needs ``data * model`` devices: on a CPU-only machine the
first call to :func:`import_jax` sets ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
(and ``JAX_PLATFORMS=cpu``) unless the caller has already set them, so set them
yourself, before anything imports jax, if you need another count.  Importing this
module imports neither jax nor torch.

PyTorch: ``torch.set_num_threads(2)`` (unless ``threads`` says otherwise), eager,
float32, ``F.scaled_dot_product_attention(is_causal=True)`` (its -inf mask gives the
same softmax as the example's large negative number: both are exactly 0 after exp in
float32),
``F.gelu(approximate="tanh")``, ``torch.optim.AdamW`` with two parameter groups
(weight decay on ndim > 1) and the learning rate set before each step.

Install these into their own venv, not the project's test venv::

    python3 -m venv .venv-bench && .venv-bench/bin/pip install -e . jax optax 'torch==2.13.0'
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

__all__ = ["jax_available", "torch_available", "import_jax", "make_jax_step",
           "make_torch_step", "params_numpy", "schedule_value"]

HOST_DEVICES = 8


# ----------------------------------------------------------------- availability

def jax_available() -> str | None:
    """None if jax and optax can be imported, else the reason."""
    try:
        import_jax()
        import optax  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def torch_available() -> str | None:
    """None if torch can be imported, else the reason."""
    try:
        import torch  # noqa: F401
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def import_jax(host_devices: int = HOST_DEVICES):
    """``import jax``, first asking XLA for ``host_devices`` CPU devices (only if jax is
    not imported yet and the caller has not set ``XLA_FLAGS`` / ``JAX_PLATFORMS``)."""
    if "jax" not in sys.modules:
        os.environ.setdefault("XLA_FLAGS",
                              f"--xla_force_host_platform_device_count={host_devices}")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    return jax


# ----------------------------------------------------------------- schedule

def schedule_value(count: int, lr: float, warmup: int, steps: int) -> float:
    """optax/spmd ``warmup_cosine_decay_schedule(0, lr, warmup, max(steps, warmup + 1),
    end_value=lr / 10)`` at ``count`` (the number of updates before this one)."""
    total = max(steps, warmup + 1)
    if count < warmup:
        return lr * count / warmup
    t = min(count - warmup, total - warmup)
    alpha = 0.1
    return lr * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * t / (total - warmup))) + alpha)


def _cfg(cfg: dict):
    d, heads = int(cfg["d_model"]), int(cfg["heads"])
    if d % heads:
        raise ValueError(f"d_model ({d}) must be a multiple of heads ({heads})")
    return d, heads, d // heads, int(cfg["layers"]), int(cfg["context"]), int(cfg["vocab"])


def params_numpy(state) -> dict:
    """The parameters of a state from :func:`make_jax_step` or :func:`make_torch_step`
    as numpy arrays in the example's layout."""
    if isinstance(state, _TorchState):
        return state.numpy()
    import jax
    return jax.tree_util.tree_map(np.asarray, state[0])


# ----------------------------------------------------------------- JAX

def _jax_param_specs(P, layers: int):
    """The example's specs (``param_specs(cfg, fsdp=False)``)."""
    block = {"ln1": (P(), P()), "ln2": (P(), P()),
             "wqkv": P(None, None, "model", None), "wo": P("model", None, None),
             "w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}
    return {"tok": P(None, None), "pos": P(None, None), "lnf": (P(), P()),
            "blocks": [dict(block) for _ in range(layers)]}


def _state_specs(state, specs, P):
    """optax state specs: ``mu`` / ``nu`` like the parameters, everything else replicated."""
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*[specs if f in ("mu", "nu") else _state_specs(v, specs, P)
                             for f, v in zip(state._fields, state)])
    if isinstance(state, (tuple, list)):
        return type(state)(_state_specs(s, specs, P) for s in state)
    return P()


def make_jax_step(cfg: dict, params_np: dict, mesh_shape: tuple[int, int] | None,
                  lr: float = 1e-2, warmup: int = 10, steps: int = 60, donate: bool = True):
    """A jitted JAX + optax training step from ``params_np``.

    ``mesh_shape`` None: ``jax.jit`` on one device.  ``(data, model)``: ``jax.jit`` of a
    ``jax.shard_map`` over a mesh of that shape (``data * model`` devices; see
    :func:`import_jax`).  Returns ``(step, state)``; ``step(state, batch_np) ->
    (state, loss)`` with ``loss`` a Python float (so each call waits for its step)."""
    jax = import_jax()
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding, PartitionSpec as P

    d, heads, hd, layers, context, vocab = _cfg(cfg)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1),
                                                  end_value=lr / 10)
    opt = optax.adamw(schedule, b2=0.99, weight_decay=0.01,
                      mask=lambda p: jax.tree_util.tree_map(lambda x: x.ndim > 1, p))
    sharded = mesh_shape is not None
    psum = (lambda x: jax.lax.psum(x, "model")) if sharded else (lambda x: x)
    pmean = (lambda x: jax.lax.pmean(x, "data")) if sharded else (lambda x: x)

    def layer_norm(x, gb, eps=1e-5):
        g, b = gb
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + eps) * g + b

    def forward(params, tokens):
        t = tokens.shape[1]
        tok = params["tok"]
        x = jnp.take(tok, tokens, axis=0) + params["pos"][:t]
        for blk in params["blocks"]:
            h = layer_norm(x, blk["ln1"])
            qkv = jnp.einsum("btd,dchk->cbthk", h, blk["wqkv"])
            y = jax.nn.dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + psum(jnp.einsum("bthk,hkd->btd", y, blk["wo"]))
            h = layer_norm(x, blk["ln2"])
            a = jax.nn.gelu(h @ blk["w1"] + blk["b1"], approximate=True)
            x = x + psum(a @ blk["w2"]) + blk["b2"]
        x = layer_norm(x, params["lnf"])
        return x @ tok.T  # weight tying

    def loss_fn(params, batch):
        tokens, targets = batch[:, :-1], batch[:, 1:]
        logp = jax.nn.log_softmax(forward(params, tokens))
        nll = -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
        return pmean(nll)

    def body(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a, np.float32)),
                                    _as_tuples(params_np))
    donate_argnums = (0, 1) if donate else ()
    if not sharded:
        dev = jax.devices()[0]
        params = jax.device_put(params, dev)
        opt_state = jax.jit(opt.init)(params)
        fn = jax.jit(body, donate_argnums=donate_argnums)

        def put_batch(b):
            return jax.device_put(np.asarray(b, np.int32), dev)
    else:
        data, model = mesh_shape
        if heads % model or (4 * d) % model:
            raise ValueError(f"'model'={model} must divide heads ({heads}) and 4*d ({4 * d})")
        if len(jax.devices()) < data * model:
            raise RuntimeError(f"mesh {mesh_shape} needs {data * model} devices, jax has "
                               f"{len(jax.devices())} (set XLA_FLAGS="
                               f"--xla_force_host_platform_device_count={data * model} "
                               "before importing jax)")
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:data * model]).reshape(data, model),
                                 ("data", "model"))
        specs = _jax_param_specs(P, layers)
        is_p = lambda x: isinstance(x, P)  # noqa: E731
        shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs,
                                           is_leaf=is_p)
        params = jax.device_put(params, shardings)
        state_specs = _state_specs(opt.init(params), specs, P)
        state_shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s),
                                                 state_specs, is_leaf=is_p)
        opt_state = jax.jit(opt.init, out_shardings=state_shardings)(params)
        fn = jax.jit(jax.shard_map(body, mesh=mesh,
                                   in_specs=(specs, state_specs, P("data", None)),
                                   out_specs=(specs, state_specs, P())),
                     donate_argnums=donate_argnums)
        batch_sharding = NamedSharding(mesh, P("data", None))

        def put_batch(b):
            b = np.asarray(b, np.int32)
            if b.shape[0] % data:
                raise ValueError(f"'data'={data} must divide the batch ({b.shape[0]})")
            return jax.device_put(b, batch_sharding)

    def step(state, batch_np):
        p, s = state
        p, s, loss = fn(p, s, put_batch(batch_np))
        return (p, s), float(loss)

    return step, (params, opt_state)


def _as_tuples(params_np: dict) -> dict:
    """The layout with (g, b) pairs as tuples (lists would make other pytrees)."""
    ln = lambda gb: (gb[0], gb[1])  # noqa: E731
    keys = ("ln1", "ln2")
    return {"tok": params_np["tok"], "pos": params_np["pos"], "lnf": ln(params_np["lnf"]),
            "blocks": [{k: (ln(v) if k in keys else v) for k, v in blk.items()}
                       for blk in params_np["blocks"]]}


# ----------------------------------------------------------------- PyTorch

class _TorchState:
    """The parameters (torch tensors in the example's layout), the optimizer and the
    number of updates done."""

    def __init__(self, params, opt):
        self.params, self.opt, self.count = params, opt, 0

    def numpy(self) -> dict:
        t = lambda x: x.detach().cpu().numpy().copy()  # noqa: E731
        p = self.params
        return {"tok": t(p["tok"]), "pos": t(p["pos"]), "lnf": tuple(map(t, p["lnf"])),
                "blocks": [{k: (tuple(map(t, v)) if isinstance(v, tuple) else t(v))
                            for k, v in blk.items()} for blk in p["blocks"]]}


def make_torch_step(cfg: dict, params_np: dict, lr: float = 1e-2, warmup: int = 10,
                    steps: int = 60, threads: int | None = 2):
    """An eager PyTorch (CPU, float32) training step from ``params_np``.

    Returns ``(step, state)``; ``step(state, batch_np) -> (state, loss)`` with ``loss``
    a Python float.  ``threads``: ``torch.set_num_threads`` (None leaves it)."""
    import torch
    import torch.nn.functional as F

    if threads is not None:
        torch.set_num_threads(threads)
    d, heads, hd, layers, context, vocab = _cfg(cfg)

    def param(a):
        return torch.nn.Parameter(torch.tensor(np.asarray(a, np.float32)))

    p = {"tok": param(params_np["tok"]), "pos": param(params_np["pos"]),
         "lnf": tuple(param(a) for a in params_np["lnf"]), "blocks": []}
    for blk in params_np["blocks"]:
        p["blocks"].append({k: (tuple(param(a) for a in v) if k in ("ln1", "ln2")
                                else param(v)) for k, v in blk.items()})
    leaves = [p["tok"], p["pos"], *p["lnf"]]
    for blk in p["blocks"]:
        for v in blk.values():
            leaves.extend(v if isinstance(v, tuple) else [v])
    decay = [x for x in leaves if x.ndim > 1]
    no_decay = [x for x in leaves if x.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=schedule_value(0, lr, warmup, steps), betas=(0.9, 0.99),
                            eps=1e-8)

    def forward(tokens):
        b, t = tokens.shape
        tok = p["tok"]
        x = F.embedding(tokens, tok) + p["pos"][:t]
        for blk in p["blocks"]:
            h = F.layer_norm(x, (d,), *blk["ln1"], eps=1e-5)
            qkv = (h @ blk["wqkv"].reshape(d, 3 * heads * hd)).view(b, t, 3, heads, hd)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (b, heads, t, hd)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).reshape(b, t, heads * hd)
            x = x + y @ blk["wo"].reshape(heads * hd, d)
            h = F.layer_norm(x, (d,), *blk["ln2"], eps=1e-5)
            a = F.gelu(h @ blk["w1"] + blk["b1"], approximate="tanh")
            x = x + a @ blk["w2"] + blk["b2"]
        x = F.layer_norm(x, (d,), *p["lnf"], eps=1e-5)
        return x @ tok.T  # weight tying

    def step(state, batch_np):
        batch = torch.from_numpy(np.asarray(batch_np, np.int64))
        tokens, targets = batch[:, :-1], batch[:, 1:]
        rate = schedule_value(state.count, lr, warmup, steps)
        for group in state.opt.param_groups:
            group["lr"] = rate
        logits = forward(tokens)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        state.opt.zero_grad(set_to_none=True)
        loss.backward()
        state.opt.step()
        state.count += 1
        return state, loss.item()

    return step, _TorchState(p, opt)

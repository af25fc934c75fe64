"""Train a character-level transformer with data, tensor and (optionally) fully
sharded data parallelism, with checkpoints that resume on another mesh.

    spmd-run -n 4 examples/train_transformer.py --mesh data=2,model=2 --steps 60
    spmd-run -n 4 examples/train_transformer.py --mesh data=2,model=2 --fsdp --ckpt-dir ck
    spmd-run -n 2 examples/train_transformer.py --mesh data=1,model=2 --ckpt-dir ck
    spmd-run -n 4 --max-restarts 2 examples/train_transformer.py --ckpt-dir ck --save-every 10
    spmd-run -n 4 examples/train_transformer.py --mesh data=-1,model=2   # data: the rest
    python examples/train_transformer.py --mesh data=4,model=2     # 8 simulated devices
    python examples/train_transformer.py --mesh data=2,model=2,seq=2   # context parallel
    python examples/train_transformer.py --mesh data=2,model=2,expert=2 --experts 4  # MoE
    SPMD_NUM_DEVICES=16 python examples/train_transformer.py --mesh data=2,model=2,seq=2,pipe=2
    spmd-run -n 4 --trace trace.json.gz examples/train_transformer.py   # a timeline
    python examples/train_transformer.py --profile trace.json.gz        # (one process)

The model is a decoder-only transformer (token and position embeddings, pre-norm
blocks of causal multi-head attention and a GELU MLP, a final layer norm, output
weights tied to the token embedding).  The text is the documentation of Python's
standard library (module, class and function docstrings of ~90 modules, read
with ``inspect``: present offline on every machine, identical on every rank).

Parallelism on the mesh ``('data', 'model')``, written as one ``shard_map``:

- ``'data'`` splits the batch; the loss is averaged over it with ``pmean``, and
  the gradients of replicated parameters are summed over it by the transposes;
- ``'model'`` splits the attention heads and the MLP hidden layer Megatron-style:
  ``W_qkv`` and ``W_1`` by output columns, ``W_o`` and ``W_2`` by input rows, so
  each block needs one ``psum`` over ``'model'`` after attention and one after
  the MLP in the forward pass;
- ``--fsdp`` also splits every weight matrix (and so its AdamW state) over
  ``'data'``: each is ``all_gather``-ed before use, and the transpose of that
  gather is a ``psum_scatter`` of its gradient, so a device keeps 1/D of them;
- ``seq=C`` in ``--mesh`` adds a ``'seq'`` axis that splits the sequence (context
  parallelism): each device embeds, normalises and transforms only its block of the
  positions, attention is ``spmd.parallel.ring_attention`` (key/value blocks passed
  around the ``'seq'`` ring), and the loss is averaged over ``'seq'`` too;
- ``--experts N`` makes each block's MLP a top-``k`` mixture of ``N`` experts
  (``spmd.parallel.moe``), and ``expert=E`` in ``--mesh`` splits the experts over an
  ``'expert'`` axis, which also splits the batch: tokens reach their experts'
  devices by ``all_to_all``; the router's load-balancing loss is added to the loss;
  each expert's hidden units are split over ``'model'``, or with
  ``--experts-over-model`` the experts themselves are split over ``'expert'`` x
  ``'model'`` (``moe(..., replicated_axes="model")``: each ``'model'`` device routes
  its share of its group's tokens);
- ``pipe=S`` in ``--mesh`` cuts the blocks into ``S`` pipeline stages over a
  ``'pipe'`` axis, ``--microbatches K`` of each device's rows flowing through them by
  ``--schedule gpipe|1f1b`` (``spmd.parallel.pipeline_value_and_grad``; the step is in
  ``transformer_pipeline.py``); it composes with every other axis (``data``,
  ``model``, ``seq``, ``expert``/``--experts`` and ``--fsdp``), and its checkpoints
  keep the usual layout (a run saved with ``pipe=2`` resumes with ``pipe=1`` or on
  another mesh).

The optimizer is ``spmd.optim.adamw`` with a warm-up cosine schedule, applied
inside the same program to each device's blocks.  Rank 0 shows a progress bar
with tokens per second, prints ``step <k> loss <x>`` at step 1 and every
``--log-every`` steps and ``final loss <x>`` at the end, writes a loss-curve PNG
(``--plot``) and prints a short generated sample.

With ``--ckpt-dir``, a run whose directory holds a complete checkpoint resumes
from the latest one (so does a job that ``spmd-run --max-restarts`` starts
again after a failure); ``--resume`` insists on one, ``--no-resume`` refuses to
mix a fresh run's checkpoints with those already there.  The batch of step k is
a function of k, so a resumed run computes what the uninterrupted run would have.
``--save-local-every N`` also keeps the state in the nodes' memory every N steps
(``checkpointing.save(local=True)``, under ``spmd-run``): a restart after a lost
node (``spmd-run --min-ranks``, with ``--mesh data=-1,...``) resumes from there.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import sys
import time
import types
import warnings

import numpy as np

import spmd
import spmd.numpy as snp
import spmd.optim as optim
from spmd import P, NamedSharding, checkpointing, lax, nn
from spmd.parallel import moe, ring_attention

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import transformer_pipeline as TP  # noqa: E402  (beside this file)

MODULES = (
    "abc argparse array ast asyncio base64 bisect calendar cmd codecs collections "
    "concurrent.futures configparser contextlib copy csv dataclasses datetime decimal difflib "
    "dis doctest email enum fnmatch fractions functools gettext glob gzip hashlib heapq html "
    "http.client inspect io ipaddress itertools json keyword locale logging math "
    "multiprocessing operator os pathlib pdb pickle platform pprint queue random re sched "
    "secrets selectors shelve shlex shutil signal site socket sqlite3 statistics string "
    "struct subprocess sysconfig tarfile tempfile textwrap threading time timeit tokenize "
    "trace traceback types typing unicodedata unittest urllib.parse uuid warnings weakref "
    "xml.etree.ElementTree zipfile").split()
VOCAB = [chr(c) for c in range(32, 127)] + ["\n"]  # 96 symbols; others map to '?'


# ------------------------------------------------------------------- data

def load_corpus() -> np.ndarray:
    """The docstrings of the standard library modules above as int32 symbol ids."""
    parts = []
    with warnings.catch_warnings():  # reading some attributes warns of their deprecation
        warnings.simplefilter("ignore")
        for name in MODULES:
            try:
                mod = importlib.import_module(name)
            except ImportError:  # a trimmed Python: fewer modules, same code
                continue
            parts.append(inspect.getdoc(mod) or "")
            for attr, obj in sorted(vars(mod).items()):
                if not attr.startswith("_") and getattr(obj, "__module__", None) == mod.__name__:
                    doc = inspect.getdoc(obj)
                    if doc:
                        parts.append(doc)
    index = {c: i for i, c in enumerate(VOCAB)}
    unknown = index["?"]
    text = "\n\n".join(parts)
    return np.fromiter((index.get(c, unknown) for c in text), np.int32, len(text))


def batch_at(corpus: np.ndarray, step: int, batch: int, context: int, seed: int) -> np.ndarray:
    """The global batch of ``step``: ``batch`` windows of ``context + 1`` symbols.

    A function of the step alone, so that a resumed run sees the data it would have."""
    rng = np.random.default_rng((seed, step))
    starts = rng.integers(0, len(corpus) - context - 1, size=batch)
    return np.stack([corpus[s:s + context + 1] for s in starts])


# ------------------------------------------------------------------ model

class Config:
    def __init__(self, args):
        self.vocab, self.d, self.heads, self.layers = len(VOCAB), args.d_model, args.heads, \
            args.layers
        self.hidden, self.context = 4 * args.d_model, args.context
        self.head_dim = self.d // self.heads
        # Mixture of experts (0: the dense MLP).
        self.experts = getattr(args, "experts", 0)
        self.top_k = getattr(args, "top_k", 2)
        self.capacity_factor = getattr(args, "capacity_factor", 1.25)
        # The experts split over 'expert' x 'model' (whole experts on each device), not
        # each expert's hidden units over 'model'.
        self.experts_over_model = getattr(args, "experts_over_model", False)


AUX_WEIGHT = 0.01  # of the router's load-balancing loss (Switch Transformer's)


def param_specs(cfg: Config, fsdp: bool, expert: bool = False):
    """Each parameter's PartitionSpec over ('data', 'model') (and 'expert' when the
    mesh has that axis: the experts' weights are split over it)."""
    f = "data" if fsdp else None
    block = {"ln1": (P(), P()), "ln2": (P(), P()),
             "wqkv": P(f, None, "model", None),      # (d, 3, heads, head_dim)
             "wo": P("model", None, f)}               # (heads, head_dim, d)
    if cfg.experts and cfg.experts_over_model:
        e = ("expert", "model") if expert else "model"
        block.update({"router": P(), "w_in": P(e, None, None), "w_out": P(e, None, None),
                      "b2": P()})
    elif cfg.experts:
        e = "expert" if expert else None
        block.update({"router": P(),                  # (d, experts)
                      "w_in": P(e, None, "model"),    # (experts, d, hidden)
                      "w_out": P(e, "model", None),   # (experts, hidden, d)
                      "b2": P()})
    else:
        block.update({"w1": P(f, "model"), "b1": P("model"),   # (d, hidden)
                      "w2": P("model", f), "b2": P()})          # (hidden, d)
    return {"tok": P(f, None), "pos": P(f, None), "lnf": (P(), P()),
            "blocks": [dict(block) for _ in range(cfg.layers)]}


def init_params(cfg: Config, specs, mesh, seed: int):
    """Parameters drawn with ``spmd.random`` and placed by ``specs``: under
    ``jit(out_shardings=...)`` each device draws only its own block of a sharded
    weight (the numbers do not depend on the mesh, so a run on another mesh starts
    from the same model)."""
    d, h, hd, hid = cfg.d, cfg.heads, cfg.head_dim, cfg.hidden
    scale_out = 0.02 / np.sqrt(2 * cfg.layers)  # GPT-2's scaling of residual projections
    normal = nn.initializers.normal
    zeros = nn.initializers.zeros
    ones = nn.initializers.ones

    def build(key):
        keys = iter(spmd.random.split(key, 2 + 4 * cfg.layers))
        ln = lambda: (ones(None, (d,)), zeros(None, (d,)))  # noqa: E731
        def mlp():
            if not cfg.experts:
                return {"w1": normal(0.02)(next(keys), (d, hid)), "b1": zeros(None, (hid,)),
                        "w2": normal(scale_out)(next(keys), (hid, d)), "b2": zeros(None, (d,))}
            n, k = cfg.experts, next(keys)  # two keys a block, as the dense MLP's
            return {"router": normal(0.02)(spmd.random.fold_in(k, 1), (d, n)),
                    "w_in": normal(0.02)(spmd.random.fold_in(k, 0), (n, d, hid)),
                    "w_out": normal(scale_out)(next(keys), (n, hid, d)),
                    "b2": zeros(None, (d,))}

        return {"tok": normal(0.02)(next(keys), (cfg.vocab, d)),
                "pos": normal(0.01)(next(keys), (cfg.context, d)),
                "lnf": ln(),
                "blocks": [{"ln1": ln(), "ln2": ln(),
                            "wqkv": normal(0.02)(next(keys), (d, 3, h, hd)),
                            "wo": normal(scale_out)(next(keys), (h, hd, d)),
                            **mlp()} for _ in range(cfg.layers)]}

    shardings = spmd.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs,
                                        is_leaf=lambda x: isinstance(x, P))
    return spmd.jit(build, out_shardings=shardings)(spmd.random.key(seed))


def _gather(w, spec):
    """A weight whole over 'data' (FSDP): all-gather the dimension split over it."""
    for dim, entry in enumerate(spec):
        if entry == "data":
            return lax.all_gather(w, "data", axis=dim, tiled=True)
    return w


def layer_norm(x, gb, eps=1e-5):
    g, b = gb
    mu = snp.mean(x, axis=-1, keepdims=True)
    var = snp.mean(snp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * g + b


def block(cfg: Config, x, blk, bspec, seq: str | None = None, expert: str = "expert",
          token_axes=None):
    """One transformer block on this device's activations ``x`` (rows, T, d): ``(x,
    the router's load-balancing loss share)`` (0 for the dense MLP)."""
    gb = lambda name: _gather(blk[name], bspec[name])  # noqa: E731
    h = layer_norm(x, blk["ln1"])
    if seq is None:
        # Causal attention over this device's heads, as one blocked kernel (the scores
        # are made tile by tile in cache; the backward recomputes them).
        qkv = snp.einsum("btd,dchk->cbthk", h, gb("wqkv"))   # local heads only
        y = spmd.nn.dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        y = snp.einsum("bthk,hkd->btd", y, gb("wo"))
    else:
        qkv = snp.einsum("btd,dchk->cbhtk", h, gb("wqkv"))
        y = snp.einsum("bhtk,hkd->btd", ring_attention(qkv[0], qkv[1], qkv[2], seq), gb("wo"))
    x = x + lax.psum(y, "model")
    h = layer_norm(x, blk["ln2"])
    if cfg.experts:
        b, t_, d = h.shape
        # Either each expert's hidden units are split over 'model', as the dense MLP's
        # (each device of a 'model' group computes its slice of every token's experts, and
        # the slices' partial outputs are summed: the combine is linear in them), or
        # (--experts-over-model) the experts themselves, each device routing its share
        # of the group's tokens.
        over_model = cfg.experts_over_model
        y, stats = moe(snp.reshape(h, (b * t_, d)), blk["router"], blk["w_in"],
                       blk["w_out"], expert, top_k=cfg.top_k,
                       capacity_factor=cfg.capacity_factor, token_axes=token_axes,
                       replicated_axes="model" if over_model else None)
        y = y if over_model else lax.psum(y, "model")
        return x + snp.reshape(y, (b, t_, d)) + blk["b2"], stats["aux_loss"] / cfg.layers
    a = spmd.nn.gelu(h @ gb("w1") + blk["b1"])
    return x + lax.psum(a @ gb("w2"), "model") + blk["b2"], np.float32(0.0)


def embed(tok, pos, tokens, seq: str | None):
    """The embeddings of this device's ``tokens`` (rows, T) plus their positions' (with
    ``seq``, this device's block ``axis_index(seq)`` of the sequence); ``tok`` and
    ``pos`` whole (gathered)."""
    t = tokens.shape[1]
    pos = pos[:t] if seq is None else \
        lax.dynamic_slice_in_dim(pos, lax.axis_index(seq) * t, t, axis=0)
    return snp.take(tok, tokens, axis=0) + pos


def token_axes(mesh, seq: str | None) -> tuple:
    """Every mesh axis the tokens are split over: the batch's rows' and ``seq``."""
    rows = batch_spec(mesh)[0]
    return (rows if isinstance(rows, tuple) else (rows,)) + ((seq,) if seq else ())


def own_positions(mesh, seq: str | None, *arrays) -> tuple:
    """Each (rows, T) array's block of the positions on this device (equal blocks along
    ``seq``); the arrays as they are without ``seq``."""
    if seq is None:
        return arrays
    t = arrays[0].shape[1] // mesh.shape[seq]
    start = lax.axis_index(seq) * t
    return tuple(lax.dynamic_slice_in_dim(a, start, t, axis=1) for a in arrays)


def forward(cfg: Config, params, specs, tokens, seq: str | None = None,
            expert: str = "expert", token_axes=None):
    """Per-device logits: ``tokens`` (rows, T) of this device; the heads and hidden units
    of its 'model' slice.  With ``seq`` (context parallelism) ``tokens`` is this
    device's block of the positions along that axis.  With experts, the router's
    load-balancing loss of the blocks is returned too: ``(logits, aux)``; ``expert`` is
    the mesh axis the experts are split over, ``token_axes`` all those the tokens are
    (the loss's statistics are over all tokens)."""
    g = lambda name, p=params, s=specs: _gather(p[name], s[name])  # noqa: E731
    tok = g("tok")
    x = embed(tok, g("pos"), tokens, seq)
    aux = np.float32(0.0)
    for blk, bspec in zip(params["blocks"], specs["blocks"]):
        x, a = block(cfg, x, blk, bspec, seq, expert, token_axes)
        aux = aux + a
    x = layer_norm(x, params["lnf"])
    logits = x @ tok.T  # weight tying
    return (logits, aux) if cfg.experts else logits


def make_step(cfg: Config, mesh, specs, opt):
    """The jitted training step over the mesh: loss, gradients and AdamW in one program."""
    state_specs = _state_specs(opt, specs)

    seq = "seq" if mesh.shape.get("seq", 1) > 1 else None
    axes = token_axes(mesh, seq)

    def loss_fn(params, batch):
        tokens, targets = own_positions(mesh, seq, batch[:, :-1], batch[:, 1:])
        out = forward(cfg, params, specs, tokens, seq, token_axes=axes)
        logits, aux = out if cfg.experts else (out, 0.0)
        logp = spmd.nn.log_softmax(logits)
        nll = -snp.mean(snp.take_along_axis(logp, targets[..., None], axis=-1))
        loss = lax.pmean(nll, axes)
        return loss + AUX_WEIGHT * aux if cfg.experts else loss

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh,
                       in_specs=(specs, state_specs, batch_spec(mesh)),
                       out_specs=(specs, state_specs, P()))
    def step(params, state, batch):
        loss, grads = spmd.value_and_grad(loss_fn)(params, batch)
        updates, state = opt.update(grads, state, params)
        return optim.apply_updates(params, updates), state, loss

    return step, state_specs


def _state_specs(opt, specs):
    """The optimizer state's specs: each parameter's state like the parameter (ZeRO),
    counters replicated."""
    abstract = spmd.tree_util.tree_map(lambda s: np.zeros((), np.float32), specs,
                                       is_leaf=lambda x: isinstance(x, P))
    shape_of_state = opt.init(abstract)
    flat_specs = spmd.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, P))

    def assign(sub):
        leaves, tree = spmd.tree_util.tree_flatten(sub)
        if len(leaves) == len(flat_specs):
            return spmd.tree_util.tree_unflatten(tree, flat_specs)
        return spmd.tree_util.tree_map(lambda _: P(), sub)

    return _map_state(shape_of_state, assign)


def _map_state(state, assign):
    """Replace each per-parameter tree of the optimizer state by ``assign(tree)``."""
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*[_map_state(v, assign) if f == "count" else assign(v)
                             if f in ("mu", "nu", "trace") else _map_state(v, assign)
                             for f, v in zip(state._fields, state)])
    if isinstance(state, tuple):
        return tuple(_map_state(s, assign) for s in state)
    return P()


def sample(cfg: Config, params, specs_whole, start: str, n: int, seed: int) -> str:
    """Generate ``n`` symbols after ``start`` (rank 0, on whole numpy parameters)."""
    mesh1 = make_mesh(1, 1, moe=cfg.experts > 0, devices=spmd.local_devices()[:1])

    def logits(p, t):
        out = forward(cfg, p, specs_whole, t)
        return out[0] if cfg.experts else out

    logits_of = spmd.jit(spmd.shard_map(
        logits, mesh=mesh1,
        # One device: nothing differs between devices (the experts' all_to_all over the
        # size-1 'expert' axis types its result as varying along it).
        in_specs=(specs_whole, P()), out_specs=P(), check_vma=not cfg.experts))
    index = {c: i for i, c in enumerate(VOCAB)}
    ids = [index.get(c, index["?"]) for c in start]
    rng = np.random.default_rng(seed)
    for _ in range(n):
        window = np.array([ids[-cfg.context:]], np.int32)
        logits = np.asarray(logits_of(params, window))[0, -1] / 0.8
        probs = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(VOCAB), p=probs / probs.sum())))
    return "".join(VOCAB[i] for i in ids)


# ------------------------------------------------------------------ driver

def parse_mesh(text: str, n_devices: int) -> tuple[int, int, int, int, int]:
    """``(data, model, seq, expert, pipe)`` of ``--mesh data=D,model=M[,seq=C][,expert=E]
    [,pipe=S]`` (``seq``, ``expert`` and ``pipe`` 1 when left out; ``data=-1``: the rest
    of the devices, so that the run follows the job's size)."""
    try:
        parts = dict(kv.split("=") for kv in text.split(","))
        data, model = int(parts.pop("data")), int(parts.pop("model"))
        seq, expert = int(parts.pop("seq", 1)), int(parts.pop("expert", 1))
        pipe = int(parts.pop("pipe", 1))
        if parts or min(model, seq, expert, pipe) < 1 or (data < 1 and data != -1):
            raise ValueError
    except (ValueError, KeyError):
        raise SystemExit(f"--mesh must read data=D,model=M with optional ,seq=C, ,expert=E "
                         f"and ,pipe=S (D may be -1: the rest of the devices), "
                         f"got {text!r}") from None
    others = model * seq * expert * pipe
    if data == -1:
        if n_devices % others:
            raise SystemExit(f"--mesh {text}: data=-1 takes the rest of the {n_devices} "
                             f"devices, but the other axes' product {others} does not "
                             f"divide {n_devices}")
        data = n_devices // others
    need = data * others
    if need != n_devices:
        raise SystemExit(f"--mesh {text} needs {need} devices, but "
                         f"this job has {n_devices} (the number of MPI ranks times "
                         "SPMD_LOCAL_DEVICES, or SPMD_NUM_DEVICES in one process)")
    return data, model, seq, expert, pipe


def make_mesh(data: int, model: int, seq: int = 1, expert: int = 1, moe: bool = False,
              devices=None, pipe: int = 1):
    """The mesh ``('data', 'model')``, with a ``'seq'`` axis when the sequence is split,
    an ``'expert'`` axis when the model has experts (size 1 when they are not split: the
    mixture-of-experts layer communicates over it) and a ``'pipe'`` axis of pipeline
    stages."""
    sizes, names = [data, model], ["data", "model"]
    for size, name, wanted in ((seq, "seq", seq > 1), (expert, "expert", moe or expert > 1),
                               (pipe, "pipe", pipe > 1)):
        if wanted:
            sizes.append(size)
            names.append(name)
    return spmd.make_mesh(tuple(sizes), tuple(names), devices=devices)


def batch_spec(mesh) -> P:
    """The batch's rows are split over 'data', and over 'expert' too where it exists."""
    return P(("data", "expert") if "expert" in mesh.axis_names else "data", None)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mesh", default=None, help="data=D,model=M[,seq=C][,expert=E][,pipe=S] "
                    "(D=-1: the rest of the devices) "
                    "(default: data=N/2,model=2); seq splits the sequence (ring attention), "
                    "expert the experts (with --experts), pipe the blocks into pipeline "
                    "stages")
    ap.add_argument("--microbatches", type=int, default=4,
                    help="microbatches of each device's rows (with pipe=S)")
    ap.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b",
                    help="the pipeline schedule (with pipe=S)")
    ap.add_argument("--experts", type=int, default=0,
                    help="experts of each block's MLP (0: a dense MLP)")
    ap.add_argument("--top-k", type=int, default=2, help="experts per token")
    ap.add_argument("--capacity-factor", type=float, default=1.25,
                    help="slots per expert, relative to an even share of the tokens")
    ap.add_argument("--experts-over-model", action="store_true",
                    help="split the experts over 'expert' x 'model' (whole experts on each "
                         "device; each 'model' device routes its share of the tokens) "
                         "instead of each expert's hidden units over 'model'")
    ap.add_argument("--fsdp", action="store_true", help="also shard weights over 'data'")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-2, help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--ckpt-dir", default=None)
    ap.add_argument("--save-every", type=int, default=0, help="0: only at the end")
    ap.add_argument("--keep", type=int, default=3, help="checkpoints kept on disk")
    ap.add_argument("--save-local-every", type=int, default=0, metavar="N",
                    help="also keep the state in the nodes' memory every N steps "
                         "(checkpointing.save(local=True); under spmd-run): a restart "
                         "after a lost node resumes from there, not from disk")
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                    help="restore the latest complete checkpoint in --ckpt-dir (default: when "
                         "there is one); --resume fails without one, --no-resume starts from "
                         "step 0 and needs a --ckpt-dir without checkpoints")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--plot", default=None, metavar="PNG")
    ap.add_argument("--sample", type=int, default=120, help="symbols to generate at the end")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None, metavar="PATH",
                    help="record a timeline of the training steps to PATH (.json or .json.gz; "
                         "spmd.profiler.trace; under spmd-run, use its --trace instead)")
    ap.add_argument("--stats", default=None, metavar="JSON",
                    help="write this rank's measurements to JSON.rank<k>.json (benchmarks)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    check_ckpt_dir(args.ckpt_dir)
    n = spmd.device_count()
    data, model, seq, expert, pipe = parse_mesh(
        args.mesh or f"data={max(n // 2, 1)},model={min(n, 2)}", n)
    if args.resume and not args.ckpt_dir:
        raise SystemExit("--resume needs --ckpt-dir")
    if args.save_local_every and not args.ckpt_dir:
        raise SystemExit("--save-local-every needs --ckpt-dir (the checkpoints it belongs to)")
    # Decided first, from what every rank reads alike (or agrees on).
    first = _resume_step(args)
    rank0 = spmd.process_index() == 0
    say = print if rank0 else (lambda *a, **k: None)
    cfg = Config(args)
    if cfg.heads % model or cfg.hidden % model or args.batch % (data * expert) or \
            cfg.context % seq:
        raise SystemExit(f"--mesh: 'model'={model} must divide the heads ({cfg.heads}), "
                         f"'data' x 'expert'={data * expert} the batch ({args.batch}) and "
                         f"'seq'={seq} the context ({cfg.context})")
    if expert > 1 and (not cfg.experts or cfg.experts % expert):
        raise SystemExit(f"--mesh: 'expert'={expert} must divide --experts "
                         f"({cfg.experts}; give --experts N)")
    if pipe > 1:
        TP.check(cfg, args, data, seq, expert, pipe)
    check_experts_over_model(cfg, args, data, model, seq, expert, pipe)
    mesh = make_mesh(data, model, seq, expert, moe=cfg.experts > 0, pipe=pipe)
    specs = param_specs(cfg, args.fsdp, expert="expert" in mesh.axis_names)
    schedule = optim.warmup_cosine_decay_schedule(0.0, args.lr, args.warmup,
                                                  max(args.steps, args.warmup + 1),
                                                  end_value=args.lr / 10)
    opt = optim.adamw(schedule, b2=0.99, weight_decay=0.01, mask=TP.decay_mask)
    if pipe > 1:
        model_fns = types.SimpleNamespace(block=block, layer_norm=layer_norm, _gather=_gather,
                                          AUX_WEIGHT=AUX_WEIGHT, batch_spec=batch_spec,
                                          _state_specs=_state_specs, embed=embed,
                                          own_positions=own_positions, token_axes=token_axes)
        step_fn, state_specs = TP.make_pipe_step(model_fns, cfg, mesh, specs, opt,
                                                 args.microbatches, args.schedule)
    else:
        step_fn, state_specs = make_step(cfg, mesh, specs, opt)
    corpus = load_corpus()
    say(f"corpus: {len(corpus)} symbols of standard-library documentation; model d={cfg.d}, "
        f"{cfg.layers} layers, {cfg.heads} heads, context {cfg.context}; mesh data={data} x "
        f"model={model}{f' x seq={seq}' if seq > 1 else ''}"
        f"{f' x expert={expert}' if expert > 1 else ''}"
        f"{f' x pipe={pipe} ({args.schedule}, {args.microbatches} microbatches)' if pipe > 1 else ''}"
        f"{f', {cfg.experts} experts (top {cfg.top_k})' if cfg.experts else ''}"
        f"{' (FSDP)' if args.fsdp else ''} "
        f"over {n} devices in "
        f"{spmd.process_count()} process(es)")

    params = init_params(cfg, specs, mesh, args.seed)
    state = opt.init(params)
    if first:
        target = {"params": params, "opt": state}
        restored = checkpointing.restore(args.ckpt_dir, _targets(target, mesh, specs,
                                                                 state_specs), step=first)
        params, state = restored["params"], restored["opt"]
        say(f"resumed from step {first}")
    if pipe > 1:  # the pipeline's layout: each stage's blocks stacked, split over 'pipe'
        params = TP.place(TP.stacked(params), mesh, TP.pipe_specs(specs))
        state = TP.place(TP.map_param_trees(state, TP.stacked), mesh, state_specs)

    losses, t0, tokens = [], time.perf_counter(), 0
    steady = None  # (time, tokens) after the first step, which traces and compiles
    pending = None  # the checkpoint being written in the background
    bar = _progress(args.steps - first, rank0)
    if args.profile:
        spmd.profiler.start_trace(args.profile)
    for k in range(first + 1, args.steps + 1):
        with spmd.profiler.StepTraceAnnotation("train", step_num=k):
            batch = _put_batch(batch_at(corpus, k, args.batch, cfg.context, args.seed), mesh)
            params, state, loss = step_fn(params, state, batch)
            loss = float(loss)
        losses.append((k, loss))
        tokens += args.batch * cfg.context
        rate = tokens / (time.perf_counter() - t0)
        if steady is None:  # (time, tokens, seconds in collectives so far)
            steady = (time.perf_counter(), tokens, spmd.distributed.collective_time()[1])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
        if k == 1 or k % args.log_every == 0:
            msg = f"step {k} loss {loss:.4f} ({rate:,.0f} tokens/s)"
            bar.write(msg) if bar is not None else say(msg, flush=True)
        to_disk = k == args.steps or (args.save_every and k % args.save_every == 0)
        to_memory = args.save_local_every and k % args.save_local_every == 0
        if args.ckpt_dir and (to_disk or to_memory):
            # Written by a background thread while the next steps train.
            pending = checkpointing.save_async(args.ckpt_dir, TP.to_save(params, state, pipe,
                                                                         cfg.layers),
                                               step=k, keep=args.keep if to_disk else None,
                                               local=not to_disk)
    if pending is not None:
        pending.wait()
    if args.profile:
        spmd.profiler.stop_trace()
        say(f"timeline written to {args.profile}")
    if bar is not None:
        bar.close()
    if losses:
        say(f"final loss {losses[-1][1]:.4f}")
    if args.stats:
        _write_stats(args, steady, tokens, params, state, losses)
    if args.plot and rank0 and losses:
        _plot(args.plot, losses)
        say(f"loss curve written to {args.plot}")
    if args.sample:
        whole = spmd.tree_util.tree_map(
            _whole, TP.unstacked(params, cfg.layers) if pipe > 1 else params)
        if rank0:
            specs1 = param_specs(cfg, False)
            text = sample(cfg, whole, specs1, "Return the ", args.sample, args.seed)
            say("sample: " + repr(text))
    return 0


def check_experts_over_model(cfg: Config, args, data: int, model: int, seq: int,
                             expert: int, pipe: int) -> None:
    """``--experts-over-model`` with experts that 'expert' x 'model' divide, and calls of
    the experts' layer whose tokens 'model' divides (a device's rows, or a microbatch's
    under a pipeline, times its positions), or SystemExit saying what to change.

    >>> check_experts_over_model(cfg, args, 2, 2, 1, 2, 1)  # doctest: +SKIP
    """
    if not args.experts_over_model:
        return
    if not cfg.experts or cfg.experts % (expert * model):
        raise SystemExit(f"--experts-over-model: 'expert' x 'model' = {expert * model} must "
                         f"divide --experts ({cfg.experts}); give --experts a multiple of it")
    rows = args.batch // (data * expert) // (args.microbatches if pipe > 1 else 1)
    tokens = rows * (cfg.context // seq)
    if tokens % model:
        raise SystemExit(f"--experts-over-model: 'model'={model} must divide the tokens of "
                         f"each call of the experts' layer ({tokens}: --batch, --context, "
                         "the mesh and, with pipe=S, --microbatches give them)")


def check_ckpt_dir(path) -> None:
    """Fail now, not at the first save after minutes of training, when ``--ckpt-dir``
    cannot hold checkpoints: a file, a path under a file, or a directory that cannot be
    created or written (it is created here when missing)."""
    problem = path and checkpointing.layout.create_directory(path)
    if problem:
        raise SystemExit(f"--ckpt-dir: {problem}")


def _resume_step(args) -> int:
    """The step to resume after: the latest complete checkpoint in ``--ckpt-dir``
    (``checkpointing.latest_step``, which skips saves that did not finish), or 0 to
    start fresh, as ``--resume`` / ``--no-resume`` / neither ask."""
    # With in-memory steps: the newest of both tiers, agreed by every rank (collective).
    latest = checkpointing.latest_step(args.ckpt_dir, local=bool(args.save_local_every)) \
        if args.ckpt_dir else None
    if args.resume is False:
        if latest is not None:
            # Its saves would mix with these, and keeping the newest three by step
            # would delete the fresh run's own.
            raise SystemExit(f"--no-resume: --ckpt-dir {args.ckpt_dir!r} already holds "
                             f"checkpoints (latest: step {latest}); to start from step 0, "
                             "give an empty or new --ckpt-dir, or leave out --no-resume to "
                             "resume from them")
        return 0
    if latest is None:
        if args.resume:
            raise SystemExit(f"--resume: no complete checkpoint in {args.ckpt_dir!r}")
        return 0
    return latest


def _local_bytes(tree) -> int:
    """Bytes of the blocks this process's devices hold."""
    total = 0
    for x in spmd.tree_util.tree_leaves(tree):
        if hasattr(x, "addressable_shards"):
            total += sum(s.data.nbytes for s in x.addressable_shards)
        else:
            total += np.asarray(x).nbytes
    return total


def _write_stats(args, steady, tokens, params, state, losses) -> None:
    import json
    import resource

    elapsed = time.perf_counter() - steady[0] if steady else 0.0
    comm = spmd.distributed.collective_time()[1] - steady[2] if steady else 0.0
    stats = {"rank": spmd.process_index(), "ranks": spmd.process_count(),
             "mesh": args.mesh, "fsdp": args.fsdp, "steps": len(losses),
             "tokens_per_s": (tokens - steady[1]) / elapsed if elapsed > 0 else None,
             # Share of the steady steps' time this rank spent in MPI collectives
             # (waiting for the others included; 0 in one process).
             "comm_share": comm / elapsed if elapsed > 0 else None,
             "param_bytes": _local_bytes(params), "opt_state_bytes": _local_bytes(state),
             "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             "final_loss": losses[-1][1] if losses else None,
             "losses": [loss for _, loss in losses]}
    with open(f"{args.stats}.rank{spmd.process_index()}.json", "w") as f:
        json.dump(stats, f)


def _whole(x):
    """The whole value of a parameter (rank 0 samples from the whole model)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    return spmd.process_allgather(x)


def _targets(tree, mesh, specs, state_specs):
    """The shardings to restore onto: this run's mesh and specs."""
    return spmd.tree_util.tree_map(lambda x: x.sharding, tree)


def _put_batch(batch: np.ndarray, mesh):
    """Each process passes only the rows of its devices."""
    sharding = NamedSharding(mesh, batch_spec(mesh))
    if spmd.process_count() == 1:
        return spmd.device_put(batch, sharding)
    index = sharding.devices_indices_map(batch.shape)
    rows = sorted({(index[d][0].start or 0, index[d][0].stop or batch.shape[0])
                   for d in spmd.local_devices() if d in index})
    lo, hi = rows[0][0], rows[-1][1]
    return spmd.make_array_from_process_local_data(sharding, batch[lo:hi], batch.shape)


def _progress(total: int, enabled: bool):
    if not (enabled and sys.stderr.isatty()):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="step", file=sys.stderr, leave=False, dynamic_ncols=True)


def _plot(path: str, losses) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([k for k, _ in losses], [v for _, v in losses])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats per symbol)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

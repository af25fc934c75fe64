"""The pipelined training step of ``train_transformer.py`` (``--mesh ...,pipe=S``).

The blocks are cut into ``S`` stages of ``layers / S`` blocks over a ``'pipe'`` mesh
axis: a device holds its stage's blocks only, stacked (each block parameter gets a
leading dimension of the stage's blocks, split over ``'pipe'``).  The embedding runs
before the pipeline (on every stage: it is small), the final layer norm and the
tied output projection are the pipeline's loss head on the last stage, and
``spmd.parallel.pipeline_value_and_grad`` runs ``--microbatches K`` microbatches of the
device's rows by ``--schedule gpipe|1f1b``.  Composes with every other axis of the mesh, their
collectives running inside the stages: ``'data'`` (with ``--fsdp``, the stage
gathers its blocks' weights over it), ``'model'`` (the tensor-parallel ``psum`` calls),
``'seq'`` (each device embeds its block of the positions; the stages' attention is
ring attention) and ``'expert'``/``--experts`` (the stages' mixture-of-experts
``all_to_all``; each stage adds its blocks' load-balancing loss for each microbatch,
``stage_loss``, so the loss is the one the unpipelined step computes, the balancing
term averaged over the microbatches rather than taken over the device's rows at once:
equal with ``--microbatches 1``).

The loss is written as a sum over the devices that split the tokens (``'data'``,
``'expert'``, ``'seq'``: ``N`` of them): each device's term is its mean token loss
over ``N`` (and ``1 / N`` of the load-balancing loss, which every device computes
alike), so the gradients that autodiff sums over those axes are the loss's, with no
division after.

Checkpoints keep the model's usual layout (a list of blocks): :func:`stacked` and
:func:`unstacked` convert, so a run saved with ``pipe=2`` resumes with ``pipe=1`` and
the other way round.
"""

from __future__ import annotations

import functools

import numpy as np

import spmd
import spmd.numpy as snp
import spmd.optim as optim
from spmd import P, lax
from spmd.parallel import pipeline_value_and_grad

tree_map = spmd.tree_util.tree_map


def stacked(params):
    """The list of blocks as one block of stacked leaves (the pipeline's layout)."""
    return {**params, "blocks": tree_map(lambda *xs: snp.stack(xs), *params["blocks"])}


def unstacked(params, layers: int):
    """The stacked blocks as a list (the checkpoints' layout)."""
    return {**params, "blocks": [tree_map(lambda a, k=k: a[k], params["blocks"])
                                 for k in range(layers)]}


def pipe_specs(specs):
    """The specs of :func:`stacked` parameters: each block leaf split over 'pipe' along
    its leading (stage) dimension."""
    blk = specs["blocks"][0]
    return {**specs, "blocks": tree_map(lambda s: P("pipe", *s), blk,
                                        is_leaf=lambda x: isinstance(x, P))}


def decay_mask(params):
    """AdamW's weight-decay mask: matrices only, in either layout (a stacked layer-norm
    gain is 2-d but is no matrix)."""
    lead = isinstance(params.get("blocks"), dict)  # the stacked layout
    return {k: tree_map(lambda x: x.ndim > (2 if k == "blocks" and lead else 1), v)
            for k, v in params.items()}


def check(cfg, args, data: int, seq: int, expert: int, pipe: int) -> None:
    """``--mesh ...,pipe=S`` checked against the model and the batch, or SystemExit
    saying what to change (every mesh axis composes with 'pipe'; ``seq`` is checked
    by the caller, as without a pipeline).

    >>> check(cfg, parse_args(["--layers", "4"]), 1, 1, 1, 2)  # doctest: +SKIP
    """
    if cfg.layers % pipe:
        raise SystemExit(f"--mesh: 'pipe'={pipe} must divide --layers ({cfg.layers}); "
                         "give a multiple of it")
    rows = args.batch // (data * expert)
    if args.microbatches < 1 or rows % args.microbatches:
        raise SystemExit(f"--microbatches {args.microbatches} must divide each device's rows "
                         f"({rows} = --batch {args.batch} / data={data} x expert={expert})")


def to_save(params, state, pipe: int, layers: int):
    """The checkpoint's tree: the list layout whatever the mesh (so it restores onto
    any)."""
    if pipe == 1:
        return {"params": params, "opt": state}
    return {"params": unstacked(params, layers),
            "opt": map_param_trees(state, lambda t: unstacked(t, layers))}


def make_pipe_step(T, cfg, mesh, specs, opt, microbatches: int, schedule: str):
    """The jitted pipelined step (``T``: the model's ``block``, ``layer_norm``,
    ``_gather``, ``embed``, ``own_positions``, ``token_axes``, ``AUX_WEIGHT``,
    ``batch_spec`` and ``_state_specs``, from
    ``train_transformer``; ``specs``: the list layout's); it takes and returns
    :func:`stacked` parameters.

    >>> step, state_specs = make_pipe_step(ex, cfg, mesh, specs, opt, 4, "1f1b")  # doctest: +SKIP
    """
    sspecs = pipe_specs(specs)
    state_specs = T._state_specs(opt, sspecs)
    seq = "seq" if mesh.shape.get("seq", 1) > 1 else None
    tok_axes = T.token_axes(mesh, seq)  # every axis the tokens are split over
    n_tok = int(np.prod([mesh.shape[a] for a in tok_axes]))
    stage = _stage(T, cfg, specs["blocks"][0], cfg.layers // mesh.shape["pipe"], seq,
                   tok_axes, n_tok)

    def head(hp, y, targets):
        lnf, tok = hp
        logp = spmd.nn.log_softmax(T.layer_norm(y, lnf) @ T._gather(tok, specs["tok"]).T)
        # This device's share of the mean over all N token-splitting devices' tokens.
        return -snp.mean(snp.take_along_axis(logp, targets[..., None], axis=-1)) / n_tok

    def loss_and_grads(params, batch):
        tokens, targets = T.own_positions(mesh, seq, batch[:, :-1], batch[:, 1:])
        rows, t = tokens.shape
        k = microbatches

        def embed(tok, pos):
            x = T.embed(T._gather(tok, specs["tok"]), T._gather(pos, specs["pos"]), tokens, seq)
            return snp.reshape(x, (k, rows // k, t, cfg.d))

        xs, back = spmd.vjp(embed, params["tok"], params["pos"])
        loss, g = pipeline_value_and_grad(
            stage, head, params["blocks"], xs, snp.reshape(targets, (k, rows // k, t)),
            "pipe", loss_params=(params["lnf"], params["tok"]), schedule=schedule,
            stage_loss=bool(cfg.experts))
        d_tok, d_pos = back(g.inputs)
        # Every parameter is the same on the N devices (or, under FSDP, gathered over
        # 'data'): autodiff sums their gradients, which are of each device's share of
        # the loss, so the sum is the loss's gradient.
        grads = {"tok": d_tok + g.loss[1], "pos": d_pos, "lnf": g.loss[0],
                 "blocks": g.stage}
        return lax.psum(loss, tok_axes), grads

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh,
                       in_specs=(sspecs, state_specs, T.batch_spec(mesh)),
                       out_specs=(sspecs, state_specs, P()))
    def step(params, state, batch):
        loss, grads = loss_and_grads(params, batch)
        updates, state = opt.update(grads, state, params)
        return optim.apply_updates(params, updates), state, loss

    return step, state_specs


def _stage(T, cfg, bspec, per_stage: int, seq, tok_axes, n_tok: int):
    """A stage: this device's ``(per_stage, ...)`` stacked blocks on a microbatch; with
    experts, ``(output, this device's share of the blocks' load-balancing loss)``."""

    def stage(blocks, x):
        aux = np.float32(0.0)
        for k in range(per_stage):
            x, a = T.block(cfg, x, tree_map(lambda a: a[k], blocks), bspec, seq, "expert",
                           tok_axes)
            aux = aux + a
        if not cfg.experts:
            return x
        # The balancing loss is the same on the N token-splitting devices (its
        # statistics are over all their tokens): each carries 1/N of it as its own
        # summand, so the loss (their sum) counts it once and so does its gradient.
        return x, lax.pvary(T.AUX_WEIGHT * aux / n_tok, tok_axes)

    return stage


def map_param_trees(state, fn):
    """The optimizer state with each per-parameter tree (``mu``, ``nu``, ``trace``)
    replaced by ``fn(tree)`` (to change its layout with :func:`stacked`/:func:`unstacked`)."""
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*[fn(v) if f in ("mu", "nu", "trace") else map_param_trees(v, fn)
                             for f, v in zip(state._fields, state)])
    if isinstance(state, tuple):
        return tuple(map_param_trees(s, fn) for s in state)
    return state


def place(tree, mesh, specs):
    """``tree`` put on ``mesh`` by ``specs`` (a tree of PartitionSpecs of its structure)."""
    shardings = tree_map(lambda s: spmd.NamedSharding(mesh, s), specs,
                         is_leaf=lambda x: isinstance(x, P))
    return spmd.device_put(tree, shardings)

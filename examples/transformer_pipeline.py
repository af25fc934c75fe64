"""The pipelined training step of ``train_transformer.py`` (``--mesh ...,pipe=S``).

The blocks are cut into ``S`` stages of ``layers / S`` blocks over a ``'pipe'`` mesh
axis: a device holds its stage's blocks only, stacked (each block parameter gets a
leading dimension of the stage's blocks, split over ``'pipe'``).  The embedding runs
before the pipeline (on every stage: it is small), the final layer norm and the
tied output projection are the pipeline's loss head on the last stage, and
``spmd.parallel.pipeline_value_and_grad`` runs ``--microbatches K`` microbatches of the
device's rows by ``--schedule gpipe|1f1b``.  Composes with ``'data'`` and ``'model'``
(the tensor-parallel ``psum``s run inside the stages).

Checkpoints keep the model's usual layout (a list of blocks): :func:`stacked` and
:func:`unstacked` convert, so a run saved with ``pipe=2`` resumes with ``pipe=1`` and
the other way round.
"""

from __future__ import annotations

import functools

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
    """``--mesh ...,pipe=S`` with what it composes with, or SystemExit saying why not."""
    if seq > 1 or expert > 1 or cfg.experts or args.fsdp:
        raise SystemExit("--mesh ...,pipe=S composes with 'data' and 'model' only (not with "
                         "seq=, expert=, --experts or --fsdp yet)")
    if cfg.layers % pipe:
        raise SystemExit(f"--mesh: 'pipe'={pipe} must divide --layers ({cfg.layers})")
    rows = args.batch // data
    if args.microbatches < 1 or rows % args.microbatches:
        raise SystemExit(f"--microbatches {args.microbatches} must divide each 'data' "
                         f"device's rows ({rows} = --batch {args.batch} / data={data})")


def to_save(params, state, pipe: int, layers: int):
    """The checkpoint's tree: the list layout whatever the mesh (so it restores onto
    any)."""
    if pipe == 1:
        return {"params": params, "opt": state}
    return {"params": unstacked(params, layers),
            "opt": map_param_trees(state, lambda t: unstacked(t, layers))}


def make_pipe_step(T, cfg, mesh, specs, opt, microbatches: int, schedule: str):
    """The jitted pipelined step (``T``: the model's ``block``, ``layer_norm``,
    ``batch_spec`` and ``_state_specs``, from ``train_transformer``; ``specs``: the
    list layout's); it takes and returns :func:`stacked` parameters."""
    stages = mesh.shape["pipe"]
    per_stage = cfg.layers // stages
    bspec = specs["blocks"][0]
    sspecs = pipe_specs(specs)
    state_specs = T._state_specs(opt, sspecs)
    data = mesh.shape["data"]

    def stage(blocks, x):  # this device's (per_stage, ...) blocks
        for k in range(per_stage):
            x, _ = T.block(cfg, x, tree_map(lambda a: a[k], blocks), bspec)
        return x

    def head(hp, y, targets):
        lnf, tok = hp
        logp = spmd.nn.log_softmax(T.layer_norm(y, lnf) @ tok.T)
        return -snp.mean(snp.take_along_axis(logp, targets[..., None], axis=-1))

    def loss_and_grads(params, batch):
        tokens, targets = batch[:, :-1], batch[:, 1:]
        rows, t = tokens.shape
        k = microbatches

        def embed(tok, pos):
            x = snp.take(tok, tokens, axis=0) + pos[:t]
            return snp.reshape(x, (k, rows // k, t, cfg.d))

        xs, back = spmd.vjp(embed, params["tok"], params["pos"])
        loss, g = pipeline_value_and_grad(
            stage, head, params["blocks"], xs, snp.reshape(targets, (k, rows // k, t)),
            "pipe", loss_params=(params["lnf"], params["tok"]), schedule=schedule)
        d_tok, d_pos = back(g.inputs)
        # Each 'data' device's loss is the mean over its rows: the parameters, the same on
        # every 'data' device, get the sum of their gradients, so the mean is a division.
        mean = lambda x: x / data  # noqa: E731
        grads = {"tok": mean(d_tok + g.loss[1]), "pos": mean(d_pos),
                 "lnf": tree_map(mean, g.loss[0]), "blocks": tree_map(mean, g.stage)}
        return lax.pmean(loss, "data"), grads

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh,
                       in_specs=(sspecs, state_specs, T.batch_spec(mesh)),
                       out_specs=(sspecs, state_specs, P()))
    def step(params, state, batch):
        loss, grads = loss_and_grads(params, batch)
        updates, state = opt.update(grads, state, params)
        return optim.apply_updates(params, updates), state, loss

    return step, state_specs


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

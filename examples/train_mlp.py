"""Train a digit classifier with data AND tensor parallelism on a 2-D mesh.

The main job (``make demo``).  Runs unchanged in one process on simulated
devices and under MPI, one device per rank::

    python examples/train_mlp.py                      # 8 simulated devices: mesh (4, 2)
    spmd-run -n 4 examples/train_mlp.py               # 4 ranks: mesh (2, 2)
    mpiexec -n 4 python examples/train_mlp.py         # the same, by hand
    python examples/train_mlp.py --epochs 5 --batch 64 --mesh 8,1 --plot loss.png

The data are scikit-learn's bundled 8x8 digits (1797 images, 10 classes; they
ship inside the package, nothing is downloaded), standardised, split 80/20 by
a fixed seed.  The model is an MLP 64-256-256-10 with ReLU:

- the batch is split over the mesh axis ``'data'``;
- the two hidden layers are split Megatron-style over ``'model'``: ``W1`` by
  columns (``P(None, 'model')``), so each device computes its own quarter of
  the first hidden layer with no communication, and ``W2`` by rows
  (``P('model', None)``), so each device's product ``h1 @ W2`` is a partial
  sum that one ``psum`` over ``'model'`` completes;
- the output layer is replicated; the loss is the softmax cross-entropy
  averaged over the local rows and then over ``'data'`` by ``lax.pmean``.

``spmd.value_and_grad`` is taken OUTSIDE the ``shard_map``: the transposes add
one all-reduce over ``'data'`` per parameter gradient and nothing over
``'model'`` (the transpose of ``psum`` is ``pvary``).  The step (gradient and
momentum SGD) is one ``spmd.jit`` program.  Rank 0 prints a progress bar, the
loss of every epoch, the held-out accuracy (which must exceed 90%: the script
exits 1 otherwise) and the wall time.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time


def _limit_blas_threads() -> None:
    """Under a bare ``mpiexec -n N``, give each rank's BLAS its share of the cores.

    It must run before numpy loads OpenBLAS, which otherwise starts one spinning
    thread per core in every rank: 4 ranks on 2 cores then ran each step about
    20x slower.  ``spmd-run`` sets these variables itself.
    """
    ranks = os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") \
        or os.environ.get("PMI_SIZE")
    if not (ranks and ranks.isdigit() and int(ranks) > 1):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = str(max(1, (cores or 1) // int(ranks)))
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, threads)


_limit_blas_threads()

import numpy as np  # noqa: E402  (after the BLAS thread limit)

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import P, lax  # noqa: E402

SIZES = (64, 256, 256, 10)
N_CLASSES = SIZES[-1]
# W1, b1 split by output column over 'model'; W2 split by input row; the rest replicated.
PARAM_SPECS = ((P(None, "model"), P("model")), (P("model", None), P()), (P(), P()))
MIN_ACCURACY = 0.90
SEED = 0


# ------------------------------------------------------------------- data

def load_data(test_fraction: float = 0.2, seed: int = SEED):
    """``(x_train, y_train, x_test, y_test)``: standardised float32 images, int32 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(test_fraction * len(x)))
    test, train = order[:n_test], order[n_test:]
    # Statistics of the training set only; constant pixels (the borders) have std 0.
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std[std < 1e-6] = 1.0
    x = (x - mean) / std
    return x[train], y[train], x[test], y[test]


def one_hot(labels: np.ndarray) -> np.ndarray:
    return np.eye(N_CLASSES, dtype=np.float32)[labels]


# ------------------------------------------------------------------ model

def init_params(seed: int = SEED):
    """He-initialised weights (``spmd.nn.initializers``, JAX's values for the key) and zero
    biases, as global numpy arrays (the same on every rank: one key everywhere)."""
    he = spmd.nn.initializers.variance_scaling(2.0, "fan_in", "normal")
    keys = spmd.random.split(spmd.random.key(seed + 1), len(SIZES) - 1)
    return tuple((np.asarray(he(k, (m, n))), np.zeros(n, np.float32))
                 for k, m, n in zip(keys, SIZES[:-1], SIZES[1:]))


def logits_block(params, x):
    """The per-device forward pass: ``x`` holds this device's rows, W1/b1/W2 its slices."""
    (w1, b1), (w2, b2), (w3, b3) = params
    h1 = spmd.nn.relu(x @ w1 + b1)              # (rows, 256 / model): no communication
    h2 = lax.psum(h1 @ w2, "model")             # partial sums over the hidden units
    h2 = spmd.nn.relu(h2 + b2)                  # (rows, 256), the same on every 'model' device
    return h2 @ w3 + b3


def make_functions(mesh, lr: float, momentum: float):
    """``(train_step, correct_count, loss)`` for ``mesh``: the jitted momentum-SGD step,
    the jitted sharded count of correct predictions, and the sharded loss itself."""

    @functools.partial(spmd.shard_map, mesh=mesh,
                       in_specs=(PARAM_SPECS, P("data", None), P("data", None)), out_specs=P())
    def loss(params, x, y_onehot):
        log_p = spmd.nn.log_softmax(logits_block(params, x))
        local = -snp.mean(snp.sum(y_onehot * log_p, axis=-1))
        return lax.pmean(local, "data")

    @spmd.jit
    def train_step(params, velocity, x, y_onehot):
        value, grads = spmd.value_and_grad(loss)(params, x, y_onehot)
        velocity = spmd.tree_util.tree_map(lambda v, g: momentum * v + g, velocity, grads)
        params = spmd.tree_util.tree_map(lambda p, v: p - lr * v, params, velocity)
        return params, velocity, value

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh,
                       in_specs=(PARAM_SPECS, P("data", None), P("data"), P("data")),
                       out_specs=P())
    def correct_count(params, x, labels, weight):
        """How many of the (weighted: 0 marks padding) rows are classified right."""
        pred = snp.argmax(logits_block(params, x), axis=-1)
        hits = snp.where(pred == labels, weight, snp.zeros_like(weight))
        return lax.psum(snp.sum(hits), "data")

    return train_step, correct_count, loss


# -------------------------------------------------------------- the batch

def put_batch(array: np.ndarray, mesh, spec):
    """The batch as the step's argument.

    With ``spmd.make_array_from_process_local_data`` each process passes only
    the rows its devices hold; without it, every rank passes the global batch
    and ``shard_map`` slices its own blocks out of it.
    """
    if spmd.process_count() == 1 or not hasattr(spmd, "make_array_from_process_local_data"):
        return array
    sharding = spmd.NamedSharding(mesh, spec)
    index = sharding.devices_indices_map(array.shape)
    mine = [index[d][0] for d in spmd.local_devices() if d in index]
    start = min(s.start or 0 for s in mine)
    stop = max(array.shape[0] if s.stop is None else s.stop for s in mine)
    return spmd.make_array_from_process_local_data(sharding, array[start:stop], array.shape)


# ----------------------------------------------------------------- output

class Progress:
    """A progress bar over the training steps on rank 0 (tqdm when installed)."""

    def __init__(self, total: int, enabled: bool):
        self.enabled, self.total, self.done = enabled, total, 0
        self.bar = None
        # A redrawn bar needs a terminal; through pipes (spmd-run's rank prefixes,
        # CI logs) each epoch line carries a text bar instead.
        self.live = enabled and sys.stderr.isatty()
        if self.live:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="step", file=sys.stderr, leave=False,
                                dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, loss: float) -> None:
        if not self.enabled:
            return
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        elif self.live and (self.done == self.total or self.done % max(1, self.total // 50) == 0):
            width = 30
            filled = width * self.done // self.total
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] "
                             f"{self.done}/{self.total} steps  loss {loss:.4f}")
            sys.stderr.flush()

    def write(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        elif not self.live:
            width = 20
            filled = width * self.done // max(1, self.total)
            print(f"[{'#' * filled}{'.' * (width - filled)}] {line}", flush=True)
        else:
            if self.done:
                sys.stderr.write("\r" + " " * 70 + "\r")
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.live and self.done:
            sys.stderr.write("\n")


def save_plot(path: str, losses: list[float]) -> str:
    """Plot the loss per epoch to ``path``; returns a line to print."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return f"--plot {path}: matplotlib is not installed, no plot written"
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(range(1, len(losses) + 1), losses, marker="o")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"loss curve written to {path}"


# ------------------------------------------------------------------- main

def default_mesh_shape(n_devices: int) -> tuple[int, int]:
    """(data, model): two-way tensor parallelism whenever there are 4 or more devices."""
    if n_devices >= 4 and n_devices % 2 == 0:
        return n_devices // 2, 2
    return n_devices, 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=20, help="passes over the training set")
    ap.add_argument("--batch", type=int, default=128, help="global batch size")
    ap.add_argument("--mesh", default=None, metavar="DATA,MODEL",
                    help="mesh shape, e.g. 2,2 (default: from the device count)")
    ap.add_argument("--lr", type=float, default=0.05, help="learning rate")
    ap.add_argument("--momentum", type=float, default=0.9, help="momentum")
    ap.add_argument("--plot", default=None, metavar="PNG",
                    help="write the loss curve there (needs matplotlib)")
    return ap.parse_args(argv)


def mesh_shape(arg: str | None, n_devices: int) -> tuple[int, int]:
    if arg is None:
        return default_mesh_shape(n_devices)
    try:
        data, model = (int(v) for v in arg.split(","))
    except ValueError:
        raise SystemExit(f"--mesh must be DATA,MODEL (two integers), got {arg!r}") from None
    if data * model != n_devices:
        raise SystemExit(f"--mesh {data},{model} needs {data * model} devices, but there are "
                         f"{n_devices} (set SPMD_NUM_DEVICES, or the number of MPI ranks)")
    return data, model


def main(argv=None) -> int:
    args = parse_args(argv)
    rank0 = spmd.process_index() == 0
    say = print if rank0 else (lambda *a, **k: None)
    data, model = mesh_shape(args.mesh, spmd.device_count())
    if SIZES[1] % model:
        raise SystemExit(f"--mesh: the hidden width {SIZES[1]} must be divisible by the "
                         f"'model' size {model}")
    if args.batch % data:
        raise SystemExit(f"--batch {args.batch} must be divisible by the 'data' size {data}")
    mesh = spmd.make_mesh((data, model), ("data", "model"))

    x_train, y_train, x_test, y_test = load_data()
    steps_per_epoch = len(x_train) // args.batch
    if steps_per_epoch == 0:
        raise SystemExit(f"--batch {args.batch} is larger than the training set "
                         f"({len(x_train)} images)")
    say(f"digits: {len(x_train)} training / {len(x_test)} test images; MLP "
        f"{'-'.join(map(str, SIZES))}; mesh data={data} x model={model} over "
        f"{spmd.device_count()} devices in {spmd.process_count()} process(es); "
        f"batch {args.batch}, {steps_per_epoch} steps per epoch")

    train_step, correct_count, _ = make_functions(mesh, args.lr, args.momentum)
    params = init_params()
    velocity = spmd.tree_util.tree_map(np.zeros_like, params)
    rng = np.random.default_rng(SEED + 2)  # the same shuffles on every rank

    t0 = time.perf_counter()
    progress = Progress(args.epochs * steps_per_epoch, rank0)
    epoch_losses = []
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        total = 0.0
        for s in range(steps_per_epoch):
            rows = order[s * args.batch:(s + 1) * args.batch]
            xb = put_batch(x_train[rows], mesh, P("data", None))
            yb = put_batch(one_hot(y_train[rows]), mesh, P("data", None))
            params, velocity, value = train_step(params, velocity, xb, yb)
            total += float(value)
            progress.update(float(value))
        epoch_losses.append(total / steps_per_epoch)
        progress.write(f"epoch {epoch + 1:3d}/{args.epochs}  loss {epoch_losses[-1]:.4f}")
    progress.close()
    train_s = time.perf_counter() - t0

    accuracy = evaluate(correct_count, params, x_test, y_test, mesh)
    wall = time.perf_counter() - t0
    say(f"held-out accuracy: {accuracy:.4f} ({len(x_test)} test images)")
    say(f"wall time: {wall:.2f} s ({train_s:.2f} s training, "
        f"{1e3 * train_s / (args.epochs * steps_per_epoch):.2f} ms per step)")
    if args.plot and rank0:
        say(save_plot(args.plot, epoch_losses))
    if accuracy <= MIN_ACCURACY:
        say(f"FAILED: held-out accuracy {accuracy:.4f} is not above {MIN_ACCURACY}",
            file=sys.stderr)
        return 1
    say(f"accuracy > {MIN_ACCURACY}: ok")
    return 0


def evaluate(correct_count, params, x, y, mesh) -> float:
    """Accuracy on ``(x, y)``, padded to a multiple of the 'data' size (padding weighs 0)."""
    data = mesh.shape["data"]
    pad = (-len(x)) % data
    weight = np.concatenate([np.ones(len(x), np.float32), np.zeros(pad, np.float32)])
    x = np.concatenate([x, np.zeros((pad, x.shape[1]), x.dtype)])
    y = np.concatenate([y, np.zeros(pad, y.dtype)])
    hits = correct_count(params, put_batch(x, mesh, P("data", None)),
                         put_batch(y, mesh, P("data")), put_batch(weight, mesh, P("data")))
    return float(hits) / float(weight.sum())


if __name__ == "__main__":
    sys.exit(main())

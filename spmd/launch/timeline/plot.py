"""A picture of a merged trace (``spmd-run --trace-plot PNG``): per rank, stacked
bars of compute, transfer, wait and other time (from
:func:`~spmd.launch.timeline.summary.summarize`), and a strip of its step times
(the durations of its most common program, in order), titled with the straggler.

matplotlib is an optional dependency (the ``spmd[examples]`` extra); it is loaded
only here, when a plot is asked for.

>>> from spmd.launch.timeline import plot
>>> plot.plot(trace, "timeline.png")  # doctest: +SKIP
"""

from __future__ import annotations

from spmd.launch.timeline.merge import atomic_file, output_directory
from spmd.launch.timeline.summary import summarize

PHASES = (("compute", "#4c72b0"), ("transfer", "#55a868"), ("wait", "#c44e52"),
          ("other", "#b0b0b0"))


def plot(trace: dict, path: str) -> None:
    """Draw ``trace`` (a :func:`~spmd.launch.timeline.merge.merge` result) into the
    PNG file ``path``, atomically (a reader sees the old file or the whole new one).

    >>> plot(merge.merge(merge.read_parts("spool")), "timeline.png")  # doctest: +SKIP
    """
    output_directory(path, "plot")  # (before the drawing: a typo fails fast)
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError("plot: drawing the timeline needs matplotlib; install it with "
                          "`pip install matplotlib` (or the `spmd[examples]` extra)") from e
    # (Agg on a figure of its own, no pyplot: no global figure state, no GUI, and the
    # backend of a program that uses pyplot itself is left as it is)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    s = summarize(trace)
    fig = Figure(figsize=(10, 3 + 0.4 * max(s["ranks"], 1)), layout="constrained")
    FigureCanvasAgg(fig)
    bars, strip = fig.subplots(1, 2, gridspec_kw={"width_ratios": (1, 1.4)})
    _bars(bars, s)
    _strip(strip, s)
    fig.suptitle(_title(s))
    with atomic_file(path, "plot") as f:
        fig.savefig(f, format="png", dpi=100)


def _bars(ax, s: dict) -> None:
    """Per rank, a horizontal bar of its seconds split into the four kinds."""
    rows = s["per_rank"]
    labels = [f"rank {r['rank']}" + (f" ({r['host']})" if r["host"] else "") for r in rows]
    left = [0.0] * len(rows)
    for kind, color in PHASES:
        widths = [max(r[kind + "_s"], 0.0) for r in rows]
        ax.barh(labels, widths, left=left, color=color, label=kind)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()  # (rank 0 on top, as in the trace viewer)
    ax.set_xlabel("seconds")
    ax.set_title("where time went")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize="small",
              frameon=False)


def _strip(ax, s: dict) -> None:
    """Per rank, its step durations against the step's index."""
    for pid, step in s["steps"].items():
        ax.plot(range(step["count"]), [d * 1e3 for d in step["durations_s"]],
                marker=".", linestyle="-", linewidth=0.6, markersize=3,
                label=f"rank {pid}")
    names = sorted({step["name"] for step in s["steps"].values()})
    ax.set_title("step times" + (f": {', '.join(names)}" if names else " (no programs)"))
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    longest = max((max(step["durations_s"]) for step in s["steps"].values()), default=0.0)
    # (from zero, so that a few percent between ranks looks like a few percent)
    ax.set_ylim(0, longest * 1e3 * 1.15 or 1.0)
    ax.ticklabel_format(axis="y", useOffset=False)
    if s["steps"]:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=min(len(s["steps"]), 8),
                  fontsize="small", frameon=False)


def _title(s: dict) -> str:
    n = s["ranks"]
    title = f"spmd timeline: {n} rank{'s' * (n != 1)}, {s['duration_s']:.3g} s"
    st = s["straggler"]
    if st is not None:
        title += (f"\nstraggler {st['label']}, last at {st['share']:.0%} of collectives, "
                  f"{st['late_median_s'] * 1e3:.1f} ms late (median)")
    return title

"""python -m lab.eval_length's figures (--plot): the loss against position and length of each row, and the
passkey task's needle-in-a-haystack heatmaps, a panel or line per row of results (its checkpoint, label,
scaling, block_size and measures by length)."""

import math
from pathlib import Path

import numpy as np
import torch

from lab.measure.instruments import pyplot, save_figure

# a line style per row's method, the same in every panel
LINESTYLES = {"plain": "-", "window": ":", "linear": "--", "ntk": "-.", "yarn": (0, (6, 2))}
LINESTYLES |= {"dynamic": (0, (3, 1, 1, 1, 1, 1)), "llama3": (0, (8, 2, 1, 2)), "longrope": (0, (1, 1))}


def plot_needles(path, rows):
    """Needle-in-a-haystack heatmaps, a panel per row: length across, depth down, exact match (grey: n/a)."""
    plt, columns = pyplot(), min(4, len(rows))
    cmap, lines = plt.get_cmap("RdYlGn").with_extremes(bad="lightgrey"), math.ceil(len(rows) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(3.2 * columns, 2.8 * lines), squeeze=False)
    for ax in axes.flat[len(rows) :]:
        ax.axis("off")
    for ax, row in zip(axes.flat, rows):
        lengths = sorted(row.measures)
        depths = [c.depth for c in row.measures[lengths[0]]]
        grid = np.array([[c.accuracy for c in row.measures[n]] for n in lengths], dtype=float).T  # None: NaN
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            text = "n/a" if math.isnan(value) else f"{value:.0%}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_xlabel(f"length (tokens; T = {row.block_size})", fontsize=7)
        ax.set_ylabel("depth of the key", fontsize=7)
        ax.set_title(f"{Path(row.checkpoint).name}\n{row.label}", fontsize=8)
    save_figure(fig, path, "plot", dpi=120, tight=True)


def bucketed(positions, bucket):
    """(first position of each bucket, its mean loss): one point per `bucket` positions (the last: fewer)."""
    points = torch.tensor(positions, dtype=torch.float64).split(bucket)
    return [i * bucket for i in range(len(points))], [p.mean().item() for p in points]


def plot_losses(path, rows, bucket=1):
    """A column per checkpoint, the y-axes shared: on top the loss at each position (per bucket) at each row's
    longest length, a vertical line at T; below, the loss against L on a log2 axis. Within a column each row
    (plain, window, a RoPE extension) has its own colour, the same in every column, named in its legend."""
    plt, checkpoints = pyplot(), dict.fromkeys(row.checkpoint for row in rows)
    colors = {scaling: plt.cm.tab10(i) for i, scaling in enumerate(LINESTYLES)}
    size = (4.2 * len(checkpoints) + 1, 7.5)
    fig, axes = plt.subplots(2, len(checkpoints), figsize=size, squeeze=False, sharey="row")
    for column, checkpoint in enumerate(checkpoints):
        by_position, by_length = axes[:, column]
        for row in (row for row in rows if row.checkpoint == checkpoint):
            measured = [m for m in row.measures.values() if m.loss is not None]
            if not measured:
                continue
            style = dict(color=colors[row.scaling], linestyle=LINESTYLES[row.scaling], label=row.label)
            longest = max(measured, key=lambda m: m.length)
            by_position.plot(*bucketed(longest.positions, bucket), linewidth=1, **style)
            lengths, losses = [m.length for m in measured], [m.loss for m in measured]
            by_length.plot(lengths, losses, marker="o", markersize=3, **style)
            by_position.axvline(row.block_size, color="grey", linewidth=0.8)
        by_position.set_title(Path(checkpoint).name, fontsize=10)
        per = "position" if bucket == 1 else f"bucket of {bucket} positions"
        by_position.set_xlabel(f"position (one point per {per}; grey: T)", fontsize=8)
        by_length.set_xscale("log", base=2)
        by_length.set_xlabel("L (tokens, log2)", fontsize=8)
        by_length.legend(fontsize=7, frameon=False)
    axes[0, 0].set_ylabel("validation loss at the position\n(at each row's longest length)")
    axes[1, 0].set_ylabel("mean validation loss over L tokens")
    save_figure(fig, path, "plot", dpi=120, tight=True)

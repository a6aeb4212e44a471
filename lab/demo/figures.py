"""Regenerate the lesson's figures (docs/lesson.md) into docs/figures/, deterministically, offline, on a CPU.

    python -m lab.demo.figures                                  # all (the README's runs, trained if missing)
    python -m lab.demo.figures --only=sinusoidal,rope_decay     # a subset (these two need no model)
    python -m lab.demo.figures --checkpoints=DIR                # DIR/<pos> or DIR/shakespeare_char_<pos>

    sinusoidal      the sin/cos table at d = 768, and each pair's wavelength (2 pi .. ~61,000 tokens)
    rope_decay      RoPE's long-term decay (Su et al. 2021, 3.4.3): the bound, and scores of random q, k
    qk_terms        layer 1's q k^T of a trained learned-position model, split into its four terms
    attention       each scheme's attention maps (same head, same prompt), and attention against distance
    extrapolation   loss against length from docs/extrapolation.csv (the extrapolation study), if it exists
    probe           linear probes for position, per layer and scheme (python -m lab.demo.probe --figure)

The README's runs missing are trained first (1.5-2 minutes each on 2 CPU cores). Fixed seeds: the same
checkpoints give the same PNG bytes. A file already in --out under a figure's name is replaced when it is a
PNG (this command drew it), any other only with --replace."""

import sys

if not __package__:  # `python lab/demo/figures.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.demo.figures`")


import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lab.experiments.runs import inputs_of, model_dirs, read_rows, run_python
from lab.measure import instruments
from plumbing.cli import parse_flags
from plumbing.errors import UserError, one_line_errors
from positions import POS_SCHEMES, causal_mask, rope_frequencies, sinusoidal_embedding

PROG = "python -m lab.demo.figures"
FIGURES = ("sinusoidal", "rope_decay", "qk_terms", "attention", "extrapolation", "probe")
NEEDS_MODELS = ("qk_terms", "attention", "probe")
FILES = {"attention": ("attention.png", "attention_distance.png")}  # a figure's files but <name>.png
SEED_FOLDER = re.compile(r"_seed\d+")  # the study's runs of seeds after the first: its table gives the spread
UNSCALED = ("none", "plain", "", "-")  # the extrapolation table's names for no RoPE extension in a row


@dataclass
class FiguresConfig:
    only: str | None = None  # a comma-separated subset of the figures (default: all)
    out: str = "docs/figures"  # where the PNGs go
    checkpoints: str | None = None  # a folder holding <pos>/ or shakespeare_char_<pos>/; default: README's
    csv: str = "docs/extrapolation.csv"  # the extrapolation study's results, read (never recomputed) here
    replace: bool = False  # the figures may replace files in --out that this command did not write

    def __post_init__(self):
        names = self.names()
        if (unknown := [name for name in names if name not in FIGURES]) or not names:
            raise ValueError(
                f"--only={self.only!r}: unknown figure {', '.join(map(repr, unknown))}; "
                f"choose from {', '.join(FIGURES)}"
            )

    def names(self):
        return list(FIGURES) if self.only is None else [n.strip() for n in self.only.split(",") if n.strip()]


def sinusoidal_wavelengths(dim, base=10000.0):
    """Vaswani et al. 2017, 3.5: 2 pi / w_i, w_i = base^(-2i/dim): pair i's period in tokens. -> (dim/2,)"""
    return 2 * math.pi * base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def figure_sinusoidal(out, dim=768, n_pos=512, **_):
    fig, (ax_table, ax_wave) = instruments.pyplot().subplots(1, 2, figsize=(12, 4.6), width_ratios=[1.25, 1])
    table = sinusoidal_embedding(n_pos, dim, dtype=torch.float64).numpy()
    image = ax_table.imshow(table, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    ax_table.set(xlabel="channel (2i: sin, 2i + 1: cos)", ylabel="position p")
    ax_table.set_title(f"PE[p, channel], d = {dim}: fast pairs on the left, slow on the right")
    fig.colorbar(image, ax=ax_table, fraction=0.04)
    wavelength = sinusoidal_wavelengths(dim)
    ax_wave.semilogy(wavelength.numpy(), color="C0")
    for length, label in ((64, "T = 64 (our models)"), (1024, "T = 1024 (GPT-2)")):
        ax_wave.axhline(length, color="grey", linestyle="--", linewidth=0.8)
        ax_wave.text(dim // 2 - 1, length * 1.15, label, ha="right", fontsize=8, color="grey")
    for i, offset, ha in ((0, (8, 6), "left"), (dim // 2 - 1, (-8, -14), "right")):
        w = wavelength[i].item()
        ax_wave.annotate(f"{w:,.1f}", (i, w), textcoords="offset points", xytext=offset, ha=ha)
    ax_wave.set(xlabel="pair i", ylabel="wavelength 2 pi 10000^(2i/d) (tokens)")
    ax_wave.set_title("each pair's wavelength: 2 pi to ~61,000 tokens")
    ax_wave.grid(alpha=0.3, which="both")
    return [instruments.save_figure(fig, out / "sinusoidal.png", tight=True)]


def rope_decay_bound(distances, head_dim=128, base=10000.0):
    """Su et al.'s bound on |q^T R_m k| is max_j |h_(j+1) - h_j| sum_j |S_j|, S_j = sum_(k<j) e^(i m theta_k).
    -> (1/(d/2)) sum_j |S_j| at each distance m over its value at m = 0, (d/2 + 1) / 2: 1, then decaying."""
    inv_freq, _ = rope_frequencies(head_dim, base)
    angle = distances.to(torch.float64)[:, None] * inv_freq.double()[None, :]  # (M, d/2)
    partial = torch.polar(torch.ones_like(angle), angle).cumsum(dim=1)  # S_1 .. S_(d/2)
    return partial.abs().mean(dim=1) / ((head_dim / 2 + 1) / 2)


def rope_scores(q, k, distances, inv_freq):
    """<R_m q, k> for each pair and distance m, in apply_rope's rotate-half pairs (x_i, x_(i + d/2)):
    sum_i cos(m theta_i) (q1 k1 + q2 k2)_i + sin(m theta_i) (q1 k2 - q2 k1)_i. q, k: (N, d) -> (N, M)"""
    half = q.size(-1) // 2
    (q1, q2), (k1, k2) = q.split(half, dim=-1), k.split(half, dim=-1)
    angle = distances.to(q.dtype)[:, None] * inv_freq.to(q.dtype)[None, :]  # (M, d/2)
    return (q1 * k1 + q2 * k2) @ angle.cos().T + (q1 * k2 - q2 * k1) @ angle.sin().T


def figure_rope_decay(out, head_dim=128, max_distance=1024, n_pairs=2000, **_):
    distances = torch.arange(max_distance + 1)
    inv_freq = rope_frequencies(head_dim)[0].double()
    q, k = torch.randn(2, n_pairs, head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    same = rope_scores(q, q, distances, inv_freq) / (q * q).sum(-1, keepdim=True)  # q = k, relative to m = 0
    independent = rope_scores(q, k, distances, inv_freq) / (q.norm(dim=-1) * k.norm(dim=-1))[:, None]
    fig, (ax_bound, ax_random) = instruments.pyplot().subplots(1, 2, figsize=(12, 4.3), sharex=True)
    ax_bound.plot(distances, rope_decay_bound(distances, head_dim))
    ax_bound.set_title(f"Su et al. 3.4.3: the bound (1/(d/2)) sum_j |S_j|, d = {head_dim}, base 10^4")
    ax_bound.set_ylabel("relative to its value at distance 0")
    for ax in (ax_bound, ax_random):
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set_xlabel("relative distance m - n (tokens)")
        ax.grid(alpha=0.3)
    for scores, color, label in ((same, "C0", "q = k random"), (independent, "C3", "q, k independent")):
        low, high = torch.quantile(scores, torch.tensor([0.05, 0.95], dtype=scores.dtype), dim=0)
        ax_random.fill_between(distances, low, high, color=color, alpha=0.2, label=f"{label}: 5-95 %")
        ax_random.plot(distances, scores.mean(dim=0), color=color, label=f"{label}: mean")
    ax_random.set_title(f"{n_pairs} random Gaussian pairs: q.k / (|q| |k|) after RoPE")
    ax_random.legend(fontsize=8, loc="upper right")
    return [instruments.save_figure(fig, out / "rope_decay.png", tight=True)]


# Figures of trained models, on the same prompt: the first validation window
def figure_qk_terms(out, folders, head=0, **_):
    """Each term on its own colour scale (its spread in the title): the small ones still show their shape."""
    model, tokenizer, ckpt = instruments.load(folders["learned"], torch.float64)
    idx = instruments.validation_windows(ckpt, 1)
    terms = instruments.qk_terms(model, idx, head)
    terms["sum = q k^T"] = sum(terms.values())
    fig, axes = instruments.pyplot().subplots(1, 5, figsize=(20, 4.6), layout="constrained")
    positions = torch.arange(idx.size(-1))
    for ax, (name, term) in zip(axes, terms.items()):
        visible = term.masked_fill(~causal_mask(positions, positions), float("nan"))  # the future: blank
        limit = visible.nan_to_num().abs().max().item()
        image = ax.imshow(visible.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit)
        ax.set_title(f"{name}\n(std {visible[~visible.isnan()].std().item():.2f})")
        ax.set_xlabel("key position j")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
    axes[0].set_ylabel("query position i")
    text = tokenizer.decode(idx[0].tolist()).replace("\n", "\\n")
    fig.suptitle(
        f"Learned positions, layer 1, head {head}: q k^T = (q_tok + q_pos)(k_tok + k_pos)^T "
        f'on "{text[:48]}..."\n'
        "ln_1 split by the statistics of the sum x = tok + pos: LN(x) = g (tok - mean tok)/sigma_x + "
        "g (pos - mean pos)/sigma_x (exact, bias=False); W_q, W_k of the head applied to each part"
    )
    return [instruments.save_figure(fig, out / "qk_terms.png")]


def attention_by_distance(probs):
    """Mean attention weight at each distance i - j, over queries, heads and windows. (..., T, T) -> (T,).
    Even uniform attention falls with distance (only late queries see far keys): the figure draws it too."""
    T = probs.size(-1)
    distance = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    return torch.stack([probs[..., distance == d].mean() for d in range(T)])


def figure_attention(out, folders, head=0, n_windows=64, **_):
    """Row 1: layer 1, row 2: the last layer, head `head`, on the same prompt; then the distance profile."""
    plt = instruments.pyplot()
    from matplotlib.colors import PowerNorm

    fig, axes = plt.subplots(2, len(folders), figsize=(4 * len(folders), 8), squeeze=False)
    profiles = {}  # (pos, row): attention against distance over n_windows windows
    for column, pos in enumerate(folders):  # the schemes with a run (model_dirs)
        model, _, ckpt = instruments.load(folders[pos])
        windows = instruments.validation_windows(ckpt, n_windows)
        for row, layer in enumerate((0, model.config.n_layer - 1)):
            probs = instruments.attention_probabilities(model, windows[:1], layer)[0, head]
            ax = axes[row][column]
            ax.imshow(probs.numpy(), cmap="magma", norm=PowerNorm(0.5, vmin=0, vmax=1))
            ax.set_title(f"{pos}: layer {layer + 1}, head {head}", fontsize=10)
            ax.set_xlabel("key position j")
            every = instruments.attention_probabilities(model, windows, layer)  # (n_windows, n_head, T, T)
            profiles[pos, row] = attention_by_distance(every)
    for row in axes:
        row[0].set_ylabel("query position i")
    fig.suptitle("Attention probabilities of the trained models on the same prompt (colour: sqrt scale)")
    paths = [instruments.save_figure(fig, out / "attention.png", tight=True)]

    positions = torch.arange(len(next(iter(profiles.values()))))
    uniform = causal_mask(positions, positions).float() / (positions + 1)[:, None]  # 1/(i + 1) for j <= i
    uniform_profile = attention_by_distance(uniform).numpy()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for row, (ax, name) in enumerate(zip(axes, ("layer 1", "last layer"))):
        for pos in folders:
            ax.semilogy(profiles[pos, row].numpy(), label=pos)
        ax.semilogy(uniform_profile, color="grey", linestyle="--", label="uniform over j <= i")
        ax.set_title(f"{name}: mean attention at distance i - j ({n_windows} windows, all heads)")
        ax.set_xlabel("distance i - j (tokens)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("mean attention probability")
    axes[1].legend()
    return paths + [instruments.save_figure(fig, out / "attention_distance.png", tight=True)]


def figure_probe(out, checkpoints=None, replace=False, **_):
    """The probe is its own entry point: run as a user would (a subprocess), it draws the figure."""
    given = [f"--checkpoints={Path(checkpoints).resolve()}"] if checkpoints else []
    given += ["--replace"] if replace else []  # main checked probe.png as this command's output
    run_python(["-m", "lab.demo.probe", f"--figure={out.resolve() / 'probe.png'}", *given])
    return [out / "probe.png"]


def read_extrapolation(path):
    """{(checkpoint, pos, scaling): rows sorted by length}, each row with floats (NaN where empty)."""

    def number(text):
        try:
            return float(text)
        except (TypeError, ValueError):
            return math.nan

    curves, study = {}, "python -m lab.experiments.extrapolation"
    for row in read_rows(path, ("checkpoint", "pos", "block_size", "length", "loss"), study):
        key = (row["checkpoint"], row["pos"], row.get("scaling") or "none")
        columns = ("block_size", "length", "loss", "loss_beyond", "stderr")
        curves.setdefault(key, []).append({name: number(row.get(name)) for name in columns})
    return {key: sorted(rows, key=lambda r: r["length"]) for key, rows in curves.items()}


def figure_extrapolation(out, csv_path, **_):
    path = Path(csv_path)
    if not path.is_file():
        print(
            f"skipping extrapolation: {path} does not exist yet (the extrapolation study writes it); "
            "the other figures are made"
        )
        return []
    plt = instruments.pyplot()
    curves = {key: rows for key, rows in read_extrapolation(path).items() if not SEED_FOLDER.search(key[0])}
    fig, axes = plt.subplots(1, 2, figsize=(15, 5), sharex=True)
    colors = plt.get_cmap("tab20").colors  # 20 distinct colours: the study has 19 rows
    for i, ((checkpoint, pos, scaling), rows) in enumerate(sorted(curves.items())):
        column = {name: [r[name] for r in rows] for name in rows[0]}
        label = pos if scaling in UNSCALED else f"{pos} + {scaling}"
        style = dict(color=colors[i % len(colors)], marker="o", markersize=3)
        style["label"] = f"{label} ({Path(checkpoint).name})"
        axes[0].errorbar(column["length"], column["loss"], yerr=column["stderr"], capsize=2, **style)
        axes[1].plot(column["length"], column["loss_beyond"], **style)
    trained = {r["block_size"] for rows in curves.values() for r in rows if not math.isnan(r["block_size"])}
    titles = ("validation loss over the whole window", "loss at positions past the trained length")
    for ax, title in zip(axes, titles):
        for block_size in sorted(trained):
            ax.axvline(block_size, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="evaluation length (tokens); dashed: trained length", title=title)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("cross-entropy (nats/token)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", fontsize=7)
    fig.suptitle(f"Extrapolation, read from {path.name}")
    fig.tight_layout(rect=(0, 0, 0.74, 1))
    return [instruments.save_figure(fig, out / "extrapolation.png")]


def main(argv=None):
    """Make the figures --only names; -> the paths written."""
    with one_line_errors(PROG):
        sections = [("figures", FiguresConfig, None)]
        cfg = FiguresConfig(**parse_flags(argv, PROG, __doc__, sections))
        instruments.use_one_thread()
        try:
            instruments.pyplot()
        except ImportError:
            raise UserError("matplotlib is not installed: pip install matplotlib") from None
        out, names = Path(cfg.out), cfg.names()
        if "extrapolation" in names and Path(cfg.csv).is_file():
            read_extrapolation(cfg.csv)  # a CSV that is not the study's: refused before any figure
        files = [out / file for name in names for file in FILES.get(name, (f"{name}.png",))]
        inputs = [cfg.csv, *inputs_of(POS_SCHEMES, cfg.checkpoints)]  # what no figure may replace
        instruments.check_figure_paths("out", files, cfg.replace, inputs)  # before the work
        folders = {}
        if any(name in NEEDS_MODELS for name in names):
            started = time.perf_counter()
            folders = model_dirs(POS_SCHEMES, cfg.checkpoints)
            if "qk_terms" in names and "learned" not in folders:  # its figure reads the learned run's terms
                raise UserError(f"--only=qk_terms needs a run of pos=learned in {cfg.checkpoints}")
            shown = ", ".join(os.path.relpath(folder) for folder in folders.values())
            print(f"models ready in {time.perf_counter() - started:.0f} s: {shown}")
        written = []
        for name in names:
            started = time.perf_counter()
            torch.manual_seed(0)  # anything that draws without its own generator draws the same every run
            figure = globals()[f"figure_{name}"]
            paths = figure(
                out, folders=folders, csv_path=cfg.csv, checkpoints=cfg.checkpoints, replace=cfg.replace
            )
            for path in paths:
                print(f"wrote {path} ({name}, {time.perf_counter() - started:.1f} s)")
            written += paths
        return written


if __name__ == "__main__":
    main()

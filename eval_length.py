"""
Loss against length: how each checkpoint predicts text at, and past, the length it was trained on.

    python eval_length.py out/shakespeare_char_learned out/shakespeare_char_rope --lengths 0.5,1,2,4,8 --max_windows 64
    python eval_length.py out/shakespeare_char_rope out/shakespeare_char_alibi --lengths 32t,64t,256t \
        --max_windows 32 --csv loss.csv --plot loss.png

For each checkpoint (a folder train.py wrote, its best.pt else ckpt.pt, or a .pt file) and each length L, on the
validation split of the dataset it was trained on: the mean loss over non-overlapping windows of L tokens (all
that fit, or --max_windows of them spread evenly over the split), its standard error over the windows, and the
mean loss at positions >= T, the trained block_size. Exact full forward passes (no KV cache), in eval mode.

Lengths (--lengths, comma-separated). A bare number up to 16, or any number ending in x, is a multiple of each
checkpoint's own T, rounded to whole tokens: 0.5, 2, 8, 32x. A bare whole number above 16, or one ending in t, is
a count of tokens, the same for every checkpoint: 64, 256, 8t.

Rows, one per checkpoint and method; the method is the CSV's scaling column:
  plain    the checkpoint as trained. One fine-tuned with a RoPE extension (its model_config records a
           rope_scaling) is evaluated as recorded, at its own factor, and its row is labelled with that scaling.
  linear, ntk, dynamic, yarn
           RoPE checkpoints without a recorded extension: that extension at factor s = max(1, L / T), without
           retraining (as sample.py --rope_scaling sets it). At L <= T, s = 1 and each is plain (measured once).
  window   learned only. It has no positions past T, so its plain row is n/a there (never clamped or wrapped);
           this row scores each position with a sliding window of up to T tokens of context, as it generates.

Output: a markdown table on stdout, a row per checkpoint and method, a column per length; a cell is the loss
and, in brackets, its ratio to the same checkpoint's plain loss at L = T (measured even when T is not among the
lengths). --csv writes one line per (checkpoint, method, length); --positions_csv the mean loss at every
position; --plot the loss by position and the loss against length (needs matplotlib; the format from its
extension, png without one). Each is checked before the evaluation (its folder made, a temporary file written
there) and written all at once after it, so a prior file is replaced whole or not at all.

A bad flag is one line and exit status 2; a checkpoint or dataset that cannot be used, an output that cannot be
written, or windows that would not fit in the memory available, one line and exit status 1.
"""

import csv
import importlib.util
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from plumbing import report
from plumbing.checkpoint import CheckpointError, build_model, check_same_vocabulary, checkpoint_path, load_checkpoint
from plumbing.cli import RunError, UsageError, one_line_errors, parse_flags
from data.common import dataset_dir, load_meta
from plumbing.evaluation import validation_tokens, window_bytes, window_losses, window_starts
from plumbing.hardware import check_device, check_device_name, check_memory, resolve_device
from plumbing.outputs import check_outputs, write_output
from model import ROPE_SCALINGS, GPTConfig

CSV_COLUMNS = ("checkpoint", "pos", "scaling", "block_size", "length", "loss", "loss_beyond", "stderr", "windows")
POSITION_COLUMNS = ("checkpoint", "scaling", "length", "position", "loss")
MAX_BARE_MULTIPLE = 16  # a bare number up to this is a multiple of T (0.5, 1, 2, 4, 8), above it tokens (64, 256)


@dataclass
class EvalConfig:
    checkpoints: list[str]  # out_dirs of train.py runs (best.pt, else ckpt.pt) or checkpoint files
    lengths: str = "0.5,1,2,4,8"  # comma-separated; 2 or 2x: 2 x T; 256 or 256t: 256 tokens (bare > 16: tokens)
    rope_scalings: list[str] = field(default_factory=lambda: [*ROPE_SCALINGS])  # RoPE extensions run at s = L/T
    max_windows: int | None = None  # windows per length, spread evenly over the split; None: all that fit
    batch_size: int = 8  # windows per forward pass
    dataset: str | None = None  # evaluate on this dataset's val split; None: each checkpoint's own
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    csv: str | None = None  # write one line per (checkpoint, method, length) to this CSV file
    positions_csv: str | None = None  # write the mean loss at every position to this CSV file
    plot: str | None = None  # draw loss by position and loss against length into this image file
    bucket: int = 1  # positions averaged into each point of the plotted loss-by-position curves
    progress: bool = True  # a progress bar on stderr

    def __post_init__(self):
        parse_lengths(self.lengths)
        for name in ("max_windows", "batch_size", "bucket"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_device_name(self.device)
        if self.plot and importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--plot needs matplotlib: pip install matplotlib (or leave out --plot)")
        if self.plot:
            plot_format(self.plot)

    @property
    def outputs(self):
        return {"csv": self.csv, "positions_csv": self.positions_csv, "plot": self.plot}


def parse_args(argv=None):
    """Flags (and --config) -> EvalConfig; a mistake exits with status 2 and one line."""
    values = parse_flags(argv, "eval_length.py", __doc__, [("evaluation", EvalConfig, None)],
                         choices={"rope_scalings": ROPE_SCALINGS}, positional=("checkpoints",))
    with one_line_errors("eval_length.py"):
        return EvalConfig(**values)


# -----------------------------------------------------------------------------
# Lengths: multiples of T or token counts


@dataclass(frozen=True)
class Length:
    value: float  # a multiple of T, or a number of tokens
    multiple: bool  # True: value x T; False: value tokens

    def tokens(self, block_size):
        return round(self.value * block_size) if self.multiple else int(self.value)

    def __str__(self):
        return f"{self.value:g}x" if self.multiple else f"{int(self.value)}t"


def parse_lengths(text):
    """--lengths -> [Length]; ValueError (one line) for anything that is not a length of at least one token."""
    lengths = []
    for item in text.split(","):
        spec = item.strip().lower()
        number = spec[:-1] if spec.endswith(("x", "t")) else spec
        try:
            value = float(number)
        except ValueError:
            raise ValueError(f"--lengths: {item.strip()!r} is not a length; write 2 or 2x (2 x T) or 256 or 256t "
                             "(256 tokens)") from None
        # a bare number up to MAX_BARE_MULTIPLE is a multiple of T, a larger one a count of tokens
        multiple = spec.endswith("x") or (not spec.endswith("t") and value <= MAX_BARE_MULTIPLE)
        if not math.isfinite(value) or value <= 0 or (not multiple and value < 1):
            raise ValueError(f"--lengths: {item.strip()} is below 1: a length must be at least one token")
        if not multiple and not value.is_integer():
            raise ValueError(f"--lengths: {item.strip()} is not a whole number of tokens")
        lengths.append(Length(value if multiple else int(value), multiple))
    return lengths


# -----------------------------------------------------------------------------
# Checkpoints, and what to measure on each


@dataclass
class Source:
    """One checkpoint to evaluate, with the validation tokens of its dataset."""

    name: str  # as given on the command line
    path: Path
    ckpt: dict
    tokens: object  # the val split (np.memmap)

    @property
    def config(self):
        return self.ckpt["model_config"]

    @property
    def block_size(self):
        return self.config["block_size"]

    def methods(self, rope_scalings):
        """The CSV scaling names of this checkpoint's rows, its own (plain, or its recorded RoPE extension) first."""
        if self.config.get("rope_scaling"):
            return [self.config["rope_scaling"]]  # fine-tuned with it: measured as recorded, never re-scaled
        extra = ["window"] if self.config["pos"] == "learned" else []
        if self.config["pos"] == "rope":
            extra = list(rope_scalings)
        return ["plain", *extra]


def open_source(name, dataset=None):
    """Load a checkpoint (folder or file) and its dataset's val split; a one-line CheckpointError or ValueError
    for a missing path, a file that is no checkpoint, or a dataset whose token ids mean something else."""
    given = Path(name)
    if not given.exists():
        raise CheckpointError(f"{name}: no such folder or checkpoint file")
    path = given if given.is_file() else checkpoint_path(given)
    ckpt = load_checkpoint(path, mmap=True)  # the weights are read per row, the optimizer state never
    dataset = dataset or ckpt.get("train_config", {}).get("dataset")
    if dataset is None:
        raise CheckpointError(f"{path}: records no training dataset; say which with --dataset")
    try:
        tokens = validation_tokens(dataset)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    if "meta" in ckpt:
        check_same_vocabulary(path, ckpt["meta"], load_meta(dataset_dir(dataset)), dataset, "evaluate")
    return Source(name, path, ckpt, tokens)


def lengths_for(source, lengths):
    """{Length: tokens} for one checkpoint; a length that rounds to no token is a one-line ValueError."""
    resolved = {}
    for length in lengths:
        n = length.tokens(source.block_size)
        if n < 1:
            raise ValueError(f"--lengths: {length} of T = {source.block_size} ({source.name}) is {n} tokens, below 1")
        resolved[length] = n
    return resolved


def model_for(source, method, length, device):
    """The model a row is measured with at `length` tokens: the checkpoint as recorded (plain, window, or its own
    extension), or a RoPE extension at factor s = max(1, L / T)."""
    if method in ROPE_SCALINGS and not source.config.get("rope_scaling"):
        factor = max(1.0, length / source.block_size)
        model = build_model(source.path, source.ckpt, rope_scaling=method, rope_factor=factor)
    else:
        model = build_model(source.path, source.ckpt)
    return model.to(device).eval()


# -----------------------------------------------------------------------------
# Measuring


@dataclass
class Measure:
    length: int  # L, in tokens
    windows: int  # windows of L tokens averaged (0: not available)
    loss: float | None = None  # mean loss over every position of every window; None: not available
    loss_beyond: float | None = None  # mean loss at positions >= T; None when L <= T
    stderr: float | None = None  # standard error of the per-window mean loss; None with fewer than two windows
    positions: list = field(default_factory=list)  # mean loss at each position 0 .. L-1 over the windows


@dataclass
class Row:
    checkpoint: str
    pos: str
    scaling: str  # plain | linear | ntk | dynamic | yarn | window
    block_size: int  # T
    label: str  # how the table names the method
    measures: dict  # {L: Measure}
    reference: float  # the checkpoint's plain loss at L = T


def summarize(losses, length, block_size):
    """(windows, L) token losses -> Measure."""
    per_window = losses.double().mean(1)
    n = len(per_window)
    return Measure(
        length=length, windows=n, loss=per_window.mean().item(),
        loss_beyond=losses[:, block_size:].double().mean().item() if length > block_size else None,
        stderr=(per_window.std() / math.sqrt(n)).item() if n > 1 else None,
        positions=losses.double().mean(0).tolist(),
    )


def available(source, method, length):
    """learned has no positions past its table: its plain loss is not available there (see the window row)."""
    return not (method == "plain" and source.config["pos"] == "learned" and length > source.block_size)


def label(source, method):
    if method == "plain" or method == "window":
        return method
    if source.config.get("rope_scaling"):
        return f"{method} x{source.config['rope_factor']:g} (as trained)"
    return f"{method} (s = L/T)"


def same_as_plain(source, method, length):
    """Whether a row is the plain model at L: up to T, a RoPE extension applied here (not recorded in the
    checkpoint) runs at s = 1, and learned's sliding window holds the whole context."""
    applied_here = method == "window" or (method in ROPE_SCALINGS and not source.config.get("rope_scaling"))
    return applied_here and length <= source.block_size


def evaluate(sources, lengths, cfg, device):
    """Measure every row at every length (and each checkpoint's own row at L = T, the ratios' reference). -> [Row]
    A row that is the plain model at some length (same_as_plain) reuses plain's measure there."""
    plan = []  # (source, method, L, window starts)
    for source in sources:
        asked = sorted(set(lengths_for(source, lengths).values()))
        for i, method in enumerate(source.methods(cfg.rope_scalings)):
            for n in sorted({*asked, source.block_size}) if i == 0 else asked:
                if available(source, method, n) and not same_as_plain(source, method, n):
                    plan.append((source, method, n, window_starts(len(source.tokens), n, cfg.max_windows)))
    results = {}
    with tqdm(total=sum(len(starts) for *_, starts in plan), unit="window", disable=not cfg.progress,
              file=sys.stderr, dynamic_ncols=True) as bar:
        for source, method, n, starts in plan:
            bar.set_postfix_str(f"{source.name} {method} L={n}", refresh=False)
            model = model_for(source, method, n, device)
            losses = window_losses(model, source.tokens, n, starts, cfg.batch_size, device, bar.update)
            results[source.name, method, n] = summarize(losses, n, source.block_size)
    rows = []
    for source in sources:
        methods = source.methods(cfg.rope_scalings)
        reference = results[source.name, methods[0], source.block_size].loss
        for method in methods:
            measures = {n: results.get((source.name, "plain" if same_as_plain(source, method, n) else method, n),
                                       Measure(n, 0))
                        for n in lengths_for(source, lengths).values()}
            rows.append(Row(source.name, source.config["pos"], method, source.block_size, label(source, method),
                            measures, reference))
    return rows


# -----------------------------------------------------------------------------
# Reporting


def fmt(value, digits=6):
    return "" if value is None else f"{value:.{digits}f}"


def markdown_table(rows, lengths):
    """One line per row, one column per length: 'loss (ratio to the plain loss at L = T)', n/a where not available."""
    head = ["checkpoint", "pos", "T", "method", *(str(length) for length in lengths)]
    lines = []
    for row in rows:
        cells = []
        for length in lengths:
            m = row.measures[length.tokens(row.block_size)]
            cells.append("n/a" if m.loss is None else f"{m.loss:.3f} ({m.loss / row.reference:.2f})")
        lines.append([row.checkpoint, row.pos, str(row.block_size), row.label, *cells])
    caption = ("validation loss over non-overlapping windows of L tokens (2x: 2 x T; 256t: 256 tokens); in "
               "brackets the ratio to the checkpoint's own loss at L = T; n/a: no positions past T")
    return "\n".join([caption, "", report.markdown_table(head, lines)])


def write_table(flag, path, columns, lines):
    """A CSV file at path (its folder made): the header row, then lines; written atomically (outputs.write_output)."""

    def write(tmp):
        with open(tmp, "x", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(lines)

    write_output(flag, path, write)


def write_csv(path, rows):
    """One line per (checkpoint, method, length), CSV_COLUMNS; loss empty where not available."""
    write_table("csv", path, CSV_COLUMNS, [[row.checkpoint, row.pos, row.scaling, row.block_size, n, fmt(m.loss),
                                            fmt(m.loss_beyond), fmt(m.stderr), m.windows]
                                           for row in rows for n, m in row.measures.items()])


def write_positions_csv(path, rows):
    """The mean loss at every position of every measured (checkpoint, method, length), POSITION_COLUMNS."""
    write_table("positions_csv", path, POSITION_COLUMNS, [[row.checkpoint, row.scaling, n, p, fmt(loss)]
                                                          for row in rows for n, m in row.measures.items()
                                                          for p, loss in enumerate(m.positions)])


def bucketed(positions, bucket):
    """(first position of each bucket, mean loss over it): one point per `bucket` positions, the last may be short."""
    points = torch.tensor(positions, dtype=torch.float64).split(bucket)
    return [i * bucket for i in range(len(points))], [p.mean().item() for p in points]


def plot_format(path):
    """The image format --plot writes: its extension's (png without one); ValueError for one matplotlib can't write."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix, formats = Path(path).suffix[1:].lower(), FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise ValueError(f"--plot={path}: matplotlib writes no .{suffix} file; give one of "
                         f"{', '.join('.' + name for name in sorted(formats))}")
    return suffix or "png"


def plot(path, rows, bucket=1):
    """Two panels: the loss at each position (per bucket of positions) at each row's longest length, with a
    vertical line at each T; and the loss against L on a log2 axis."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    styles = {"plain": "-", "window": ":", "linear": "--", "ntk": "-.", "dynamic": (0, (3, 1, 1, 1, 1, 1)),
              "yarn": (0, (6, 2))}
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(dict.fromkeys(row.checkpoint for row in rows))}
    fig, (by_position, by_length) = plt.subplots(1, 2, figsize=(16, 6))
    for row in rows:
        style = {"color": colors[row.checkpoint], "linestyle": styles[row.scaling],
                 "label": f"{Path(row.checkpoint).name}: {row.label}"}
        measured = [m for m in row.measures.values() if m.loss is not None]
        if not measured:
            continue
        longest = max(measured, key=lambda m: m.length)
        by_position.plot(*bucketed(longest.positions, bucket), linewidth=1, **style)
        by_length.plot([m.length for m in measured], [m.loss for m in measured], marker="o", markersize=3, **style)
    for T in sorted({row.block_size for row in rows}):
        by_position.axvline(T, color="grey", linewidth=0.8)
        by_position.annotate(f" T = {T}", (T, 0.01), xycoords=("data", "axes fraction"), fontsize=8)
    per = "position" if bucket == 1 else f"bucket of {bucket} positions"
    by_position.set(xlabel=f"position (one point per {per})", ylabel="validation loss",
                    title="loss by position, at each row's longest length")
    by_length.set_xscale("log", base=2)
    by_length.set(xlabel="L (tokens, log2)", ylabel="mean validation loss over L tokens", title="loss against length")
    handles, labels = by_length.get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0, 0.74, 1))
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.74, 0.5), fontsize=7, frameon=False)
    write_output("plot", path, lambda tmp: fig.savefig(tmp, format=plot_format(path), dpi=120))
    plt.close(fig)


def check_windows(source, length, cfg, device):
    """ValueError (one line) if not one window of `length` tokens fits in the split, or a batch of them would not
    fit in the memory available."""
    batch = min(cfg.batch_size, len(window_starts(len(source.tokens), length, cfg.max_windows)))
    check_memory(window_bytes(GPTConfig(**source.config), batch, length), device,
                 f"evaluating {source.name} at L = {length:,} tokens in batches of {batch}",
                 "lower --lengths or --batch_size")


def main(argv=None):
    """Evaluate, print the table, write --csv, --positions_csv and --plot. -> [Row]"""
    cfg = parse_args(argv)
    lengths = parse_lengths(cfg.lengths)
    with one_line_errors("eval_length.py", status=1, errors=(CheckpointError, RunError, UsageError, ValueError)):
        device = resolve_device(cfg.device)
        check_device(device)
        sources = [open_source(name, cfg.dataset) for name in cfg.checkpoints]
        check_outputs(cfg.outputs, inputs=[source.path for source in sources])  # before the work, not after it
        for source in sources:  # every length is checked before any work
            for n in lengths_for(source, lengths).values():
                check_windows(source, n, cfg, device)
        rows = evaluate(sources, lengths, cfg, device)
        print(markdown_table(rows, lengths))
        if cfg.csv:
            write_csv(cfg.csv, rows)
        if cfg.positions_csv:
            write_positions_csv(cfg.positions_csv, rows)
        if cfg.plot:
            plot(cfg.plot, rows, cfg.bucket)
    return rows


if __name__ == "__main__":
    main()

"""
Loss against length, or passkey retrieval against length: how each checkpoint does at, and past, the length it
was trained on.

    python -m lab.eval_length out/shakespeare_char_learned out/shakespeare_char_rope --lengths 0.5,1,2,4,8
    python -m lab.eval_length out/shakespeare_char_rope out/shakespeare_char_alibi --lengths 32t,64t,256t \
        --max_windows 32 --csv loss.csv --plot loss.png
    python -m lab.eval_length out/passkey_rope out/passkey_alibi --task=passkey --csv pk.csv --plot pk.png

--task=loss: the mean val loss over non-overlapping windows of L tokens, its standard error, and the mean loss
at positions >= T (the trained block_size), by exact full forward passes. --task=passkey (checkpoints trained
on data/passkey): the exact match of the five digits over --trials samples per length and depth of the key,
with its 95% Wilson interval. A length is a multiple of T (a bare number up to 16, or ending in x: 0.5, 2,
32x) or a count of tokens (a bare whole number above 16, or ending in t: 64, 256, 8t). A row per checkpoint
and method: plain (as trained, or at its recorded RoPE extension); for RoPE each extension at s = max(1, L/T),
no retraining; for learned, which has no positions past T, a window of its last T tokens, as it generates.
A file already at --csv, --positions_csv or --plot is replaced when this command wrote it (a CSV with one of
its headers, an image of the format asked for), any other only with --replace.
"""

import sys

if not __package__:  # `python lab/eval_length.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.eval_length`")


import csv
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from data.common import dataset_dir, load_meta
from data.passkey.task import CHARS as PASSKEY_CHARS
from data.passkey.task import filler_length
from lab.measure.instruments import figure_format
from lab.measure.length_plots import plot_losses, plot_needles
from lab.measure.losses import validation_tokens, window_losses, window_starts
from lab.measure.retrieval import count_correct, passkey_batch, wilson_interval
from lab.outputs import check_not_input, check_not_theirs, check_outputs, csv_file, figure_file, write_output
from lab.tables import fmt, markdown_table
from model import GPTConfig
from plumbing import hardware
from plumbing.checkpoint import (
    check_same_vocabulary,
    checkpoint_path,
    open_checkpoint,
    open_model,
    rope_overrides,
)
from plumbing.cli import device_flag, list_flag, machine_device, parse_flags, threads_flag
from plumbing.errors import UserError, one_line_errors
from plumbing.fields import changed_fields, check_fields, setting
from plumbing.hardware import out_of_memory
from plumbing.progress import progress_bar
from positions import (
    LONGROPE,
    POSITION_MODULES,
    ROPE_SCALING_CHOICES,
    ROPE_SCALINGS,
    default_rope_factor,
    takes,
)

PROG = "python -m lab.eval_length"  # as the user types it, in every error line
ROW_COLUMNS = ("checkpoint", "pos", "scaling", "block_size", "length")
CSV_COLUMNS = (*ROW_COLUMNS, "loss", "loss_beyond", "stderr", "windows")
POSITION_COLUMNS = ("checkpoint", "scaling", "length", "position", "loss")
PASSKEY_COLUMNS = (*ROW_COLUMNS, "depth", "trials", "correct", "accuracy", "ci_low", "ci_high")
TASKS = ("loss", "passkey")
DEFAULT_LENGTHS = {"loss": "0.5,1,2,4,8", "passkey": "1,2,4,8"}
MAX_BARE_MULTIPLE = 16  # a bare number up to this is a multiple of T, above it a count of tokens
LENGTH_FORMS = "2 or 2x (2 x T) or 256 or 256t (256 tokens)"


@dataclass
class EvalConfig:
    checkpoints: list[str]  # out_dirs of train.py runs (best.pt, else ckpt.pt) or checkpoint files
    task: str = setting(
        "loss", "loss: validation loss against length; passkey: retrieval of a key stated once", choices=TASKS
    )
    lengths: str | None = setting(
        None, "2 or 2x: 2 x T; 256 or 256t: 256 tokens; None: 0.5,1,2,4,8 (passkey: 1-8)"
    )
    depths: str = setting(
        "0,0.25,0.5,0.75,1", "passkey: where the key is stated, as a fraction of the filler"
    )
    trials: int = setting(
        50, "passkey: samples per (length, depth), each with a fresh key and filler", at_least=1
    )
    passkey_seed: int = setting(
        0, "passkey: seeds the evaluation samples (keys apart from training's: data/passkey)", at_least=0
    )
    rope_scalings: list[str] = setting(
        [*ROPE_SCALINGS], "RoPE extensions at s = L/T", choices=ROPE_SCALING_CHOICES
    )
    rope_factors: str | None = setting(
        None, "longrope's per-pair factors (JSON): a longrope row for RoPE checkpoints"
    )
    max_windows: int | None = setting(
        None, "windows per length, spread evenly over the split; None: all that fit", at_least=1
    )
    batch_size: int = setting(8, at_least=1)  # windows per forward pass
    dataset: str | None = None  # evaluate on this dataset's val split; None: each checkpoint's own
    device: str = device_flag()  # auto | cpu | cuda | cuda:N | mps
    threads: str = threads_flag()
    csv: str | None = None  # write one line per (checkpoint, method, length) to this CSV file
    positions_csv: str | None = None  # write the mean loss at every position to this CSV file
    plot: str | None = None  # draw loss by position and loss against length into this image file
    bucket: int = setting(
        1, "positions averaged into each point of the plotted loss-by-position curves", at_least=1
    )
    progress: bool = True  # a progress bar on stderr
    replace: bool = False  # --csv, --positions_csv and --plot may replace a file this command did not write

    def __post_init__(self):
        check_fields(self)
        self.lengths = self.lengths or DEFAULT_LENGTHS[self.task]
        parse_lengths(self.lengths)
        parse_depths(self.depths)
        if self.rope_factors and LONGROPE not in self.rope_scalings:
            self.rope_scalings = [*self.rope_scalings, LONGROPE]
        if LONGROPE in self.rope_scalings and not self.rope_factors:
            raise ValueError("--rope_scalings=longrope takes its factors from --rope_factors=FILE")
        read = self.rope_factors and POSITION_MODULES["rope"].Settings(rope_factors=self.rope_factors)
        self.longrope = changed_fields(read) if read else None  # the file's settings, by RoPE's rules
        if self.plot and importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--plot needs matplotlib: pip install matplotlib (or leave out --plot)")
        if self.plot:
            figure_format(self.plot, "plot")  # one matplotlib writes


@dataclass(frozen=True)
class Length:
    value: float  # a multiple of T, or a number of tokens
    multiple: bool  # True: value x T; False: value tokens

    def tokens(self, block_size):
        return round(self.value * block_size) if self.multiple else int(self.value)

    def __str__(self):
        return f"{self.value:g}x" if self.multiple else f"{int(self.value)}t"


def parse_lengths(text):
    """--lengths -> [Length]; a one-line ValueError for anything not a length of at least one token, or a
    length given twice (1 and 1x are one: the same column twice)."""
    lengths = {}  # {Length: the item that gave it}
    for item in (item.strip() for item in text.split(",")):
        spec = item.lower()
        try:
            value = float(spec[:-1] if spec.endswith(("x", "t")) else spec)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value):
            finite = "" if value is None else " (not a finite number)"
            raise ValueError(f"--lengths: {item!r} is not a length{finite}; write {LENGTH_FORMS}")
        multiple = spec.endswith("x") or (not spec.endswith("t") and value <= MAX_BARE_MULTIPLE)
        if value <= 0 or (not multiple and value < 1):
            raise ValueError(f"--lengths: {item} is below 1: a length must be at least one token")
        if not multiple and not value.is_integer():
            raise ValueError(f"--lengths: {item} is not a whole number of tokens")
        length = Length(value if multiple else int(value), multiple)
        if length in lengths:
            raise ValueError(f"--lengths: {lengths[length]} and {item} are one length; give each once")
        lengths[length] = item
    return list(lengths)


def parse_depths(text):
    """--depths -> sorted [float] in [0, 1]: 0 is the first of the filler, 1 just before the question."""
    depths = set()
    for item in text.split(","):
        try:
            depth = float(item)
        except ValueError:
            depth = math.nan
        if not 0.0 <= depth <= 1.0:
            raise ValueError(
                f"--depths: {item.strip()!r} is not a depth; give fractions from 0 to 1 such as 0,0.5,1"
            )
        depths.add(depth)
    return sorted(depths)


@dataclass
class Source:
    name: str  # as given on the command line
    path: Path
    ckpt: dict
    tokens: object  # the val split (np.memmap); None for the passkey task
    data_dir: Path | None = None  # the folder of that split's dataset; None for the passkey task

    def __post_init__(self):
        self.config = GPTConfig(**self.ckpt["model_config"]).flat()  # its fields and settings, by name
        self.block_size = self.config["block_size"]
        with torch.device("meta"):  # its answers, no memory allocated
            self.scheme = POSITION_MODULES[self.config["pos"]](GPTConfig.from_flat(**self.config))
        self.limit = self.scheme.length_limit  # learned's table; None: unbounded

    def methods(self, rope_scalings, longrope=None):
        """The scaling names of its rows, its own (plain, or its recorded RoPE extension) first; longrope
        only where `longrope`, the --rope_factors read, fits it (no_longrope)."""
        if self.config.get("rope_scaling"):
            return [self.config["rope_scaling"]]  # fine-tuned with it: measured as recorded, never re-scaled
        if takes(self.scheme, "rope_scaling"):
            fits = longrope is not None and not self.no_longrope(longrope)
            return ["plain", *(m for m in rope_scalings if m != LONGROPE or fits)]
        return ["plain", "window"] if self.limit is not None else ["plain"]

    def no_rope_scalings(self):
        """Why this checkpoint takes no --rope_scalings row (its scheme rotates nothing, or it is measured at
        its own extension); None: it takes them."""
        if not takes(self.scheme, "rope_scaling"):
            return f"pos={self.config['pos']}, not RoPE"
        if self.config.get("rope_scaling"):
            return f"measured at its own rope_scaling={self.config['rope_scaling']}"
        return None

    def no_longrope(self, longrope):
        """Why the factors read from --rope_factors give this checkpoint no longrope row; None: they do."""
        if why := self.no_rope_scalings():
            return why
        searched = longrope.get("rope_original_len")
        original = self.config.get("rope_original_len") or self.block_size
        if searched not in (None, original):
            return f"T = {original}, the factors were searched for {searched}"
        return None


def open_source(name, dataset=None, task="loss"):
    """A checkpoint (folder or file) and, for the loss, its dataset's val split, or a one-line UserError."""
    given = Path(name)
    if not given.exists():
        raise UserError(f"{name}: no such folder or checkpoint file")
    path = given if given.is_file() else checkpoint_path(given)
    ckpt = open_checkpoint(path, mmap=True)  # the weights are read per row, the optimizer state never
    if task == "passkey":  # makes its own samples (lab/measure/retrieval.py)
        return Source(name, path, ckpt, None)
    dataset = dataset or ckpt.get("train_config", {}).get("dataset")
    if dataset is None:
        raise UserError(f"{path}: records no training dataset; say which with --dataset")
    tokens = validation_tokens(dataset)
    check_same_vocabulary(path, ckpt["meta"], load_meta(dataset_dir(dataset)), dataset, "evaluate")
    return Source(name, path, ckpt, tokens, dataset_dir(dataset))


def lengths_for(source, lengths):
    """{Length: tokens} for one checkpoint; a length that rounds to no token is a one-line UserError."""
    resolved, T = {length: length.tokens(source.block_size) for length in lengths}, source.block_size
    for length, n in resolved.items():
        if n < 1:
            why = f"{length} of T = {T} ({source.name}) is {n} tokens, below 1"
            raise UserError(f"--lengths: {why}; give longer lengths", 2)  # a bad value, as 0 is
    return resolved


def model_for(source, method, length, device, longrope=None):
    """A row's model: the checkpoint as recorded, or a RoPE extension at s = max(1, length / T)."""
    if method in ROPE_SCALING_CHOICES and not source.config.get("rope_scaling"):
        factor = default_rope_factor(length, source.block_size)
        longrope = longrope if method == LONGROPE else None
        return open_model(source.path, device, source.ckpt, method, factor, longrope=longrope)[0]
    return open_model(source.path, device, source.ckpt)[0]


def available(source, method, length):
    """A scheme with a table (learned) has no positions past it: its plain row is not available there."""
    return not (method == "plain" and source.limit is not None and length > source.limit)


def same_as_plain(source, method, length):
    """Up to T, a RoPE extension applied here runs at s = 1 and learned's window holds the whole context."""
    applied_here = method == "window" or (method in ROPE_SCALINGS and not source.config.get("rope_scaling"))
    return applied_here and length <= source.block_size


def label(source, method):
    if method == "plain" or method == "window":
        return method
    if source.config.get("rope_scaling"):
        return f"{method} x{source.config['rope_factor']:g} (as trained)"
    return "longrope (--rope_factors)" if method == LONGROPE else f"{method} (s = L/T)"


@dataclass
class Measure:
    length: int  # L, in tokens
    windows: int  # windows of L tokens averaged (0: not available)
    loss: float | None = None  # mean loss over every position of every window; None: not available
    loss_beyond: float | None = None  # mean loss at positions >= T; None when L <= T
    stderr: float | None = None  # standard error of the per-window mean loss; None under two windows
    positions: list = field(default_factory=list)  # mean loss at each position 0 .. L-1 over the windows

    def fields(self):  # CSV_COLUMNS after the row's
        return [*(fmt(v, ".6f") for v in (self.loss, self.loss_beyond, self.stderr)), self.windows]


@dataclass
class Retrieval:
    length: int  # L, in tokens
    depth: float  # where the key was stated, as a fraction of the filler before it
    trials: int  # 0: not available (learned past its table)
    correct: int  # trials whose five digits were all the argmax

    @property
    def accuracy(self):
        return self.correct / self.trials if self.trials else None

    def fields(self):  # PASSKEY_COLUMNS after the row's; accuracy and interval empty if not available
        low, high = wilson_interval(self.correct, self.trials) if self.trials else (None, None)
        rates = (fmt(v, ".4f") for v in (self.accuracy, low, high))
        return [f"{self.depth:g}", self.trials, self.correct, *rates]


@dataclass
class Row:
    checkpoint: str
    pos: str
    scaling: str  # plain | linear | ntk | dynamic | yarn | llama3 | window
    block_size: int  # T
    label: str  # how the table names the method
    measures: dict  # {L: Measure}, or {L: [Retrieval per depth]}
    reference: float | None  # the checkpoint's plain loss at L = T (None for passkey)

    def key(self, n):
        return [self.checkpoint, self.pos, self.scaling, self.block_size, n]


def passkey_vocabulary(source):
    """{char: id} of a checkpoint trained on the passkey vocabulary; a one-line UserError for any other."""
    chars = source.ckpt.get("meta", {}).get("chars") or []
    missing = sorted(set(PASSKEY_CHARS).difference(chars))
    if missing:
        raise UserError(
            f"{source.name}: --task=passkey needs a checkpoint trained on the passkey vocabulary "
            f"(python train.py --config configs/passkey.toml); its vocabulary lacks {''.join(missing)!r}"
        )
    return {c: i for i, c in enumerate(chars)}


def evaluate(sources, lengths, cfg, device, depths=None):
    """A Row per checkpoint and method: the loss at every length, or with depths (--task=passkey) cfg.trials
    samples at each length and depth. Each model runs once, under one progress bar, where it is available and
    not plain's model (same_as_plain: there the row shows plain's), and for the loss each checkpoint's own row
    at L = T too, the ratios' reference. -> [Row]"""
    plan = []  # (source, method, L)
    for source in sources:
        asked = set(lengths_for(source, lengths).values())
        for i, method in enumerate(source.methods(cfg.rope_scalings, cfg.longrope)):
            for n in sorted(asked | {source.block_size} if i == 0 and depths is None else asked):
                if available(source, method, n) and not same_as_plain(source, method, n):
                    plan.append((source, method, n))
    if depths is None:
        starts = {(s.name, n): window_starts(len(s.tokens), n, cfg.max_windows) for s, _, n in plan}
        total, unit = sum(len(starts[s.name, n]) for s, _, n in plan), "window"
    else:
        total, unit = len(plan) * len(depths) * cfg.trials, "trial"
    results = {}
    with progress_bar(total, unit, "evaluating", enabled=cfg.progress) as bar:
        for source, method, n in plan:
            bar.set_postfix_str(f"{source.name} {method} L={n}", refresh=False)
            model = model_for(source, method, n, device, cfg.longrope)
            if depths is None:  # (windows, L) token losses -> Measure
                windows = starts[source.name, n]
                losses = window_losses(model, source.tokens, n, windows, cfg.batch_size, device, bar.update)
                losses, T, count = losses.double(), source.block_size, len(windows)
                per_window = losses.mean(1)
                beyond = losses[:, T:].mean().item() if n > T else None
                stderr = (per_window.std() / math.sqrt(count)).item() if count > 1 else None
                result = Measure(n, count, per_window.mean().item(), beyond, stderr, losses.mean(0).tolist())
            else:
                stoi, result = passkey_vocabulary(source), []
                for depth in depths:
                    tokens, answer_start = passkey_batch(stoi, n, depth, cfg.trials, cfg.passkey_seed)
                    correct = count_correct(model, tokens.to(device), answer_start, cfg.batch_size)
                    result.append(Retrieval(n, depth, cfg.trials, correct))
                    bar.update(cfg.trials)
            results[source.name, method, n] = result
    rows = []
    for source in sources:
        methods = source.methods(cfg.rope_scalings, cfg.longrope)
        reference = results[source.name, methods[0], source.block_size].loss if depths is None else None
        for method in methods:
            measures = {}
            for n in lengths_for(source, lengths).values():
                key = (source.name, "plain" if same_as_plain(source, method, n) else method, n)
                empty = Measure(n, 0) if depths is None else [Retrieval(n, d, 0, 0) for d in depths]
                measures[n] = results.get(key, empty)
            pos, T = source.config["pos"], source.block_size
            rows.append(Row(source.name, pos, method, T, label(source, method), measures, reference))
    return rows


def table(caption, rows, lengths, cell):
    """The caption, then a markdown table: a line per row, a column per length, cell(row, its measure)."""
    head = ["checkpoint", "pos", "T", "method", *(str(length) for length in lengths)]
    lines = [
        [row.checkpoint, row.pos, str(row.block_size), row.label]
        + [cell(row, row.measures[length.tokens(row.block_size)]) for length in lengths]
        for row in rows
    ]
    return "\n".join([caption, "", markdown_table(head, lines)])


def loss_table(rows, lengths):
    caption = (
        "validation loss over non-overlapping windows of L tokens (2x: 2 x T; 256t: 256 tokens); in "
        "brackets the ratio to the checkpoint's own loss at L = T; n/a: no positions past T"
    )
    cell = lambda row, m: "n/a" if m.loss is None else f"{m.loss:.3f} ({m.loss / row.reference:.2f})"
    return table(caption, rows, lengths, cell)


def passkey_table(rows, lengths, depths, trials):
    caption = (
        f"passkey retrieval: exact match of all five digits, {trials} trials at each of the depths "
        f"{', '.join(f'{d:g}' for d in depths)}, pooled; in brackets the 95% Wilson interval; "
        "n/a: no positions past T"
    )

    def cell(row, cells):
        correct, n = sum(c.correct for c in cells), sum(c.trials for c in cells)
        low, high = wilson_interval(correct, n)
        return "n/a" if n == 0 else f"{correct / n:.0%} [{low:.0%}, {high:.0%}]"

    return table(caption, rows, lengths, cell)


def write_csv(flag, path, columns, lines):
    def write(tmp):  # the header row, then lines; written whole or not at all
        with open(tmp, "x", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([columns, *lines])

    write_output(flag, path, write)


def check_length(source, n, cfg):
    """A one-line UserError if `n` tokens cannot be measured: no window of n tokens fits in the split, or a
    passkey sample has no room for its key and question."""
    if cfg.task == "passkey":
        passkey_vocabulary(source)
        try:
            filler_length(n + 1)  # n inputs, and the last digit as their last target
        except ValueError as e:
            raise UserError(f"--lengths: {n} tokens of {source.name}: {e}; choose longer lengths") from None
    else:
        window_starts(len(source.tokens), n, cfg.max_windows)


def check_rope_scalings(sources, cfg):
    """Before any row: --rope_scalings given (other than its default, every one) where no checkpoint takes a
    RoPE extension's row is a usage UserError; -> a note naming the checkpoints it gives none, or None."""
    asked = [m for m in cfg.rope_scalings if m != LONGROPE]
    if not asked or tuple(asked) == ROPE_SCALINGS:
        return None
    skipped = [f"{s.name} ({why})" for s in sources if (why := s.no_rope_scalings())]
    if len(skipped) == len(sources):
        raise UserError(
            f"--rope_scalings={','.join(asked)} extends RoPE; no checkpoint takes it: {', '.join(skipped)}", 2
        )
    return f"note: --rope_scalings gives no rows to {', '.join(skipped)}" if skipped else None


def check_longrope(sources, lengths, cfg):
    """Before any row: a one-line UserError if --rope_factors give no checkpoint a longrope row, or cannot
    give one its row at every length (GPTConfig refuses them: their count, the attention factor); -> a note
    naming the checkpoints they give none (no_longrope), None if they give every one."""
    if not cfg.longrope:
        return None
    skipped = [f"{s.name} ({why})" for s in sources if (why := s.no_longrope(cfg.longrope))]
    if len(skipped) == len(sources):
        raise UserError(
            f"--rope_factors {cfg.rope_factors} gives no checkpoint a longrope row: {', '.join(skipped)}", 2
        )
    for source in (s for s in sources if not s.no_longrope(cfg.longrope)):
        for n in lengths_for(source, lengths).values():
            factor = default_rope_factor(n, source.block_size)
            try:
                GPTConfig.from_flat(**source.config | rope_overrides(LONGROPE, factor, longrope=cfg.longrope))
            except ValueError as e:
                raise UserError(f"--rope_factors {cfg.rope_factors} on {source.name}: {e}", 2) from None
    return f"note: --rope_factors gives no longrope row to {', '.join(skipped)}" if skipped else None


def check_flags_used(cfg, given):
    """A flag given (`given`: parse_flags') that this evaluation does not read is a usage UserError: ignored,
    it would look like a setting that took effect. -> None"""
    loss, passkey, plot = cfg.task == "loss", cfg.task == "passkey", "--plot with --task=loss"
    used = {  # flag: (read here, what reads it)
        "depths": (passkey, "--task=passkey"),
        "trials": (passkey, "--task=passkey"),
        "passkey_seed": (passkey, "--task=passkey"),
        "max_windows": (loss, "--task=loss"),
        "dataset": (loss, "--task=loss"),  # the passkey task makes its own samples
        "positions_csv": (loss, "--task=loss"),  # the loss at every position
        "bucket": (loss and cfg.plot, plot),  # points of the loss-by-position curves
        "replace": (any(output_flags(cfg).values()), "--csv, --positions_csv or --plot"),
    }
    for flag, (read, by) in used.items():
        if flag in given and not read:
            raise UserError(f"--{flag} applies to {by} only: leave it out, or give {by}", 2)


def check_checkpoints_distinct(names):
    """A checkpoint given twice (or as its folder and its file) is a usage UserError: its rows twice."""
    seen = {}  # {checkpoint file: the name that gave it}
    for name in names:
        real = checkpoint_path(name).resolve()
        if real in seen:
            twice = "given twice" if seen[real] == name else f"the same checkpoint as {seen[real]} ({real})"
            raise UserError(f"{name}: {twice}; give each checkpoint once", 2)
        seen[real] = name


def output_flags(cfg):
    return {"csv": cfg.csv, "positions_csv": cfg.positions_csv, "plot": cfg.plot}


def check_files(cfg, sources=None):
    """--csv, --positions_csv and --plot: before the checkpoints are read, check_outputs (none a checkpoint,
    each writable); once `sources` are open, none in the folder of a dataset they read, nor over a file this
    command did not write (a CSV of another header, a file that is no image) without --replace."""
    given = {flag: Path(path) for flag, path in output_flags(cfg).items() if path is not None}
    if sources is None:
        return check_outputs(given, [checkpoint_path(name) for name in cfg.checkpoints])
    data_dirs = [source.data_dir for source in sources if source.data_dir is not None]
    mine = csv_file(CSV_COLUMNS, PASSKEY_COLUMNS, POSITION_COLUMNS)  # a rerun may change the task
    plot = cfg.plot and figure_file(figure_format(cfg.plot, "plot"))
    earlier = {"csv": mine, "positions_csv": mine, "plot": plot}
    for flag, path in given.items():
        check_not_input(f"--{flag}={path}", path.resolve(), data_dirs)
    for flag, path in given.items():  # as check_outputs orders them: the message about the place first
        check_not_theirs(flag, path, *earlier[flag], cfg.replace)


def check_checkpoints_first(argv, sections):
    """A checkpoint (a run's folder, or a .pt file) that starts a second group of positional arguments, after
    flags that ended the first (`CKPT --lengths=1 CKPT2`), is a usage UserError saying that checkpoints go
    first, where argparse would call it an unrecognized argument. A flag's value (`--csv PATH`) is no
    positional; after a list flag, which takes every word, parse_flags says so itself."""
    groups, previous = 0, None
    for before, arg in zip([None, *argv], argv):
        flag = before is not None and before.startswith("--") and "=" not in before
        if flag and list_flag(sections, before[2:].replace("-", "_")):
            return
        if arg.startswith("-") or flag:  # a flag, or its value
            previous = None
            continue
        groups += previous is None
        previous = arg
        is_run = Path(arg).is_dir() and checkpoint_path(arg).is_file()
        if groups > 1 and (is_run or (arg.endswith(".pt") and Path(arg).is_file())):
            where = f"give the checkpoints before the flags: {PROG} CHECKPOINT... --FLAG..."
            raise UserError(f"{arg}: a checkpoint after the flags; {where}", 2)


def parse_args(argv=None):
    """The flags (sys.argv[1:] when None) -> EvalConfig, each rule on them checked: a bad one is a UserError
    of status 2 (or parse_flags' exit)."""
    sections, given = [("evaluation", EvalConfig, None)], set()
    check_checkpoints_first(sys.argv[1:] if argv is None else argv, sections)
    cfg = EvalConfig(**parse_flags(argv, PROG, __doc__, sections, positional=("checkpoints",), given=given))
    check_flags_used(cfg, given)
    check_checkpoints_distinct(cfg.checkpoints)
    return cfg


def main(argv=None):
    """Evaluate, print the table, write --csv, --positions_csv and --plot. -> [Row]"""
    with one_line_errors(PROG):
        cfg = parse_args(argv)
        lengths = parse_lengths(cfg.lengths)
        device = machine_device(cfg.device)
        # first: a full disk leaves torch no temporary folder, which reading a checkpoint may need
        check_files(cfg)
        sources = [open_source(name, cfg.dataset, cfg.task) for name in cfg.checkpoints]
        check_files(cfg, sources)  # the datasets the checkpoints name, and the files already there
        for source in sources:  # every length before any work
            for n in lengths_for(source, lengths).values():
                check_length(source, n, cfg)
        for note in (check_longrope(sources, lengths, cfg), check_rope_scalings(sources, cfg)):
            if note:
                print(note)
        print(hardware.use_threads(cfg.threads, device))  # the checks passed: work starts
        depths = parse_depths(cfg.depths) if cfg.task == "passkey" else None  # never empty for the passkey
        with out_of_memory("lower --lengths or --batch_size"):
            rows = evaluate(sources, lengths, cfg, device, depths)
        print(passkey_table(rows, lengths, depths, cfg.trials) if depths else loss_table(rows, lengths))
        cells = [(row, n, c) for row in rows for n, m in row.measures.items() for c in (m if depths else [m])]
        if cfg.csv:  # a line per Measure, or per Retrieval (a depth)
            columns = PASSKEY_COLUMNS if depths else CSV_COLUMNS
            write_csv("csv", cfg.csv, columns, [[*row.key(n), *c.fields()] for row, n, c in cells])
        if cfg.positions_csv:  # --task=loss only (check_flags_used)
            lines = [
                [row.checkpoint, row.scaling, n, p, fmt(loss, ".6f")]
                for row, n, m in cells
                for p, loss in enumerate(m.positions)
            ]
            write_csv("positions_csv", cfg.positions_csv, POSITION_COLUMNS, lines)
        if cfg.plot and depths:
            plot_needles(cfg.plot, rows)
        elif cfg.plot:
            plot_losses(cfg.plot, rows, cfg.bucket)
    return rows


if __name__ == "__main__":
    main()

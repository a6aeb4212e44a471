"""
The length-extrapolation study of docs/extrapolation.md, in one command: train, fine-tune, evaluate, summarise.

    python -m experiments.extrapolation                      # loss against length, one seed (~20 min, 2 CPU cores)
    python -m experiments.extrapolation --seeds 3            # the same with three training seeds per run
    python -m experiments.extrapolation --task passkey       # passkey retrieval against length (data/passkey)
    python -m experiments.extrapolation --config configs/shakespeare_char.toml   # the GPU recipe, T = 256
    python -m experiments.extrapolation --quick              # every step once, tiny and meaningless: a smoke run

It runs `python train.py` and `python eval_length.py` as subprocesses, exactly as a user would type them (each
command is printed first):
  1. the five schemes with the task's preset: train.py's defaults for loss (char-level Tiny Shakespeare, T = 64),
     configs/passkey.toml for passkey; --config names another. Into {out_root}/{dataset}_{pos}, and with
     --seeds N, seeds 1337 (train.py's default, that folder) to 1337 + N - 1 ({dataset}_{pos}_seed{S})
  2. four context extensions to 4 x T, each a short fine-tune of a trained run (train.py --init_from): rope with
     position interpolation (--rope_scaling=linear --rope_factor=4), rope with YaRN (--rope_scaling=yarn
     --rope_factor=4), learned with its table interpolated to 4 T rows (--block_size alone: train.py resizes it),
     and rope with nothing but the longer context, the control. Passkey fine-tunes on data/passkey_ctx{4T}.
  3. eval_length.py on all of them (once per seed) at 1, 2, 4 and 8 x T tokens (0.5 too for loss; the same
     token counts for every checkpoint), which also runs each RoPE extension without fine-tuning (s = L / T) and
     learned's sliding window
  4. under --results: {name}.csv (every checkpoint and seed), {name}.png (the first seed's figure: loss curves,
     or the needle heatmaps) and {name}_table.md: each seed's table, the mean and standard deviation over seeds
     (retrieval: accuracy pooled over seeds and depths, with its 95% interval), and which orderings of the
     schemes hold in every seed; name is extrapolation (loss) or retrieval (passkey).
A finished run of the same command is reused, one stopped early is continued (train.py --resume), and a folder
holding a run of other settings stops the study with one line (plumbing/runs.py; --retrain trains them all
again). So the README's own `python train.py --pos=X` runs serve as step 1's first seed, and an interrupted study
continues where it was.
"""

import csv
import importlib.util
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from data.common import load_meta
from data.passkey.task import default_name
from measure.retrieval import wilson_interval
from plumbing.cli import parse_flags
from plumbing.errors import UserError, one_line_errors
from plumbing.report import markdown_table
from plumbing.resume import fine_tune_dir
from plumbing.runs import DEFAULT_DURATION, ROOT, ensure_trained, plan, run_python
from positions import POS_SCHEMES

EXTENSION = 4  # the fine-tunes' context: 4 x T
FIRST_SEED = 1337  # train.py's default seed: its runs are the first seed's
# --extra: RoPE as released models ship it, at the same preset: (folder name, train.py flags)
EXTRA_RUNS = (
    ("rope_frac0.25", ("--pos=rope", "--rope_fraction=0.25")),  # GPT-NeoX rotates 25% of each head
    ("rope_nope4", ("--pos=rope", "--nope_interval=4")),
)  # Llama 4: every 4th layer without RoPE
# The fine-tunes: (source scheme, rope_scaling or None). train.py names their folders as here.
FINE_TUNES = (("rope", "linear"), ("rope", "yarn"), ("learned", None), ("rope", None))
# --quick: a few steps of everything, to check the pipeline end to end (the numbers mean nothing)
QUICK_TRAIN = [
    "--n_layer=4",
    "--n_head=2",
    "--n_embd=32",
    "--max_iters=20",
    "--eval_interval=20",
    "--eval_iters=2",
    "--log_interval=10",
]
QUICK_FINE_TUNE = [
    "--max_iters=4",
    "--warmup_iters=1",
    "--eval_interval=4",
    "--eval_iters=1",
    "--log_interval=2",
    "--batch_size=4",
]
QUICK_WINDOWS, QUICK_TRIALS = 2, 4


@dataclass(frozen=True)
class Task:
    name: str  # what the results files are called
    preset: str | None  # the base runs' train.py --config (None: train.py's defaults)
    lengths: str  # evaluation lengths, multiples of the base T
    eval_flags: tuple  # eval_length.py's flags for this task
    longer: tuple = ()  # (scheme, train.py flags): schemes its own preset trains longer, to learn the task inside T


TASKS = {
    "loss": Task("extrapolation", None, "0.5,1,2,4,8", ("--task=loss", "--batch_size=8")),
    # NoPE learns to copy last: 11% of keys at T after the preset's 3000 steps (docs/extrapolation.md)
    "passkey": Task(
        "retrieval",
        "configs/passkey.toml",
        "1,2,4,8",
        ("--task=passkey", "--batch_size=50"),
        longer=(("none", ("--max_iters=5000", "--lr_decay_iters=5000")),),
    ),
}


@dataclass
class StudyConfig:
    task: str = "loss"  # loss: validation loss against length; passkey: retrieval of a key stated once
    config: str | None = (
        None  # the base runs' train.py preset; None: the task's (train.py's defaults for loss)
    )
    seeds: int = 1  # training seeds per run: 1337, 1338, ...; tables give their mean and spread
    out_root: str | None = (
        None  # checkpoint folder; None: out (out/study_quick with --quick, out/<preset> with
    )
    #                              a --config other than the task's)
    results: str | None = (
        None  # folder for the CSV, figure and table; None: docs (docs/<preset> with a --config
    )
    #                             other than the task's; out_root with --quick)
    retrain: bool = False  # train and fine-tune again even where a checkpoint exists
    max_iters: int = 200  # fine-tuning steps at 4 x T (Peng et al. 2023 fine-tune YaRN for 400 steps)
    learning_rate: float = (
        3e-4  # fine-tuning peak learning rate, under pretraining's 1e-3 as in Chen et al. 2023
    )
    batch_size: int = 8  # fine-tuning sequences per step, each 4 x T tokens long
    lengths: str | None = None  # evaluation lengths, multiples of the base T; None: the task's
    max_windows: int = (
        64  # loss: evaluation windows per length and row, spread evenly over the validation split
    )
    trials: int = 50  # passkey: samples per length and depth
    device: str = "auto"  # passed to train.py and eval_length.py
    extra: bool = False  # also train and evaluate EXTRA_RUNS: rope rotating a quarter of each head, and rope
    #                      with every fourth layer without it
    quick: bool = False  # smoke run: a 1-layer model, 20 training and 4 fine-tuning steps, a few windows

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        for name in ("seeds", "max_iters", "batch_size", "max_windows", "trials"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.config is not None and not (ROOT / self.config).is_file():
            raise ValueError(f"config {self.config!r}: no such file; the presets are in configs/")
        self.lengths = self.lengths or TASKS[self.task].lengths
        try:
            multiples = multiples_of(self.lengths)
        except ValueError:
            multiples = []
        if not multiples or min(multiples) <= 0:
            raise ValueError(
                f"lengths must be positive multiples of T such as 0.5,1,2x, got {self.lengths!r}"
            )
        own = self.config in (None, TASKS[self.task].preset)
        subfolder = "" if own else Path(self.config).stem
        self.config = self.config or TASKS[self.task].preset
        self.out_root = self.out_root or ("out/study_quick" if self.quick else str(Path("out") / subfolder))
        self.results = self.results or (self.out_root if self.quick else str(Path("docs") / subfolder))


def multiples_of(lengths):
    """'0.5,1,2x' -> [0.5, 1.0, 2.0]"""
    return [float(x.strip().lower().removesuffix("x")) for x in lengths.split(",")]


def parse_args(argv=None):
    values = parse_flags(
        argv,
        "experiments/extrapolation.py",
        __doc__,
        [("study", StudyConfig, None)],
        choices={"task": tuple(TASKS)},
    )
    return StudyConfig(**values)


# -----------------------------------------------------------------------------
# The runs


def seeds(cfg):
    return [FIRST_SEED + i for i in range(cfg.seeds)]


def base_runs(cfg):
    """(name, train.py flags) of the runs trained from scratch: the five schemes (those the task's own preset trains
    longer with their flags), and EXTRA_RUNS with --extra."""
    task = TASKS[cfg.task]
    longer = dict(task.longer) if cfg.config == task.preset else {}
    return [(pos, (f"--pos={pos}", *longer.get(pos, ()))) for pos in POS_SCHEMES] + (
        list(EXTRA_RUNS) if cfg.extra else []
    )


def base_dir(cfg, dataset, name, seed):
    suffix = "" if seed == FIRST_SEED else f"_seed{seed}"
    return f"{cfg.out_root}/{dataset}_{name}{suffix}"


def train_runs(cfg, commands, duration=None):
    """The runs of these train.py commands: reused, continued or trained (plumbing/runs.py)."""
    ensure_trained(
        commands,
        None if cfg.quick else duration,
        cfg.retrain,
        elsewhere="move it away, or pass another --out_root (--retrain trains it again, replacing it)",
    )


def preset_flags(cfg):
    return [f"--config={cfg.config}"] if cfg.config else []


def base_commands(cfg, dataset):
    """train.py's flags for the five schemes (and --extra's) with the task's preset, each seed (QUICK_TRAIN's few
    steps with --quick)."""
    return [
        [
            *preset_flags(cfg),
            *flags,
            f"--out_dir={base_dir(cfg, dataset, name, seed)}",
            f"--seed={seed}",
            f"--device={cfg.device}",
            *(QUICK_TRAIN if cfg.quick else []),
        ]
        for seed in seeds(cfg)
        for name, flags in base_runs(cfg)
    ]


def train_base(cfg, dataset):
    train_runs(
        cfg,
        base_commands(cfg, dataset),
        DEFAULT_DURATION if cfg.task == "loss" and cfg.config is None else None,
    )


def fine_tune(cfg, dataset, long_dataset, block_size, seed):
    """The four context extensions to EXTENSION x block_size, each from its base run's weights. -> their folders"""
    long = EXTENSION * block_size
    steps = cfg.max_iters
    schedule = (
        QUICK_FINE_TUNE
        if cfg.quick
        else [
            f"--max_iters={steps}",
            f"--warmup_iters={max(1, steps // 10)}",
            f"--eval_interval={max(1, steps // 2)}",
            "--eval_iters=20",
            f"--log_interval={max(1, steps // 10)}",
            f"--batch_size={cfg.batch_size}",
        ]
    )
    sources = [base_dir(cfg, dataset, pos, seed) for pos, _ in FINE_TUNES]
    out_dirs = [fine_tune_dir(source, long, scaling) for source, (_, scaling) in zip(sources, FINE_TUNES)]
    data = [] if long_dataset == dataset else [f"--dataset={long_dataset}"]
    train_runs(
        cfg,
        [
            [
                f"--init_from={source}",
                f"--block_size={long}",
                *data,
                *([f"--rope_scaling={scaling}", f"--rope_factor={EXTENSION}"] if scaling else []),
                *schedule,
                f"--learning_rate={cfg.learning_rate}",
                f"--min_lr={cfg.learning_rate / 10:g}",
                f"--seed={seed}",
                f"--device={cfg.device}",
                f"--out_dir={out_dir}",
            ]
            for source, (_, scaling), out_dir in zip(sources, FINE_TUNES, out_dirs)
        ],
    )
    return out_dirs


def ensure_passkey_data(block_size):
    """data/passkey (T = 64) or data/passkey_ctx{T}, prepared once: python -m data.passkey.prepare. One made by an
    older prepare.py (other filler) stops the study in one line, saying how to make it again."""
    name = default_name(block_size)
    folder = ROOT / "data" / name
    if not (folder / "meta.json").is_file():
        run_python(["-m", "data.passkey.prepare", f"--block_size={block_size}"])
    load_meta(folder)  # refuses samples an older prepare.py drew, before any run starts
    return name


# -----------------------------------------------------------------------------
# Evaluating


def evaluate(cfg, block_size, out_dirs, seed, csv_path, figure):
    """eval_length.py on one seed's checkpoints at the same token counts. -> its table"""
    task = TASKS[cfg.task]
    lengths = ",".join(f"{round(m * block_size)}t" for m in multiples_of(cfg.lengths))
    plot = []
    if figure and importlib.util.find_spec("matplotlib") is None:
        print("note: matplotlib is not installed: no figure (pip install matplotlib)")
    elif figure:
        plot = ["--plot", figure, *(["--bucket=8"] if cfg.task == "loss" else [])]
    amount = (
        f"--trials={QUICK_TRIALS if cfg.quick else cfg.trials}"
        if cfg.task == "passkey"
        else f"--max_windows={QUICK_WINDOWS if cfg.quick else cfg.max_windows}"
    )
    command = [
        "eval_length.py",
        *out_dirs,
        *task.eval_flags,
        "--lengths",
        lengths,
        amount,
        f"--device={cfg.device}",
        "--csv",
        csv_path,
        *plot,
    ]
    print(f"\n$ {' '.join(['python', *map(str, command)])}   # seed {seed}")
    return run_python(command, stdout=subprocess.PIPE, text=True).stdout


# -----------------------------------------------------------------------------
# Over seeds: mean and spread, and the orderings that hold in every seed


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def run_name(checkpoint, seed):
    """The run a checkpoint folder belongs to, whatever its seed: out/passkey_rope_seed1338_ctx256_yarn ->
    passkey_rope_ctx256_yarn."""
    return Path(checkpoint).name.replace(f"_seed{seed}", "")


def loss_cells(records, seed):
    """{(run, method, length): loss} of one seed's eval_length CSV, available cells only."""
    return {
        (run_name(r["checkpoint"], seed), r["scaling"], int(r["length"])): float(r["loss"])
        for r in records
        if r["loss"]
    }


def retrieval_cells(records, seed):
    """{(run, method, length): (correct, trials)} pooled over depths, of one seed's eval_length CSV."""
    cells = defaultdict(lambda: [0, 0])
    for r in records:
        if int(r["trials"]):
            cell = cells[run_name(r["checkpoint"], seed), r["scaling"], int(r["length"])]
            cell[0] += int(r["correct"])
            cell[1] += int(r["trials"])
    return {key: tuple(value) for key, value in cells.items()}


def ordering(values_by_seed, better):
    """The runs ranked by their mean over seeds, '<' between neighbours whose order holds in every seed (better
    first), '~' where some seed reverses it. values_by_seed: {run: [value per seed]}"""
    mean = {run: statistics.fmean(values) for run, values in values_by_seed.items()}
    ranked = sorted(mean, key=mean.get, reverse=better == "higher")
    text = ranked[0]
    for a, b in zip(ranked, ranked[1:]):
        pairs = zip(values_by_seed[a], values_by_seed[b])
        holds = all((x < y) if better == "lower" else (x > y) for x, y in pairs)
        text += f" {'<' if holds else '~'} {b}" if better == "lower" else f" {'>' if holds else '~'} {b}"
    return text


def summary(cfg, per_seed, block_size):
    """The markdown of the spread over seeds: a table of mean +- standard deviation (loss) or pooled accuracy with
    its interval (retrieval), and per length the orderings of the five base schemes (their own rows)."""
    lengths = sorted({key[2] for cells in per_seed for key in cells})
    keys = sorted({key[:2] for cells in per_seed for key in cells})
    head = ["run", "method", *(f"{n}t" for n in lengths)]
    lines = []
    for run, method in keys:
        row = [run, method]
        for n in lengths:
            found = [cells[run, method, n] for cells in per_seed if (run, method, n) in cells]
            if not found:
                row.append("n/a")
            elif cfg.task == "loss":
                spread = f" ± {statistics.stdev(found):.3f}" if len(found) > 1 else ""
                row.append(f"{statistics.fmean(found):.3f}{spread}")
            else:
                correct, trials = sum(c for c, _ in found), sum(t for _, t in found)
                low, high = wilson_interval(correct, trials)
                row.append(f"{correct / trials:.0%} [{low:.0%}, {high:.0%}]")
        lines.append(row)
    what = (
        "mean validation loss ± its standard deviation over seeds"
        if cfg.task == "loss"
        else "exact-match rate pooled over seeds and depths, [95% Wilson interval]"
    )
    text = [
        f"Over {len(per_seed)} seed(s) ({', '.join(map(str, seeds(cfg)))}): {what}.",
        "",
        markdown_table(head, lines),
        "",
    ]
    if len(per_seed) > 1:
        text.append(
            "The base schemes (their own rows) ranked by the mean, best first: '<' (or '>') where every "
            "seed puts them in that order, '~' where some seed reverses it (a difference within the seed "
            "spread)."
        )
        text.append("")
        for n in lengths:
            runs = [key[0] for key in keys if key[1] == "plain" and "_ctx" not in key[0]]
            values = {}
            for run in runs:
                found = [cells.get((run, "plain", n)) for cells in per_seed]
                if all(v is not None for v in found):
                    values[run] = found if cfg.task == "loss" else [c / t for c, t in found]
            if len(values) > 1:
                text.append(
                    f"- {n} tokens ({n / block_size:g} T): "
                    f"{ordering(values, 'lower' if cfg.task == 'loss' else 'higher')}"
                )
    return "\n".join(text)


def merge_csv(paths, out_path):
    """The seeds' CSVs as one file, one header."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", newline="", encoding="utf-8") as out:
        writer = None
        for path in paths:
            for record in read_csv(path):
                if writer is None:
                    writer = csv.DictWriter(out, fieldnames=list(record))
                    writer.writeheader()
                writer.writerow(record)


def main(argv=None):
    with one_line_errors("experiments/extrapolation.py"):
        return run_study(parse_args(argv), argv)


def run_study(cfg, argv):
    """Train, fine-tune and evaluate every run of the study, write its tables. -> wall time in seconds"""
    task = TASKS[cfg.task]
    start = time.perf_counter()
    results = ROOT / cfg.results
    preset = plan([[*preset_flags(cfg), "--pos=rope", *(QUICK_TRAIN if cfg.quick else [])]])[0]
    dataset, block_size = preset.train_config["dataset"], preset.model_config["block_size"]
    long_dataset = dataset
    if cfg.task == "passkey":
        if default_name(block_size) != dataset:  # checked before anything is prepared
            raise UserError(
                f"--task=passkey trains on data/passkey (or passkey_ctxN for T = N); the preset "
                f"{cfg.config} trains on {dataset}"
            )
        ensure_passkey_data(block_size)
        long_dataset = ensure_passkey_data(EXTENSION * block_size)
    train_base(cfg, dataset)
    runs = {
        seed: [base_dir(cfg, dataset, name, seed) for name, _ in base_runs(cfg)]
        + fine_tune(cfg, dataset, long_dataset, block_size, seed)
        for seed in seeds(cfg)
    }
    tables, per_seed, csvs = [], [], []
    for i, seed in enumerate(seeds(cfg)):
        csv_path = ROOT / cfg.out_root / f"{task.name}_seed{seed}.csv"
        figure = results / f"{task.name}.png" if i == 0 else None
        tables.append(
            f"Seed {seed}:\n\n{evaluate(cfg, block_size, runs[seed], seed, csv_path, figure).rstrip()}"
        )
        records = read_csv(csv_path)
        per_seed.append(loss_cells(records, seed) if cfg.task == "loss" else retrieval_cells(records, seed))
        csvs.append(csv_path)
    merge_csv(csvs, results / f"{task.name}.csv")
    seconds = time.perf_counter() - start
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    footer = (
        f"Measured {when} by `python {' '.join(['-m experiments.extrapolation', *(argv or sys.argv[1:])])}`: "
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()} with "
        f"{torch.get_num_threads()} threads; wall time {seconds / 60:.1f} min"
        + (" (--quick: the numbers mean nothing)" if cfg.quick else "")
        + "."
    )
    text = "\n\n".join([summary(cfg, per_seed, block_size), *tables, footer])
    table_path = results / f"{task.name}_table.md"
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(text + "\n", encoding="utf-8")
    print(
        f"\n{text}\nwrote {cfg.results}/{task.name}.csv, {task.name}.png (if matplotlib) and {task.name}_table.md"
    )
    return seconds


if __name__ == "__main__":
    main()

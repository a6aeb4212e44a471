"""The length-extrapolation study of docs/extrapolation.md, one command: train, fine-tune, evaluate, tabulate.

    python -m experiments.extrapolation                   # loss against length, one seed (~20 min, 2 cores)
    python -m experiments.extrapolation --seeds 3         # the same with three training seeds per run
    python -m experiments.extrapolation --task passkey    # passkey retrieval against length (data/passkey)
    python -m experiments.extrapolation --config configs/shakespeare_char.toml   # the GPU recipe, T = 256
    python -m experiments.extrapolation --quick           # every step once, tiny: a smoke run
    python -m experiments.extrapolation --schemes rope --longrope --seeds 3   # LongRoPE beside YaRN, llama3
    python -m experiments.extrapolation --schemes rope --longrope --search_seeds 3   # and the search's spread

It runs train.py and eval_length.py as a user would, each command printed first: the schemes into
{out_root}/{dataset}_{pos}[_seed{S}]; fine-tunes to 4 x T (rope with PI, with YaRN, and alone as the control;
learned with its table interpolated; --longrope: LongRoPE's factors searched at 4 T, then from the fine-tune
at 8 T and at T; --search_seeds N: N searches at 4 T, each put on the rope run by a 0-step run, their spread
tabulated); every run at 1 to 8 x T (RoPE's extensions zero-shot too). It writes {name}.csv, {name}.png and
{name}_table.md (per seed, then mean and spread over seeds) under --results. Finished runs are
reused (--retrain trains again): the README's train.py runs are seed 1337's."""

import csv
import importlib.util
import math
import platform
import statistics
import subprocess
import sys
import time
from collections import namedtuple
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from data.common import load_meta
from data.passkey.task import default_name, filler_length
from measure.retrieval import wilson_interval
from plumbing.cli import parse_flags
from plumbing.errors import UserError, one_line_errors
from plumbing.outputs import check_outputs, write_output
from plumbing.report import markdown_table
from plumbing.resume import fine_tune_dir
from plumbing.runs import DEFAULT_DURATION, ROOT, ensure_trained, plan, run_python
from positions import LONGROPE, POS_SCHEMES, require

PROG = "experiments/extrapolation.py"
EXTENSION = 4  # the fine-tunes' context: 4 x T
FIRST_SEED = 1337  # train.py's default seed: its runs are the first seed's
# --extra: RoPE as released models ship it: GPT-NeoX rotates 25% of each head, Llama 4 skips every 4th layer
EXTRA_RUNS = (
    ("rope_frac0.25", ("--pos=rope", "--rope_fraction=0.25")),
    ("rope_nope4", ("--pos=rope", "--nope_interval=4")),
)
# The fine-tunes: (source scheme, rope_scaling or None); train.py names their folders as here
FINE_TUNES = (("rope", "linear"), ("rope", "yarn"), ("learned", None), ("rope", None))
# --quick: a few steps of everything, to check the pipeline end to end
QUICK_TRAIN = "--n_layer=4 --n_head=2 --n_embd=32 --max_iters=20 --eval_interval=20 --eval_iters=2".split()
QUICK_TRAIN += ["--log_interval=10"]
QUICK_FINE_TUNE = "--max_iters=4 --warmup_iters=1 --eval_interval=4 --eval_iters=1 --log_interval=2".split()
QUICK_FINE_TUNE += ["--batch_size=4"]


# name: the results files'; preset: the base runs' train.py --config (None: its defaults); lengths: multiples
# of T evaluated; longer: {scheme: train.py flags} its own preset trains longer, to learn the task
Task = namedtuple("Task", "name preset lengths eval_flags longer")
NOPE = {"none": ("--max_iters=5000", "--lr_decay_iters=5000")}  # copies last: 11% of keys at T in 3000 steps
TASKS = {
    "loss": Task("extrapolation", None, "0.5,1,2,4,8", ("--task=loss", "--batch_size=8"), {}),
    "passkey": Task(
        "retrieval", "configs/passkey.toml", "1,2,4,8", ("--task=passkey", "--batch_size=50"), NOPE
    ),
}


@dataclass
class StudyConfig:
    task: str = "loss"  # loss: validation loss against length; passkey: retrieval of a key stated once
    config: str | None = None  # the base runs' train.py preset; None: the task's
    seeds: int = 1  # training seeds per run: 1337, 1338, ...; tables give their mean and spread
    out_root: str | None = None  # folder; None: out, out/<preset> (other preset), out/study_quick (--quick)
    results: str | None = None  # results folder; None: docs, docs/<preset> (other preset), out_root (--quick)
    retrain: bool = False  # train and fine-tune again even where a checkpoint exists
    max_iters: int = 200  # fine-tuning steps at 4 x T (Peng et al. 2023 fine-tune YaRN for 400 steps)
    learning_rate: float = 3e-4  # fine-tuning peak learning rate, under pretraining's 1e-3 (Chen et al. 2023)
    batch_size: int = 8  # fine-tuning sequences per step, each 4 x T tokens long
    lengths: str | None = None  # evaluation lengths, multiples of the base T; None: the task's
    max_windows: int = 64  # loss: evaluation windows per length and row, spread over the validation split
    trials: int = 50  # passkey: samples per length and depth
    device: str = "auto"  # passed to train.py and eval_length.py
    extra: bool = False  # also train and evaluate EXTRA_RUNS (partial RoPE, RoPE skipping every 4th layer)
    schemes: list[str] = field(default_factory=lambda: [*POS_SCHEMES])  # the base runs' schemes
    longrope: bool = False  # also LongRoPE on rope: searched at 4 T, fine-tuned, searched at 8 T and at T
    search_seeds: int = 1  # --longrope: searches at 4 T per rope run (seeds S, S + 1000, ...): their spread
    quick: bool = False  # smoke run: a small model, 20 training and 4 fine-tuning steps, a few windows

    def __post_init__(self):  # task and schemes: parse_flags' choices
        for name in ("seeds", "max_iters", "batch_size", "max_windows", "trials", "search_seeds"):
            require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        require(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        exists = self.config is None or (ROOT / self.config).is_file()
        require(exists, f"config {self.config!r}: no such file; the presets are in configs/")
        require(self.schemes, f"--schemes is empty: give some of {', '.join(POS_SCHEMES)}")
        require(not self.longrope or "rope" in self.schemes, "--longrope extends rope: keep it in --schemes")
        require(
            self.longrope or self.search_seeds == 1,
            "--search_seeds repeats LongRoPE's search: add --longrope",
        )
        if self.quick:
            self.max_windows, self.trials = 2, 4
        self.lengths = self.lengths or TASKS[self.task].lengths
        multiples_of(self.lengths)  # checks them
        subfolder = "" if self.config in (None, TASKS[self.task].preset) else Path(self.config).stem
        self.config = self.config or TASKS[self.task].preset
        self.out_root = self.out_root or ("out/study_quick" if self.quick else str(Path("out") / subfolder))
        self.results = self.results or (self.out_root if self.quick else str(Path("docs") / subfolder))


def multiples_of(lengths):
    """'0.5,1,2x' -> [0.5, 1.0, 2.0]; a ValueError unless every one is a positive finite number"""
    try:
        multiples = [float(x.strip().lower().removesuffix("x")) for x in lengths.split(",")]
    except ValueError:
        multiples = [0]
    if not all(0 < m < math.inf for m in multiples):  # nan too
        raise ValueError(f"lengths must be positive multiples of T such as 0.5,1,2x, got {lengths!r}")
    return multiples


seeds = lambda cfg: [FIRST_SEED + i for i in range(cfg.seeds)]
preset_flags = lambda cfg: [f"--config={cfg.config}"] if cfg.config else []
base_dir = lambda cfg, dataset, name, seed: (
    f"{cfg.out_root}/{dataset}_{name}" + ("" if seed == FIRST_SEED else f"_seed{seed}")
)


def parse_args(argv=None):
    choices = {"task": tuple(TASKS), "schemes": POS_SCHEMES}
    return StudyConfig(**parse_flags(argv, PROG, __doc__, [("study", StudyConfig, None)], choices=choices))


def results_name(cfg):
    """extrapolation or retrieval, then a subset's schemes, then longrope: no part overwrites the whole."""
    subset = [] if cfg.schemes == list(POS_SCHEMES) else cfg.schemes
    return "_".join([TASKS[cfg.task].name, *subset, *(["longrope"] if cfg.longrope else [])])


def base_runs(cfg):
    """(name, train.py flags) of the runs trained from scratch: the schemes, and EXTRA_RUNS with --extra."""
    task = TASKS[cfg.task]
    longer = task.longer if cfg.config == task.preset else {}
    runs = [(pos, (f"--pos={pos}", *longer.get(pos, ()))) for pos in POS_SCHEMES if pos in cfg.schemes]
    return runs + (list(EXTRA_RUNS) if cfg.extra else [])


def train_runs(cfg, commands, duration=None):
    """The runs of these train.py commands: reused, continued or trained (plumbing/runs.py)."""
    elsewhere = "move it away, or pass another --out_root (--retrain trains it again, replacing it)"
    ensure_trained(commands, None if cfg.quick else duration, cfg.retrain, elsewhere=elsewhere)


def base_commands(cfg, dataset):
    """train.py's flags for every base run and seed."""
    quick = QUICK_TRAIN if cfg.quick else []
    return [
        [*preset_flags(cfg), *flags, f"--out_dir={base_dir(cfg, dataset, name, seed)}", f"--seed={seed}"]
        + [f"--device={cfg.device}", *quick]
        for seed in seeds(cfg)
        for name, flags in base_runs(cfg)
    ]


def fine_tune(cfg, dataset, long_dataset, block_size, seed):
    """The context extensions to EXTENSION x block_size of the base runs. -> (folders, their shared flags)"""
    long, steps, tenth = EXTENSION * block_size, cfg.max_iters, max(1, cfg.max_iters // 10)
    schedule = [f"--max_iters={steps}", f"--warmup_iters={tenth}", f"--eval_interval={max(1, steps // 2)}"]
    schedule += ["--eval_iters=20", f"--log_interval={tenth}", f"--batch_size={cfg.batch_size}"]
    schedule = QUICK_FINE_TUNE if cfg.quick else schedule
    data = [] if long_dataset == dataset else [f"--dataset={long_dataset}"]
    rest = [f"--learning_rate={cfg.learning_rate}", f"--min_lr={cfg.learning_rate / 10:g}", f"--seed={seed}"]
    commands, out_dirs = [], []
    for pos, scaling in [(pos, scaling) for pos, scaling in FINE_TUNES if pos in cfg.schemes]:
        source = base_dir(cfg, dataset, pos, seed)
        out_dirs.append(fine_tune_dir(source, long, scaling))
        scale = [f"--rope_scaling={scaling}", f"--rope_factor={EXTENSION}"] if scaling else []
        commands.append([f"--init_from={source}", f"--block_size={long}", *data, *scale, *schedule, *rest])
        commands[-1] += [f"--device={cfg.device}", f"--out_dir={out_dirs[-1]}"]
    train_runs(cfg, commands)
    return out_dirs, data + schedule + rest + [f"--device={cfg.device}"]


def search_longrope(cfg, ckpt, seed, name, *flags):
    """python -m experiments.longrope on a checkpoint into {ckpt}_longrope_{name}, once."""
    out = Path(f"{ckpt}_longrope_{name}")
    if not (ROOT / out / "factors.json").is_file():
        quick = ["--population=4", "--parents=2", "--generations=2", "--windows=2"] if cfg.quick else []
        run_python(["-m", "experiments.longrope", ckpt, *flags, f"--seed={seed}", f"--out={out}", *quick])
    return f"{out}/factors.json"


def searched_runs(cfg, dataset, source, seed, first):
    """--search_seeds N > 1: search k = 1 at 4 T is the fine-tune's (first: its factors file), k = 2 .. N
    more for the rope run (seeds seed + 1000 (k - 1)), each put on its weights by a 0-step run
    {source}_x4_search{k}. -> those runs"""
    runs, long = [], f"x{EXTENSION}"
    for k in range(1, cfg.search_seeds + 1 if cfg.search_seeds > 1 else 1):
        extra = (cfg, source, seed + 1000 * (k - 1), f"{long}_search{k}", f"--factor={EXTENSION}")
        factors = first if k == 1 else search_longrope(*extra)
        runs.append(f"{source}_{long}_search{k}")
        zero = [f"--init_from={source}", f"--dataset={dataset}", f"--rope_factors={factors}", "--max_iters=0"]
        zero += ["--eval_iters=1", f"--seed={seed}", f"--device={cfg.device}", f"--out_dir={runs[-1]}"]
        train_runs(cfg, [zero])
    return runs


def longrope_runs(cfg, dataset, block_size, seed, fine_tune_flags):
    """LongRoPE, progressive as the paper's: factors for the rope run at 4 T, a fine-tune with them, from it
    factors at 8 T and (short-context recovery) at T, put on its weights by 0-step runs; with --search_seeds,
    searched_runs too. -> (factors, runs)"""
    source, long = base_dir(cfg, dataset, "rope", seed), EXTENSION * block_size
    factors = search_longrope(cfg, source, seed, f"x{EXTENSION}", f"--factor={EXTENSION}")
    tuned = fine_tune_dir(source, long, LONGROPE)
    command = [f"--init_from={source}", f"--block_size={long}", f"--rope_factors={factors}"]
    train_runs(cfg, [[*command, *fine_tune_flags, f"--out_dir={tuned}"]])
    applied, data = [], [flag for flag in fine_tune_flags if flag.startswith("--dataset=")]  # the fine-tune's
    for name, flag in ((f"x{2 * EXTENSION}", f"--factor={2 * EXTENSION}"), ("short", "--short")):
        searched = search_longrope(cfg, tuned, seed, name, flag)
        applied.append(f"{tuned}_{name}")
        zero = [f"--init_from={tuned}", *data, f"--rope_factors={searched}", "--max_iters=0"]
        zero += ["--eval_iters=1", f"--seed={seed}", f"--device={cfg.device}", f"--out_dir={applied[-1]}"]
        train_runs(cfg, [zero])
    return factors, [tuned, *applied, *searched_runs(cfg, dataset, source, seed, factors)]


def summary(cfg, per_seed, block_size):
    """The markdown of the spread over seeds: per run, method and length the losses' mean +- standard
    deviation, or the pooled accuracy with its 95% Wilson interval; then the base schemes' orderings."""
    loss = cfg.task == "loss"
    lengths = sorted({key[2] for cells in per_seed for key in cells})
    keys = sorted({key[:2] for cells in per_seed for key in cells})
    found = lambda key: [cells[key] for cells in per_seed if key in cells]

    def cell(values):
        if not values:
            return "n/a"
        if loss:
            spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
            return f"{statistics.fmean(values):.3f}{spread}"
        correct, trials = sum(c for c, _ in values), sum(t for _, t in values)
        low, high = wilson_interval(correct, trials)
        return f"{correct / trials:.0%} [{low:.0%}, {high:.0%}]"

    rows = [[run, method, *(cell(found((run, method, n))) for n in lengths)] for run, method in keys]
    what = "mean validation loss ± its standard deviation over seeds"
    what = what if loss else "exact-match rate pooled over seeds and depths, [95% Wilson interval]"
    head = ["run", "method", *(f"{n}t" for n in lengths)]
    listed = ", ".join(map(str, seeds(cfg)))
    text = [f"Over {len(per_seed)} seed(s) ({listed}): {what}.", "", markdown_table(head, rows), ""]
    if len(per_seed) > 1:
        text += [
            "The base schemes (their own rows) ranked by the mean, best first: '<' (or '>') where every seed "
            "puts them in that order, '~' where some seed reverses it (a difference within the seed spread).",
            "",
        ]
        runs = [
            run for run, method in keys if method == "plain" and "_ctx" not in run and "_search" not in run
        ]
        for n in lengths:
            every = {run: v for run in runs if len(v := found((run, "plain", n))) == len(per_seed)}
            values = every if loss else {run: [c / t for c, t in v] for run, v in every.items()}
            if len(values) > 1:
                mean = {run: statistics.fmean(v) for run, v in values.items()}
                ranked = sorted(mean, key=mean.get, reverse=not loss)
                order = ranked[0]
                for a, b in zip(ranked, ranked[1:]):
                    holds = all((x < y) if loss else (x > y) for x, y in zip(values[a], values[b]))
                    order += f" {('<' if loss else '>') if holds else '~'} {b}"
                text.append(f"- {n} tokens ({n / block_size:g} T): {order}")
    return "\n".join(text)


def search_spread(cfg, per_seed, block_size):
    """The markdown of how much LongRoPE's result owes to its search's seed: per training seed, run, method
    and length, the mean ± standard deviation, min and max over the --search_seeds searched_runs."""
    loss, groups = cfg.task == "loss", {}
    for seed, cells in zip(seeds(cfg), per_seed):
        for (run, method, n), value in cells.items():
            if "_search" in run:
                key = (seed, run.rsplit("_search", 1)[0], method, n)
                groups.setdefault(key, []).append(value if loss else value[0] / value[1])
    if not groups:
        return []
    show = (lambda v: f"{v:.3f}") if loss else (lambda v: f"{v:.0%}")
    rows = []
    for (seed, run, method, n), v in sorted(groups.items()):
        spread = f"{show(statistics.fmean(v))} ± {show(statistics.stdev(v))}" if len(v) > 1 else show(v[0])
        rows.append(
            [str(seed), run, method, f"{n / block_size:g} T", spread, f"{show(min(v))} to {show(max(v))}"]
        )
    what = "validation loss" if loss else "exact-match rate"
    head = ["training seed", "run", "method", "length", f"{what}: mean ± sd", "min to max"]
    text = f"LongRoPE's factors from {cfg.search_seeds} search seeds per rope run, each applied zero-shot:"
    return [f"{text}\n\n{markdown_table(head, rows)}"]


def main(argv=None):
    with one_line_errors(PROG):
        cfg = parse_args(argv)
        check_outputs({"results": ROOT / cfg.results / f"{results_name(cfg)}_table.md"})  # before any run
        return run_study(cfg, argv)


def run_study(cfg, argv):
    """Train, fine-tune and evaluate every run of the study, write its tables. -> wall time in seconds"""
    start = time.perf_counter()
    results = ROOT / cfg.results
    preset = plan([[*preset_flags(cfg), "--pos=rope", *(QUICK_TRAIN if cfg.quick else [])]])[0]
    dataset, block_size = preset.train_config["dataset"], preset.model_config["block_size"]
    for m in multiples_of(cfg.lengths):  # before any run trains, as eval_length.py will require them
        n = round(m * block_size)
        try:
            require(n >= 1, f"{m:g} x T = {m * block_size:g} tokens at T = {block_size}: less than one")
            if cfg.task == "passkey":  # room for the key and its question (data/passkey/task.py)
                filler_length(n + 1)  # n inputs, and the key's last digit as their last target
        except ValueError as e:
            raise UserError(f"--lengths={cfg.lengths}: {e}; choose longer lengths", 2) from None
    long_dataset = dataset
    if cfg.task == "passkey":
        if default_name(block_size) != dataset:  # checked before anything is prepared
            raise UserError(
                f"--task=passkey trains on data/passkey (or passkey_ctxN for T = N); the preset "
                f"{cfg.config} trains on {dataset}"
            )
        for n in (block_size, EXTENSION * block_size):  # prepared once; stale data stops here (load_meta)
            long_dataset = default_name(n)
            if not (ROOT / "data" / long_dataset / "meta.json").is_file():
                run_python(["-m", "data.passkey.prepare", f"--block_size={n}"])
            load_meta(ROOT / "data" / long_dataset)
    duration = DEFAULT_DURATION if cfg.task == "loss" and cfg.config is None else None
    train_runs(cfg, base_commands(cfg, dataset), duration)
    runs, factors = {}, {}
    for seed in seeds(cfg):
        tuned, fine_tune_flags = fine_tune(cfg, dataset, long_dataset, block_size, seed)
        runs[seed] = [base_dir(cfg, dataset, name, seed) for name, _ in base_runs(cfg)] + tuned
        if cfg.longrope:
            factors[seed], more = longrope_runs(cfg, dataset, block_size, seed, fine_tune_flags)
            runs[seed] += more
    name = results_name(cfg)
    lengths = ",".join(f"{round(m * block_size)}t" for m in multiples_of(cfg.lengths))  # the same tokens
    amount = f"--trials={cfg.trials}" if cfg.task == "passkey" else f"--max_windows={cfg.max_windows}"
    plot = ["--plot", results / f"{name}.png", *(["--bucket=8"] if cfg.task == "loss" else [])]
    if importlib.util.find_spec("matplotlib") is None:
        print("note: matplotlib is not installed: no figure (pip install matplotlib)")
        plot = []
    tables, per_seed, records = [], [], []
    for i, seed in enumerate(seeds(cfg)):
        csv_path = ROOT / cfg.out_root / f"{name}_seed{seed}.csv"  # eval_length.py on the seed's runs
        command = ["eval_length.py", *runs[seed], *TASKS[cfg.task].eval_flags, "--lengths", lengths, amount]
        command += [f"--device={cfg.device}", "--csv", csv_path, *(plot if i == 0 else [])]
        command += [f"--rope_factors={factors[seed]}"] if cfg.longrope else []
        print(f"\n$ {' '.join(['python', *map(str, command)])}   # seed {seed}")
        table = run_python(command, stdout=subprocess.PIPE, text=True).stdout
        tables.append(f"Seed {seed}:\n\n{table.rstrip()}")
        with open(csv_path, newline="", encoding="utf-8") as f:
            records.append(list(csv.DictReader(f)))
        cells = {}  # {(run, method, length): loss} or {...: (correct, trials)} pooled over depths
        for r in records[-1]:  # the run: the folder's name less the seed's suffix
            key = (Path(r["checkpoint"]).name.replace(f"_seed{seed}", ""), r["scaling"], int(r["length"]))
            if cfg.task == "loss" and r["loss"]:
                cells[key] = float(r["loss"])
            elif cfg.task == "passkey" and int(r["trials"]):
                correct, trials = cells.get(key, (0, 0))
                cells[key] = (correct + int(r["correct"]), trials + int(r["trials"]))
        per_seed.append(cells)

    def write_csv(tmp):  # the seeds' CSVs as one file, one header
        with open(tmp, "w", newline="", encoding="utf-8") as out:
            if rows := [row for seed_rows in records for row in seed_rows]:
                writer = csv.DictWriter(out, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)

    write_output("results", results / f"{name}.csv", write_csv)
    seconds = time.perf_counter() - start
    command = " ".join(["python -m experiments.extrapolation", *(argv or sys.argv[1:])])
    footer = f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M UTC} by `{command}`: torch {torch.__version__}, "
    footer += f"Python {platform.python_version()}, {platform.machine()} with {torch.get_num_threads()} "
    footer += f"threads; wall time {seconds / 60:.1f} min"
    footer += " (--quick: the numbers mean nothing)." if cfg.quick else "."
    spread = search_spread(cfg, per_seed, block_size)
    text = "\n\n".join([summary(cfg, per_seed, block_size), *spread, *tables, footer])
    table_md = results / f"{name}_table.md"
    write_output("results", table_md, lambda tmp: tmp.write_text(text + "\n", encoding="utf-8"))
    print(f"\n{text}\nwrote {cfg.results}/{name}.csv, {name}.png (if matplotlib) and {name}_table.md")
    return seconds


if __name__ == "__main__":
    main()

"""The length-extrapolation study's settings, runs and results files (`python -m
lab.experiments.extrapolation`): its StudyConfig, the tasks and their files' names, the runs' names and the
claims the docs make of them, and the reading of the CSVs it writes, per training seed. Shared by the study
and lab/experiments/findings.py, which writes the docs' sentences from those CSVs: an entry point imports no
other."""

import math
import re
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path

from lab.experiments.runs import EVAL_COLUMNS, EVAL_NUMBERS, ROOT, pooled_cells, read_rows
from plumbing.cli import device_flag
from plumbing.fields import check_fields, setting
from positions import POS_SCHEMES, require

EXTENSION = 4  # the fine-tunes' context: 4 x T
FIRST_SEED = 1337  # train.py's default seed: its runs are the first seed's


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
    seeds: int = setting(
        1, at_least=1
    )  # training seeds per run: 1337, 1338, ...; tables: their mean and spread
    out_root: str | None = None  # folder; None: out, out/<preset> (other preset), out/study_quick (--quick)
    results: str | None = None  # results folder; None: docs, docs/<preset> (other preset), out_root (--quick)
    retrain: bool = False  # train and fine-tune again even where a checkpoint exists
    max_iters: int = setting(200, at_least=1)  # fine-tuning steps at 4 x T (Peng et al. 2023: 400 for YaRN)
    learning_rate: float = 3e-4  # fine-tuning peak learning rate, under pretraining's 1e-3 (Chen et al. 2023)
    batch_size: int = setting(8, at_least=1)  # fine-tuning sequences per step, each 4 x T tokens long
    lengths: str | None = None  # evaluation lengths, multiples of the base T; None: the task's
    max_windows: int = setting(
        64, at_least=1
    )  # loss: evaluation windows per length and row, over the val split
    trials: int = setting(50, at_least=1)  # passkey: samples per length and depth
    device: str = device_flag()  # passed to train.py and lab/eval_length.py
    extra: bool = False  # also train and evaluate EXTRA_RUNS (partial RoPE, RoPE skipping every 4th layer)
    schemes: list[str] = field(default_factory=lambda: [*POS_SCHEMES])  # the base runs' schemes
    longrope: bool = False  # also LongRoPE on rope: searched at 4 T, fine-tuned, searched at 8 T and at T
    search_seeds: int = setting(
        1, at_least=1
    )  # --longrope: searches at 4 T per rope run (seeds S, S + 1000, ...)
    preset: str | None = None  # the study's settings from configs/{extrapolation|retrieval}_{preset}.toml
    jobs: int = setting(1, at_least=1)  # train.py runs side by side, each one's output in {out_dir}.log
    train_flags: str = ""  # train.py flags added to every base run, after the preset's ("--max_iters=2000")
    quick: bool = False  # smoke run: a small model, 20 training and 4 fine-tuning steps, a few windows
    tables: bool = False  # no runs: the tables again from {results}/{name}.csv (and {name}_seed*.csv)

    def __post_init__(self):  # task and schemes: parse_flags' choices
        check_fields(self)
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


def results_name(cfg):
    """extrapolation or retrieval, then a subset's schemes, then longrope: no part overwrites the whole."""
    subset = [] if cfg.schemes == list(POS_SCHEMES) else cfg.schemes
    return "_".join([TASKS[cfg.task].name, *subset, *(["longrope"] if cfg.longrope else [])])


# A side of a comparison: a run (its folder name after the dataset's, less the seed; {long}: EXTENSION x T in
# tokens), its method, and the length as a multiple of the base runs' T
Side = namedtuple("Side", "run method multiple")
FT = "rope_ctx{long}_"  # the fine-tunes of rope, FT + "linear" (PI), "yarn", "plain" (the control)
PI_FT, YARN_FT, CONTROL = (FT + "linear", "linear"), (FT + "yarn", "yarn"), (FT + "plain", "plain")
LR = FT + "longrope"  # LongRoPE's fine-tune with its 4 T factors; LR + "_x8": progressive, LR + "_short"
Comparison = namedtuple("Comparison", "a b claim")  # a claim of the docs, tested by a - b paired over seeds


def compare(a, b, claim):
    return Comparison(Side(*a), Side(*b), claim)


COMPARISONS = {  # the claims docs/extrapolation.md and the README make of each study
    "loss": (
        compare(("sinusoidal", "plain", 2), ("sinusoidal", "plain", 1), "sinusoidal collapses past T"),
        compare(("rope", "plain", 4), ("rope", "plain", 1), "RoPE degrades past T"),
        compare(("alibi", "plain", 2), ("alibi", "plain", 1), "ALiBi is lower past T than at T"),
        compare(("alibi", "plain", 8), ("alibi", "plain", 1), "ALiBi stays flat to 8 T"),
        compare(("none", "plain", 2), ("none", "plain", 1), "NoPE degrades past T"),
        compare(("alibi", "plain", 4), ("rope", "plain", 4), "ALiBi beats RoPE past T"),
        compare(("alibi", "plain", 8), ("rope", "plain", 8), "ALiBi beats RoPE past T"),
        compare(("rope", "linear", 2), ("rope", "plain", 2), "PI zero-shot beats plain RoPE (Chen et al.)"),
        compare(("rope", "linear", 4), ("rope", "plain", 4), "PI zero-shot beats plain RoPE (Chen et al.)"),
        compare(("rope", "linear", 8), ("rope", "plain", 8), "PI zero-shot beats plain RoPE (Chen et al.)"),
        compare(("rope", "yarn", 4), ("rope", "linear", 4), "YaRN beats PI zero-shot (Peng et al.)"),
        compare(("rope", "ntk", 4), ("rope", "linear", 4), "NTK beats PI zero-shot (Peng et al.)"),
        compare(("rope", "yarn", 4), ("rope", "plain", 4), "YaRN zero-shot beats plain RoPE"),
        compare(("rope", "ntk", 4), ("rope", "plain", 4), "NTK zero-shot beats plain RoPE"),
        compare(("rope", "llama3", 4), ("rope", "yarn", 4), "llama3 against YaRN, zero-shot"),
        compare((*PI_FT, 4), ("rope", "plain", 4), "PI fine-tuned beats plain RoPE zero-shot"),
        compare((*PI_FT, 4), ("rope", "plain", 1), "PI fine-tuned recovers the loss at T"),
        compare((*YARN_FT, 4), (*PI_FT, 4), "YaRN beats PI fine-tuned (Peng et al.)"),
        compare((*CONTROL, 4), (*YARN_FT, 4), "the control against fine-tuned YaRN"),
        compare((*CONTROL, 8), (*YARN_FT, 8), "the control against fine-tuned YaRN"),
        compare(
            ("learned_ctx{long}_plain", "plain", 4), ("learned", "window", 4), "learned's table interpolated"
        ),
        compare(("rope_frac0.25", "plain", 1), ("rope", "plain", 1), "rotating a quarter of each head"),
        compare(("rope_frac0.25", "plain", 4), ("rope", "plain", 4), "rotating a quarter of each head"),
        compare(("rope_nope4", "plain", 1), ("rope", "plain", 1), "a layer in 4 without RoPE"),
        compare(("rope_nope4", "plain", 4), ("rope", "plain", 4), "a layer in 4 without RoPE"),
        compare(("rope_nope4", "plain", 8), ("rope", "plain", 8), "a layer in 4 without RoPE"),
        compare(("t5", "plain", 4), ("t5", "plain", 1), "T5's bias past T"),
        compare(("t5", "plain", 8), ("t5", "plain", 1), "T5's bias past T"),
        compare(("fire", "plain", 4), ("fire", "plain", 1), "FIRE past T"),
        compare(("fire", "plain", 8), ("fire", "plain", 1), "FIRE past T"),
        compare(("t5", "plain", 1), ("rope", "plain", 1), "T5's bias against RoPE"),
        compare(("t5", "plain", 4), ("rope", "plain", 4), "T5's bias against RoPE"),
        compare(("fire", "plain", 1), ("rope", "plain", 1), "FIRE against RoPE"),
        compare(("fire", "plain", 4), ("rope", "plain", 4), "FIRE against RoPE"),
        compare(("fire", "plain", 8), ("t5", "plain", 8), "FIRE against T5's buckets far past T"),
    ),
    "passkey": (
        compare(("rope", "plain", 2), ("rope", "plain", 1), "RoPE fails past T (Mohtashami & Jaggi)"),
        compare(("sinusoidal", "plain", 2), ("sinusoidal", "plain", 1), "sinusoidal fails past T"),
        compare(("none", "plain", 2), ("none", "plain", 1), "NoPE fails past T"),
        compare(("learned", "window", 2), ("learned", "plain", 1), "learned's window fails past T"),
        compare(("alibi", "plain", 2), ("rope", "plain", 2), "ALiBi retrieves past T, RoPE not"),
        compare(("alibi", "plain", 4), ("rope", "plain", 4), "ALiBi retrieves past T, RoPE not"),
        compare(("alibi", "plain", 8), ("rope", "plain", 8), "ALiBi retrieves past T, RoPE not"),
        compare(("rope", "yarn", 2), ("rope", "linear", 2), "YaRN beats PI zero-shot (Peng et al.)"),
        compare(("rope", "yarn", 2), ("rope", "plain", 2), "YaRN zero-shot beats plain RoPE"),
        compare(("rope", "llama3", 2), ("rope", "plain", 2), "llama3 zero-shot beats plain RoPE"),
        compare(("rope", "dynamic", 2), ("rope", "plain", 2), "dynamic NTK zero-shot beats plain RoPE"),
        compare(("rope", "llama3", 4), ("rope", "yarn", 4), "llama3 against YaRN, zero-shot"),
        compare((*PI_FT, 4), (*CONTROL, 4), "PI fine-tuned (Chen et al., Table 4)"),
        compare((*YARN_FT, 4), (*CONTROL, 4), "YaRN fine-tuned against the control"),
        compare(("rope_frac0.25", "plain", 2), ("rope", "plain", 2), "rotating a quarter of each head"),
        compare(("rope_nope4", "plain", 2), ("rope", "plain", 2), "a layer in 4 without RoPE"),
        compare(("t5", "plain", 2), ("t5", "plain", 1), "T5's bias past T"),
        compare(("fire", "plain", 2), ("fire", "plain", 1), "FIRE past T"),
        compare(("t5", "plain", 2), ("rope", "plain", 2), "T5's bias against RoPE"),
        compare(("t5", "plain", 4), ("rope", "plain", 4), "T5's bias against RoPE"),
        compare(("fire", "plain", 2), ("rope", "plain", 2), "FIRE against RoPE"),
        compare(("fire", "plain", 4), ("rope", "plain", 4), "FIRE against RoPE"),
    ),
}
LONGROPE_COMPARISONS = (  # --longrope's runs (the study's longrope_runs), the claims of Ding et al. 2024
    compare(("rope", "longrope", 4), ("rope", "yarn", 4), "searched factors beat YaRN zero-shot at 4 T"),
    compare(("rope", "longrope", 4), ("rope", "llama3", 4), "searched factors beat llama3 zero-shot at 4 T"),
    compare((LR, "longrope", 4), (*YARN_FT, 4), "fine-tuned with them, against YaRN's fine-tune"),
    compare((LR, "longrope", 1), ("rope", "plain", 1), "the fine-tune with the long factors, at T"),
    compare((LR + "_x8", "longrope", 8), (LR, "longrope", 8), "progressive: factors searched at 8 T after"),
    compare((LR + "_x8", "longrope", 8), (*YARN_FT, 8), "progressive, against YaRN's fine-tune"),
    compare((LR + "_x8", "longrope", 8), (*CONTROL, 8), "progressive, against the control"),
    compare((LR + "_short", "longrope", 1), (LR, "longrope", 1), "short-context recovery at T"),
)
COMPARISONS = {task: (*found, *LONGROPE_COMPARISONS) for task, found in COMPARISONS.items()}


# the seed suffix of the folder name of a run and of its fine-tunes (lab/experiments/extrapolation.py's
# base_dir)
SEED_SUFFIX = re.compile(r"_seed(\d+)")


def read_cells(rows, task):
    """lab/eval_length.py's CSV rows -> ({seed: {(run, method, length): loss or (correct, trials)}}, {run:
    T}):
    the run is the folder's name less its seed suffix (none: FIRST_SEED), retrieval pooled over depths."""
    seed = lambda r: int(m[1]) if (m := SEED_SUFFIX.search(Path(r["checkpoint"]).name)) else FIRST_SEED
    run = lambda r: SEED_SUFFIX.sub("", Path(r["checkpoint"]).name)
    per_seed, key = {seed(r): {} for r in rows}, lambda r: (seed(r), run(r), r["scaling"], int(r["length"]))
    for (s, *cell), value in pooled_cells(rows, task, key).items():
        per_seed[s][tuple(cell)] = value
    return dict(sorted(per_seed.items())), {run(r): int(r["block_size"]) for r in rows}


def lookup(cells, run, method, n, block_size):
    """A cell of one seed by the run's name after its dataset's (Side.run), or None where not measured."""
    want = run.format(long=EXTENSION * block_size)
    for (name, scaling, length), value in cells.items():
        if (name == want or name.endswith(f"_{want}")) and (scaling, length) == (method, n):
            return value
    return None


def side_values(per_seed, side, block_size, loss):
    """{seed: the side's loss, or its retrieval rate pooled over depths} of the seeds that measured it."""
    n = round(side.multiple * block_size)
    found = {seed: lookup(cells, side.run, side.method, n, block_size) for seed, cells in per_seed.items()}
    return {seed: v if loss else v[0] / v[1] for seed, v in found.items() if v is not None}


def read_study(cfg):
    """read_cells of {results}/{name}.csv and of any {name}_seed*.csv beside it (a seed evaluated apart), the
    latter only for seeds {name}.csv lacks: a seed's rows counted once."""
    results, name = ROOT / cfg.results, results_name(cfg)
    study = "python -m lab.experiments.extrapolation (its flags, without --tables)"
    per_seed, trained = read_cells(
        read_rows(results / f"{name}.csv", EVAL_COLUMNS[cfg.task], study, *EVAL_NUMBERS[cfg.task]), cfg.task
    )
    for path in sorted(results.glob(f"{name}_seed*.csv")):
        more, runs = read_cells(
            read_rows(path, EVAL_COLUMNS[cfg.task], "python -m lab.eval_length", *EVAL_NUMBERS[cfg.task]),
            cfg.task,
        )
        per_seed |= {seed: cells for seed, cells in more.items() if seed not in per_seed}
        trained |= runs
    return dict(sorted(per_seed.items())), trained

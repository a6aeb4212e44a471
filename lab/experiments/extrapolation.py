"""The length-extrapolation study of docs/extrapolation.md, one command: train, fine-tune, evaluate, tabulate.

    python -m lab.experiments.extrapolation                   # loss against length, one seed (~20 min)
    python -m lab.experiments.extrapolation --seeds 3         # the same with three training seeds per run
    python -m lab.experiments.extrapolation --task passkey    # passkey retrieval against length
    python -m lab.experiments.extrapolation --config configs/shakespeare_char.toml   # the GPU recipe, T = 256
    python -m lab.experiments.extrapolation --quick           # every step once, tiny: a smoke run
    python -m lab.experiments.extrapolation --schemes rope --longrope --seeds 3   # LongRoPE, YaRN, llama3
    python -m lab.experiments.extrapolation --schemes rope --longrope --search_seeds 3   # the search's spread
    python -m lab.experiments.extrapolation --tables          # the tables again from the committed CSVs
    python -m lab.experiments.extrapolation --preset gpu      # nanoGPT's shakespeare_char scale on one GPU
    python -m lab.experiments.extrapolation --preset gpu --task passkey --seeds 2   # adds a seed to its CSV

It runs train.py and lab/eval_length.py as a user would, each command printed first: the schemes into
{out_root}/{dataset}_{pos}[_seed{S}], their fine-tunes to 4 x T (FINE_TUNES; --longrope: LongRoPE's
progressive runs), every run evaluated at 1 to 8 x T. It writes {name}.csv, {name}.png and {name}_table.md
under --results (per seed, then the spread over seeds and the verdicts: paired differences with their 95%
interval) and under docs/ fills the docs' generated blocks. Finished runs are reused, a stopped one continues
from its checkpoint (--retrain: trained again), so a later run with more --seeds trains only the new seeds and
writes every seed's rows to the same CSV.

--preset NAME takes the study's own settings from configs/{extrapolation|retrieval}_NAME.toml (by --task),
any of the flags below; flags given override it. --preset gpu: configs/extrapolation_gpu.toml and
retrieval_gpu.toml, the base runs at nanoGPT's shakespeare_char scale, --jobs of them at once on one GPU."""

import sys

if not __package__:  # `python lab/experiments/extrapolation.py`: the repository's packages are not importable
    sys.exit(
        f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.experiments.extrapolation`"
    )


import importlib.util
import statistics
import subprocess
import time
from dataclasses import fields
from pathlib import Path

from data.common import load_meta
from data.passkey.task import default_name, filler_length
from lab.experiments.extrapolation_results import (
    COMPARISONS,
    EXTENSION,
    FIRST_SEED,
    LONGROPE_COMPARISONS,
    PI_FT,
    TASKS,
    YARN_FT,
    StudyConfig,
    lookup,
    multiples_of,
    read_cells,
    read_study,
    results_name,
    side_values,
)
from lab.experiments.runs import (
    DEFAULT_DURATION,
    EVAL_COLUMNS,
    EVAL_NUMBERS,
    ROOT,
    check_jobs,
    ensure_trained,
    plan,
    read_rows,
    run_python,
    study_inputs,
)
from lab.measure.paired import paired_difference, verdict
from lab.measure.retrieval import wilson_interval
from lab.outputs import check_folder, check_outputs, write_output, write_rows
from lab.tables import fill_generated, markdown_table, measured
from plumbing.cli import build_parser, machine_device, parse_flags, read_config_file
from plumbing.errors import UserError, one_line_errors
from plumbing.resume import fine_tune_dir
from positions import LONGROPE, POS_SCHEMES, require

PROG = "python -m lab.experiments.extrapolation"
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
QUICK_BATCH = 4  # the fine-tunes' sequences per step
QUICK_FINE_TUNE += [f"--batch_size={QUICK_BATCH}"]


seeds = lambda cfg: [FIRST_SEED + i for i in range(cfg.seeds)]
preset_flags = lambda cfg: [f"--config={cfg.config}"] if cfg.config else []
base_dir = lambda cfg, dataset, name, seed: (
    f"{cfg.out_root}/{dataset}_{name}" + ("" if seed == FIRST_SEED else f"_seed{seed}")
)


def study_presets():
    """The names NAME of configs/{extrapolation|retrieval}_NAME.toml: --preset's choices."""
    names = [task.name for task in TASKS.values()]
    found = {
        p.stem.split("_", 1)[1] for p in (ROOT / "configs").glob("*_*.toml") if p.stem.split("_")[0] in names
    }
    return tuple(sorted(found))


def parse_args(argv=None):
    """StudyConfig from the flags, over --preset's file where one is given."""
    choices, sections = (
        {"task": tuple(TASKS), "schemes": POS_SCHEMES, "preset": study_presets()},
        [("study", StudyConfig, None)],
    )
    values = parse_flags(argv, PROG, __doc__, sections, choices=choices)
    if values["preset"]:  # its keys are flags, and flags given override them
        path = ROOT / "configs" / f"{TASKS[values['task']].name}_{values['preset']}.toml"
        if not path.is_file():
            raise UserError(
                f"--preset {values['preset']}: no {path.relative_to(ROOT)} for --task {values['task']}", 2
            )
        parser = build_parser(PROG, __doc__, sections, {}, choices, (), False)
        valid = [f.name for f in fields(StudyConfig) if f.name not in ("task", "preset")]
        defaults = read_config_file(parser, str(path), valid, False)
        values = parse_flags(argv, PROG, __doc__, sections, defaults=defaults, choices=choices)
    return StudyConfig(**values)


def base_runs(cfg):
    """(name, train.py flags) of the runs trained from scratch: the schemes, and EXTRA_RUNS with --extra."""
    task = TASKS[cfg.task]
    longer = task.longer if cfg.config == task.preset else {}
    runs = [(pos, (f"--pos={pos}", *longer.get(pos, ()))) for pos in POS_SCHEMES if pos in cfg.schemes]
    return runs + (list(EXTRA_RUNS) if cfg.extra else [])


def train_runs(cfg, commands, duration=None):
    """The runs of these train.py commands: reused, continued or trained (lab/experiments/runs.py)."""
    elsewhere = "move it away, or pass another --out_root (--retrain trains it again, replacing it)"
    ensure_trained(commands, None if cfg.quick else duration, cfg.retrain, elsewhere=elsewhere, jobs=cfg.jobs)


def base_commands(cfg, dataset):
    """train.py's flags for every base run and seed."""
    quick = QUICK_TRAIN if cfg.quick else []
    return [
        [*preset_flags(cfg), *flags, f"--out_dir={base_dir(cfg, dataset, name, seed)}", f"--seed={seed}"]
        + [f"--device={cfg.device}", *quick, *cfg.train_flags.split()]
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
    """python -m lab.experiments.longrope on a checkpoint into {ckpt}_longrope_{name}, once."""
    out = Path(f"{ckpt}_longrope_{name}")
    if not (ROOT / out / "factors.json").is_file():
        quick = ["--population=4", "--parents=2", "--generations=2", "--windows=2"] if cfg.quick else []
        run_python(["-m", "lab.experiments.longrope", ckpt, *flags, f"--seed={seed}", f"--out={out}", *quick])
    return f"{out}/factors.json"


def apply_factors(cfg, source, data, factors, seed, out):
    """The 0-step run `out`: source's weights with LongRoPE's factors (a factors.json), trained on nothing."""
    zero = [f"--init_from={source}", *data, f"--rope_factors={factors}", "--max_iters=0", "--eval_iters=1"]
    train_runs(cfg, [[*zero, f"--seed={seed}", f"--device={cfg.device}", f"--out_dir={out}"]])
    return out


def longrope_runs(cfg, dataset, block_size, seed, fine_tune_flags):
    """LongRoPE, progressive as the paper's: factors for the rope run at 4 T, a fine-tune with them, from it
    factors at 8 T and (short-context recovery) at T, put on its weights by 0-step runs; with --search_seeds
    N > 1, search k = 1 at 4 T is the fine-tune's and k = 2 .. N more for the rope run (seeds seed + 1000 (k -
    1)), each put on its weights by a 0-step run {source}_x4_search{k}. -> (factors, runs)"""
    source, long, flag = base_dir(cfg, dataset, "rope", seed), EXTENSION * block_size, f"--factor={EXTENSION}"
    factors = search_longrope(cfg, source, seed, f"x{EXTENSION}", flag)
    tuned = fine_tune_dir(source, long, LONGROPE)
    command = [f"--init_from={source}", f"--block_size={long}", f"--rope_factors={factors}"]
    train_runs(cfg, [[*command, *fine_tune_flags, f"--out_dir={tuned}"]])
    applied, data = [], [f for f in fine_tune_flags if f.startswith("--dataset=")]  # the fine-tune's
    for name, more in ((f"x{2 * EXTENSION}", f"--factor={2 * EXTENSION}"), ("short", "--short")):
        searched = search_longrope(cfg, tuned, seed, name, more)
        applied.append(apply_factors(cfg, tuned, data, searched, seed, f"{tuned}_{name}"))
    for k in range(1, cfg.search_seeds + 1 if cfg.search_seeds > 1 else 1):
        name = f"x{EXTENSION}_search{k}"
        searched = factors if k == 1 else search_longrope(cfg, source, seed + 1000 * (k - 1), name, flag)
        applied.append(
            apply_factors(cfg, source, [f"--dataset={dataset}"], searched, seed, f"{source}_{name}")
        )
    return factors, [tuned, *applied]


# A word needs this many seeds; with fewer the interval is shown and the word is inconclusive
VERDICT_SEEDS = 3

# The README's table: (label, run, method) as in Side, at 1 to 8 x T
README_ROWS = (
    ("learned (sliding window)", "learned", "window"),
    ("sinusoidal", "sinusoidal", "plain"),
    ("rope", "rope", "plain"),
    ("rope + YaRN x L/T, zero-shot", "rope", "yarn"),
    ("rope + PI x L/T, zero-shot", "rope", "linear"),
    ("alibi", "alibi", "plain"),
    ("none", "none", "plain"),
    ("rope, YaRN x4 fine-tuned at 4 T", *YARN_FT),
    ("rope, PI x4 fine-tuned at 4 T", *PI_FT),
)


def spread_cell(values, loss):
    """The losses' mean +- standard deviation, or the pooled accuracy with its 95% Wilson interval."""
    if not values:
        return "n/a"
    if loss:
        spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
        return f"{statistics.fmean(values):.3f}{spread}"
    correct, trials = sum(c for c, _ in values), sum(t for _, t in values)
    low, high = wilson_interval(correct, trials)
    return f"{correct / trials:.0%} [{low:.0%}, {high:.0%}]"


def spread_table(per_seed, loss):
    """Per run, method and length the spread over seeds (spread_cell)."""
    lengths = sorted({key[2] for cells in per_seed for key in cells})
    keys = sorted({key[:2] for cells in per_seed for key in cells})
    found = lambda key: [cells[key] for cells in per_seed if key in cells]
    rows = [
        [run, method, *(spread_cell(found((run, method, n)), loss) for n in lengths)] for run, method in keys
    ]
    return markdown_table(["run", "method", *(f"{n}t" for n in lengths)], rows)


def rankings(per_seed, block_size, loss):
    """Per length, the base schemes (their own rows) ranked by the mean, best first: '<' (or '>') where every
    seed keeps the order, '~' where some seed reverses it."""
    lengths = sorted({key[2] for cells in per_seed for key in cells})
    base = lambda run, method: method == "plain" and "_ctx" not in run and "_search" not in run
    runs = sorted({run for cells in per_seed for run, method, _ in cells if base(run, method)})
    found = lambda key: [cells[key] for cells in per_seed if key in cells]
    lines = []
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
            lines.append(f"- {n} tokens ({n / block_size:g} T): {order}")
    return lines


def summary(cfg, per_seed, block_size, listed=None):
    """The markdown of the spread over seeds (listed; None: cfg's): per run, method and length the losses'
    mean +- standard deviation, or the pooled accuracy with its 95% Wilson interval; then the base schemes'
    orderings."""
    loss = cfg.task == "loss"
    what = "mean validation loss ± its standard deviation over seeds"
    what = what if loss else "exact-match rate pooled over seeds and depths, [95% Wilson interval]"
    keys = {key for cells in per_seed for key in cells}
    if any(sum(key in cells for cells in per_seed) < len(per_seed) for key in keys):
        what += "; a row measured in fewer seeds is over those"
    listed = ", ".join(map(str, listed or seeds(cfg)))
    text = [f"Over {len(per_seed)} seed(s) ({listed}): {what}.", "", spread_table(per_seed, loss), ""]
    if len(per_seed) > 1:
        text += [
            "The base schemes (their own rows) ranked by the mean, best first: '<' (or '>') where every seed "
            "puts them in that order, '~' where some seed reverses it (a difference within the seed spread).",
            "",
            *rankings(per_seed, block_size, loss),
        ]
    return "\n".join(text)


def difference(a, b, loss):
    """[seeds, a - b with its 95% paired-t interval, the word]: the word (lab.measure.paired.verdict for a)
    only from VERDICT_SEEDS seeds or more, as an interval over fewer is too wide or too unsure to rank by."""
    n, unit = len(a), "" if loss else " points"
    show = (lambda v: f"{v:+.3f}") if loss else (lambda v: f"{100 * v:+.0f}")
    if n == 1:
        return ["1", f"{show(a[0] - b[0])}{unit}, no interval", "inconclusive (1 seed)"]
    mean, low, high = paired_difference(a, b)
    word = verdict(low, high, not loss) if n >= VERDICT_SEEDS else f"inconclusive ({n} seeds)"
    return [str(n), f"{show(mean)} [{show(low)}, {show(high)}]{unit}", word]


def describe(side, block_size):
    """'rope + yarn at 4 T': the method named unless plain or in the run's name (a fine-tune's)."""
    run = side.run.format(long=EXTENSION * block_size)
    method = "" if side.method == "plain" or run.endswith(side.method) else f" + {side.method}"
    return f"{run}{method} at {'' if side.multiple == 1 else f'{side.multiple:g} '}T"


def verdict_table(comparisons, per_seed, block_size, loss):
    """The markdown of each comparison both of whose sides some seed measured: a - b paired over the seeds
    that measured both, its 95% interval and the word it supports (difference); None if none was measured."""
    rows = []
    for c in comparisons:
        a, b = (side_values(per_seed, side, block_size, loss) for side in (c.a, c.b))
        if common := sorted(a.keys() & b.keys()):
            sides = [describe(c.a, block_size), describe(c.b, block_size)]
            rows.append([c.claim, *sides, *difference([a[s] for s in common], [b[s] for s in common], loss)])
    head = ["claim", "a", "b", "seeds", "a - b [95% interval]", "a against b"]
    return markdown_table(head, rows) if rows else None


def ratio_table(cells, trained):
    """One seed's losses, each with its ratio to the run's own loss at its T (the same method's there)."""
    lengths = sorted({key[2] for key in cells})
    keys = sorted({key[:2] for key in cells})

    def cell(run, method, n):
        value, reference = cells.get((run, method, n)), cells.get((run, method, trained[run]))
        if value is None:
            return "n/a"
        return f"{value:.3f}" + (f" ({value / reference:.2f})" if reference else "")

    rows = [
        [run, str(trained[run]), method, *(cell(run, method, n) for n in lengths)] for run, method in keys
    ]
    return markdown_table(["run", "T", "method", *(f"{n}t" for n in lengths)], rows)


def per_seed_table(per_seed, block_size, multiples=(1, 2, 4, 8)):
    """Retrieval of every run and method that each seed measured at every multiple: a column per seed, its
    rates at the multiples of T joined by ' / '."""
    lengths = [round(m * block_size) for m in multiples]
    keys = sorted({key[:2] for cells in per_seed.values() for key in cells})
    rates = lambda cells, key: " / ".join(
        f"{100 * cells[(*key, n)][0] / cells[(*key, n)][1]:.0f}" for n in lengths
    )
    every = lambda key: all((*key, n) in cells for cells in per_seed.values() for n in lengths)
    rows = [[*key, *(rates(cells, key) + "%" for cells in per_seed.values())] for key in keys if every(key)]
    head = ["run", "method", *(f"seed {seed}" for seed in per_seed)]
    return markdown_table(head, rows)


def readme_table(per_seed, block_size):
    """README_ROWS' losses at 1 to 8 x T, mean +- standard deviation over seeds."""
    lengths = [m * block_size for m in (1, 2, 4, 8)]
    values = lambda run, method, n: [
        v for cells in per_seed.values() if (v := lookup(cells, run, method, n, block_size)) is not None
    ]
    rows = [
        [label, *(spread_cell(values(run, method, n), True) for n in lengths)]
        for label, run, method in README_ROWS
    ]
    return markdown_table(["L (tokens)", *map(str, lengths)], rows)


def docs_tables(task, per_seed, trained, longrope=False):
    """{generated block name: markdown} of the docs' blocks of the whole study of `task` (longrope: of
    --schemes rope --longrope), from read_cells."""
    block_size, loss = min(trained.values()), task == "loss"
    first, name = per_seed[FIRST_SEED], TASKS[task].name
    verdicts = verdict_table(COMPARISONS[task], per_seed, block_size, loss)
    if longrope:  # the rope runs' own verdicts are the whole study's: here LongRoPE's
        cfg = StudyConfig(task=task, schemes=["rope"], longrope=True)
        searches = search_spread(cfg, per_seed, block_size)
        return {
            f"{name}_rope_longrope_seeds": spread_table(list(per_seed.values()), loss),
            f"{name}_rope_longrope_verdicts": verdict_table(LONGROPE_COMPARISONS, per_seed, block_size, loss),
            **({f"{name}_rope_longrope_searches": searches[0].split("\n\n", 1)[1]} if searches else {}),
        }
    if loss:
        cells = list(per_seed.values())
        spread = "\n".join([spread_table(cells, True), "", *rankings(cells, block_size, True)])
        return {
            f"{name}_seed{FIRST_SEED}": ratio_table(first, trained),
            f"{name}_seeds": spread,
            f"{name}_verdicts": verdicts,
            f"{name}_readme": readme_table(per_seed, block_size),
        }
    ranked = rankings(list(per_seed.values()), block_size, False)
    return {
        f"{name}_seed{FIRST_SEED}": spread_table([first], False),
        f"{name}_seeds": "\n".join([per_seed_table(per_seed, block_size), "", *ranked]),
        f"{name}_verdicts": verdicts,
    }


def report(cfg, per_seed, trained):
    """{name}_table.md's part before the per-seed tables: summary, the verdicts if any was measured, then
    search_spread's table if any."""
    block_size = min(trained.values())
    parts = [summary(cfg, list(per_seed.values()), block_size, list(per_seed))]
    table = verdict_table(COMPARISONS[cfg.task], per_seed, block_size, cfg.task == "loss")
    if table is not None:
        parts += [
            "Verdicts: a - b paired over the seeds that measured both, its 95% t interval and the word it "
            "supports for a ('level' where the interval holds 0; 'inconclusive' under "
            f"{VERDICT_SEEDS} seeds).",
            table,
        ]
    return "\n\n".join([*parts, *search_spread(cfg, per_seed, block_size)])


def write_tables(cfg):
    """--tables: {name}_table.md's summary part (its per-seed tables and footer kept) and, for the whole study
    under docs/, the docs' generated blocks, from read_study. No run is trained or evaluated."""
    results, name = ROOT / cfg.results, results_name(cfg)
    per_seed, trained = read_study(cfg)
    path = results / f"{name}_table.md"
    old = path.read_text(encoding="utf-8") if path.is_file() else "\n"
    rest = old[old.index("\n\nSeed ") :] if "\n\nSeed " in old else "\n"
    text = report(cfg, per_seed, trained)
    write_output("results", path, lambda tmp: tmp.write_text(text + rest, encoding="utf-8"))
    print(f"{text}\nwrote {path}")
    longrope = cfg.longrope and len(cfg.schemes) == 1  # the LongRoPE study alone (its one scheme: checked)
    if name == TASKS[cfg.task].name or longrope:
        fill_generated(results, docs_tables(cfg.task, per_seed, trained, longrope))
    return text


def search_spread(cfg, per_seed, block_size):
    """The markdown of how much LongRoPE's result owes to its search's seed: per training seed, run, method
    and length, the mean ± standard deviation, min and max over the --search_seeds searched_runs."""
    loss, groups = cfg.task == "loss", {}
    for seed, cells in per_seed.items():
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
    searches = max(len(v) for v in groups.values())
    text = f"LongRoPE's factors from {searches} search seeds per rope run, each applied zero-shot:"
    return [f"{text}\n\n{markdown_table(head, rows)}"]


def main(argv=None):
    with one_line_errors(PROG):
        cfg = parse_args(argv)
        machine_device(cfg.device)  # as train.py and lab/eval_length.py will, before any run
        if not cfg.tables:  # the runs it trains, --jobs at once
            check_jobs(cfg.jobs, cfg.device)
        name, inputs = results_name(cfg), study_inputs(cfg.config and ROOT / cfg.config)
        written = ("_table.md",) if cfg.tables else (".csv", ".png", "_table.md")  # --tables reads the CSV
        for suffix in written:  # before any run
            check_outputs({"results": ROOT / cfg.results / f"{name}{suffix}"}, inputs)
        check_folder("out_root", ROOT / cfg.out_root, inputs)
        return write_tables(cfg) if cfg.tables else run_study(cfg, argv)


def evaluated(csv_path, printed, said, runs):
    """Whether csv_path holds the evaluation of these runs by the command `said` (the first line of printed,
    the table it printed after it), made after every run's checkpoint: nothing to evaluate again."""
    if not (csv_path.is_file() and printed.is_file()):
        return False
    if printed.read_text(encoding="utf-8").split("\n", 1)[0] != said:
        return False
    made = min(csv_path.stat().st_mtime, printed.stat().st_mtime)
    checkpoints = [ROOT / run / "ckpt.pt" for run in runs]
    return all(path.is_file() and path.stat().st_mtime <= made for path in checkpoints)


def run_study(cfg, argv):
    """Train, fine-tune and evaluate every run of the study, write its tables. -> wall time in seconds"""
    start = time.perf_counter()
    results = ROOT / cfg.results
    quick = QUICK_TRAIN if cfg.quick else []
    preset = plan([[*preset_flags(cfg), "--pos=rope", *quick, *cfg.train_flags.split()]])[0]
    dataset, block_size = preset.train_config["dataset"], preset.model_config["block_size"]
    for m in multiples_of(cfg.lengths):  # before any run trains, as lab/eval_length.py will require them
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
    tables, records = [], []
    for i, seed in enumerate(seeds(cfg)):
        csv_path = ROOT / cfg.out_root / f"{name}_seed{seed}.csv"  # lab/eval_length.py on the seed's runs
        command = [
            "-m",
            "lab.eval_length",
            *runs[seed],
            *TASKS[cfg.task].eval_flags,
            "--lengths",
            lengths,
            amount,
        ]
        command += [f"--device={cfg.device}", *([f"--rope_factors={factors[seed]}"] if cfg.longrope else [])]
        said, printed = " ".join(["python", *map(str, command)]), csv_path.with_suffix(".md")
        if evaluated(csv_path, printed, said, runs[seed]):  # a later run with more seeds: this one is done
            print(f"\nusing {csv_path}: seed {seed}'s runs, evaluated by `{said}` since they trained")
            table = printed.read_text(encoding="utf-8").split("\n", 1)[1]
        else:
            command += ["--csv", csv_path, *(plot if i == 0 else [])]
            print(f"\n$ {' '.join(['python', *map(str, command)])}   # seed {seed}")
            table = run_python(command, stdout=subprocess.PIPE, text=True).stdout
            text = f"{said}\n{table}"
            write_output("out_root", printed, lambda tmp, text=text: tmp.write_text(text, encoding="utf-8"))
        tables.append(f"Seed {seed}:\n\n{table.rstrip()}")
        records += read_rows(
            csv_path, EVAL_COLUMNS[cfg.task], "python -m lab.eval_length", *EVAL_NUMBERS[cfg.task]
        )
    per_seed, trained = read_cells(records, cfg.task)
    columns = list(records[0]) if records else []  # the seeds' CSVs as one file, one header
    write_rows("results", results / f"{name}.csv", columns, [list(r.values()) for r in records])
    footer = measured(PROG, argv, start, cfg.quick, threads=True)
    text = "\n\n".join([report(cfg, per_seed, trained), *tables, footer])
    table_md = results / f"{name}_table.md"
    write_output("results", table_md, lambda tmp: tmp.write_text(text + "\n", encoding="utf-8"))
    print(f"\n{text}\nwrote {cfg.results}/{name}.csv, {name}.png (if matplotlib) and {name}_table.md")
    return time.perf_counter() - start


if __name__ == "__main__":
    main()

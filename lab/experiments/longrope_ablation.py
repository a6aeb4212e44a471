"""LongRoPE's search varied (docs/extrapolation.md, "LongRoPE: what the search needs"): the fitness (the
paper's loss against a passkey fitness) and n-hat (0, 8, or searched), each over --seeds search seeds per
checkpoint, zero-shot at s = --factor, beside YaRN at the same s.

    python -m lab.experiments.longrope_ablation out/longlora/passkey_rope --factor 4     # fitness and n-hat
    python -m lab.experiments.longrope_ablation out/shakespeare_char_rope \\
        out/shakespeare_char_rope_seed1338 out/shakespeare_char_rope_seed1339 \\
        --factor 8 --variants loss                                                   # 8 T without fine-tuning

Each search is `python -m lab.experiments.longrope` (reused when finished); each row is scored by
lab/eval_length.py on what no search saw, at T and at s x T. A search against YaRN is paired over (checkpoint,
search seed): the same model and windows, YaRN's one value per checkpoint. Two searched variants share the
model but not a search: their search seeds' numbers pair nothing, so Welch's unpaired interval compares them
(lab/measure/paired.py). Writes {name}.csv and {name}_table.md under --results (name: longrope_{dataset}_x{s},
or --name)."""

import sys

if not __package__:  # run as a file: the repository's packages are not importable
    sys.exit(
        f"{sys.argv[0]}: error: run it from the repository root as "
        "`python -m lab.experiments.longrope_ablation`"
    )


from dataclasses import dataclass, field
from pathlib import Path

from lab.experiments.longrope_ablation_results import COLUMNS, NUMBERS, PROG, cells
from lab.experiments.runs import (
    ROOT,
    eval_length,
    mean_sd,
    paired_verdict,
    read_rows,
    run_python,
    study_inputs,
)
from lab.outputs import check_outputs, write_output, write_rows
from lab.tables import fill_generated, markdown_table
from plumbing.checkpoint import checkpoint_path, open_checkpoint, run_folder
from plumbing.cli import parse_flags
from plumbing.errors import one_line_errors
from plumbing.fields import check_fields, setting
from positions import POSITION_MODULES, require, takes

VARIANTS = {  # name: lab.experiments.longrope's flags
    "loss": (),  # the paper's: the loss at L, n-hat searched
    "passkey": ("--fitness=passkey",),
    "loss_nhat0": ("--n_hat=0",),
    "loss_nhat8": ("--n_hat=8",),
}
COMPARISONS = (  # (a, b, the question)
    ("loss", "yarn", "searched factors against YaRN's formula"),
    ("passkey", "loss", "a passkey fitness against the loss fitness"),
    ("loss_nhat0", "loss", "n-hat fixed at 0 against searched"),
    ("loss_nhat8", "loss", "n-hat fixed at 8 against searched"),
)


@dataclass
class AblationConfig:
    checkpoints: list[str]  # RoPE runs' folders or checkpoint files (several: training seeds)
    factor: float = 4.0  # s: the searches' and YaRN's extension, zero-shot
    variants: list[str] = field(default_factory=lambda: [*VARIANTS])  # searches to run
    seeds: int = setting(3, at_least=1)  # search seeds per checkpoint and variant: 0, 1, ...
    trials: int = setting(20, at_least=1)  # passkey: lab/eval_length.py's samples per length and depth
    max_windows: int = setting(64, at_least=1)  # loss: windows per length
    results: str = "docs"  # folder of {name}.csv and {name}_table.md
    name: str | None = None  # None: longrope_{dataset}_x{factor}
    tables: bool = False  # only {name}_table.md and the docs' block from {name}.csv: no search, no evaluation

    def __post_init__(self):  # variants: parse_flags' choices
        require(self.factor > 1, f"factor must be > 1 (the extension), got {self.factor}")
        check_fields(self)
        require(self.variants, f"--variants is empty: give some of {', '.join(VARIANTS)}")


def datasets(cfg):
    """{checkpoint: its training dataset}, every checkpoint RoPE and trained on one dataset with one T."""
    found = {}
    for folder in cfg.checkpoints:
        ckpt = open_checkpoint(checkpoint_path(folder), mmap=True)
        scheme = POSITION_MODULES[ckpt["model_config"]["pos"]]
        require(takes(scheme, "rope_scaling"), f"{folder}: not a RoPE checkpoint")
        found[folder] = (ckpt.get("train_config") or {}).get("dataset"), ckpt["model_config"]["block_size"]
    require(len(set(found.values())) == 1, f"the checkpoints differ in dataset or T: {found}")
    return {folder: dataset for folder, (dataset, _) in found.items()}, next(iter(found.values()))[1]


def search(cfg, folder, variant, seed):
    """lab.experiments.longrope's factors for one (checkpoint, variant, search seed), searched once -> the
    file"""
    out = Path(f"{run_folder(folder)}_longrope_x{cfg.factor:g}_{variant}_s{seed}")
    if not (ROOT / out / "factors.json").is_file():
        flags = [f"--factor={cfg.factor:g}", *VARIANTS[variant], f"--seed={seed}", f"--out={out}"]
        run_python(["-m", "lab.experiments.longrope", folder, *flags])
    return out / "factors.json"


def evaluate(cfg, folder, task, lengths, scalings, factors=None):
    """lab/eval_length.py on one checkpoint -> {(scaling, length): retrieval pooled over depths, or the
    loss}"""
    path = ROOT / f"{run_folder(folder)}_ablation_{task}.csv"
    flags = ["--progress=false", "--device=cpu", *([f"--rope_factors={factors}"] if factors else [])]
    key = lambda r: (r["scaling"].split(" ")[0], int(r["length"]))
    return eval_length(cfg, task, [folder], lengths, path, key, *flags, "--rope_scalings", *scalings)


def main(argv=None):
    with one_line_errors(PROG):
        sections, choices = [("ablation", AblationConfig, None)], {"variants": tuple(VARIANTS)}
        values = parse_flags(argv, PROG, __doc__, sections, choices=choices, positional=("checkpoints",))
        cfg = AblationConfig(**values)
        data, T = datasets(cfg)
        name = cfg.name or f"longrope_{next(iter(data.values()))}_x{cfg.factor:g}"
        results = ROOT / cfg.results
        rows = (
            read_rows(results / f"{name}.csv", COLUMNS, PROG, *NUMBERS) if cfg.tables else None
        )  # before any write
        read = study_inputs(*map(checkpoint_path, cfg.checkpoints))
        for suffix in ("_table.md",) if cfg.tables else (".csv", "_table.md"):  # before any search
            check_outputs({"results": results / f"{name}{suffix}"}, read)
        if cfg.tables:  # the measurement's own line kept, where the table is there
            old = results / f"{name}_table.md"
            footer = old.read_text(encoding="utf-8").rstrip().rsplit("\n", 1)[-1] if old.is_file() else ""
            return write_table(results, name, footer, rows)
        return run(cfg, data, T, results, name, argv)


def run(cfg, data, T, results, name, argv):
    lengths = f"{T}t,{round(cfg.factor * T)}t"
    rows = []  # COLUMNS
    for folder, dataset in data.items():
        tasks = ("loss", "passkey") if dataset.startswith("passkey") else ("loss",)
        for task in tasks:  # plain RoPE and YaRN once per checkpoint, then each search's factors
            for (scaling, n), value in evaluate(cfg, folder, task, lengths, ["yarn"]).items():
                rows.append((Path(folder).name, "yarn" if scaling == "yarn" else "plain", "", task, n, value))
        for variant in cfg.variants:
            for seed in range(cfg.seeds):
                factors = search(cfg, folder, variant, seed)
                for task in tasks:
                    for (scaling, n), value in evaluate(cfg, folder, task, lengths, [], factors).items():
                        if scaling == "longrope":
                            rows.append((Path(folder).name, variant, seed, task, n, value))
    write_rows("results", results / f"{name}.csv", COLUMNS, rows)
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    written = read_rows(results / f"{name}.csv", COLUMNS, PROG, *NUMBERS)
    return write_table(results, name, f"Measured by `{command}`.", written)


def write_table(results, name, footer, rows):
    """{name}_table.md from {name}.csv's rows (read_rows), and under docs/ the docs' block of that name."""
    table = render(rows)
    text = f"{table}\n\n{footer}\n"
    write_output("results", results / f"{name}_table.md", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    print(f"{text}wrote {results / name}_table.md")
    fill_generated(results, {name: table})
    return text


def render(rows):
    """The mean ± sd table per variant and length, and the verdicts at the longest length."""
    tasks = [t for t in ("passkey", "loss") if any(r["task"] == t for r in rows)]
    lengths = sorted({int(r["length"]) for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    head = ["variant"]
    for task in tasks:
        head += [f"{'retrieval' if task == 'passkey' else 'loss'} at {n}" for n in lengths]
    values = lambda variant, task, n: list(cells(rows, variant, task, n).values())
    table = [[v, *(mean_sd(values(v, t, n), t) for t in tasks for n in lengths)] for v in variants]
    units = len({(r["checkpoint"], r["search_seed"]) for r in rows if r["search_seed"]})
    parts = [f"Mean ± sd over {units} (checkpoint, search seed) pairs:", markdown_table(head, table)]
    verdicts, longest = [], lengths[-1]
    for a, b, question in COMPARISONS:
        if a in variants and b in variants:
            welch = b in VARIANTS  # both searched: nothing pairs one search with another
            side = lambda v, t: cells(rows, v, t, longest)
            found = [paired_verdict(side(a, t), side(b, t), t, "pairs", welch=welch) for t in tasks]
            verdicts.append([a, b, question, "Welch" if welch else "paired", *found])
    if verdicts:
        what = [f"{'retrieval (points)' if t == 'passkey' else 'loss'} a - b at {longest}" for t in tasks]
        parts += [
            f"Verdicts at {longest} tokens: a - b, its 95% t interval (paired over (checkpoint, search seed) "
            "against a formula; Welch's, unpaired, between two searches), the word it supports:",
            markdown_table(["a", "b", "question", "interval", *what], verdicts),
        ]
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()

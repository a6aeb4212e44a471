"""Every CSV in docs/ names the committed command that would rebuild it, and that command stands: its module
imports, its flags parse as the module's main parses them, it writes a file of that name, and the columns its
writer produces are the CSV's header. The command is read from the docs, not from this file: the footer of the
CSV's {name}_table.md (or the paragraph of the page that names the CSV)."""

import csv
import importlib
import re
import shlex
from pathlib import Path

import pytest

from lab import eval_length
from lab.experiments import extrapolation as study
from lab.experiments import longlora
from lab.experiments import longrope_ablation as ablation
from lab.perf import threads
from plumbing.cli import parse_flags

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CSVS = sorted(DOCS.glob("*.csv"))
COMMAND = re.compile(r"`(python -m [\w.]+[^`]*)`")
SEED_CSV = re.compile(r"(.+)_seed(\d+)$")


def source(csv_path):
    """The page that names the command of a CSV: its own {stem}_table.md ({name}_seed{S}.csv: {name}'s), the
    LongLoRA study's for its cost, docs/perf.md for lab.perf.threads'."""
    stem = SEED_CSV.sub(r"\1", csv_path.stem)
    pages = {"longlora_cost": "longlora_table.md", "perf_threads": "perf.md"}
    return DOCS / pages.get(stem, f"{stem}_table.md")


def commands(csv_path):
    """The `python -m ...` commands of the paragraphs of its page that say how it was measured: a table file's
    closing lines (Measured ..., Budget rows ...), or any paragraph naming the CSV's file."""
    paragraphs = source(csv_path).read_text(encoding="utf-8").split("\n\n")
    said = [
        p
        for p in paragraphs
        if csv_path.name in p
        or (source(csv_path).name.endswith("_table.md") and p.startswith(("Measured", "Budget")))
    ]
    if SEED_CSV.match(csv_path.stem):  # a seed evaluated apart: only the paragraph naming it
        said = [p for p in said if csv_path.name in p]
    return [shlex.split(c) for p in said for c in COMMAND.findall(p.replace("\n", " "))]


def parsed(module, argv):
    """The config the module's main builds from argv (its own parse_flags call), or pytest.fail."""
    if module == "lab.experiments.extrapolation":
        return study.parse_args(argv)
    if module == "lab.experiments.longlora":
        return longlora.StudyConfig(
            **parse_flags(argv, longlora.PROG, "", [("study", longlora.StudyConfig, None)])
        )
    if module == "lab.experiments.longrope_ablation":
        sections, choices = (
            [("ablation", ablation.AblationConfig, None)],
            {"variants": tuple(ablation.VARIANTS)},
        )
        values = parse_flags(argv, ablation.PROG, "", sections, choices=choices, positional=("checkpoints",))
        return ablation.AblationConfig(**values)
    if module == "lab.perf.threads":
        return threads.ThreadsConfig(
            **parse_flags(argv, threads.PROG, "", [("measurement", threads.ThreadsConfig, None)])
        )
    pytest.fail(f"no writer of docs' CSVs is known in {module}")


def written(module, cfg):
    """{file name: its columns} of the CSVs the command writes (extrapolation: its per-seed files too)."""
    if module == "lab.experiments.extrapolation":
        name, columns = (
            study.results_name(cfg),
            eval_length.PASSKEY_COLUMNS if cfg.task == "passkey" else None,
        )
        columns = columns or eval_length.CSV_COLUMNS
        return {f"{name}.csv": columns} | {f"{name}_seed{s}.csv": columns for s in study.seeds(cfg)}
    if module == "lab.experiments.longlora":
        return {"longlora.csv": longlora.CSV_COLUMNS, "longlora_cost.csv": longlora.COST}
    if module == "lab.experiments.longrope_ablation":  # its name holds the dataset of the checkpoints given
        return {
            f"longrope_{dataset}_x{cfg.factor:g}.csv": ablation.COLUMNS
            for dataset in ("passkey", "shakespeare_char")
        }
    return {"perf_threads.csv": threads.COLUMNS}


@pytest.mark.parametrize("path", CSVS, ids=[p.name for p in CSVS])
def test_every_csv_in_docs_names_a_command_that_writes_it_with_its_columns(path):
    found = commands(path)
    assert found, f"{path.name}: {source(path).name} names no `python -m ...` command for it"
    with open(path, newline="", encoding="utf-8") as f:
        header = tuple(next(csv.reader(f)))
    for python, flag, module, *argv in found:
        assert (python, flag) == ("python", "-m")
        importlib.import_module(module)
        cfg = parsed(module, argv)
        columns = written(module, cfg)
        assert path.name in columns, f"`{module} {' '.join(argv)}` writes {sorted(columns)}, not {path.name}"
        assert tuple(columns[path.name]) == header, (
            f"{path.name}: header {header}, its writer {columns[path.name]}"
        )


def test_a_command_that_does_not_parse_or_writes_another_file_fails():
    """The checks can fail: a misspelt flag, and a study that writes another file than the CSV."""
    with pytest.raises(SystemExit):
        parsed("lab.experiments.extrapolation", ["--task", "passkey", "--seedz", "3"])
    cfg = parsed("lab.experiments.extrapolation", ["--task", "passkey"])
    assert "extrapolation.csv" not in written("lab.experiments.extrapolation", cfg)
    assert "retrieval_seed1338.csv" not in written("lab.experiments.extrapolation", cfg)  # one seed only


def test_longlora_csv_names_the_base_of_every_row():
    rows = longlora.read_rows(DOCS / "longlora.csv", longlora.CSV_COLUMNS, longlora.PROG)
    assert all(re.fullmatch(r"\S+ \(seed \d+\)", r["base"]) for r in rows)
    bases = {r["phase"]: r["base"] for r in rows}
    assert bases["budget"] != bases["report"] == bases["sweep"]  # the budget rows' base is another training

"""The docs' result tables are what the studies' code makes of the committed CSVs, never typed by hand: every
generated block is its producer's output, every table of measured numbers on a page (the README, perf.md and
every other page but the studies' own *_table.md) lies in such a block or is allowed with its reason, every
CSV in docs/ names a command that would rebuild it with its columns, and a verdict row is the paired-t
interval worked by hand."""

import re
from functools import cache
from pathlib import Path

import pytest

from lab.experiments import extrapolation as study
from lab.experiments import findings, longlora
from lab.experiments import longrope_ablation as ablation
from lab.perf import threads
from lab.tables import GENERATED, generated_blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]
BLOCKS = [
    (page, name, body)
    for page in PAGES
    for name, body in generated_blocks(page.read_text(encoding="utf-8")).items()
]
# A cell holding a measured number: a decimal (1.234, 0.5) or a percentage (56%)
MEASURED = re.compile(r"\d+\.\d+|\d+%")
# The pages whose typed tables are checked: every page but the studies' own {name}_table.md, which their code
# writes whole (tests/test_study.py, test_longlora_study.py)
CHECKED = [page for page in PAGES if not page.name.endswith("_table.md")]
# Tables of measured-looking numbers typed outside a generated block, by page and exact header, each with its
# reason: not results, or results no committed CSV holds, which no verdict of the docs stands on
TYPED = {
    ("add_a_scheme.md", "| hook | returns | who calls it |"): "the interface; one number: GPT-2's init",
    ("extrapolation.md", "| paper | finding | rows to compare |"): "the papers' claims, not results",
    (
        "extrapolation.md",
        "| ingredient | the authors (Llama 2 7B, 4,096 to 32,768 tokens) "
        "| here (0.8M parameters, 64 to 256 tokens) |",
    ): "the two recipes' settings, not results",
    ("extrapolation.md", "| filler, keys per sample, model | steps | digit accuracy inside T |"): (
        "the search for the passkey recipe: scratch loops not kept; it chose the recipe, no verdict "
        "stands on it"
    ),
    (
        "extrapolation.md",
        "| run (`python train.py --config configs/passkey.toml ...`) "
        "| best val loss | exact match at L = T = 64 |",
    ): "the recipe's training runs, best val loss from their checkpoints; no verdict stands on them",
    ("README.md", "| checkpoint | pos | T | method | 1x | 4x |"): (
        "one seed's printout of `python -m lab.eval_length`, an example of the command's output; the study's "
        "numbers are the generated table below it"
    ),
    ("usage.md", "| checkpoint | pos | T | method | 1x | 4x |"): "lab.eval_length's printout, an example",
    ("usage.md", "| preset | what | command |"): "presets and commands, not results",
    ("usage.md", "| method | what it does to theta_i |"): "formulas, not results",
    ("claims.md", "| claim | demonstrated by | checked by |"): "claims and the tests that check them",
    ("perf.md", "| target | measured | status |"): (
        "lab.perf.bench and lab.perf.ab printouts of the day, dated, with the command; no CSV, and no "
        "verdict of the length study stands on them"
    ),
    (
        "perf.md",
        "| pos | ms/step | x learned | % of peak | cached tok/s | reference tok/s | speed-up "
        "| compiled tok/s |",
    ): "lab.perf.bench's printout; docs/perf_cpu.json holds every figure of the run",
    ("perf.md", "| `--pos` | best val loss | wall time | ms/iter |"): (
        "timings of one day's training runs by /usr/bin/time, dated; no CSV, no verdict stands on them"
    ),
}


@cache
def extrapolation_tables():
    """{block name: text} of the loss and retrieval studies, from docs/{extrapolation,retrieval}*.csv."""
    found = {}
    for task in study.TASKS:
        cfg = study.StudyConfig(task=task)
        found |= study.docs_tables(task, *study.read_study(cfg))
        cfg = study.StudyConfig(task=task, schemes=["rope"], longrope=True)  # its LongRoPE study
        found |= study.docs_tables(task, *study.read_study(cfg), longrope=True)
    return found


@cache
def all_findings():
    return findings.findings()


def produced(name):
    """The text the code makes for block `name`, or None when no producer knows it."""
    if name.startswith("longlora_"):
        found = longlora.read_tables(DOCS)
        return found[name][1] if name in found else None
    if name.startswith("longrope_"):  # lab.experiments.longrope_ablation's {name}.csv
        path = DOCS / f"{name}.csv"
        return (
            ablation.render(ablation.read_rows(path, ablation.COLUMNS, ablation.PROG))
            if path.is_file()
            else None
        )
    if name == "perf_threads":  # lab.perf.threads' docs/perf_threads.csv
        return threads.render(threads.read_rows(DOCS / "perf_threads.csv", threads.COLUMNS, threads.PROG))
    if name.startswith("finding_"):  # lab.experiments.findings' sentences
        return all_findings().get(name)
    return extrapolation_tables().get(name)


@pytest.mark.parametrize("page, name, body", BLOCKS, ids=[f"{p.name}:{n}" for p, n, _ in BLOCKS])
def test_every_generated_block_is_what_its_producer_makes_of_the_committed_csvs(page, name, body):
    text = produced(name)
    assert text is not None, f"{page.name}: no producer knows the generated block {name!r}"
    assert body == text, f"{page.name}: block {name!r} differs from what its CSVs give; run --tables"


def tables(text):
    """(header line, its lines) of every markdown table in text."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            end = next((k for k in range(i, len(lines)) if not lines[k].startswith("|")), len(lines))
            found.append((line, lines[i:end]))
    return found


def typed_result_tables(text, page=""):
    """The headers of the tables of measured numbers outside generated blocks, but for page's in TYPED."""
    text = GENERATED.sub("", text)
    return [
        header
        for header, lines in tables(text)
        if (page, header) not in TYPED and any(MEASURED.search(line) for line in lines[2:])
    ]


@pytest.mark.parametrize("page", CHECKED, ids=[p.name for p in CHECKED])
def test_every_table_of_measured_numbers_is_generated_or_allowed_with_its_reason(page):
    typed = typed_result_tables(page.read_text(encoding="utf-8"), page.name)
    assert not typed, f"{page.name}: tables of measured numbers typed outside a generated block: {typed}"


def test_the_readme_and_perf_md_are_checked_and_every_allowance_names_a_table_that_exists():
    assert {"README.md", "perf.md", "extrapolation.md", "lesson.md"} <= {page.name for page in CHECKED}
    headers = {
        (page.name, header) for page in CHECKED for header, _ in tables(page.read_text(encoding="utf-8"))
    }
    assert not set(TYPED) - headers, f"allowances for tables no page holds: {set(TYPED) - headers}"
    assert all(reason.strip() for reason in TYPED.values())


def test_a_table_of_numbers_is_found_typed_and_taken_inside_a_block():
    table = "| run | 64t |\n|---|---|\n| rope | 1.759 |"
    assert typed_result_tables(f"text\n\n{table}\n\nmore") == ["| run | 64t |"]
    assert typed_result_tables(f"<!-- generated: x -->\n{table}\n<!-- end generated -->") == []
    header = "| checkpoint | pos | T | method | 1x | 4x |"
    allowed = f"{header}\n|---|---|---|---|---|---|\n| rope | rope | 64 | plain | 1.775 | 2.097 |"
    assert typed_result_tables(allowed, "README.md") == []
    assert typed_result_tables(allowed, "perf.md") == [header]  # its page only


def test_a_verdict_row_is_the_paired_t_interval_of_three_seeds():
    """ALiBi against RoPE at 4 T from three made-up seeds: differences -0.20, -0.23, -0.23, mean -0.22, sd
    0.01 sqrt(3), so the half-width is t(0.975, 2) x 0.01 = 0.043: [-0.263, -0.177], below 0: better."""
    alibi, rope = (1.80, 1.82, 1.84), (2.00, 2.05, 2.07)
    per_seed = {
        1337 + i: {("x_alibi", "plain", 256): a, ("x_rope", "plain", 256): r}
        for i, (a, r) in enumerate(zip(alibi, rope))
    }
    table = study.verdict_table(study.COMPARISONS["loss"], per_seed, 64, loss=True)
    assert table.splitlines()[2:] == [
        "| ALiBi beats RoPE past T | alibi at 4 T | rope at 4 T | 3 | -0.220 [-0.263, -0.177] | better |"
    ]


@pytest.mark.parametrize("task", study.TASKS)
def test_the_studys_table_files_begin_with_what_their_csvs_give(task):
    """docs/extrapolation_table.md and retrieval_table.md: the summary over seeds and the verdicts, before
    the per-seed tables that lab/eval_length.py printed."""
    cfg = study.StudyConfig(task=task)
    text = (DOCS / f"{study.results_name(cfg)}_table.md").read_text(encoding="utf-8")
    assert text.startswith(study.report(cfg, *study.read_study(cfg)) + "\n\n")


def test_an_empty_generated_block_is_read_alone_and_never_reaches_into_the_next():
    """A block whose text is empty is its own block: the pattern never spans from one block's start to the
    next block's end (a rewrite would delete the text between them)."""
    end = "<!-- end generated -->"
    page = f"a\n<!-- generated: one -->\n{end}\nkept\n<!-- generated: two -->\nx\n{end}\n"
    assert generated_blocks(page) == {"one": "", "two": "x"}
    filled = GENERATED.sub(lambda m: f"{m[1]}new\n<!-- end generated -->", page)
    assert "kept" in filled and generated_blocks(filled) == {"one": "new", "two": "new"}

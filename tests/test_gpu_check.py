"""lab/perf/gpu_check.sh runs from where it lives: its dry run (every step's command on a CPU at tiny sizes)
exits 0, every step at exit 0, and leaves the 8 files its header names and nothing else; its step timeouts add
up to what its header says, within 8 minutes; a bad argument, or the real run without CUDA, is one line."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "lab" / "perf" / "gpu_check.sh"
TEXT = SCRIPT.read_text()
STEPS = re.findall(r'^\s*step "([^"]+)" (\d+) ', TEXT, flags=re.M)  # (name, timeout s) in the order run
NANOGPT_STEP = "$nanogpt"  # its name is a variable: the one step a dry run leaves out


def header_files():
    """The files the header's "It writes 8 files under $OUT" paragraph names."""
    paragraph = TEXT[TEXT.index("# It writes 8 files") : TEXT.index("# Exit status")]
    return list(dict.fromkeys(re.findall(r"\b[a-z_]+\.(?:txt|log|json)\b", paragraph)))


def environment(out, tmp):
    """The script's environment: this interpreter, $OUT and $TMPDIR given, $NANOGPT left to its default."""
    env = {k: v for k, v in os.environ.items() if k != "NANOGPT"}
    return env | {"OUT": str(out), "PYTHON": sys.executable, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The dry run, started from another folder than the repository (it must cd there itself)."""
    out, tmp, elsewhere = (tmp_path_factory.mktemp(name) for name in ("out", "tmp", "elsewhere"))
    run = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"],
        cwd=elsewhere,
        env=environment(out, tmp),
        capture_output=True,
        text=True,
        timeout=400,
    )
    return run, out, tmp


def test_the_dry_run_exits_0_with_every_step_at_exit_0_in_order(dry_run):
    run, out, _ = dry_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = (out / "summary.txt").read_text().splitlines()
    ran = [re.match(r"(.+): exit (\d+) in \d+ s$", line) for line in summary]
    ran = [(m[1], int(m[2])) for m in ran if m]
    wanted = [name for name, _ in STEPS if name != NANOGPT_STEP]
    assert len(wanted) == 10 and ran == [(name, 0) for name in wanted], summary
    nanogpt = ROOT / "peers" / "nanoGPT"
    nanogpt = nanogpt if nanogpt.is_dir() else ROOT.parent / "shared" / "peers" / "nanoGPT"
    (line,) = [line for line in summary if line.startswith("nanoGPT bench.py")]
    found = f"not run in a dry run (it needs CUDA), found at {nanogpt.resolve()}/bench.py"
    assert line.endswith(found if nanogpt.is_dir() else "not run, no ../shared/peers/nanoGPT/bench.py"), line
    assert "compiled.log: 0 'Recompiling function' lines" in summary  # nothing compiled in a dry run
    assert sum(line.startswith("sample.py: ") and "tokens/s" in line for line in summary) == 2
    assert any(line.startswith("pytest: ") and " passed" in line for line in summary), summary


def test_the_dry_run_leaves_the_8_files_of_the_header_and_nothing_else(dry_run):
    """The json_* figures and train.py's runs live in a temporary folder, merged into figures.json, gone."""
    run, out, tmp = dry_run
    assert run.returncode == 0
    files = header_files()
    assert len(files) == 8 and sorted(p.name for p in out.rglob("*")) == sorted(files)
    assert not list(tmp.glob("gpu_check.*"))  # the temporary folder is removed on exit
    figures = json.loads((out / "figures.json").read_text())
    assert sorted(figures) == ["124m", "124m_compiled", "recipe", "recipe_compiled", "train"]
    assert (
        list(figures["recipe"]["generation"]) == list(figures["124m"]["generation"])
        and figures["train"]["training"]
    )
    assert (
        list(figures["recipe_compiled"]["generation"])
        == ["rope"]
        == list(figures["124m_compiled"]["generation"])
    )
    rows = [row for name in figures for g in figures[name]["generation"].values() for row in g["rows"]]
    assert rows and {row["dtype"] for row in rows} == {"float32"}  # a CPU's default
    env = (out / "env.txt").read_text()
    assert env.startswith("gpu_check.sh --dry-run,") and f"torch {torch.__version__}" in env


def test_the_step_timeouts_add_up_to_the_headers_sum_within_8_minutes():
    (stated,) = re.findall(r"the step timeouts below add up to (\d+) s", TEXT)
    timeouts = [int(seconds) for _, seconds in STEPS]
    assert len(STEPS) == 11 and sum(timeouts) == int(stated) <= 480


def test_a_bad_argument_is_one_line_and_status_2(tmp_path):
    run = subprocess.run(["bash", str(SCRIPT), "--dryrun"], env=environment(tmp_path / "out", tmp_path),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "'--dryrun'" in run.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA would run the real check")
def test_the_real_run_without_a_gpu_is_one_line_status_1_and_measures_nothing(tmp_path):
    out = tmp_path / "out"
    env = environment(out, tmp_path)
    run = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "no CUDA GPU here" in run.stderr
    assert [p.name for p in out.iterdir()] == ["summary.txt"] and not list(tmp_path.glob("gpu_check.*"))

"""Hostile inputs, round five: the lab by the core's mechanisms. Each case as a user types it is one line and
a non-zero status, no traceback, and nothing on disk changed: no output over an input (check_outputs given
every input), no setting dropped, one CSV reader (runs.read_rows), one rule for --jobs (runs.check_jobs), and
every `python -m lab.NAME` quiet on Ctrl-C from its first imports (lab/__init__.py)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TINY_RUN, error_line

import train
from lab import eval_length
from lab.demo import figures
from lab.experiments import extrapolation, findings, longlora
from lab.perf import bench

ROOT = Path(__file__).resolve().parents[1]
TINY_BENCH = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--device=cpu"]


def test_bench_json_over_a_file_of_the_dataset_it_reads_is_refused_with_replace(capsys):
    """--json inside --dataset's folder: refused before any work, --replace or not; the folder unchanged."""
    folder = ROOT / "data" / "shakespeare_char"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    argv = ["--json=data/shakespeare_char/meta.json", "--dataset=shakespeare_char", "--replace", *TINY_BENCH]
    err = error_line(capsys, bench, argv, 1)
    assert "--json=data/shakespeare_char/meta.json" in err and "folder this run reads" in err
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


def test_bench_json_over_its_own_config_is_refused_with_replace(tmp_path, capsys):
    """--config x.toml --json x.toml --replace: the preset is an input; its bytes are kept."""
    preset = tmp_path / "x.toml"
    shutil.copy(ROOT / "configs" / "cpu_recipe.toml", preset)
    before = preset.read_bytes()
    err = error_line(capsys, bench, ["--config", str(preset), "--json", str(preset), "--replace"], 1)
    assert f"--json={preset}: that file is an input of this run" in err
    assert preset.read_bytes() == before


def test_bench_quick_with_a_flag_it_replaces_is_refused(capsys):
    """--quick sets train_steps: --quick --train_steps=0 would train 10 steps anyway."""
    err = error_line(capsys, bench, ["--quick", "--train_steps=0"], 2)
    assert "--quick sets --train_steps" in err


def test_a_bench_preset_scheme_setting_is_applied_or_refused(tmp_path, capsys):
    """fire_hidden = 64 shapes the fire model bench times; with fire not timed (--pos=rope) it is refused."""
    preset = tmp_path / "fire.toml"
    preset.write_text("n_layer = 1\nn_embd = 32\nn_head = 2\nfire_hidden = 64\n")
    cfg = bench.parse_args(["--config", str(preset), "--pos=rope,fire", "--device=cpu"])
    assert cfg.model_configs["fire"].pos_settings.fire_hidden == 64
    assert cfg.model_configs["rope"].n_layer == 1
    err = error_line(capsys, bench, ["--config", str(preset), "--pos=rope", "--device=cpu"], 2)
    assert "fire_hidden is a setting of pos=fire" in err


def test_figures_out_over_its_csv_is_refused_with_replace(tmp_path, capsys):
    """--csv D/extrapolation.png --out D --replace: the figure would replace the CSV it reads."""
    csv = tmp_path / "extrapolation.png"
    shutil.copy(ROOT / "docs" / "extrapolation.csv", csv)
    before = csv.read_bytes()
    (tmp_path / "runs").mkdir()  # no runs: not the README's in out/, whatever this checkout holds
    argv = [f"--csv={csv}", f"--out={tmp_path}", "--only=extrapolation", "--replace"]
    err = error_line(capsys, figures, [*argv, f"--checkpoints={tmp_path / 'runs'}"], 1)
    assert "that file is an input of this run" in err and csv.read_bytes() == before


def docs_with(tmp_path, change):
    """A copy of docs/*.csv with longlora.csv's lines changed by `change`, findings reading it."""
    for path in (ROOT / "docs").glob("*.csv"):
        shutil.copy(path, tmp_path)
    lines = (tmp_path / "longlora.csv").read_text().splitlines()
    (tmp_path / "longlora.csv").write_text("\n".join(change(lines)) + "\n")
    return tmp_path


def with_value(value):
    return lambda lines: [lines[0], *(line.replace(",0.97,", f",{value},", 1) for line in lines[1:])]


@pytest.mark.parametrize(
    "change, said",
    [
        (with_value("nan"), "line 41: value is 'nan', not a finite number"),
        (with_value("inf"), "line 41: value is 'inf', not a finite number"),
        (with_value("abc"), "line 41: value is 'abc', not a finite number"),
        (lambda lines: [lines[0].replace(",value,", ",valu,"), *lines[1:]], "no column value"),
        (lambda lines: [line for line in lines if ",base," not in line], "setting base"),
        (lambda lines: [line for line in lines if not (",pi_s2," in line and ",1337," not in line)],
         "setting pi_s2"),
    ],
    ids=["nan", "inf", "abc", "no column", "no setting", "one seed"],
)  # fmt: skip
def test_findings_reads_its_csvs_through_the_studies_reader(tmp_path, monkeypatch, capsys, change, said):
    """A value that is no finite number, a missing column, a setting with too few seeds: one line naming the
    file, the line or setting, and the command that rebuilds it; nothing written."""
    docs = docs_with(tmp_path, change)
    monkeypatch.setattr(findings, "DOCS", docs)
    findings.longlora_rows.cache_clear()
    before = {p.name: p.read_bytes() for p in docs.iterdir()}
    try:
        err = error_line(capsys, findings, [], 2)
    finally:
        findings.longlora_rows.cache_clear()
    assert f"{docs / 'longlora.csv'}" in err and said in err and "python -m lab.experiments.longlora" in err
    assert {p.name: p.read_bytes() for p in docs.iterdir()} == before


@pytest.mark.parametrize(
    "study, argv",
    [(extrapolation, ["--preset=gpu", "--device=cpu"]), (longlora, ["--jobs=3"])],
    ids=["extrapolation gpu preset on cpu", "longlora"],
)
def test_every_study_refuses_more_jobs_than_the_cpu_runs_at_once(monkeypatch, capsys, study, argv):
    """On 2 cores, the GPU preset's jobs 7 (and longlora's --jobs=3): one line naming --jobs."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    err = error_line(capsys, study, argv, 2)
    assert "--jobs=" in err and "give 1 to 2" in err


def test_eval_length_checkpoint_after_the_flags_says_checkpoints_go_first(tmp_path, capsys):
    """CKPT --lengths=1 CKPT2: the second checkpoint named, and that checkpoints go before the flags."""
    train.main([*TINY_RUN, f"--out_dir={tmp_path / 'a'}"])
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    err = error_line(capsys, eval_length, [str(tmp_path / "a"), "--lengths=1", str(tmp_path / "b")], 2)
    assert f"{tmp_path / 'b'}: a checkpoint after the flags" in err and "before the flags" in err


CTRL_C_COMMANDS = [["-m", "lab.experiments.findings"], ["-m", "lab.course", "grade"]]
MOMENTS = (0.1, 0.3, 1.0)  # seconds after the start: the package's imports, torch's, the work


@pytest.mark.skipif(sys.platform != "linux", reason="process groups: POSIX")
def test_ctrl_c_during_a_lab_commands_imports_is_status_130_and_quiet():
    """SIGINT to the process group at several moments of the start (all at once, so the test takes ~1 s
    plus the slowest exit): status 130, no traceback, never a swallowed signal and exit 0."""
    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}
    started = []
    for command in CTRL_C_COMMANDS:
        for moment in MOMENTS:
            process = subprocess.Popen(
                [sys.executable, *command], cwd=ROOT, env=env, text=True, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            started.append((command, moment, time.monotonic(), process))
    failures = []
    for command, moment, start, process in sorted(started, key=lambda s: s[1]):
        time.sleep(max(0.0, start + moment - time.monotonic()))
        running = process.poll() is None
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=60)
        if running and (process.returncode != 130 or "Traceback" in err or "KeyboardInterrupt" in err):
            failures.append(f"{' '.join(command)} at {moment} s: status {process.returncode}\n{err[-800:]}")
    assert not failures, "\n\n".join(failures)

"""CPU threads: every entry point chooses them in one function (plumbing.hardware.use_threads), says what it
chose in its first lines, and --threads overrides the choice; a training run slowed far below its own fastest
step says so once, with the likely cause; progress off a terminal is a few plain lines, not a bar."""

import dataclasses
import io
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import TINY_RUN, error_line
from tqdm import tqdm

import sample
import train
from lab import eval_length
from lab.perf import ab, bench, threads
from lab.tables import generated_blocks
from plumbing import hardware
from plumbing.cli import threads_flag
from plumbing.errors import UserError
from plumbing.progress import progress_bar
from train import SLOWDOWN, StepClock, step_line

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_thread_count_given_is_applied_and_reported(threads_restored):
    line = hardware.use_threads("2", "cpu")
    assert torch.get_num_threads() == 2 and line.startswith(
        f"threads: 2 of {os.cpu_count()} cores (--threads)"
    )


def test_auto_keeps_omp_num_threads_where_set(monkeypatch, threads_restored):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    assert "(OMP_NUM_THREADS" in hardware.use_threads("auto", "cpu") and torch.get_num_threads() == 1


@pytest.mark.parametrize(
    "cores, others, threads",
    [(2, 0, 2), (2, 1, 1), (2, 5, 1), (16, 3, 13), (1, 0, 1), (2, None, 2)],
    ids=["idle", "one busy process", "loaded", "16 cores", "one core", "no /proc/stat"],
)
def test_auto_takes_the_cores_the_tasks_running_now_leave_free(
    monkeypatch, threads_restored, cores, others, threads
):
    """Without OMP_NUM_THREADS, on a CPU: the cores minus the other tasks running now, at least one."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(hardware, "runnable_others", lambda: others)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: setattr(torch, "_threads_set", n))
    line = hardware.use_threads("auto", "cpu")
    assert torch._threads_set == threads and line.startswith(f"threads: {threads} of {cores} cores (auto")


def test_the_tasks_running_now_are_read_from_proc_stat_without_this_one(monkeypatch, tmp_path):
    """procs_running counts this process too; the fewest of the reads counts (a task waking for a moment)."""
    reads = iter(["3", "2", "4", "2", "3"])
    real_open = open
    fake = tmp_path / "stat"
    monkeypatch.setattr(hardware.time, "sleep", lambda seconds: None)

    def fake_open(path, *args, **kwargs):
        if path == "/proc/stat":
            fake.write_text(f"cpu  1 2 3\nprocs_running {next(reads)}\nprocs_blocked 0\n")
            return real_open(fake, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert hardware.runnable_others() == 1


@pytest.mark.parametrize("threads", ["3", "1000", "99999999999999999999", "0", "-1", "two"])
def test_more_threads_than_cores_are_refused_naming_the_flag(monkeypatch, threads):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    refused = rf"^--threads={threads}: give auto or a number of threads from 1 to 2 "
    with pytest.raises(ValueError, match=refused):
        hardware.check_threads(threads)


@pytest.mark.parametrize("script", [train, sample, eval_length, bench, ab])
def test_every_entry_point_declares_threads_once_and_its_help_says_what_it_does(capsys, script):
    """--threads is plumbing.cli.threads_flag in each script's config: one help text everywhere."""
    config = {train: train.TrainConfig, sample: sample.SampleConfig, eval_length: eval_length.EvalConfig}
    config |= {bench: bench.BenchConfig, ab: ab.ABConfig}
    threads = next(f for f in dataclasses.fields(config[script]) if f.name == "threads")
    assert (threads.default, threads.metadata) == ("auto", threads_flag().metadata)
    with pytest.raises(SystemExit):
        script.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "--threads THREADS CPU threads, at most the cores (more: refused); auto: the cores idle" in shown


@pytest.mark.parametrize("script", [train, sample, eval_length, bench, ab])
def test_a_bad_thread_count_is_one_line_naming_the_choices(capsys, script):
    argv = ["--threads=0", *{eval_length: ["out/x"], ab: ["--against=HEAD"]}.get(script, [])]
    if script is ab:  # lab.perf.ab's prog is its module name
        with pytest.raises(SystemExit, match="2"):
            ab.main(argv)
        err = capsys.readouterr().err.strip()
    else:
        err = error_line(capsys, script, argv, 2)
    assert "--threads=0: give auto or a number of threads from 1 to" in err and "\n" not in err, err


def test_train_says_its_threads_in_its_first_lines_and_the_flag_sets_them(capsys, tmp_path, threads_restored):
    torch.set_num_threads(2)
    train.main([*TINY_RUN, f"--out_dir={tmp_path}", "--threads=1"])
    first_lines = capsys.readouterr().out.splitlines()[:3]
    assert any(line.startswith("threads: 1 of ") for line in first_lines), first_lines
    assert torch.get_num_threads() == 1


def run_steps(step_seconds, log_interval):
    """A StepClock on a fake clock through steps taking step_seconds each -> the slowdown note of each lap."""
    now = [0.0]
    clock = StepClock(SimpleNamespace(max_iters=len(step_seconds), eval_interval=1000), 0, lambda: now[0])
    notes = []
    for step, seconds in enumerate(step_seconds, 1):
        now[0] += seconds
        clock.step()
        if step % log_interval == 0:
            notes.append(clock.slowdown(clock.lap(step)[0]))
    return notes


def test_steps_far_slower_than_the_fastest_get_one_note_with_the_cause(threads_restored):
    torch.set_num_threads(2)
    notes = run_steps([0.1] * 4 + [0.1 * SLOWDOWN * 1.2] * 8, 4)
    assert notes[0] is None and notes[2] is None, notes  # the slow windows are noted once
    assert notes[1].startswith("note: steps take 300 ms, 3.0x this run's fastest step (100 ms)"), notes
    assert "other processes" in notes[1] and "--threads=1" in notes[1]


def test_steps_at_an_uneven_but_steady_pace_get_no_note():
    assert run_steps([0.1, 0.2] * 20, 10) == [None] * 4


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_few_plain_lines_when_not_on_a_terminal():
    """lab/eval_length.py's and data/fineweb_edu/prepare.py's progress: off a terminal (a log, a pipe), one
    whole line per quarter, never a bar redrawn with carriage returns; on a terminal, tqdm's bar."""
    log = io.StringIO()
    with progress_bar(1000, "tok", "tokenizing", file=log) as bar:
        for _ in range(100):
            bar.update(10)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 4, lines
    assert lines[-1].startswith("tokenizing: 1,000/1,000 (100%) tok"), lines
    silent = io.StringIO()
    with progress_bar(10, "tok", file=silent, enabled=False) as bar:
        bar.update(10)
    assert silent.getvalue() == ""
    with progress_bar(10, "tok", file=Terminal()) as bar:
        assert isinstance(bar, tqdm)


def test_perf_threads_tables_regenerates_the_committed_block_from_the_committed_csv(tmp_path, capsys):
    """docs/perf.md's table of train.py's speed per machine state and --threads is what --tables makes of
    docs/perf_threads.csv (tests/test_docs_tables.py checks the docs' copy; here the command itself)."""
    shutil.copy(ROOT / "docs" / "perf_threads.csv", tmp_path)
    block = generated_blocks((ROOT / "docs" / "perf.md").read_text(encoding="utf-8"))["perf_threads"]
    assert threads.main(["--tables", f"--results={tmp_path}"]) == block
    assert "| idle | 43 (41-44), takes 2 |" in block  # the median of the four windows, their range


def test_perf_threads_reads_the_threads_and_ms_per_iter_from_the_lines_train_py_prints(monkeypatch):
    """The figures come from train.py's own threads line and step lines (train.step_line), and the
    child runs without OMP_NUM_THREADS, which its --threads=auto would keep instead of reading the machine."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = SimpleNamespace(max_iters=60)
    speed = lambda ms: {"ms_per_iter": ms, "tokens_per_sec": 1000.0}
    lines = [
        "threads: 2 of 2 cores (auto: the cores the 0 other running tasks leave free); --threads=N sets them"
    ]
    lines += [
        step_line(step, cfg, 2.0, 1e-3, speed(ms), 5) for step, ms in ((20, 9.0), (40, 43.8), (60, 41.3))
    ]
    seen = {}

    def run_python(args, env, **kwargs):
        seen.update(args=args, env=env)
        return SimpleNamespace(stdout="\n".join(lines) + "\n")

    monkeypatch.setattr(threads, "run_python", run_python)
    assert threads.train("auto") == [2, 43.8, 41.3]
    assert "--threads=auto" in seen["args"] and "OMP_NUM_THREADS" not in seen["env"]


@pytest.mark.parametrize("stop", [UserError("`python train.py ...` failed"), KeyboardInterrupt()])
def test_perf_threads_stops_its_busy_processes_when_a_run_fails_or_is_interrupted(monkeypatch, stop):
    """The busy loops of each machine state end with it, and those running when a train.py run fails (or
    Ctrl-C strikes) are killed too: no spinning process outlives the measurement. Nothing is timed."""
    started, runs = [], []
    popen = subprocess.Popen
    monkeypatch.setattr(threads.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(
        threads.subprocess, "Popen", lambda *a, **k: started.append(popen(*a, **k)) or started[-1]
    )

    def train(flag):  # the first run beside three busy processes fails
        runs.append([loop.poll() for loop in started])
        if len(runs) == 13:
            raise stop
        return [2, 40.0, 41.0]

    monkeypatch.setattr(threads, "train", train)
    with pytest.raises(type(stop)):
        threads.measure(2)
    assert runs[0] == [] and runs[6] == [None]  # idle, then one busy process while the runs ran
    assert runs[12][0] is not None and runs[12][1:] == [None] * 3  # that one stopped; three running
    assert len(started) == 4 and all(loop.poll() is not None for loop in started)

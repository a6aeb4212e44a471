"""lab/experiments/runs.py's ensure_trained side by side (jobs > 1): every run trained and finished, each
one's output in {out_dir}.log, each given its share of the cores, a finished one reused."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TINY_RUN

from lab.experiments import runs
from lab.experiments.runs import ensure_trained
from plumbing.checkpoint import open_checkpoint, run_finished
from plumbing.run_folder import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]


def test_runs_side_by_side_each_finish_with_its_own_log_and_thread_share(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    commands = [
        [*TINY_RUN, f"--out_dir={tmp_path / name}", f"--seed={seed}"] for name, seed in (("a", 1), ("b", 2))
    ]
    logged = []
    assert ensure_trained(commands, log=logged.append, jobs=2) == [tmp_path / "a", tmp_path / "b"]
    for name in ("a", "b"):
        assert run_finished(open_checkpoint(tmp_path / name / "ckpt.pt"))
        output = (tmp_path / f"{name}.log").read_text()
        assert "threads: 1 of" in output and "done in" in output  # 2 cores / 2 jobs
    assert sum("trained in" in line for line in logged) == 2
    logged.clear()
    ensure_trained(commands, log=logged.append, jobs=2)
    assert sum(line.startswith("using ") for line in logged) == 2


def test_one_after_another_every_run_gets_the_same_thread_count(tmp_path, monkeypatch):
    """Not each child's own reading of the machine, which the run before it may still load."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    given = []
    monkeypatch.setattr(runs, "run_python", lambda args, env=None, **kw: given.append(env["OMP_NUM_THREADS"]))
    commands = [[*TINY_RUN, f"--out_dir={tmp_path / name}"] for name in "abc"]
    ensure_trained(commands, log=lambda line: None)
    assert given == ["8", "8", "8"]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    ensure_trained(commands, log=lambda line: None)
    assert given[3:] == ["3", "3", "3"]


# A study in miniature: one long run through ensure_trained, as the studies train theirs
STUDY = """
import sys
from lab.experiments.runs import ensure_trained
from plumbing.errors import one_line_errors
with one_line_errors("study"):
    ensure_trained([sys.argv[2:]], jobs=int(sys.argv[1]))
"""


def first_steps_logged(out_dir, study, jobs):
    """Wait until the run has logged step 2: on the study's output (jobs=1) or in its {out_dir}.log."""
    if jobs == 1:
        for line in study.stdout:
            if line.startswith("step 2/"):
                return
    log = Path(f"{out_dir}.log")
    for _ in range(600):
        if log.is_file() and "step 2/" in log.read_text():
            return
        time.sleep(0.1)


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_a_study_reaches_its_runs_which_save_before_it_stops(tmp_path, sig, jobs):
    """kill PID on a study (nohup, tmux), or kill -INT PID (an IDE's stop button, Jupyter's interrupt),
    signals it alone, not its process group: it passes the signal on to the train.py runs it started, which
    save and stop as train.py does, then stops itself, status 128 + the signal's number, no traceback; no run
    trains on unseen."""
    out_dir = tmp_path / "long"
    flags = [*TINY_RUN, "--max_iters=100000", "--eval_interval=1000", f"--out_dir={out_dir}"]
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    study = subprocess.Popen(
        [sys.executable, "-c", STUDY, str(jobs), *flags],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first_steps_logged(out_dir, study, jobs)
        study.send_signal(sig)  # to the study only, not its process group
        _, err = study.communicate(timeout=60)
    finally:
        study.kill()
        lock = out_dir / LOCK_NAME
        if lock.is_file():  # a run left training: stop it
            os.kill(int(lock.read_text().split()[1]), signal.SIGKILL)  # "pid N on HOST, ..."
    assert study.returncode == 128 + sig and "Traceback" not in err, err
    assert not (out_dir / LOCK_NAME).exists()  # the run has ended
    saved = open_checkpoint(out_dir / "ckpt.pt")
    assert not run_finished(saved) and saved["iter_num"] >= 2

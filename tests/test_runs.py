"""experiments/runs.py's ensure_trained side by side (jobs > 1): every run trained and finished, each one's
output in {out_dir}.log, each given its share of the cores, a finished one reused."""

from helpers import TINY_RUN

from experiments import runs
from experiments.runs import ensure_trained
from plumbing.checkpoint import open_checkpoint, run_finished


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

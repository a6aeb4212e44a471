"""plumbing/runs.py's ensure_trained side by side (jobs > 1): every run trained and finished, each one's
output in {out_dir}.log, each given its share of the cores, a finished one reused."""

from helpers import TINY_RUN

from plumbing.checkpoint import open_checkpoint, run_finished
from plumbing.runs import ensure_trained


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

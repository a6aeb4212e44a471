"""The study and the figure scripts check every flag and output path before the first training step or the
first computation: one line, a non-zero status, nothing trained or computed."""

import pytest

from lab.demo import figures, probe
from lab.experiments import extrapolation
from lab.perf import ab


def never(what):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{what} ran: the flag should have been refused first")

    return refuse


@pytest.fixture
def places(tmp_path):
    """{name: path}: a file, a path under it, a folder, and /proc (where no file can be made)."""
    (tmp_path / "file").write_text("x")
    return {"file": tmp_path / "file", "under": tmp_path / "file" / "sub", "dir": tmp_path, "proc": "/proc"}


STUDY = ["--quick", "--out_root={dir}/study"]
OUT_ROOT = ["--quick", "--results={dir}/results"]  # the results elsewhere: --out_root is what is checked
CASES = [
    (extrapolation, [*STUDY, "--lengths=nan"], 2, "lengths must be positive"),
    (extrapolation, [*STUDY, "--lengths=1,inf"], 2, "lengths must be positive"),
    (extrapolation, [*STUDY, "--lengths=1e-9"], 2, "less than one; choose longer lengths"),
    (extrapolation, [*STUDY, "--task=passkey", "--lengths=0.1"], 2, "cannot hold a statement"),
    (extrapolation, [*STUDY, "--results={file}"], 1, "--results=", "is a file, not a folder"),
    (extrapolation, [*STUDY, "--results={under}"], 1, "is a file, not a folder"),
    (extrapolation, [*STUDY, "--results={proc}"], 1, "cannot write there"),
    (extrapolation, [*OUT_ROOT, "--out_root={file}"], 1, "--out_root=", "is a file, not a folder"),
    (extrapolation, [*OUT_ROOT, "--out_root={under}"], 1, "--out_root=", "is a file, not a folder"),
    (extrapolation, [*OUT_ROOT, "--out_root={proc}/study"], 1, "--out_root=", "cannot write there"),
    (probe, ["--checkpoints={dir}", "--figure={dir}"], 1, "--figure=", "is a folder"),
    (probe, ["--checkpoints={dir}", "--figure={proc}/probe.png"], 1, "cannot write there"),
    (probe, ["--checkpoints={dir}", "--figure={under}/probe.png"], 1, "is a file, not a folder"),
    (probe, ["--checkpoints={dir}", "--figure={dir}/probe.xyz"], 2, "matplotlib writes no .xyz file"),
    (probe, ["--checkpoints={dir}", "--figure={dir}/rope/ckpt.pt"], 2, "matplotlib writes no .pt file"),
    (figures, ["--checkpoints={dir}", "--out={file}"], 1, "--out=", "is a file, not a folder"),
    (figures, ["--checkpoints={dir}", "--out={proc}"], 1, "cannot write there"),
    (figures, ["--checkpoints={dir}", "--out={under}"], 1, "is a file, not a folder"),
    (ab, ["--against="], 2, "--against: is empty"),  # git show :path would read the index
]


@pytest.mark.parametrize("script, argv, status, words", [(s, a, c, w) for s, a, c, *w in CASES])
def test_a_bad_flag_or_output_is_one_line_before_any_work(
    script, argv, status, words, places, capsys, monkeypatch
):
    """No run trained (lab.experiments.runs.ensure_trained), no model probed or drawn, no revision loaded."""
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(extrapolation, "ensure_trained", never("training"))
    monkeypatch.setattr(probe, "run_probes", never("the probes"))
    monkeypatch.setattr(figures, "model_dirs", never("finding the models"))
    monkeypatch.setattr(figures, "figure_sinusoidal", never("a figure"))
    monkeypatch.setattr(ab, "side_at", never("git show"))
    files = lambda: sorted(path for path in places["dir"].rglob("*") if path.is_file())
    before = files()
    with pytest.raises(SystemExit) as exit_info:
        script.main([arg.format(**places) for arg in argv])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == status and "\n" not in err and "Traceback" not in err, err
    assert "error: " in err and all(word in err for word in words), err
    assert files() == before  # no file written or left behind (a folder may be made, as the write will)


class Ran(Exception):
    """The command a study would run, caught instead of run."""


@pytest.mark.parametrize("task", ["passkey", "loss"])
def test_the_longlora_studys_evaluation_gives_lab_eval_length_only_flags_its_task_reads(task, monkeypatch):
    """lab.eval_length refuses a flag its --task does not read (--dataset with the passkey task, which makes
    its own samples): each command the study runs passes its checks, as the study writes it."""
    from lab import eval_length
    from lab.experiments import longlora, runs

    def caught(args, *_, **__):
        raise Ran(args)

    monkeypatch.setattr(runs, "run_python", caught)
    with pytest.raises(Ran) as ran:
        longlora.evaluate(
            longlora.StudyConfig(quick=True), task, ["out/a", "out/b"], "out/x.csv", "passkey_ctx"
        )
    command = [str(arg) for arg in ran.value.args[0]]
    assert command[:2] == ["-m", "lab.eval_length"] and f"--task={task}" in command
    assert eval_length.parse_args(command[2:]).task == task

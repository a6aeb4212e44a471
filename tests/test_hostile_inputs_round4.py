"""Hostile inputs, round four: each input below, typed as a user would, gives one line on stderr naming its
entry point as typed, a non-zero exit status and no traceback, before any work starts. The table runs each
through the real entry point: main(argv) in-process where it can, a subprocess where the input is the way the
script is started, a signal or a resource limit."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import eval_length
import train
from perf import bench

ROOT = Path(__file__).resolve().parents[1]
ENV = os.environ | {"OMP_NUM_THREADS": "1"}


def one_line(err, prog):
    """stderr's only line, which begins `prog: error: `; no traceback."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


def in_process(capsys, main, argv):
    """main(argv) -> (its exit status, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


# every entry point inside a package, run as a file: the line names its `python -m` form
AS_FILES = {
    "course/__main__.py": "course",
    "data/fineweb_edu/prepare.py": "data.fineweb_edu.prepare",
    "data/passkey/prepare.py": "data.passkey.prepare",
    "data/shakespeare/prepare.py": "data.shakespeare.prepare",
    "data/shakespeare_char/prepare.py": "data.shakespeare_char.prepare",
    "data/text/prepare.py": "data.text.prepare",
    "demo/figures.py": "demo.figures",
    "demo/permutation.py": "demo.permutation",
    "demo/probe.py": "demo.probe",
    "experiments/extrapolation.py": "experiments.extrapolation",
    "experiments/longlora.py": "experiments.longlora",
    "experiments/longrope.py": "experiments.longrope",
    "experiments/longrope_ablation.py": "experiments.longrope_ablation",
    "perf/ab.py": "perf.ab",
    "perf/bench.py": "perf.bench",
    "perf/threads.py": "perf.threads",
}


def test_every_entry_point_in_a_package_is_in_the_table():
    """A new `python -m` entry point gets the same guard (and a row above)."""
    found = {
        path.relative_to(ROOT).as_posix()
        for folder in ("course", "data", "demo", "experiments", "perf")
        for path in (ROOT / folder).rglob("*.py")
        if 'if __name__ == "__main__"' in path.read_text()
    }
    assert found == set(AS_FILES)


@pytest.mark.parametrize("path", sorted(AS_FILES))
def test_an_entry_point_run_as_a_file_names_its_module_form(path):
    done = subprocess.run(
        [sys.executable, path, "--help"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60
    )
    line = one_line(done.stderr, path)
    assert done.returncode == 1 and line.endswith(
        f"run it from the repository root as `python -m {AS_FILES[path]}`"
    )


THREADS = {"train.py": train.main, "eval_length.py": eval_length.main, "python -m perf.bench": bench.main}


@pytest.mark.parametrize("threads", ["¹", "٣", "３"])
@pytest.mark.parametrize("prog", sorted(THREADS))
def test_threads_takes_ascii_digits_only(capsys, prog, threads):
    """str.isdigit() takes a superscript one and other scripts' digits; int() refuses or reads them."""
    argv = [f"--threads={threads}", "--device=cpu"] + (["out/none"] if prog == "eval_length.py" else [])
    status, err = in_process(capsys, THREADS[prog], argv)
    line = one_line(err, prog)
    assert status == 2 and f"--threads={threads}: give auto or a number of threads from 1 to" in line

"""docs/add_a_scheme.md as written: its class, registered as the page says, passes its test; followed
literally in a copy of the repository, the scheme tests and the course stay green; and the commands it gives
name flags the study and the bench accept."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import positions
from lab.course.exercises import EXERCISES
from lab.experiments import extrapolation
from lab.perf import bench

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "add_a_scheme.md").read_text()
# the tests that run every scheme of POS_SCHEMES through the model, fast enough to rerun in a copy
SCHEME_TESTS = ["test_positions.py", "test_scheme_interface.py", "test_generation.py", "test_s2_attn.py"]


def blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", PAGE, re.DOTALL)


def test_the_pages_scheme_passes_the_pages_test(monkeypatch):
    """The page's StepPositions, a PositionScheme named "step" in POSITION_MODULES alone, passes the page's
    test: the model builds any scheme POSITION_MODULES names."""
    scheme_code, test_code = blocks("python")
    namespace = vars(positions).copy()
    exec(scheme_code, namespace)
    assert issubclass(namespace["StepPositions"], positions.PositionScheme)
    monkeypatch.setitem(positions.POSITION_MODULES, "step", namespace["StepPositions"])
    tests = {}
    exec(test_code, tests)
    (test,) = [f for name, f in tests.items() if name.startswith("test_")]
    test()


def test_the_pages_commands_parse(monkeypatch):
    """Each study and bench command of the page parses, "step" registered in POSITION_MODULES (flags and
    values accepted). POS_SCHEMES, the dict's keys, is taken at import, as is each module's copy of it: as
    positions.py would derive it with "step" in the dict, it is set again here."""
    monkeypatch.setitem(positions.POSITION_MODULES, "step", positions.PositionScheme)
    schemes = tuple(positions.POSITION_MODULES)
    for module in (positions, extrapolation, bench):
        monkeypatch.setattr(module, "POS_SCHEMES", schemes)
    commands = [shlex.split(line) for block in blocks("sh") for line in block.splitlines() if line]
    parsed = {"lab.experiments.extrapolation": 0, "lab.perf.bench": 0}
    for words in commands:
        if words[:3] == ["python", "-m", "lab.experiments.extrapolation"]:
            assert extrapolation.parse_args(words[3:]).schemes == ["step", "alibi"]
        elif words[:3] == ["python", "-m", "lab.perf.bench"]:
            assert list(bench.parse_args(words[3:]).schemes) == ["step", "alibi"]
        else:
            assert words == ["python", "-m", "pytest", "-q"], words
            continue
        parsed[words[2]] += 1
    assert parsed == {"lab.experiments.extrapolation": 2, "lab.perf.bench": 1}


def follow_the_page(copy):
    """Do what the page says, in copy: its class at the end of positions.py, before the registry
    POSITION_MODULES (and the comment above it), `step=StepPositions` at the end of that dict, and its test
    in a file of its own."""
    scheme_code, test_code = blocks("python")
    source = (copy / "positions.py").read_text()
    registry = source.index("POSITION_MODULES = dict(")
    before = source.rindex("\n\n", 0, registry) + 2  # the registry's comment lines go with it
    closing = source.index(")", registry)
    added = [source[:before], scheme_code, "\n\n", source[before:closing], ", step=StepPositions"]
    (copy / "positions.py").write_text("".join(added) + source[closing:])
    (copy / "tests" / "test_step.py").write_text(test_code)


def test_the_page_followed_in_a_copy_keeps_the_scheme_tests_and_the_course_green(tmp_path):
    """In a copy of the repository's tracked files, with the page's scheme added as it says: the tests that
    run every scheme of the registry (which then includes "step"), the page's own test, and every course
    exercise pass, no other file edited."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: its tracked files are what the page is followed in")
    copy = tmp_path / "repo"
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is left out
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    follow_the_page(copy)
    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}
    run = lambda *args: subprocess.run(
        [sys.executable, "-m", *args], cwd=copy, env=env, capture_output=True, text=True
    )
    files = [f"tests/{name}" for name in SCHEME_TESTS]
    tests = run("pytest", "-q", "-rA", "-p", "no:cacheprovider", *files, "tests/test_step.py")
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    passed = [line.split()[1] for line in tests.stdout.splitlines() if line.startswith("PASSED")]
    assert {node.split("::")[0] for node in passed if node.endswith("[step]")} == set(files)  # each ran it
    assert "tests/test_step.py::test_step_penalises_keys_past_its_reach_and_decodes_past_block_size" in passed
    graded = run("lab.course", "grade")
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert f"all {len(EXERCISES)} exercises pass" in graded.stdout

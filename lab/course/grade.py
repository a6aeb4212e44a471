"""python -m lab.course grade [DIR]: each exercise graded by its own tests, in a student copy or this
repository: one pytest run, `-m "ex1 or ex2 ..." --strict-markers`, lab/course/plugin.py reporting each test's
outcome."""

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lab.course.exercises import by_id
from lab.course.make import MARKER, ROOT, counted, solution_leaks, strip_sections
from plumbing.errors import UserError

TIME_LIMIT = 900  # seconds for the whole run: a student's endless loop should not hang the grader


@dataclass
class Verdict:
    exercise: object  # the Exercise
    passed: bool
    n_tests: int
    detail: str  # why it failed: the first failing test and its line

    @property
    def not_started(self):
        """Failed on its own stub: nothing of it written yet."""
        return self.detail == f"NotImplementedError: {self.exercise.stub_message}"


def graded_by(directory):
    """The exercise ids a folder is graded on by default: those its .course.json names in a student copy, or
    None (all) in this repository."""
    directory, path = Path(directory), Path(directory) / MARKER
    if not directory.is_dir():
        raise UserError(f"{directory} is not a folder", 2)
    if not path.is_file() and directory.resolve() == ROOT:
        return None
    if not path.is_file():
        neither = f"is neither this repository nor a student copy (it has no {MARKER})"
        raise UserError(f"{directory} {neither}: make one with python -m lab.course make OUT_DIR", 2)
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not the marker python -m lab.course make writes ({e})", 2) from None
    exercises = marker.get("exercises", []) if isinstance(marker, dict) else None
    if not (isinstance(exercises, list) and all(isinstance(e, str) for e in exercises)):
        what = "its exercises are not a list of ids" if isinstance(marker, dict) else "not a JSON object"
        raise UserError(f"{path}: not the marker python -m lab.course make writes ({what})", 2)
    return exercises


def failure(message):
    return {"tests": {}, "errors": [{"node": "", "message": message}]}


def verdict(exercise, results):
    """Passed when each node id the exercise names ran, at least one test passed and none failed."""
    tests = {node: test for node, test in results["tests"].items() if exercise.id in test["exercises"]}
    files = {node.split("::")[0] for node in exercise.tests}
    broken = [e for e in results["errors"] if e["node"].split("::")[0] in files or not e["node"]]
    missing = [n for n in exercise.tests if not any(t == n or t.startswith(f"{n}[") for t in tests)]
    failing = [(node, t) for node, t in tests.items() if t["outcome"] in ("failed", "error")]
    detail = ""
    if broken:
        detail = f"{broken[0]['node'] or 'pytest'} did not load: {broken[0]['message']}"
    elif missing:
        detail = f"no test {missing[0]} (lab/course/exercises.py names it)"
    elif failing:
        node, test = failing[0]
        stub = test["message"].startswith("NotImplementedError: exercise")
        detail = ("" if stub else f"{node.split('::')[-1]}: ") + test["message"]
    elif not any(t["outcome"] == "passed" for t in tests.values()):
        detail = "every test was skipped"
    return Verdict(exercise, not detail, 0 if broken else len(tests), detail)


def report_lines(verdicts):
    """One line per exercise, then a total ("all 3 exercises pass", "1 of 3 exercises passes"). Under an
    exercise begun and failing: its hints, for what the test's message leaves unsaid."""
    width = max(len(v.exercise.title) for v in verdicts)
    lines = []
    for v in verdicts:
        status = f"passed ({counted(v.n_tests, 'test')})" if v.passed else f"failed: {v.detail}"
        lines.append(f"{v.exercise.id:<5} {v.exercise.title:<{width}}  {status}")
        if not v.passed and not v.not_started:
            lines += [f"      hint: {hint}" for hint in v.exercise.hints]
    n, total = sum(v.passed for v in verdicts), len(verdicts)
    everything = f"all {total} exercises pass" if total > 1 else f"{counted(total, 'exercise')} passes"
    some = f"{n} of {counted(total, 'exercise')} {'passes' if 1 in (n, total) else 'pass'}"
    return lines + [everything if n == total else some]


def grade(directory, exercises, calls=False):
    """One pytest process over the exercises' tests. -> (verdicts in the order given, the plugin's report)"""
    directory = Path(directory).resolve()
    files = sorted({node.split("::")[0] for exercise in exercises for node in exercise.tests})
    selection = " or ".join(exercise.id for exercise in exercises)
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "pytest", *files, "-m", selection, "--strict-markers", "-q"]
        # --tb=line: the plugin keeps each failure's own line, and a fresh copy's long tracebacks cost seconds
        command += [
            "--tb=line",
            f"--rootdir={directory}",
            "-p",
            "no:cacheprovider",
            "-p",
            "lab.course.plugin",
        ]
        command += [f"--course-report={report}", *(["--course-calls"] if calls else [])]
        try:
            done = subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=TIME_LIMIT)
            results = json.loads(report.read_text()) if report.is_file() else {"tests": {}, "errors": []}
        except subprocess.TimeoutExpired:
            done, results = None, failure(f"the tests ran past {TIME_LIMIT} s")
    if done and done.returncode not in (0, 1) and not results["errors"] and not results["tests"]:
        printed = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        results = failure(f"pytest stopped (exit {done.returncode}): {printed[-1] if printed else ''}")
    return [verdict(exercise, results) for exercise in exercises], results


def check_copy(directory):
    """Before handing a copy out: each exercise fails on its own stub (not started), no file quotes a stripped
    body, no page keeps an instructors' section. -> (verdicts, [problems])"""
    if (ids := graded_by(directory)) is None:
        no_copy = f"is no student copy (it has no {MARKER})"
        raise UserError(f"{directory} {no_copy}: make one with python -m lab.course make", 2)
    exercises = [by_id()[i] for i in ids if i in by_id()]
    problems = [f"{c['page']}:{c['line']} {c['why']}" for c in solution_leaks(directory, exercises)]
    for page in sorted(Path(directory).rglob("*.md")):
        name = page.relative_to(directory)
        if not any(part.startswith(".") for part in name.parts):  # not a .venv
            headings = strip_sections(page.read_text())[1]
            problems += [f"{name}: an instructors' section, {h!r}" for h in headings]
    verdicts, _ = grade(directory, exercises)
    problems += [
        f"{v.exercise.id} {'passes' if v.passed else 'fails on more than its stub'}: not a fresh copy"
        for v in verdicts
        if v.passed or not v.not_started
    ]
    return verdicts, problems

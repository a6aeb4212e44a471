"""The pytest plugin behind `python -m lab.course grade`: `--course-report=FILE` writes each test's outcome,
first line of failure and exercise marker, and each module that failed to import, to FILE (JSON).
--course-calls also records (sys.settrace) which exercise functions each test calls: so that one body put back
passes exactly its exercise, an exercise's tests call its functions and no other exercise's."""

import importlib
import inspect
import json
import sys
from functools import reduce
from pathlib import Path

import pytest

from lab.course.exercises import EXERCISES, by_id

CLOSE = ("Tensor-likes are not close!", "Scalars are not close!")  # torch.testing.assert_close's first line


def pytest_addoption(parser):
    parser.addoption("--course-report", metavar="FILE", help="write each test's outcome and exercise to FILE")
    parser.addoption("--course-calls", action="store_true", help="also record the exercise functions called")


def pytest_configure(config):
    if config.getoption("course_report"):
        config.pluginmanager.register(Recorder(config))


def first_line(report):
    """The exception's own line ('AssertionError: ...'), or a skip's reason; for assert_close, its greatest
    differences and tolerances too."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        text = report.longrepr[2]
    else:
        text = str(report.longrepr)
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [""]
    details = [line for line in lines[1:] if line.startswith(("Greatest", "Mismatched"))]
    return "; ".join([lines[0], *details]) if lines[0].endswith(CLOSE) else lines[0]


def code(spec):
    """The code object of "module:qualname", as imported now."""
    module, qualname = spec.split(":")
    return inspect.unwrap(reduce(getattr, qualname.split("."), importlib.import_module(module))).__code__


class Recorder:
    def __init__(self, config):
        self.path, self.calls = Path(config.getoption("course_report")), config.getoption("course_calls")
        self.tests, self.errors, self.codes = {}, [], None

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append({"node": report.nodeid, "message": first_line(report)})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        markers = [m.name for m in item.iter_markers() if m.name in by_id()]
        self.tests[item.nodeid] = {"exercises": markers, "outcome": "passed", "message": "", "calls": []}
        if not self.calls:
            return (yield)
        self.codes = self.codes or {code(spec): spec for e in EXERCISES for spec in e.functions}
        called = set()

        def trace(frame, event, arg):  # 'call' events only: returning None asks for no line events
            if frame.f_code in self.codes:
                called.add(self.codes[frame.f_code])

        sys.settrace(trace)
        try:
            return (yield)
        finally:
            sys.settrace(None)
            self.tests[item.nodeid]["calls"] = sorted(called)

    def pytest_runtest_logreport(self, report):
        test = self.tests.get(report.nodeid)
        if test is None or test["outcome"] in ("failed", "error"):
            return  # the first failure is the one to show
        if report.failed or report.skipped:
            outcome = "skipped" if report.skipped else ("failed" if report.when == "call" else "error")
            test["outcome"], test["message"] = outcome, first_line(report)

    def pytest_sessionfinish(self, session):
        self.path.write_text(json.dumps({"tests": self.tests, "errors": self.errors}, indent=1))

"""Make the repository root importable (model.py, train.py, sample.py, data/) from the tests, and give the
tests that grade each course exercise its marker (lab/course/exercises.py: `python -m pytest -m ex3
--strict-markers`)."""

import os
import signal
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

try:  # the course lives in the lab: a checkout without lab/ has no exercises to mark
    from lab.course.exercises import EXERCISES  # noqa: E402  (needs the root on sys.path)
except ModuleNotFoundError:
    EXERCISES = ()

# The suite runs thousands of tiny ops: extra intra-op threads only add synchronisation, and on a busy
# machine their spin-waits make a 30 ms generation take seconds. The scripts' --threads=auto keeps
# OMP_NUM_THREADS, in this process and the scripts the tests start.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

# A shell without job control starts a background job (`pytest &`, nohup) with SIGINT ignored, and every
# script a test starts would inherit that: the Ctrl-C tests need Ctrl-C as a terminal delivers it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    # registered, so that --strict-markers (python -m lab.course grade) refuses a marker no exercise has
    for exercise in EXERCISES:
        config.addinivalue_line(
            "markers", f"{exercise.id}: grades course exercise {exercise.number}, {exercise.title}"
        )


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    """Each test the table names gets its exercise's marker, so the test files themselves need no edits. Node
    ids are taken from the root, whatever pytest's rootdir; a table entry without [params] covers every
    parameter."""
    graded = {node: exercise.id for exercise in EXERCISES for node in exercise.tests}
    for item in items:
        try:
            node = f"{item.path.relative_to(ROOT).as_posix()}::{item.nodeid.split('::', 1)[1]}"
        except (ValueError, IndexError):  # a test outside this repository, or a node without a name
            continue
        exercise = graded.get(node) or graded.get(node.split("[")[0])
        if exercise:
            item.add_marker(exercise)

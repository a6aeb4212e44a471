"""docs/add_a_scheme.md as written: its class, registered as the page says, passes its test, and the
commands it gives name flags the study and the bench accept."""

import re
import shlex
from pathlib import Path

import positions
from experiments import extrapolation
from perf import bench

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "add_a_scheme.md").read_text()


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
    parsed = {"experiments.extrapolation": 0, "perf.bench": 0}
    for words in commands:
        if words[:3] == ["python", "-m", "experiments.extrapolation"]:
            assert extrapolation.parse_args(words[3:]).schemes == ["step", "alibi"]
        elif words[:3] == ["python", "-m", "perf.bench"]:
            assert list(bench.parse_args(words[3:]).schemes) == ["step", "alibi"]
        else:
            assert words == ["python", "-m", "pytest", "-q"], words
            continue
        parsed[words[2]] += 1
    assert parsed == {"experiments.extrapolation": 2, "perf.bench": 1}

"""docs/lesson.md's section 0 points at the lines of model.py where position enters: each reference
`[model.py:N](../model.py#LN) `code`` names a call that must stand on line N, so the lesson cannot drift from
the code."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"\[model\.py:(\d+)\]\(\.\./model\.py#L(\d+)\)\s+`([^`]+)`")


def test_lesson_line_references_point_at_their_calls():
    lesson = (ROOT / "docs" / "lesson.md").read_text()
    section = lesson[lesson.index("## 0.") : lesson.index("## 1.")]
    references = REFERENCE.findall(section)
    assert len(references) >= 6, "section 0 lists where position enters model.py, each with a line reference"
    lines = (ROOT / "model.py").read_text().splitlines()
    for shown, anchor, code in references:
        assert shown == anchor, f"model.py:{shown} links to line {anchor}"
        call = code.split("(")[0].removesuffix("...")
        assert call in lines[int(shown) - 1], (
            f"model.py:{shown} should hold {call!r}: {lines[int(shown) - 1]!r}"
        )

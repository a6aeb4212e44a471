"""
The course's exercises, data only: the functions whose bodies a student writes, the lesson section, and the
tests that grade each (tests/conftest.py gives them the exercise's marker: `python -m pytest -m ex3`).

The table itself is data, in course/exercises.toml. An exercise's tests call its own functions and no other
a student writes, so that any one can be done alone: where a function needs another exercise's, the test
supplies a reference (ex7's hand rope_frequencies theta_i and a YaRN ramp) or runs a scheme that needs none
(ex6 and ex9 use pos="none"). To add an exercise: a table in the data file, its tests (property tests in
tests/test_exercise_properties.py), a paragraph in docs/exercises.md.
"""

import tomllib
from dataclasses import dataclass
from pathlib import Path

LESSON = "docs/lesson.md"
DIFFICULTIES = ("easy", "medium", "hard", "advanced")
TABLE = Path(__file__).with_name("exercises.toml")


@dataclass(frozen=True)
class Exercise:
    id: str  # "ex3": its pytest marker, and what --only names
    title: str  # one line, quoted by each stub's NotImplementedError
    functions: tuple[str, ...]  # "module:qualname" of each function whose body the student writes
    section: str  # the anchor of its section in docs/lesson.md
    # node ids that grade it, from the root: "file::test" (every parameter) or "file::test[p]"
    tests: tuple[str, ...]
    difficulty: str  # one of DIFFICULTIES
    minutes: int  # about how long it takes someone who has read the section
    hints: tuple[str, ...]  # one or two, for what the docstrings leave unsaid

    @property
    def number(self):
        return int(self.id.removeprefix("ex"))

    @property
    def stub_message(self):
        return f"exercise {self.number}: {self.title}; see {LESSON}#{self.section}"


def load_exercises(path=TABLE):
    """The table, in teaching order, from its data file (course/exercises.toml)."""
    rows = tomllib.loads(path.read_text(encoding="utf-8"))["exercise"]
    tuples = lambda row: {k: tuple(v) if isinstance(v, list) else v for k, v in row.items()}
    return tuple(Exercise(**tuples(row)) for row in rows)


EXERCISES = load_exercises()


def by_id():
    return {exercise.id: exercise for exercise in EXERCISES}

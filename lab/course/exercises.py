"""The course's exercises, as data (lab/course/exercises.toml): the functions whose bodies a student writes,
the lesson section, and the tests that grade each (tests/conftest.py gives them the exercise's marker). An
exercise's tests call its own functions and no other a student writes, so any one can be done alone: where a
function needs another exercise's, the test supplies a reference or runs a scheme that needs none."""

import tomllib
from dataclasses import dataclass
from pathlib import Path

LESSON = "docs/lesson.md"
DIFFICULTIES = ("easy", "medium", "hard", "advanced")


@dataclass(frozen=True)
class Exercise:
    id: str  # "ex3": its pytest marker, and what --only names
    title: str  # one line, quoted by each stub's NotImplementedError
    functions: tuple[str, ...]  # "module:qualname" of each function whose body the student writes
    section: str  # the anchor of its section in docs/lesson.md
    tests: tuple[str, ...]  # node ids that grade it, from the root: "file::test" or "file::test[p]"
    difficulty: str  # one of DIFFICULTIES
    minutes: int  # about how long it takes someone who has read the section
    hints: tuple[str, ...]  # one or two, for what the docstrings leave unsaid

    @property
    def number(self):
        return int(self.id.removeprefix("ex"))

    @property
    def stub_message(self):
        return f"exercise {self.number}: {self.title}; see {LESSON}#{self.section}"


ROWS = tomllib.loads(Path(__file__).with_name("exercises.toml").read_text(encoding="utf-8"))["exercise"]
EXERCISES = tuple(  # in teaching order
    Exercise(**{k: tuple(v) if isinstance(v, list) else v for k, v in row.items()}) for row in ROWS
)


def by_id():
    return {exercise.id: exercise for exercise in EXERCISES}

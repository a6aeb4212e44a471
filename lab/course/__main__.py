"""Course mode: exercises cut from this repository's own code, graded by the lesson's own tests.

    python -m lab.course make OUT_DIR                   # a student copy: every exercise's bodies become stubs
    python -m lab.course make OUT_DIR --only=ex1,ex3    # only these exercises
    python -m lab.course grade                          # here, in the solution: every exercise passes
    python -m lab.course grade OUT_DIR --only=ex3       # a line per exercise and a total; exit 0: all pass
    python -m lab.course make OUT_DIR --classroom       # and .github/classroom/autograding.json, a test each
    python -m lab.course check OUT_DIR                  # before handing it out: every exercise not started,
                                                    # solution quoted, no instructors' section; exit 0 when so
The exercises: lab/course/exercises.toml, described in docs/exercises.md."""

import sys

if not __package__:  # `python lab/course/__main__.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.course`")


from dataclasses import dataclass

from lab.course.exercises import EXERCISES, by_id
from lab.course.grade import check_copy, grade, graded_by, report_lines
from lab.course.make import CLASSROOM, counted, make_copy
from plumbing.cli import parse_flags, parse_list
from plumbing.errors import UserError, one_line_errors

COMMANDS = "make OUT_DIR [--only=IDS] [--classroom], grade [DIR] [--only=IDS] or check DIR"


@dataclass
class MakeConfig:
    out_dir: str  # the folder the student copy goes into: new, or empty
    only: str = "all"  # the exercises to cut, comma-separated ids (ex1,ex3), or all
    classroom: bool = False  # also write GitHub Classroom's autograding configuration, one test per exercise


@dataclass
class CheckConfig:
    dir: str  # a student copy python -m lab.course make wrote


@dataclass
class GradeConfig:
    dir: str = "."  # this repository, or a student copy python -m lab.course make wrote
    only: str | None = None  # the exercises to grade, comma-separated ids; default: all those of DIR


def chosen(text, everything=None):
    """--only's exercises, in the table's order."""
    ids = parse_list("--only", text, [e.id for e in EXERCISES], everything=everything)
    return [e for e in EXERCISES if e.id in ids]


PROG = "python -m lab.course"  # as the user types it, in every error line


def make(argv):
    values = parse_flags(argv, f"{PROG} make", __doc__, [("make", MakeConfig, None)], positional=("out_dir",))
    # a UserError or ValueError: its own status, or 2; writing the copy, an OSError: status 1
    with one_line_errors(f"{PROG} make", status=1, errors=(OSError,)), one_line_errors(f"{PROG} make"):
        exercises = chosen(values["only"], everything="all")
        cfg = MakeConfig(**values)
        notes = make_copy(cfg.out_dir, exercises, classroom=cfg.classroom)
    print(
        f"a student copy of {notes.files} files in {cfg.out_dir}: {counted(len(exercises), 'exercise')}, "
        f"{counted(len(notes.functions), 'function body', 'function bodies')} to write"
    )
    for exercise in exercises:
        print(f"  {exercise.id:<5} {exercise.title}: {', '.join(exercise.functions)}")
    found = [(c, "replaced by a note in the copy") for c in notes.pages_changed]
    found += [(c, "left out of the copy (a test no exercise grades)") for c in notes.left_out]
    found += [(c, "copied as is: fix it at the source") for c in notes.leaks]
    head = "files quoting a stripped body:" if found else "no file quotes a stripped body"
    print(f"instructor notes: {head}")
    for c, done in found:
        print(f"  {c['page']}:{c['line']} {c['why']}: {done}")
    print("for students: " + "; ".join(f"{c['page']} ({c['why']})" for c in notes.rewritten))
    if cfg.classroom:
        print(f"GitHub Classroom: {CLASSROOM}, one test per exercise")
    print(f"check it: {PROG} check {cfg.out_dir}\ngrade it: {PROG} grade {cfg.out_dir}")
    return 0


def check(argv):
    values = parse_flags(argv, f"{PROG} check", __doc__, [("check", CheckConfig, None)], positional=("dir",))
    with one_line_errors(f"{PROG} check"):
        verdicts, problems = check_copy(CheckConfig(**values).dir)
    print("\n".join(report_lines(verdicts)))
    if problems:
        print("not ready to hand out:\n" + "\n".join(f"  {problem}" for problem in problems))
        return 1
    n = counted(len(verdicts), "exercise")
    print(f"ready to hand out: {n} not started, no solution quoted, no instructors' section")
    return 0


def grade_command(argv):
    # DIR is optional, where parse_flags' positionals are required; in `--only ex3` the word after is no DIR
    folder = any(not a.startswith("-") and b not in ("--only", "--config") for a, b in zip(argv, ["", *argv]))
    positional = ("dir",) if folder else ()
    sections = [("grade", GradeConfig, None)]
    values = parse_flags(argv, f"{PROG} grade", __doc__, sections, positional=positional)
    with one_line_errors(f"{PROG} grade"):
        cfg = GradeConfig(**values)
        ids = graded_by(cfg.dir)  # None: all
        exercises = chosen(cfg.only) if cfg.only else [e for e in EXERCISES if ids is None or e.id in ids]
        if unknown := [e for e in ids or [] if e not in by_id()]:
            lacks = f"was made with exercises this table lacks ({', '.join(unknown)})"
            raise UserError(f"{cfg.dir} {lacks}: make it again", 2)
    verdicts, _ = grade(cfg.dir, exercises)
    print("\n".join(report_lines(verdicts)))
    return 0 if all(v.passed for v in verdicts) else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    with one_line_errors(PROG, errors=()):  # a Ctrl-C while the tests run too: status 130, no traceback
        if not argv or argv[0] not in ("make", "grade", "check"):
            raise UserError(f"give a command: {COMMANDS}" + (f"; got {argv[0]!r}" if argv else ""), 2)
        return {"make": make, "grade": grade_command, "check": check}[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())

"""Course mode end to end, in a tmp_path: python -m course make cuts the exercises of course/exercises.py out of the
real code into a student copy, and python -m course grade grades each by its own tests.

What must hold: the copy is the tracked files with stubs and nothing else (no solution text, no .git, no
__pycache__), it imports and `python train.py --help` runs; every exercise fails there with its own
NotImplementedError; bodies put back pass exactly their exercises, and wrong ones (RoPE turning by -theta, ALiBi's
slopes reversed) fail readably; the solution passes everything, each test calling its own exercise's functions
and no other's (so any one exercise can be done alone); mistakes are one line. One copy per module (make is cheap:
a file listing and a syntax tree); each grade is one pytest process over the exercises' tests.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from course import __main__ as course_cli
from course.exercises import DIFFICULTIES, EXERCISES, by_id
from course.grade import grade, graded_by, report_lines
from course.make import (MARKER, Notes, check_table, handle_quotes, lesson_anchors, make_copy, module_path,
                         scrub_page, solution_leaks, split_function, tracked_files)
from course.source import SourceError, body_lines, body_span, find_function, replace_bodies, split_lines, stub_line
from plumbing.cli import RunError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_bytecode(monkeypatch):
    """What runs in a copy writes no __pycache__ there: the copy is checked to hold none."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A fresh copy with every exercise stripped, made once for the module."""
    try:
        tracked_files(ROOT)
    except RunError as e:
        pytest.skip(f"a copy is made of the files git tracks: {e}")
    copy = tmp_path_factory.mktemp("course") / "student"
    return copy, make_copy(copy, EXERCISES)


def solution_text(spec):
    return (ROOT / module_path(split_function(spec)[0])).read_text()


def put_back(copy, specs):
    """Write the solution's bodies of these functions into the copy, as a student who solved them would."""
    for spec in specs:
        module, qualname = split_function(spec)
        path = copy / module_path(module)
        path.write_text(replace_bodies(path.read_text(), {qualname: body_lines(solution_text(spec), qualname)}))


def put_wrong(copy, spec, line):
    """Replace a top-level function's stub by `line`, which may call the solved function as _solved_<name>
    (appended to the module): a wrong body made from the solution, so this file holds none of it."""
    module, qualname = split_function(spec)
    path = copy / module_path(module)
    solution = solution_text(spec)
    node = find_function(ast.parse(solution), qualname)
    solved = "".join(split_lines(solution)[node.lineno - 1 : node.end_lineno])
    text = path.read_text()
    indent = body_span(text, qualname)[2]
    path.write_text(replace_bodies(text, {qualname: [f"{indent}{line}\n"]}) + "\n\n"
                    + solved.replace(f"def {qualname}(", f"def _solved_{qualname}(", 1))


# -----------------------------------------------------------------------------
# The table and the syntax tree


def test_the_table_is_in_teaching_order_and_names_what_exists():
    """ex1, ex2, ... in order, at least eight; every function exists and can be cut, every section is a heading of
    docs/lesson.md; each function and each test belongs to one exercise; a known difficulty, one or two hints."""
    assert [e.id for e in EXERCISES] == [f"ex{n}" for n in range(1, len(EXERCISES) + 1)] and len(EXERCISES) >= 8
    check_table(ROOT, EXERCISES)
    for field in ("functions", "tests"):
        names = [name for e in EXERCISES for name in getattr(e, field)]
        assert len(names) == len(set(names)), field
    for e in EXERCISES:
        assert e.difficulty in DIFFICULTIES and 1 <= len(e.hints) <= 2 and e.minutes > 0 and e.tests, e.id
    assert "4-rope-rotate-queries-and-keys-scores-depend-on-the-offset" in lesson_anchors((ROOT / "docs/lesson.md")
                                                                                         .read_text())
    students_page = (ROOT / "docs/exercises.md").read_text()
    assert all(f"| {e.id} | {e.title} |" in students_page and f"**{e.id}, " in students_page for e in EXERCISES)


SAMPLE = '''import torch


@torch.no_grad()
def shaped(
    first,  # a comment in the signature
    second=1,
):
    """A docstring
    over two lines."""
    total_of_both = first + second * 2  # the body
    return total_of_both
    # a comment closing the body


class Table:
    def method(self, n):
        if n:
            return n
        return 0

    def documented(self):
        """Only a docstring."""
'''


def test_a_body_is_cut_after_its_docstring_and_everything_else_stays_byte_for_byte():
    """Decorators, a signature over several lines, the docstring and the other functions are kept as written; the
    body, with the comments closing it, becomes the stub; putting the bodies back gives the file again."""
    stubs = {"shaped": [stub_line("    ", "exercise 1: a")], "Table.method": [stub_line("        ", "exercise 2: b")],
             "Table.documented": [stub_line("        ", "exercise 3: c")]}
    stubbed = replace_bodies(SAMPLE, stubs)
    expected = (SAMPLE.replace("    total_of_both = first + second * 2  # the body\n    return total_of_both\n"
                               "    # a comment closing the body\n", '    raise NotImplementedError("exercise 1: a")\n')
                .replace("        if n:\n            return n\n        return 0\n",
                         '        raise NotImplementedError("exercise 2: b")\n')
                .replace('"""Only a docstring."""\n', '"""Only a docstring."""\n'
                         '        raise NotImplementedError("exercise 3: c")\n'))
    assert stubbed == expected
    assert body_span(SAMPLE, "Table.method")[2] == "        "
    assert replace_bodies(stubbed, {q: body_lines(SAMPLE, q) for q in ("shaped", "Table.method")}) == \
        SAMPLE.replace('"""Only a docstring."""\n', '"""Only a docstring."""\n        raise NotImplementedError('
                       '"exercise 3: c")\n')


def test_what_cannot_be_cut_is_named():
    with pytest.raises(SourceError, match="no function 'missing' on the way to Table.missing"):
        body_span(SAMPLE, "Table.missing")
    with pytest.raises(SourceError, match="shares a line with its def"):
        body_span("def f(x): return x\n", "f")


def test_a_docs_passage_quoting_a_stripped_body_is_replaced_and_named():
    """A fenced block (or a loose line) quoting a telling line of a stripped body becomes a note; the rest of the
    page is untouched."""
    page = ("# Title\n\nProse about `shaped`.\n\n```python\ndef shaped(first, second=1):\n"
            "    total_of_both = first + second * 2\n```\n\n```sh\npython train.py\n```\n"
            "    total_of_both = first + second * 2\n")
    telling = {"total_of_both = first + second * 2": "exercise 1 (sample:shaped)"}
    scrubbed, changes = scrub_page(page, telling)
    assert [line for line, _ in changes] == [5, 13] and all("exercise 1 (sample:shaped)" in why for _, why in changes)
    assert "total_of_both" not in scrubbed and "```sh\npython train.py\n```\n" in scrubbed
    assert scrubbed.startswith("# Title\n\nProse about `shaped`.\n\n(Left out of the course copy")


def test_a_quote_is_scrubbed_from_docs_an_ungraded_test_left_out_and_code_reported(tmp_path):
    """Docs: the passage replaced. A test file no exercise grades: not copied. Anything else (code, a grading
    test): copied as is and reported, to be fixed at the source."""
    quote = "    total_of_both = first + second * 2\n"
    for name in ("docs/page.md", "tests/test_other.py", "tests/test_positions.py", "plumbing/tool.py", "clean.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n" + (quote if name != "clean.py" else ""))
    notes, texts = Notes(), {}
    kept = handle_quotes(tmp_path, ["docs/page.md", "tests/test_other.py", "tests/test_positions.py",
                                    "plumbing/tool.py", "clean.py"],
                         {"total_of_both = first + second * 2": "exercise 1 (sample:shaped)"}, texts, notes)
    assert kept == ["docs/page.md", "tests/test_positions.py", "plumbing/tool.py", "clean.py"]
    assert [c["page"] for c in notes.pages_changed] == ["docs/page.md"] and "total_of_both" not in texts[
        Path("docs/page.md")]
    assert notes.left_out == [{"page": "tests/test_other.py", "line": 2,
                               "why": "quotes the solution of exercise 1 (sample:shaped)"}]
    assert [(c["page"], c["line"]) for c in notes.leaks] == [("tests/test_positions.py", 2), ("plumbing/tool.py", 2)]


# -----------------------------------------------------------------------------
# The student copy


def test_the_copy_is_the_tracked_files_with_stubs_and_no_solution_text(student):
    """Exactly the files git tracks plus .course.json (so no .git, __pycache__, runs or datasets), less the test
    files no exercise grades that quote a stripped body; each stripped function's body is its exercise's stub;
    outside those bodies every file is byte for byte the solution's; no file was copied with a quote of a stripped
    body, and none of the copy holds one (docs, tests, hints included)."""
    copy, notes = student
    files = {path.relative_to(copy).as_posix() for path in copy.rglob("*") if path.is_file()}
    assert files == set(tracked_files(ROOT)) - {c["page"] for c in notes.left_out} | {MARKER}
    marker = json.loads((copy / MARKER).read_text())
    assert marker["exercises"] == [e.id for e in EXERCISES] and marker["left_out"] == notes.left_out
    assert notes.leaks == [] == marker["leaks"]
    stubbed = {}
    for exercise in EXERCISES:
        for spec in exercise.functions:
            module, qualname = split_function(spec)
            text = (copy / module_path(module)).read_text()
            assert body_lines(text, qualname) == [stub_line(body_span(text, qualname)[2], exercise.stub_message)]
            stubbed.setdefault(module_path(module).as_posix(), []).append(qualname)
    changed_pages = {change["page"] for change in notes.pages_changed}
    for name in files - {MARKER} - changed_pages:
        if name in stubbed:
            outside = {q: [] for q in stubbed[name]}
            assert replace_bodies((copy / name).read_text(), outside) == \
                replace_bodies((ROOT / name).read_text(), outside), name
        else:
            assert (copy / name).read_bytes() == (ROOT / name).read_bytes(), name
    assert solution_leaks(copy, EXERCISES) == []


def test_the_copy_imports_and_train_help_runs(student):
    """Stubs only raise when called: every module imports, and train.py --help lists its flags."""
    copy, _ = student
    code = ("import generation, sample, plumbing.instruments, demo.permutation, demo.probe, runpy, sys; "
            "sys.argv = ['train.py', '--help']; runpy.run_path('train.py', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "usage: train.py" in done.stdout and "--pos" in done.stdout, done.stderr


def test_every_exercise_fails_in_a_fresh_copy_with_its_own_stub(student):
    """python -m course grade COPY: one line per exercise, each failing with its own NotImplementedError (so no
    exercise's tests reach another's stub first), a total, exit 1."""
    copy, _ = student
    done = subprocess.run([sys.executable, "-m", "course", "grade", str(copy)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and lines[-1] == f"0 of {len(EXERCISES)} exercises pass", done.stdout + done.stderr
    assert len(lines) == len(EXERCISES) + 1
    for exercise, line in zip(EXERCISES, lines):
        assert line.startswith(f"{exercise.id} ") and line.endswith(
            f"failed: NotImplementedError: {exercise.stub_message}"), line


def test_bodies_put_back_pass_exactly_their_exercises_and_wrong_ones_fail_readably(tmp_path):
    """In a fully stripped copy: ex1's and ex6's bodies put back pass ex1 and ex6 and nothing else; RoPE turning by
    -theta (ex3's other bodies solved) and ALiBi's slopes gentlest first (ex4's other bodies solved) fail with
    lines that say what is wrong, not with a stub's NotImplementedError."""
    copy = tmp_path / "student"
    make_copy(copy, EXERCISES)
    exercises = by_id()
    put_back(copy, [*exercises["ex1"].functions, *exercises["ex6"].functions, "model:rope_inv_freq",
                    "model:rope_cos_sin", "model:alibi_bias", "model:alibi_bias_at"])
    put_wrong(copy, "model:apply_rope", "return _solved_apply_rope(x, cos, -sin)  # turned by -angle")
    put_wrong(copy, "model:alibi_slopes", "return _solved_alibi_slopes(n_head).flip(0)  # the gentlest slope first")
    verdicts, _ = grade(copy, EXERCISES)
    detail = {v.exercise.id: v.detail for v in verdicts}
    assert {v.exercise.id for v in verdicts if v.passed} == {"ex1", "ex6"}, report_lines(verdicts)
    assert "must turn each pair (x_i, x_(i+d/2)) by +angle" in detail["ex3"], detail["ex3"]
    assert "must be the steepest slope" in detail["ex4"], detail["ex4"]
    for exercise in EXERCISES:
        if exercise.id not in ("ex1", "ex3", "ex4", "ex6"):
            assert detail[exercise.id] == f"NotImplementedError: {exercise.stub_message}"


def test_the_solution_passes_every_exercise_and_each_test_calls_its_own_exercise_only():
    """Graded in this repository every exercise passes; and, recorded from the code objects called, each test calls
    at least one function of its exercise and none of another's: what lets a student do any exercise alone."""
    verdicts, results = grade(ROOT, EXERCISES, calls=True)
    assert report_lines(verdicts)[-1] == f"all {len(EXERCISES)} exercises pass", "\n".join(report_lines(verdicts))
    exercises, crossings = by_id(), []
    for node, test in results["tests"].items():
        assert len(test["exercises"]) == 1, node
        own = set(exercises[test["exercises"][0]].functions)
        if not set(test["calls"]) & own or set(test["calls"]) - own:
            crossings.append((node, test["exercises"][0], test["calls"]))
    assert crossings == []


# -----------------------------------------------------------------------------
# The command line


def error_line(capsys, argv, prog):
    with pytest.raises(SystemExit) as exit_info:
        course_cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith(f"{prog}: error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize("argv, prog, words", [
    (["grade", str(ROOT), "--only=ex99"], "course grade", "--only='ex99': give one or more of ex1, ex2"),
    (["grade", str(ROOT), "--only", "ex3,ex3"], "course grade", "each once"),
    (["grade", "--onlyy=ex1"], "course grade", "unrecognized arguments: --onlyy=ex1"),
    (["make"], "course make", "the following arguments are required: out_dir"),
    (["make", "elsewhere", "--only=ex0"], "course make", "--only='ex0': give all, or one or more of ex1"),
    (["frobnicate"], "course", "give a command: make OUT_DIR [--only=IDS] or grade [DIR] [--only=IDS]; got"),
    ([], "course", "give a command"),
])
def test_command_mistakes_are_one_line_errors(capsys, argv, prog, words):
    assert words in error_line(capsys, argv, prog)


def test_grading_a_folder_that_is_neither_this_repository_nor_a_copy_is_one_line(tmp_path, capsys):
    (tmp_path / "model.py").write_text("")
    assert "is neither this repository nor a student copy" in error_line(capsys, ["grade", str(tmp_path)],
                                                                        "course grade")
    assert "is not a folder" in error_line(capsys, ["grade", str(tmp_path / "model.py")], "course grade")


def test_make_refuses_a_folder_in_use_or_inside_the_repository(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert "exists and is not an empty folder" in error_line(capsys, ["make", str(tmp_path)], "course make")
    assert (tmp_path / "notes.txt").read_text() == "mine" and len(list(tmp_path.iterdir())) == 1
    inside = ROOT / "out" / "course-copy-refused"
    assert "inside the repository it copies" in error_line(capsys, ["make", str(inside)], "course make")
    assert not inside.exists()


def test_make_only_cuts_the_exercises_named_and_grade_defaults_to_them(tmp_path, capsys, student):
    """--only=ex4: ALiBi's three functions are stubs, every other body is the solution's, and the copy is graded
    on ex4 by default."""
    copy = tmp_path / "alibi"
    assert course_cli.main(["make", str(copy), "--only=ex4"]) == 0
    assert f"grade it: python -m course grade {copy}" in capsys.readouterr().out
    assert graded_by(copy) == ["ex4"]
    text = (copy / "model.py").read_text()
    assert body_lines(text, "alibi_slopes") == [stub_line("    ", by_id()["ex4"].stub_message)]
    solved = (ROOT / "model.py").read_text()
    assert body_lines(text, "sinusoidal_embedding") == body_lines(solved, "sinusoidal_embedding")

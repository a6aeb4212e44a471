"""Course mode end to end, in a tmp_path: python -m lab.course make cuts the exercises of
lab/course/exercises.py out of the real code into a student copy, and python -m lab.course grade grades each
by its own tests.

What must hold: the copy is the tracked files with stubs and nothing else (no solution text, no .git, no
__pycache__), it imports and `python train.py --help` runs; every exercise fails there with its own
NotImplementedError; bodies put back pass exactly their exercises, and wrong ones (RoPE turning by -theta,
ALiBi's slopes reversed) fail readably; the solution passes everything, each test calling its own exercise's
functions and no other's (so any one exercise can be done alone); mistakes are one line. The copy is for
students: its README says how to set up, grade and what runs before which exercise, no page keeps an
instructors' section, --classroom adds a valid GitHub Classroom configuration, and `course check` passes it. A
failing exercise's line gives the numbers (got, expected, tolerance, dtype) and its hints follow. One copy per
module (make is cheap: a file listing and a syntax tree); each grade is one pytest process over the exercises'
tests.
"""

import ast
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lab.course import __main__ as course_cli
from lab.course.exercises import DIFFICULTIES, EXERCISES, by_id
from lab.course.grade import Verdict, check_copy, grade, graded_by, report_lines
from lab.course.make import (
    CLASSROOM,
    INSTRUCTORS,
    MARKER,
    STUDENT_README,
    Notes,
    handle_quotes,
    lesson_anchors,
    make_copy,
    module_path,
    scrub_page,
    solution_leaks,
    split_function,
    strip_sections,
    stripped_sources,
    tracked_files,
)
from lab.course.source import (
    SourceError,
    body_lines,
    body_span,
    find_function,
    replace_bodies,
    split_lines,
    stub_line,
)
from plumbing.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_bytecode(monkeypatch):
    """What runs in a copy writes no __pycache__ there: the copy is checked to hold none."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A fresh copy with every exercise stripped and GitHub Classroom's configuration,
    made once for the module."""
    try:
        tracked_files(ROOT)
    except UserError as e:
        pytest.skip(f"a copy is made of the files git tracks: {e}")
    copy = tmp_path_factory.mktemp("course") / "student"
    return copy, make_copy(copy, EXERCISES, classroom=True)


def solution_text(spec):
    return (ROOT / module_path(split_function(spec)[0])).read_text()


def put_back(copy, specs):
    """Write the solution's bodies of these functions into the copy, as a student who solved them would."""
    for spec in specs:
        module, qualname = split_function(spec)
        path = copy / module_path(module)
        path.write_text(
            replace_bodies(path.read_text(), {qualname: body_lines(solution_text(spec), qualname)})
        )


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
    path.write_text(
        replace_bodies(text, {qualname: [f"{indent}{line}\n"]})
        + "\n\n"
        + solved.replace(f"def {qualname}(", f"def _solved_{qualname}(", 1)
    )


# -----------------------------------------------------------------------------
# The table and the syntax tree


def test_the_table_is_in_teaching_order_and_names_what_exists():
    """ex1, ex2, ... in order, at least eight; every function exists and can be cut, every section is a
    heading of docs/lesson.md; each function and each test belongs to one exercise; a known difficulty, one or
    two hints."""
    assert [e.id for e in EXERCISES] == [f"ex{n}" for n in range(1, len(EXERCISES) + 1)] and len(
        EXERCISES
    ) >= 8
    stripped_sources(ROOT, EXERCISES)
    for field in ("functions", "tests"):
        names = [name for e in EXERCISES for name in getattr(e, field)]
        assert len(names) == len(set(names)), field
    for e in EXERCISES:
        assert e.difficulty in DIFFICULTIES and 1 <= len(e.hints) <= 2 and e.minutes > 0 and e.tests, e.id
    assert "4-rope-rotate-queries-and-keys-scores-depend-on-the-offset" in lesson_anchors(
        (ROOT / "docs/lesson.md").read_text()
    )
    students_page = (ROOT / "docs/exercises.md").read_text()
    assert all(
        f"| {e.id} | {e.title} |" in students_page and f"**{e.id}, " in students_page for e in EXERCISES
    )


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
    """Decorators, a signature over several lines, the docstring and the other functions are kept as written;
    the body, with the comments closing it, becomes the stub; putting the bodies back gives the file again."""
    stubs = {
        "shaped": [stub_line("    ", "exercise 1: a")],
        "Table.method": [stub_line("        ", "exercise 2: b")],
        "Table.documented": [stub_line("        ", "exercise 3: c")],
    }
    stubbed = replace_bodies(SAMPLE, stubs)
    expected = (
        SAMPLE.replace(
            "    total_of_both = first + second * 2  # the body\n    return total_of_both\n"
            "    # a comment closing the body\n",
            '    raise NotImplementedError("exercise 1: a")\n',
        )
        .replace(
            "        if n:\n            return n\n        return 0\n",
            '        raise NotImplementedError("exercise 2: b")\n',
        )
        .replace(
            '"""Only a docstring."""\n',
            '"""Only a docstring."""\n        raise NotImplementedError("exercise 3: c")\n',
        )
    )
    assert stubbed == expected
    assert body_span(SAMPLE, "Table.method")[2] == "        "
    assert replace_bodies(
        stubbed, {q: body_lines(SAMPLE, q) for q in ("shaped", "Table.method")}
    ) == SAMPLE.replace(
        '"""Only a docstring."""\n',
        '"""Only a docstring."""\n        raise NotImplementedError("exercise 3: c")\n',
    )


def test_what_cannot_be_cut_is_named():
    with pytest.raises(SourceError, match="no function 'missing' on the way to Table.missing"):
        body_span(SAMPLE, "Table.missing")
    with pytest.raises(SourceError, match="shares a line with its def"):
        body_span("def f(x): return x\n", "f")


def test_a_docs_passage_quoting_a_stripped_body_is_replaced_and_named():
    """A fenced block (or a loose line) quoting a telling line of a stripped body becomes a note; the rest of
    the page is untouched."""
    page = (
        "# Title\n\nProse about `shaped`.\n\n```python\ndef shaped(first, second=1):\n"
        "    total_of_both = first + second * 2\n```\n\n```sh\npython train.py\n```\n"
        "    total_of_both = first + second * 2\n"
    )
    telling = {"total_of_both = first + second * 2": "exercise 1 (sample:shaped)"}
    scrubbed, changes = scrub_page(page, telling)
    assert [line for line, _ in changes] == [5, 13] and all(
        "exercise 1 (sample:shaped)" in why for _, why in changes
    )
    assert "total_of_both" not in scrubbed and "```sh\npython train.py\n```\n" in scrubbed
    assert scrubbed.startswith("# Title\n\nProse about `shaped`.\n\n(Left out of the course copy")


def test_a_quote_is_scrubbed_from_docs_an_ungraded_test_left_out_and_code_reported(tmp_path):
    """Docs: the passage replaced. A test file no exercise grades: not copied. Anything else (code, a grading
    test): copied as is and reported, to be fixed at the source."""
    quote = "    total_of_both = first + second * 2\n"
    for name in (
        "docs/page.md",
        "tests/test_other.py",
        "tests/test_positions.py",
        "plumbing/tool.py",
        "clean.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n" + (quote if name != "clean.py" else ""))
    notes, texts = Notes(), {}
    kept = handle_quotes(
        tmp_path,
        ["docs/page.md", "tests/test_other.py", "tests/test_positions.py", "plumbing/tool.py", "clean.py"],
        {"total_of_both = first + second * 2": "exercise 1 (sample:shaped)"},
        texts,
        notes,
    )
    assert kept == ["docs/page.md", "tests/test_positions.py", "plumbing/tool.py", "clean.py"]
    assert [c["page"] for c in notes.pages_changed] == ["docs/page.md"] and "total_of_both" not in texts[
        Path("docs/page.md")
    ]
    assert notes.left_out == [
        {"page": "tests/test_other.py", "line": 2, "why": "quotes the solution of exercise 1 (sample:shaped)"}
    ]
    assert [(c["page"], c["line"]) for c in notes.leaks] == [
        ("tests/test_positions.py", 2),
        ("plumbing/tool.py", 2),
    ]


# -----------------------------------------------------------------------------
# The student copy


def test_the_copy_is_the_tracked_files_with_stubs_and_no_solution_text(student):
    """Exactly the files git tracks plus .course.json and the Classroom configuration (so no .git,
    __pycache__, runs or datasets), less the test files no exercise grades that quote a stripped body; each
    stripped function's body is its exercise's stub; outside those bodies and the pages rewritten for students
    every file is byte for byte the solution's; no file was copied with a quote of a stripped body, and none
    of the copy holds one (docs, tests, hints included)."""
    copy, notes = student
    files = {path.relative_to(copy).as_posix() for path in copy.rglob("*") if path.is_file()}
    assert files == set(tracked_files(ROOT)) - {c["page"] for c in notes.left_out} | {MARKER, CLASSROOM}
    marker = json.loads((copy / MARKER).read_text())
    assert marker["exercises"] == [e.id for e in EXERCISES] and marker["left_out"] == notes.left_out
    assert notes.leaks == [] == marker["leaks"]
    stubbed = {}
    for exercise in EXERCISES:
        for spec in exercise.functions:
            module, qualname = split_function(spec)
            text = (copy / module_path(module)).read_text()
            assert body_lines(text, qualname) == [
                stub_line(body_span(text, qualname)[2], exercise.stub_message)
            ]
            stubbed.setdefault(module_path(module).as_posix(), []).append(qualname)
    changed_pages = {change["page"] for change in notes.pages_changed + notes.rewritten}
    assert marker["rewritten"] == notes.rewritten and "README.md" in changed_pages
    for name in files - {MARKER, CLASSROOM} - changed_pages:
        if name in stubbed:
            outside = {q: [] for q in stubbed[name]}
            assert replace_bodies((copy / name).read_text(), outside) == replace_bodies(
                (ROOT / name).read_text(), outside
            ), name
        else:
            assert (copy / name).read_bytes() == (ROOT / name).read_bytes(), name
    assert solution_leaks(copy, EXERCISES) == []


def test_the_copy_imports_and_train_help_runs(student):
    """Stubs only raise when called: every module imports, and train.py --help lists its flags."""
    copy, _ = student
    code = (
        "import generation, sample, lab.measure.instruments, lab.demo.permutation, lab.demo.probe, runpy; "
        "import sys; "
        "sys.argv = ['train.py', '--help']; runpy.run_path('train.py', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "usage: train.py" in done.stdout and "--pos" in done.stdout, done.stderr


def test_every_exercise_fails_in_a_fresh_copy_with_its_own_stub(student):
    """python -m lab.course check COPY, the instructor's one command: grade's report, one line per exercise,
    each failing with its own NotImplementedError (so no exercise's tests reach another's stub first) and no
    hints (nothing begun), its total, then that the copy is ready to hand out; exit 0."""
    copy, _ = student
    command = [sys.executable, "-m", "lab.course", "check", str(copy)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = done.stdout.splitlines()
    ready = (
        f"ready to hand out: {len(EXERCISES)} exercises not started, no solution quoted, "
        "no instructors' section"
    )
    assert done.returncode == 0 and lines[-1] == ready, done.stdout
    assert lines[-2] == f"0 of {len(EXERCISES)} exercises pass" and len(lines) == len(EXERCISES) + 2
    for exercise, line in zip(EXERCISES, lines):
        assert line.startswith(f"{exercise.id} ") and line.endswith(
            f"failed: NotImplementedError: {exercise.stub_message}"
        ), line


def test_bodies_put_back_pass_exactly_their_exercises_and_wrong_ones_fail_readably(tmp_path):
    """In a fully stripped copy: ex1's and ex6's bodies put back pass ex1 and ex6 and nothing else; RoPE
    turning by -theta (ex3's other bodies solved) and ALiBi's slopes gentlest first (ex4's other bodies
    solved) fail with lines that say what is wrong, not with a stub's NotImplementedError."""
    copy = tmp_path / "student"
    make_copy(copy, EXERCISES)
    exercises = by_id()
    put_back(
        copy,
        [
            *exercises["ex1"].functions,
            *exercises["ex6"].functions,
            "positions:rope_inv_freq",
            "positions:rope_cos_sin",
            "positions:alibi_bias",
            "positions:alibi_bias_at",
        ],
    )
    put_wrong(copy, "positions:apply_rope", "return _solved_apply_rope(x, cos, -sin)  # turned by -angle")
    put_wrong(
        copy,
        "positions:alibi_slopes",
        "return _solved_alibi_slopes(n_head).flip(0)  # the gentlest slope first",
    )
    verdicts, _ = grade(copy, EXERCISES)
    detail = {v.exercise.id: v.detail for v in verdicts}
    assert {v.exercise.id for v in verdicts if v.passed} == {"ex1", "ex6"}, report_lines(verdicts)
    assert "must turn each pair (x_i, x_(i+d/2)) by +angle" in detail["ex3"], detail["ex3"]
    assert "must be the steepest slope" in detail["ex4"], detail["ex4"]
    for exercise in EXERCISES:
        if exercise.id not in ("ex1", "ex3", "ex4", "ex6"):
            assert detail[exercise.id] == f"NotImplementedError: {exercise.stub_message}"


def test_the_solution_passes_every_exercise_and_each_test_calls_its_own_exercise_only():
    """Graded in this repository every exercise passes; and, recorded from the code objects called, each test
    calls at least one function of its exercise and none of another's: what lets a student do any exercise
    alone."""
    verdicts, results = grade(ROOT, EXERCISES, calls=True)
    assert report_lines(verdicts)[-1] == f"all {len(EXERCISES)} exercises pass", "\n".join(
        report_lines(verdicts)
    )
    exercises, crossings = by_id(), []
    for node, test in results["tests"].items():
        assert len(test["exercises"]) == 1, node
        own = set(exercises[test["exercises"][0]].functions)
        if not set(test["calls"]) & own or set(test["calls"]) - own:
            crossings.append((node, test["exercises"][0], test["calls"]))
    assert crossings == []


# -----------------------------------------------------------------------------
# The command line


MAKE, CHECK, GRADE = (f"{course_cli.PROG} {command}" for command in ("make", "check", "grade"))


def error_line(capsys, argv, prog):
    with pytest.raises(SystemExit) as exit_info:
        course_cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith(f"{prog}: error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize(
    "argv, prog, words",
    [
        (["grade", str(ROOT), "--only=ex99"], GRADE, "--only='ex99': give one or more of ex1, ex2"),
        (["grade", str(ROOT), "--only", "ex3,ex3"], GRADE, "each once"),
        (["grade", "--onlyy=ex1"], GRADE, "unrecognized arguments: --onlyy=ex1"),
        (["make"], MAKE, "the following arguments are required: out_dir"),
        (["check"], CHECK, "the following arguments are required: dir"),
        (["check", str(ROOT)], CHECK, "is no student copy (it has no .course.json)"),
        (["make", "elsewhere", "--only=ex0"], MAKE, "--only='ex0': give all, or one or more of ex1"),
        (
            ["frobnicate"],
            course_cli.PROG,
            "give a command: make OUT_DIR [--only=IDS] [--classroom], grade [DIR] "
            "[--only=IDS] or check DIR; got",
        ),
        ([], course_cli.PROG, "give a command"),
    ],
)
def test_command_mistakes_are_one_line_errors(capsys, argv, prog, words):
    assert words in error_line(capsys, argv, prog)


def test_grading_a_folder_that_is_neither_this_repository_nor_a_copy_is_one_line(tmp_path, capsys):
    (tmp_path / "model.py").write_text("")
    assert "is neither this repository nor a student copy" in error_line(
        capsys, ["grade", str(tmp_path)], GRADE
    )
    assert "is not a folder" in error_line(capsys, ["grade", str(tmp_path / "model.py")], GRADE)


def test_make_refuses_a_folder_in_use_or_inside_the_repository(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert "exists and is not an empty folder" in error_line(capsys, ["make", str(tmp_path)], MAKE)
    assert (tmp_path / "notes.txt").read_text() == "mine" and len(list(tmp_path.iterdir())) == 1
    inside = ROOT / "out" / "course-copy-refused"
    assert "inside the repository it copies" in error_line(capsys, ["make", str(inside)], MAKE)
    assert not inside.exists()


def test_make_only_cuts_the_exercises_named_and_grade_defaults_to_them(tmp_path, capsys, student):
    """--only=ex4: ALiBi's three functions are stubs, every other body is the solution's, and the copy is
    graded on ex4 by default."""
    copy = tmp_path / "alibi"
    assert course_cli.main(["make", str(copy), "--only=ex4"]) == 0
    out = capsys.readouterr().out
    assert f"grade it: python -m lab.course grade {copy}" in out
    assert f"check it: python -m lab.course check {copy}" in out
    assert ": 1 exercise, 3 function bodies to write" in out and "for students: README.md (the student" in out
    assert graded_by(copy) == ["ex4"]
    text = (copy / "positions.py").read_text()
    assert body_lines(text, "alibi_slopes") == [stub_line("    ", by_id()["ex4"].stub_message)]
    solved = (ROOT / "positions.py").read_text()
    assert body_lines(text, "sinusoidal_embedding") == body_lines(solved, "sinusoidal_embedding")


def test_check_names_what_keeps_a_copy_from_being_handed_out(tmp_path):
    """An exercise that passes (its bodies put back, which quote the solution) or a page with an instructors'
    section: not ready, and each named."""
    copy = tmp_path / "alibi"
    make_copy(copy, [by_id()["ex4"]])
    put_back(copy, by_id()["ex4"].functions)
    (copy / "docs" / "notes.md").write_text("# Notes\n\n## For instructors\n\nThe answers.\n")
    verdicts, problems = check_copy(copy)
    assert [v.passed for v in verdicts] == [True]
    assert problems[-2:] == [
        "docs/notes.md: an instructors' section, 'For instructors'",
        "ex4 passes: not a fresh copy",
    ]
    files = {module_path(split_function(spec)[0]).as_posix() for spec in by_id()["ex4"].functions}
    quoted = {f"quotes the solution of exercise 4 ({spec})" for spec in by_id()["ex4"].functions}
    leaks = problems[:-2]
    assert leaks and all(p.split(":")[0] in files and p.split(" ", 1)[1] in quoted for p in leaks), leaks


# -----------------------------------------------------------------------------
# What a student reads, and what a failing exercise says


def test_the_copy_is_written_for_students(student):
    """README.md is the student README (set-up, grading, what runs before which exercise, a row per exercise)
    followed by the repository's README without its course section; no page keeps an instructors' section,
    and docs/exercises.md keeps its students' part."""
    copy, _ = student
    readme = (copy / "README.md").read_text()
    template = STUDENT_README.read_text()
    assert readme.startswith(template.split("{{")[0]) and "{{" not in readme
    for words in (
        "python3 -m venv .venv && . .venv/bin/activate",
        "pip install torch --index-url https://download.pytorch.org/whl/cpu",
        "pip install -r requirements.txt",
        "python -m lab.course grade --only=ex1",
        "`python train.py --pos=none` | nothing",
        "`python train.py` (pos=rope, the default) | ex7 (its plain case, no scaling), then ex3",
    ):
        assert words in readme, words
    assert all(f"| {e.id} | {e.title} | `{e.functions[0].replace(':', '.')}`" in readme for e in EXERCISES)
    solution_readme = (ROOT / "README.md").read_text()
    assert readme.endswith(strip_sections(solution_readme)[0]) and "## The schemes" in readme
    assert "here, in the solution" in solution_readme and "here, in the solution" not in readme
    for page in copy.rglob("*.md"):
        text = page.read_text()
        assert strip_sections(text)[1] == [] and "Keeping solutions private" not in text, page
    assert "## For students" in (copy / "docs/exercises.md").read_text()


def test_instructors_sections_are_left_out_with_their_subsections_only():
    page = (
        "# Page\n\n## For students\n\ntext\n\n```sh\n# For instructors: a shell comment, not a heading\n"
        "```\n\n## For instructors\n\n### Keeping solutions private\n\nsecret\n\n## Afterwards\n\nkept\n"
    )
    text, removed = strip_sections(page)
    assert removed == ["For instructors"] and INSTRUCTORS[0] == "For instructors"
    assert text == page.replace("## For instructors\n\n### Keeping solutions private\n\nsecret\n\n", "")


AUTOGRADING_SCHEMA = {  # GitHub Classroom's .github/classroom/autograding.json, as its editor writes it
    "type": "object",
    "required": ["tests"],
    "additionalProperties": False,
    "properties": {
        "tests": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "setup", "run", "input", "output", "comparison", "timeout", "points"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "setup": {"type": "string"},
                    "run": {"type": "string", "minLength": 1},
                    "input": {"type": "string"},
                    "output": {"type": "string"},
                    "comparison": {"enum": ["included", "exact", "regex"]},
                    "timeout": {"type": "integer", "minimum": 1, "maximum": 60},
                    "points": {"type": "integer", "minimum": 1},
                },
            },
        }
    },
}


def schema_errors(value, schema, where="$"):
    """The handful of JSON Schema keywords AUTOGRADING_SCHEMA uses. -> [error]"""
    kinds = {"object": dict, "array": list, "string": str, "integer": int}
    if "type" in schema and (not isinstance(value, kinds[schema["type"]]) or isinstance(value, bool)):
        return [f"{where}: not {schema['type']}"]
    errors = [f"{where}: not one of {schema['enum']}"] if value not in schema.get("enum", [value]) else []
    if isinstance(value, (str, list)) and len(value) < schema.get("minLength", schema.get("minItems", 0)):
        errors.append(f"{where}: too short")
    if isinstance(value, int) and not schema.get("minimum", value) <= value <= schema.get("maximum", value):
        errors.append(f"{where}: out of range")
    if isinstance(value, dict):
        errors += [f"{where}: no {key}" for key in schema.get("required", []) if key not in value]
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(item, properties[key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: unknown {key}")
    if isinstance(value, list):
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{where}[{i}]")
    return errors


def test_classroom_configuration_names_every_exercise_and_its_tests(student):
    """--classroom: one test per exercise, in order, passing the schema; each runs that exercise's tests by
    node id under its marker. Run here, ex5's command passes in the solution and fails in the fresh copy."""
    copy, _ = student
    config = json.loads((copy / CLASSROOM).read_text())
    assert schema_errors(config, AUTOGRADING_SCHEMA) == []
    assert schema_errors({"tests": [{"name": ""}]}, AUTOGRADING_SCHEMA)  # the validator does refuse
    assert [t["name"] for t in config["tests"]] == [f"{e.id}: {e.title}" for e in EXERCISES]
    for exercise, test in zip(EXERCISES, config["tests"]):
        words = shlex.split(test["run"])
        assert words[:3] == ["python", "-m", "pytest"] and f"-m {exercise.id}" in test["run"], test["run"]
        assert set(exercise.tests) <= set(words) and "--strict-markers" in words
    run = shlex.split(config["tests"][4]["run"].replace("python", sys.executable, 1))
    assert subprocess.run(run, cwd=ROOT, capture_output=True, timeout=300).returncode == 0
    assert subprocess.run(run, cwd=copy, capture_output=True, timeout=300).returncode == 1


# computes the angles in float32: the table a student writes who takes torch's default dtype
FLOAT32_TABLE = """    p = torch.arange(n_pos).float()[:, None]
    w = torch.pow(torch.tensor(float(base)), torch.arange(0, dim, 2).float() / -dim)
    return torch.stack([(p * w).sin(), (p * w).cos()], -1).reshape(n_pos, dim).to(dtype)
"""


def test_a_float32_table_fails_ex1_with_the_numbers_the_dtype_and_the_hint(tmp_path):
    """ex1 asks for float64 (its hint says so, and why): a table computed in float32 fails, and python -m
    course grade prints the entry, got, expected, the gap, the tolerance and the dtype asked for, then ex1's
    hints."""
    copy = tmp_path / "student"
    make_copy(copy, [by_id()["ex1"]])
    spec = by_id()["ex1"].functions[0]
    path = copy / module_path(split_function(spec)[0])
    path.write_text(replace_bodies(path.read_text(), {split_function(spec)[1]: split_lines(FLOAT32_TABLE)}))
    done = subprocess.run(
        [sys.executable, "-m", "lab.course", "grade", str(copy)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and lines[-1] == "0 of 1 exercise passes", done.stdout + done.stderr
    assert lines[0].startswith("ex1 ") and "failed: test_sinusoidal_table_matches_its_formula" in lines[0]
    for words in (
        "AssertionError: PE[",
        "got ",
        "expected ",
        "off by ",
        "tolerance 1e-12",
        "dtype torch.float64",
    ):
        assert words in lines[0], (words, lines[0])
    assert lines[1:-1] == [f"      hint: {hint}" for hint in by_id()["ex1"].hints]
    assert "float64 is required" in by_id()["ex1"].hints[1]


def test_the_float32_check_names_the_dtype_too():
    """Asked for float32, the float32-computed table is off by about 1e-5 by p = 300, past the 1e-6 a float32
    table is held to: the property test's message names float32."""
    import tests.test_exercise_properties as properties

    namespace = {"torch": torch}
    exec("def table(n_pos, dim, base, dtype):\n" + FLOAT32_TABLE, namespace)
    pe = namespace["table"](301, 64, 10000.0, torch.float32)
    angle = torch.arange(301, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 64, 2) / 64)
    reference = torch.stack([angle.sin(), angle.cos()], -1).reshape(301, 64)
    gap = (pe.double() - reference).abs()
    p, c = divmod(gap.argmax().item(), 64)
    assert gap.max() > 1e-6
    message = rf"PE\[{p}, {c}\]: got .*, expected .*, off by .*, tolerance 1e-06, dtype torch.float32"
    with pytest.raises(AssertionError, match=message):
        properties.near(pe[p, c].item(), reference[p, c].item(), 1e-6, f"PE[{p}, {c}]", torch.float32)


def test_totals_and_counts_are_in_the_singular_for_one():
    exercises = by_id()

    def verdicts(*passed):
        return [
            Verdict(exercises[f"ex{n + 1}"], ok, 1, "" if ok else "AssertionError: x")
            for n, ok in enumerate(passed)
        ]

    assert report_lines(verdicts(True))[-1] == "1 exercise passes"
    assert report_lines(verdicts(True))[0].endswith("passed (1 test)")
    assert report_lines(verdicts(False))[-1] == "0 of 1 exercise passes"
    assert report_lines(verdicts(True, True, True))[-1] == "all 3 exercises pass"
    assert report_lines(verdicts(True, False, False))[-1] == "1 of 3 exercises passes"
    assert report_lines(verdicts(False, False, True))[-1] == "1 of 3 exercises passes"
    assert report_lines(verdicts(False, True, True))[-1] == "2 of 3 exercises pass"

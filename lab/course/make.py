"""python -m lab.course make OUT_DIR: a student copy of the files git tracks, each chosen exercise's bodies
(after the docstring) cut from the syntax tree (lab/course/source.py) to its stub. No file of the copy quotes
a stripped body (a docs passage becomes a note, an ungraded test file is left out, anything else is reported);
no page keeps an instructors' section; .course.json records it all."""

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab.course.exercises import EXERCISES, LESSON
from lab.course.source import SourceError, body_span, replace_bodies, split_lines, stub_line, telling_lines
from plumbing.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
MARKER = ".course.json"  # in a copy's root: the exercises stripped there
OMITTED = (
    "(Left out of the course copy: this passage quoted the solution of {what}. docs/exercises.md says why.)"
)
STUDENT_README = Path(__file__).with_name("student_README.md")
INSTRUCTORS = ("For instructors", "Course mode")  # headings of sections a copy leaves out, with subsections
CLASSROOM = ".github/classroom/autograding.json"
POINTS = {"easy": 10, "medium": 20, "hard": 30, "advanced": 30}  # per exercise, by difficulty
SETUP = (
    "python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu && "
    "python -m pip install -q -r requirements.txt"
)
FENCE = re.compile(r"\s*(```|~~~)")


@dataclass
class Notes:
    """What make did, for the instructor. Each entry of the lists is {"page", "line", "why"}."""

    files: int = 0
    functions: list = field(default_factory=list)  # "model:apply_rope" of every stripped body
    pages_changed: list = field(default_factory=list)  # docs passages replaced
    left_out: list = field(default_factory=list)  # test files not copied
    leaks: list = field(default_factory=list)  # copied as is, to be fixed at the source
    rewritten: list = field(default_factory=list)  # {"page", "why"}: pages rewritten for students


def counted(n, noun, plural=None):
    """ "1 exercise", "3 exercises"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def module_path(module):
    """ "lab.measure.instruments" -> lab/measure/instruments.py"""
    return Path(*module.split(".")).with_suffix(".py")


def split_function(spec):
    """ "module:qualname" -> (module, qualname)"""
    return spec.partition(":")[::2]


def tracked_files(source):
    """The files git tracks in `source` (paths from its root) that exist in its working tree."""
    try:
        listed = subprocess.run(["git", "-C", str(source), "ls-files", "-z"], capture_output=True, text=True)
    except FileNotFoundError:
        raise UserError("git is not installed: the copy is made of the files git tracks") from None
    if listed.returncode != 0:
        raise UserError(f"{source} is not a git checkout: the copy is made of the files git tracks")
    return [name for name in listed.stdout.split("\0") if name and (source / name).is_file()]


def lesson_anchors(markdown):
    """GitHub's anchors of a page's headings: lowercase, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", markdown, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def stripped_sources(source, exercises):
    """Each exercise's functions cut from their modules, a UserError naming the exercise where one cannot be
    or its section is no heading of the lesson. -> ({module path: its text with stubs for bodies}, {telling
    line: "exercise N (module:function)"})"""
    anchors, stubs, telling = lesson_anchors((source / LESSON).read_text()), {}, {}
    for exercise in exercises:
        if exercise.section not in anchors:
            raise UserError(f"{exercise.id}: section {exercise.section!r} is no heading of {LESSON}")
        for spec in exercise.functions:
            module, qualname = split_function(spec)
            try:
                text = (source / module_path(module)).read_text()
                start, end, indent = body_span(text, qualname)
            except (OSError, SourceError) as e:
                raise UserError(f"{exercise.id}: cannot cut {spec} from {module_path(module)}: {e}") from None
            stubs.setdefault(module_path(module), {})[qualname] = [stub_line(indent, exercise.stub_message)]
            for line in telling_lines(split_lines(text)[start:end]):
                telling.setdefault(line, f"exercise {exercise.number} ({spec})")
    texts = {path: replace_bodies((source / path).read_text(), bodies) for path, bodies in stubs.items()}
    return texts, telling


def quoting(text, telling):
    """What `text` quotes of the telling lines ({line of code: what}), or None."""
    flat = " ".join(text.split())
    return next((what for line, what in telling.items() if line in flat), None)


def quotes(name, text, telling):
    """{"page", "line", "why"} of each line of file `name` that quotes a telling line."""
    found = ((n, quoting(line, telling)) for n, line in enumerate(split_lines(text), 1))
    return [{"page": name, "line": n, "why": f"quotes the solution of {what}"} for n, what in found if what]


def scrub_page(text, telling):
    """A markdown page with each fenced code block (or loose line) that quotes a telling line replaced by a
    note. -> (new text, [(line number, why)])"""
    lines = split_lines(text)
    changes, out, i = [], [], 0
    while i < len(lines):
        end = i + 1
        if fence := FENCE.match(lines[i]):  # to its closing fence, or the page's end
            closing = (j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith(fence.group(1)))
            end = next(closing, len(lines) - 1) + 1
        if what := quoting("".join(lines[i:end]), telling):
            out.append(re.match(r"\s*", lines[i]).group() + OMITTED.format(what=what) + "\n")
            changes.append((i + 1, f"quoted the solution of {what}"))
        else:
            out.extend(lines[i:end])
        i = end
    return "".join(out), changes


def strip_sections(text):
    """A markdown page without the sections whose heading starts with one of INSTRUCTORS, each up to the next
    heading of its level or above; a "#" line in fenced code is no heading. -> (text, [headings left out])"""
    out, removed, level, fence = [], [], None, None
    for line in split_lines(text):
        heading = None if fence else re.match(r"(#+)\s+(.*?)\s*$", line)
        if marker := FENCE.match(line):
            fence = None if fence == marker.group(1) else fence or marker.group(1)
        if heading and (level is None or len(heading.group(1)) <= level):  # not a subsection of one left out
            level = None
            if heading.group(2).startswith(INSTRUCTORS):
                level = len(heading.group(1))
                removed.append(heading.group(2))
        if level is None:
            out.append(line)
    return "".join(out), removed


def student_readme(exercises, readme):
    """lab/course/student_README.md with the exercises' table, then `readme` (the repository's, for
    students)."""
    rows = ["| id | exercise | functions to write | lesson section | difficulty | about |", "|---" * 6 + "|"]
    for e in exercises:
        functions = ", ".join(f"`{spec.replace(':', '.')}`" for spec in e.functions)
        section = f"[{e.section.split('-')[0]}]({LESSON}#{e.section})"
        rows.append(f"| {e.id} | {e.title} | {functions} | {section} | {e.difficulty} | {e.minutes} min |")
    n_functions = counted(sum(len(e.functions) for e in exercises), "function")
    text = STUDENT_README.read_text().replace("{{functions}}", n_functions)
    return text.replace("{{exercises}}", "\n".join(rows)) + readme


def classroom_config(exercises):
    """GitHub Classroom's autograding.json: one test per exercise, its tests by node id under its marker."""
    tests = []
    for e in exercises:
        run = f"python -m pytest -q -p no:cacheprovider --strict-markers -m {e.id} " + shlex.join(e.tests)
        test = {"name": f"{e.id}: {e.title}", "setup": SETUP, "run": run, "input": "", "output": ""}
        tests.append(test | {"comparison": "included", "timeout": 10, "points": POINTS[e.difficulty]})
    return {"tests": tests}


def handle_quotes(source, files, telling, texts, notes):
    """Scrub the docs pages, leave out the ungraded test files, and report any other file that quotes a
    stripped body. Fills texts (what to write instead) and notes. -> the files to copy"""
    graded = {node.split("::")[0] for exercise in EXERCISES for node in exercise.tests}
    kept = []
    for name in files:
        text = texts.get(Path(name)) or ((source / name).read_text() if name.endswith((".md", ".py")) else "")
        why = quotes(name, text, telling)
        if why and name.endswith(".md"):
            texts[Path(name)], changes = scrub_page(text, telling)
            notes.pages_changed += [{"page": name, "line": n, "why": reason} for n, reason in changes]
        elif why and name.startswith("tests/test_") and name not in graded:
            notes.left_out.append(why[0])
            continue
        else:
            notes.leaks += why
        kept.append(name)
    return kept


def make_copy(out_dir, exercises, classroom=False):
    """Write the student copy into out_dir (new, or empty), with classroom GitHub Classroom's too. -> Notes"""
    out_dir, source = Path(out_dir), ROOT
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"{out_dir} exists and is not an empty folder: give a new or empty one", 2)
    if out_dir.resolve().is_relative_to(source.resolve()):
        inside = "is inside the repository it copies (its tests would run with the suite's)"
        raise UserError(f"{out_dir} {inside}: give a folder outside it", 2)
    texts, telling = stripped_sources(source, exercises)
    files = tracked_files(source)
    notes = Notes(functions=[spec for e in exercises for spec in e.functions])
    for name in (name for name in files if name.endswith(".md")):  # the pages as students get them
        text, removed = strip_sections((source / name).read_text())
        if name == "README.md":
            texts[Path(name)] = student_readme(exercises, text)
            notes.rewritten.append({"page": name, "why": "the student README, then the repository's"})
        elif removed:
            texts[Path(name)] = text
            notes.rewritten.append({"page": name, "why": "left out: " + ", ".join(removed)})
    files = handle_quotes(source, files, telling, texts, notes)
    notes.files = len(files)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # built beside out_dir and moved in whole: a copy that failed halfway is never mistaken for one
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent)) / out_dir.name
    try:
        building.mkdir()  # the umask's mode: mkdtemp's 0700 would keep the copy from the students it is for
        for name in files:
            target = building / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if Path(name) in texts:
                target.write_text(texts[Path(name)])
                shutil.copymode(source / name, target)
            else:
                shutil.copy2(source / name, target, follow_symlinks=False)
        written = {MARKER: {"exercises": [e.id for e in exercises]} | asdict(notes)}
        written |= {CLASSROOM: classroom_config(exercises)} if classroom else {}
        for name, value in written.items():
            (building / name).parent.mkdir(parents=True, exist_ok=True)
            (building / name).write_text(json.dumps(value, indent=1) + "\n")
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        os.replace(building, out_dir)
    finally:
        shutil.rmtree(building.parent, ignore_errors=True)
    return notes


def solution_leaks(directory, exercises):
    """The lines of a copy's files that quote a stripped body, as Notes lists them."""
    telling = stripped_sources(ROOT, exercises)[1]
    return [
        leak
        for path in sorted(Path(directory).rglob("*"))
        if path.is_file() and path.suffix in (".py", ".md", ".txt", ".toml", ".json")
        for leak in quotes(path.relative_to(directory).as_posix(), path.read_text(errors="replace"), telling)
    ]

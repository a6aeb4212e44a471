"""The files a study, a benchmark or a demo writes: each output checked writable before the work (one line
naming its flag), then written atomically (plumbing.outputs.replace_atomically)."""

import csv
import json
import os
import re
from contextlib import suppress
from pathlib import Path

from plumbing.errors import UserError
from plumbing.outputs import NO_SPACE, PROBE_BYTES, replace_atomically, temporary_path

# How each figure format matplotlib writes begins (re.match on its first bytes): what marks a file as a figure
# an earlier run wrote. raw and rgba are bare pixels with no mark: a file there is always the user's.
FIGURE_STARTS = {
    "png": rb"\x89PNG\r\n\x1a\n",
    "pdf": rb"%PDF-",
    "eps": rb"%!PS",
    "ps": rb"%!PS",
    "svg": rb"<\?xml[^>]*>\s*<(!DOCTYPE )?svg",
    "svgz": rb"\x1f\x8b",  # gzip
    "jpg": rb"\xff\xd8\xff",
    "jpeg": rb"\xff\xd8\xff",
    "tif": rb"II\*\x00|MM\x00\*",
    "tiff": rb"II\*\x00|MM\x00\*",
    "webp": rb"RIFF.{4}WEBP",
    "gif": rb"GIF8[79]a",
    "avif": rb".{4}ftypavi[fs]",
    "pgf": rb"%% Creator: Matplotlib",
}
HEAD_BYTES = 4096  # read of an existing file to tell what it is: a header line, a format's first bytes
JSON_BYTES = 2**24  # a larger file is read as no report of ours (json_file), not parsed


def check_outputs(outputs, inputs=(), earlier=None, replace=False):
    """A one-line UserError naming the flag unless every output in outputs ({flag: path or None}) can be
    written: none an input of the run (check_not_input), no two one file, each a place for a file, writable
    (check_writable); then none over a file the user made (check_not_theirs, for the flags in `earlier`)."""
    given, written = {flag: Path(path) for flag, path in outputs.items() if path is not None}, {}
    for flag, path in given.items():
        where, real = f"--{flag}={path}", path.resolve()
        check_not_input(where, real, inputs)
        if real in written:
            raise UserError(
                f"{where}: --{written[real]} writes that file too; give each output a file of its own"
            )
        written[real] = flag
        if path.is_dir():
            raise UserError(f"{where}: is a folder; give a file name")
        if path.exists() and not path.is_file():  # a device, a pipe: the write would replace the node itself
            raise UserError(f"{where}: is not a regular file; give a file name")
        check_writable(where, path)
    for flag, path in given.items():  # once every output can be written: the message about the place first
        if flag in (earlier or {}):
            check_not_theirs(flag, path, *earlier[flag], replace)


def check_not_input(where, real, inputs):
    """A one-line UserError if the output (resolved: real) is a file the run reads (a checkpoint) or lies in a
    folder it reads (a dataset's): the output would replace what the run has just read."""
    for source in (Path(source).resolve() for source in inputs):
        if real == source:
            raise UserError(f"{where}: that file is an input of this run; write the output to another one")
        if source.is_dir() and real.is_relative_to(source):
            raise UserError(f"{where}: {source} is a folder this run reads; write the output outside it")


def check_not_theirs(flag, path, what, ours, replace):
    """The rule on an existing file at an output: a file the command wrote before (ours(path): a CSV with its
    header, a figure in the format asked for) is replaced, the normal rerun, as the studies replace their
    results; any other file is the user's, kept unless `replace` (the command's --replace, as data's prepare
    scripts take it). A one-line UserError if not."""
    if replace or not (path.exists() or path.is_symlink()) or ours(path):
        return
    raise UserError(
        f"--{flag}={path}: that file exists and is no earlier output of this command (not {what}); "
        "give another file, or add --replace to replace it"
    )


def head(path):
    """The first HEAD_BYTES of a file; b"" if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(HEAD_BYTES)
    except OSError:
        return b""


def csv_file(*headers):
    """check_not_theirs's (what, ours) for a CSV output: ours if its first line is one of `headers` (column
    names), as csv.writer wrote it."""
    lines = {",".join(columns).encode() for columns in headers}
    return (
        "a CSV with the header this command writes",
        lambda path: head(path).split(b"\n")[0].rstrip(b"\r") in lines,
    )


def json_file(*keys):
    """check_not_theirs's (what, ours) for a JSON report: ours if it is a JSON object holding every one of
    `keys`, those the command's report always has (a file over JSON_BYTES is not read: not ours)."""

    def ours(path):
        try:
            if path.stat().st_size > JSON_BYTES:
                return False
            report = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, nested too deep
            return False
        return isinstance(report, dict) and set(keys) <= set(report)

    return f"a JSON report with the keys {', '.join(keys)}", ours


def figure_file(fmt):
    """check_not_theirs's (what, ours) for a figure in matplotlib's format fmt: ours if it begins as that
    format does (FIGURE_STARTS)."""
    start = FIGURE_STARTS.get(fmt)
    ours = lambda path: start is not None and re.match(start, head(path), re.DOTALL) is not None
    return f"a .{fmt} image", ours


def check_folder(flag, folder, inputs=()):
    """check_outputs for a folder the work fills with files of its own (a study's --out_root): writable, and
    neither an input nor in a folder of inputs."""
    check_not_input(f"--{flag}={folder}", Path(folder).resolve(), inputs)
    check_writable(f"--{flag}={folder}", Path(folder) / "probe")


def check_writable(where, path):
    """A one-line UserError starting `where` unless a file can be written at path: no file in the way of its
    folders, its folder made (as the write will), a temporary file written, flushed to disk and removed, and
    the folders made for it removed too: a command refused after this check leaves nothing behind."""
    if in_the_way := next((p for p in path.parents if p.exists() and not p.is_dir()), None):
        raise UserError(f"{where}: {in_the_way} is a file, not a folder")
    made = [folder for folder in path.parents if not folder.exists()]  # deepest first
    probe = temporary_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(probe, "xb", buffering=0) as f:
            f.write(bytes(PROBE_BYTES))
            os.fsync(f.fileno())
    except OSError as e:
        full = (
            "; no space left (a full disk, a quota, ulimit -f): free some space"
            if e.errno in NO_SPACE
            else ""
        )
        raise UserError(f"{where}: cannot write there ({e.strerror or e}){full}") from None
    finally:  # once closed: Windows removes no open file
        with suppress(OSError):
            probe.unlink()
        for folder in made:  # deepest first; one that something else has filled meanwhile stays
            with suppress(OSError):
                folder.rmdir()


def write_output(flag, path, write):
    """replace_atomically(path, write), a failure (the disk filled up during the work) a UserError."""
    try:
        return replace_atomically(path, write)
    except OSError as e:
        raise UserError(f"--{flag}={path}: could not be written ({e.strerror or e})") from None


def write_rows(flag, path, columns, rows):
    """A CSV file of `columns` and `rows`, written as write_output writes."""

    def write(tmp):
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(rows)

    write_output(flag, path, write)

"""The files a study, a benchmark or a demo writes: each output checked writable before the work (one line
naming its flag), then written atomically (plumbing.outputs.replace_atomically)."""

import csv
import os
from contextlib import suppress
from pathlib import Path

from plumbing.errors import UserError
from plumbing.outputs import NO_SPACE, PROBE_BYTES, replace_atomically, temporary_path


def check_outputs(outputs, inputs=()):
    """A one-line UserError naming the flag unless every output in outputs ({flag: path or None}) can be
    written (check_writable); nor may two outputs name one file, or an output name an input (a checkpoint
    read)."""
    inputs, written = {Path(source).resolve() for source in inputs}, {}
    for flag, path in [(flag, Path(path)) for flag, path in outputs.items() if path is not None]:
        where, real = f"--{flag}={path}", path.resolve()
        if real in inputs:
            raise UserError(f"{where}: that file is an input of this run; write the output to another one")
        if real in written:
            raise UserError(
                f"{where}: --{written[real]} writes that file too; give each output a file of its own"
            )
        written[real] = flag
        if path.is_dir():
            raise UserError(f"{where}: is a folder; give a file name")
        check_writable(where, path)


def check_folder(flag, folder):
    """check_outputs for a folder the work fills with files of its own (a study's --out_root)."""
    check_writable(f"--{flag}={folder}", Path(folder) / "probe")


def check_writable(where, path):
    """A one-line UserError starting `where` unless a file can be written at path: no file in the way of its
    folders, its folder made (as the write will), a temporary file written, flushed to disk and removed."""
    if in_the_way := next((p for p in path.parents if p.exists() and not p.is_dir()), None):
        raise UserError(f"{where}: {in_the_way} is a file, not a folder")
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

"""Files a script writes its results to (eval_length.py's --csv, --positions_csv and --plot, perf.bench's
--json): checked before the work (check_outputs: a file where a folder belongs, a read-only folder or a full
disk is one line then, not a traceback after hours), written all at once after it (write_output), to a
temporary file renamed into place (replace_atomically, checkpoints and datasets too): a write that fails
midway leaves the file it replaces whole, and one that fails for lack of space says so in one line."""

import csv
import errno
import os
import shutil
import uuid
from contextlib import suppress
from pathlib import Path

from plumbing.errors import UserError
from plumbing.hardware import format_bytes

NO_SPACE = (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC))  # disk full, ulimit -f, quota
PROBE_BYTES = 4096  # a full disk still creates an empty file: check_outputs' probe must take a block


def temporary_path(path):  # hidden and unique; remove_unfinished_writes finds those a kill -9 left
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def replace_atomically(path, write, needed=None):
    """write(tmp) fills a temporary file beside path, which then os.replace()s it (atomic) and the folder is
    fsynced (POSIX). A write that fails for lack of space is a UserError (no_space; needed: its bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if full := space_error(e):
            kept = f"the previous {path.name} is whole" if path.exists() else ""
            raise no_space(full, path, needed, kept) from None
        raise
    if os.name == "posix":
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def space_error(error):
    """The OSError (error or one it was raised from, as torch.save's RuntimeError) of NO_SPACE, else None."""
    while error is not None and not (isinstance(error, OSError) and error.errno in NO_SPACE):
        error = error.__cause__ or error.__context__
    return error


def no_space(error, path, needed=None, kept=""):
    """The UserError for a write that space_error refused: why, the space it needs and has, what is kept."""
    folder = next((p for p in Path(path).parents if p.exists()), Path("."))
    free = f"{format_bytes(shutil.disk_usage(folder).free)} free"
    space = f"needs about {format_bytes(needed)}, {free}" if needed else free
    return UserError(
        f"could not write {path}: {error.strerror} ({space}){f'; {kept}' if kept else ''}; free some space "
        "(or raise ulimit -f) and run it again, or write elsewhere"
    )


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

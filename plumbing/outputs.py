"""Files a script writes its results to (lab/eval_length.py's --csv, --positions_csv and --plot,
lab.perf.bench's --json): checked before the work (check_outputs: a file where a folder belongs, a read-only
folder or a full disk is one line then, not a traceback after hours), written all at once after it
(write_output), to a temporary file renamed into place (replace_atomically, checkpoints and datasets too): a
write that fails midway leaves the file it replaces whole, and one that fails for lack of space says so in one
line."""

import errno
import os
import shutil
import uuid
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

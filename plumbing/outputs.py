"""
Files a script writes its results to (eval_length.py's --csv, --positions_csv and --plot, perf.bench's
--json): checked before the work, written all at once after it.

    check_outputs({"csv": cfg.csv, "plot": cfg.plot}, inputs=[checkpoint])   # before hours of evaluation
    write_output("csv", cfg.csv, lambda tmp: tmp.write_text(text))             # after it, atomically

A file where a folder is expected, a read-only folder or a full disk is found by writing a temporary file
where the output will go, so it stops the script in one line before the work, not with a traceback after
it. An output is written to a temporary file and renamed into place: one that fails midway leaves the file
it replaces whole.
"""

import os
from pathlib import Path

from plumbing.checkpoint import replace_atomically, temporary_path
from plumbing.errors import UserError

PROBE_BYTES = 4096  # a full disk still creates an empty file: the probe must take a block


def check_outputs(outputs, inputs=()):
    """UserError (one line, naming the flag) unless every output path in outputs ({flag: path or None}) can be
    written: its folder made (as the write will), a temporary file written, flushed to disk and removed there.
    Two outputs naming one file, or an output naming one of the inputs (a checkpoint read), are refused
    too."""
    given = [(flag, Path(path)) for flag, path in outputs.items() if path is not None]
    for i, (flag, path) in enumerate(given):
        if any(same_file(source, path) for source in inputs):
            raise UserError(
                f"--{flag}={path}: that file is an input of this run; write the output to another one"
            )
        for other, earlier in given[:i]:
            if same_file(earlier, path):
                raise UserError(
                    f"--{flag}={path}: --{other} writes that file too; give each output a file of its own"
                )
        check_writable(flag, path)


def same_file(a, b):
    return Path(a).resolve() == Path(b).resolve()


def check_writable(flag, path):
    """UserError unless a file can be written at path (a Path), as check_outputs says."""
    if path.is_dir():
        raise UserError(f"--{flag}={path}: is a folder; give a file name")
    in_the_way = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if in_the_way is not None:
        raise UserError(f"--{flag}={path}: {in_the_way} is a file, not a folder")
    probe = temporary_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(probe, "xb")
    except OSError as e:
        raise unwritable(flag, path, e) from None
    try:
        with f:
            f.write(bytes(PROBE_BYTES))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise unwritable(flag, path, e) from None
    finally:  # once closed: Windows removes no open file
        probe.unlink(missing_ok=True)


def unwritable(flag, path, error):
    return UserError(f"--{flag}={path}: cannot write there ({error.strerror or error})")


def write_output(flag, path, write):
    """replace_atomically(path, write), a failure (the disk filled up during the work) a one-line
    UserError."""
    try:
        return replace_atomically(path, write)
    except OSError as e:
        raise UserError(f"--{flag}={path}: could not be written ({e.strerror or e})") from None

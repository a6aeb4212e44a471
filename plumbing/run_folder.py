"""A run's folder (train.py): one run at a time, locked by an OS lock on out_dir/train.lock for the run, and
never a run replaced without --resume or --overwrite."""

import os
import shlex
import socket
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path

from plumbing.checkpoint import RUN_ENTRIES, open_checkpoint, run_finished
from plumbing.errors import UserError

try:
    import fcntl
except ImportError:  # Windows: no flock (msvcrt's byte-range locks are not worth it), so no folder is locked
    fcntl = None

LOCK_NAME = "train.lock"


def format_out_dir(template, dataset, pos):
    """train.py's --out_dir with {dataset} and {pos} filled in; any other field is a one-line error."""
    try:
        return template.format(dataset=dataset, pos=pos)
    except (KeyError, IndexError, ValueError) as e:
        only = "only {dataset} and {pos} can be filled in"
        raise ValueError(f"out_dir={template!r}: {only} ({e!r})") from None


def take_lock(path):
    """Open path and flock it (exclusive, not waiting) -> the open fd: the lock is held until the fd is
    closed, which the kernel does when the process dies, kill -9 included, so it is held exactly while its run
    lives. A run ending unlinks the file before letting go: the file locked must still be the one at path,
    else it is opened again."""
    if fcntl is None:
        return None
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_lock(path) or "one that has just started"
            wait = "wait for it to end or give another --out_dir"
            raise UserError(f"{path.parent} is in use by another run ({holder}); {wait}") from None
        with suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return name_holder(fd)
        os.close(fd)
    raise UserError(f"could not take {path}: other runs keep taking it")


def name_holder(fd):
    """Write into the lock file who holds it, the line a refused run quotes -> fd."""
    started, command = time.strftime("%Y-%m-%d %H:%M:%S"), shlex.join(["python", *sys.argv])
    os.ftruncate(fd, 0)  # the line a killed run left may be longer
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}: {command}\n".encode())
    return fd


def read_lock(path, patience=1.0):
    """The lock file's line (who holds it), waiting up to `patience` seconds for a run that has just taken the
    lock to write it (name_holder); None if it is still not whole by then."""
    deadline = time.monotonic() + patience
    while True:
        with suppress(OSError):
            if (text := path.read_text()).endswith("\n"):
                return text.strip()
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def describe_run(path):
    """(what the run of checkpoint `path` is, what --resume does with it: None where it cannot)."""
    try:
        ckpt = open_checkpoint(path, mmap=True)
    except UserError as e:  # unreadable, damaged, foreign (GPT-2's, nanoGPT's) or malicious
        return f"a checkpoint that cannot be continued ({e})", None
    if missing := [key for key in RUN_ENTRIES if key not in ckpt]:
        return f"a checkpoint that cannot be continued (it has no {', '.join(missing)})", None
    step = f"step {ckpt.get('iter_num')} of {(ckpt.get('train_config') or {}).get('max_iters')}"
    if run_finished(ckpt):
        return f"a finished run ({step})", "with a larger --max_iters trains it further"
    return f"a run stopped at {step}", "continues it"


def check_checkpoint_names_free(out_dir):
    """Refuse a folder (or anything else not a regular file) named ckpt.pt or best.pt in out_dir: the run's
    checkpoint writes could not replace it, and would fail only at the first evaluation, after training."""
    for path in (Path(out_dir) / "ckpt.pt", Path(out_dir) / "best.pt"):
        if path.exists() and not path.is_file():
            kind = "a folder" if path.is_dir() else "not a regular file"
            raise UserError(f"{path} is {kind}, not a checkpoint: move it away or give another --out_dir")


def check_may_start(out_dir, resume, overwrite):
    """Refuse a new run in a folder holding one unless --resume or --overwrite (-> a note), and any run where
    a checkpoint's name is taken by something else."""
    check_checkpoint_names_free(out_dir)
    saved = [path for path in (Path(out_dir) / "ckpt.pt", Path(out_dir) / "best.pt") if path.is_file()]
    if resume or not saved:
        return None
    run, resuming = describe_run(saved[0])
    if overwrite:
        return f"note: --overwrite: {out_dir} holds {run}; this run replaces it at its first evaluation"
    resuming = f"--resume {resuming}, " if resuming else ""
    again = "--overwrite starts again and replaces it (or give another --out_dir)"
    raise UserError(f"{out_dir} holds {run}: {resuming}{again}")


def check_out_dir(out_dir):
    """A file given for the run's folder (a checkpoint: the folder to give instead is named; or anything else
    that is not a folder, /dev/null) is an error."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        folder = (
            f"the folder that holds the run, --out_dir={path.parent}"
            if path.is_file()
            else "a folder for the run"
        )
        raise ValueError(f"--out_dir={out_dir} is a file: give {folder}")


@contextmanager
def own_folder(out_dir, resume, overwrite, procs, device):
    """Rank 0 locks out_dir for the run and checks the run may start there; a refusal stops every rank
    together. On every way out the lock file goes, then the lock (kill -9 leaves the file, not the lock: the
    next run takes it), and so does a folder rank 0 made and left empty."""
    folder = Path(out_dir)
    made = procs.master and not folder.exists()
    path, fd, refusal, note = folder / LOCK_NAME, None, None, None
    try:
        if procs.master:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd = take_lock(path)
                note = check_may_start(out_dir, resume, overwrite)
            except UserError as e:
                refusal = e
            except OSError as e:  # a read-only folder, a file on the path
                refusal = UserError(f"--out_dir={out_dir}: cannot write there ({e.strerror or e})")
        if procs.share([float(refusal is not None)], device)[0]:
            raise refusal or UserError("rank 0 could not take out_dir")  # only rank 0 prints it
        if note:
            procs.log(note)
        yield
    finally:
        if fd is not None:
            path.unlink(
                missing_ok=True
            )  # while still held: a run taking it meanwhile sees it gone, and retries
            os.close(fd)
        if made:
            with suppress(OSError):  # not empty: the run wrote something, which stays
                folder.rmdir()

"""A run's folder (train.py): one run at a time, locked by out_dir/train.lock (created atomically; a stale
one, its process gone, taken over), and never a run replaced without --resume or --overwrite."""

import json
import os
import shlex
import socket
import sys
import time
import uuid
from contextlib import contextmanager, suppress
from pathlib import Path

from plumbing.checkpoint import open_checkpoint, run_finished
from plumbing.errors import UserError
from plumbing.resume import RESUME_KEYS

LOCK_NAME = "train.lock"
LOCK_WRITE_SECONDS = 60  # an unreadable lock younger than this is one being written, not a crashed run's


def format_out_dir(template, dataset, pos):
    """train.py's --out_dir with {dataset} and {pos} filled in; any other field is a one-line error."""
    try:
        return template.format(dataset=dataset, pos=pos)
    except (KeyError, IndexError, ValueError) as e:
        only = "only {dataset} and {pos} can be filled in"
        raise ValueError(f"out_dir={template!r}: {only} ({e!r})") from None


def process_start(pid):
    """When process pid started (Linux /proc), or None: a pid reused by another process has another start."""
    with suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]  # field 22, after the name
    return None


def lock_record(folder):
    """What the lock says of this process: enough for the refusal to name it, and to tell a stale lock (one
    whose process is gone, or one copied with its folder: the folder's inode is another)."""
    return {
        "folder_inode": os.stat(folder).st_ino,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shlex.join(["python", *sys.argv]),
        "process_start": process_start(os.getpid()),
    }


def read_lock(path):
    """The lock file's text, or None when there is none."""
    with suppress(FileNotFoundError):
        return path.read_text()
    return None


def holder_alive(held, path):
    """Whether the process a lock names may still run; one on another host, or outside POSIX, cannot be
    checked: assumed alive, so never two runs in one folder. A lock copied from another folder (cp -r of a
    run, or of a study's runs) holds none: its process runs, if at all, in the folder it was copied from."""
    if held is None:  # unreadable: being written right now, or left half-written by a crash long ago
        with suppress(FileNotFoundError):
            return time.time() - path.stat().st_mtime < LOCK_WRITE_SECONDS
        return False
    if held.get("folder_inode") not in (None, path.parent.stat().st_ino):
        return False
    if held.get("host") != socket.gethostname() or os.name != "posix":
        return True
    try:
        os.kill(held["pid"], 0)  # signal 0: nothing is sent, only whether the process exists
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's process: it exists
        pass
    started, now = held.get("process_start"), process_start(held["pid"])
    return started is None or now is None or started == now


def remove_stale_lock(path, text):
    """Remove the stale lock unless another process took it over meanwhile: moved aside first (one rename,
    which only one process wins) and put back if it is no longer the stale one."""
    aside = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if read_lock(aside) != text:
        with suppress(OSError):
            os.link(aside, path)  # fails if yet another process holds it now: then that one stays
    aside.unlink(missing_ok=True)


def take_lock(path):
    """Create the lock (mode "x": one process only) -> (its text, a note if it took a stale one over)."""
    note = None
    for _ in range(10):
        text = json.dumps(lock_record(path.parent))
        try:
            with open(path, "x") as f:
                f.write(text)
            return text, note
        except FileExistsError:
            held_text, held, holder = read_lock(path), None, "unreadable"
        if held_text is None:
            continue
        with suppress(ValueError):
            held = json.loads(held_text)
        if isinstance(held, dict) and isinstance(held.get("pid"), int) and held["pid"] > 0:
            command = held.get("command", "an unknown command")
            holder = f"pid {held['pid']} on {held.get('host')}, started {held.get('started')}: {command}"
        else:
            held = None
        if holder_alive(held, path):
            holder = holder if held else "a process that has just started"
            wait = f"wait for it to end or give another --out_dir (if it is no longer running, delete {path})"
            raise UserError(f"{path.parent} is in use by another run ({holder}); {wait}")
        remove_stale_lock(path, held_text)
        note = f"note: took over {path}, left by a run that no longer runs ({holder})"
    raise UserError(f"could not take {path}: other runs keep taking it")


def describe_run(path):
    """(what the run of checkpoint `path` is, what --resume does with it: None where it cannot)."""
    try:
        ckpt = open_checkpoint(path, mmap=True)
    except UserError as e:  # unreadable, damaged, foreign (GPT-2's, nanoGPT's) or malicious
        return f"a checkpoint that cannot be continued ({e})", None
    if missing := [key for key in RESUME_KEYS if key not in ckpt]:
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
    """Rank 0 locks out_dir and checks the run may start there; a refusal stops every rank together. The lock
    goes on every way out but kill -9 (the next run sees its process gone and takes it over), and so does a
    folder rank 0 made and left empty."""
    folder = Path(out_dir)
    made = procs.master and not folder.exists()
    path, text, refusal, note = folder / LOCK_NAME, None, None, None
    try:
        if procs.master:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                text, took_over = take_lock(path)
                if took_over:
                    procs.log(took_over)
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
        if text is not None and read_lock(path) == text:
            path.unlink(missing_ok=True)
        if made:
            with suppress(OSError):  # not empty: the run wrote something, which stays
                folder.rmdir()

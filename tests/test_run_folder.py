"""A run owns its folder, finished means finished, and every bad input to train.py is one line.

Of two runs started at once in one folder, one is refused naming the other; the folder's lock is the kernel's
(flock), so a run killed with -9 holds it no longer and --resume continues it; a folder holding a run is never
replaced without --overwrite; a checkpoint records whether its run finished;
checkpoints, datasets and flags that cannot work are one line on stderr, a non-zero exit and no traceback,
with every file that was there before left as it was. Tiny models on CPU through train.main or
`python train.py`; no mocks.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import train_error_line
from test_resume import ENV

import train
from data.common import DATA_ROOT, load_meta
from plumbing import checkpoint as ckpt_io
from plumbing import run_folder
from plumbing.errors import UserError
from plumbing.run_folder import LOCK_NAME, take_lock

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=16",
    "--block_size=16",
    "--batch_size=4",
    "--device=cpu",
    "--compile=false",
    "--eval_iters=2",
    "--log_interval=1",
    "--max_iters=2",
    "--eval_interval=2",
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run of 2 steps: its folder (copy it before changing anything)."""
    out_dir = tmp_path_factory.mktemp("finished")
    train.main([*TINY, f"--out_dir={out_dir}"])
    return out_dir


def copy_of(folder, to):
    shutil.copytree(folder, to)
    return to


def files(folder):
    """{relative path: bytes} of every file under folder: what 'left intact' compares."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tiny_run(*flags, code=None):
    """`python train.py TINY flags` (or `python -c code TINY flags`) started in a new process."""
    script = ["-c", code] if code else ["train.py"]
    return subprocess.Popen(
        [sys.executable, *script, *TINY, *flags], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def logged_step(proc, step):
    """Read proc's stdout until it logs step `step`."""
    for line in proc.stdout:
        if line.startswith(f"step {step}/"):
            return
    raise AssertionError(f"the run ended before step {step}: {proc.stderr.read()}")


# -----------------------------------------------------------------------------
# one run per folder


def test_of_two_runs_started_at_once_in_one_folder_one_is_refused_naming_the_other(tmp_path, capsys):
    """Two `python train.py` started together on one new out_dir: one takes the folder, the other stops in
    one line, status 1, naming the first one's pid, host and command; a third (even with --resume) is refused
    the same while the first trains, and the refused runs write nothing; SIGTERM stops the first, which
    removes its lock file."""
    out_dir = tmp_path / "busy"
    flags = [f"--out_dir={out_dir}", "--max_iters=100000"]
    both = [tiny_run(*flags), tiny_run(*flags)]
    try:
        deadline = time.monotonic() + 60
        while all(proc.poll() is None for proc in both) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(proc.poll() is not None for proc in both), "both runs train in one folder"
        refused, first = sorted(both, key=lambda proc: proc.poll() is None)
        out, err = refused.communicate(timeout=60)
        holder = f"pid {first.pid} on {socket.gethostname()}, started "
        assert refused.returncode == 1 and out == "" and err.count("\n") == 1, (out, err)
        assert err.startswith(f"train.py: error: {out_dir} is in use by another run ({holder}"), err
        assert "python train.py" in err, err
        logged_step(first, 1)
        before = files(out_dir)
        for extra in ([], ["--resume"]):
            err = train_error_line(capsys, [*TINY, *flags, *extra], status=1)
            assert f"{out_dir} is in use by another run ({holder}" in err, err
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=120)
    finally:
        for proc in both:
            proc.kill()
    assert first.returncode == 143, stderr
    assert not (out_dir / LOCK_NAME).exists()
    assert set(files(out_dir)) <= set(before) | {"ckpt.pt", "best.pt"}  # nothing of the refused runs


@pytest.mark.skipif(run_folder.fcntl is None, reason="no flock here (Windows): no folder is locked")
def test_a_run_refused_just_after_the_lock_was_taken_names_its_holder(tmp_path):
    """The holder writes its line just after it takes the lock: a run refused in between waits for the line
    (briefly) and quotes it, not "one that has just started"; a line never written: said so in a second."""
    path = tmp_path / LOCK_NAME
    holder = take_lock(path)  # this process holds it; its line is now replaced by an empty file, then written
    os.ftruncate(holder, 0)
    os.lseek(holder, 0, os.SEEK_SET)
    late = threading.Timer(0.2, os.write, (holder, b"pid 1 on host, started now: python train.py\n"))
    late.start()
    with pytest.raises(
        UserError, match=r"in use by another run \(pid 1 on host, started now: python train.py\)"
    ):
        take_lock(path)
    late.join()
    os.ftruncate(holder, 0)  # a holder that never writes: the refusal still comes, within a second or so
    began = time.monotonic()
    with pytest.raises(UserError, match="one that has just started"):
        take_lock(path)
    assert time.monotonic() - began < 5
    os.close(holder)


SLOW_STEPS = """
import sys, time, train
from torch.optim.optimizer import register_optimizer_step_post_hook
register_optimizer_step_post_hook(lambda *args: time.sleep(0.3))  # time to kill it mid-run
train.main(sys.argv[1:])
"""


def test_after_kill_9_the_same_command_with_resume_takes_the_folder_and_continues(tmp_path):
    """A run killed with SIGKILL mid-run leaves its lock file but not the lock (the kernel lets go of a dead
    process's): `python train.py` with the same flags and --resume, no other, takes the folder and finishes
    the run from its checkpoint."""
    out_dir = tmp_path / "killed"
    flags = [f"--out_dir={out_dir}", "--max_iters=8", "--eval_interval=2"]
    proc = tiny_run(*flags, code=SLOW_STEPS)
    try:
        logged_step(proc, 3)  # step 2's checkpoint written
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and (out_dir / LOCK_NAME).is_file()
    killed = ckpt_io.load_checkpoint(out_dir / "ckpt.pt")
    assert 2 <= killed["iter_num"] < 8 and not ckpt_io.run_finished(killed)
    resumed = tiny_run(*flags, "--resume")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0 and "in use" not in err, (out, err)
    assert ckpt_io.run_finished(ckpt_io.load_checkpoint(out_dir / "ckpt.pt"))
    assert not (out_dir / LOCK_NAME).exists()


# -----------------------------------------------------------------------------
# a run is never replaced without asking; finished means finished


def test_a_finished_run_is_not_overwritten_and_overwrite_starts_again(tmp_path, capsys, finished):
    """The same command again in a folder holding a finished run is refused in one line giving both ways out,
    best.pt byte for byte as it was; --overwrite starts again and replaces the run."""
    out_dir = copy_of(finished, tmp_path / "run")
    before = files(out_dir)
    err = train_error_line(capsys, [*TINY, f"--out_dir={out_dir}"], status=1)
    assert err == (
        f"train.py: error: {out_dir} holds a finished run (step 2 of 2): --resume with a larger "
        "--max_iters trains it further, --overwrite starts again and replaces it (or give another "
        "--out_dir)"
    )
    assert files(out_dir) == before
    result = train.main([*TINY, f"--out_dir={out_dir}", "--overwrite", "--max_iters=1", "--eval_interval=1"])
    assert f"note: --overwrite: {out_dir} holds a finished run (step 2 of 2)" in capsys.readouterr().out
    assert result["iter_num"] == 1 and ckpt_io.load_checkpoint(out_dir / "ckpt.pt")["iter_num"] == 1
    assert files(out_dir)["best.pt"] != before["best.pt"]


def test_a_checkpoint_records_whether_its_run_finished(tmp_path, finished):
    """`finished` is True at max_iters, False at a step before it (where a stop or crash leaves a run); files
    written before the key are judged by iter_num against max_iters (run_finished, what the study asks)."""
    ckpt = ckpt_io.load_checkpoint(finished / "ckpt.pt")
    assert ckpt["finished"] is True and ckpt_io.run_finished(ckpt)
    assert ckpt_io.load_checkpoint(finished / "best.pt")["finished"] is False  # step 0's
    old = {key: value for key, value in ckpt.items() if key != "finished"}
    assert ckpt_io.run_finished(old) and not ckpt_io.run_finished(old | {"iter_num": 1})
    assert not ckpt_io.run_finished(
        {"model": {}, "model_config": {}}
    )  # says nothing: not trusted as finished


def test_a_checkpoint_file_given_to_init_from_is_taken_for_its_run(tmp_path, finished):
    """--init_from=out/x/ckpt.pt starts from that file, and its default out_dir is beside the run's folder."""
    source = copy_of(finished, tmp_path / "source")
    result = train.main(
        [
            "--init_from",
            str(source / "ckpt.pt"),
            "--block_size=32",
            "--max_iters=0",
            "--device=cpu",
            "--eval_iters=1",
            "--batch_size=2",
        ]
    )
    assert Path(result["checkpoint"]) == tmp_path / "source_ctx32_plain" / "ckpt.pt"


# -----------------------------------------------------------------------------
# one line for each bad input, files intact


class Shell:
    """Unpickled, it would run a shell command: what a malicious checkpoint carries."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def spoil(path, kind, marker):
    """Rewrite the checkpoint at path in one of the ways a hostile user would."""
    ckpt = ckpt_io.load_checkpoint(path)
    if kind == "no meta":
        del ckpt["meta"]
    elif kind == "no vocabulary":
        del ckpt["meta"]["chars"]
    elif kind == "weights that do not fit":
        ckpt["model"]["lm_head.weight"] = torch.zeros(65, 8)
        ckpt["model"]["extra.weight"] = torch.zeros(1)
        del ckpt["model"]["transformer.h.0.mlp.c_fc.weight"]
    elif kind == "malicious":
        ckpt["meta"] = Shell(marker)
    torch.save(ckpt, path)


@pytest.mark.parametrize(
    "kind, words",
    [
        ("no meta", "ckpt.pt: not a usable checkpoint (KeyError: 'meta')"),
        ("no vocabulary", "ckpt.pt: not a usable checkpoint (ValueError: a char tokenizer needs chars"),
        (
            "weights that do not fit",
            "ckpt.pt: its GPT state does not fit (missing transformer.h.0.mlp.c_fc.weight; "
            "unexpected extra.weight; mis-shaped lm_head.weight (65, 8) where the model "
            "has (65, 16))",
        ),
        (
            "malicious",
            f"ckpt.pt: not a usable checkpoint (UnpicklingError: Trying to load unsupported GLOBAL "
            f"{os.system.__module__}.system",
        ),
    ],
)
@pytest.mark.parametrize("how", ["--resume", "--init_from"])
def test_a_checkpoint_that_cannot_be_used_is_one_line(tmp_path, capsys, finished, kind, words, how):
    """Resuming, or starting from, a checkpoint without meta or vocabulary, with weights that do not fit
    (named), or pickling a function (named, and never run; no hint to load it with weights_only=False): one
    line, exit 1."""
    out_dir = copy_of(finished, tmp_path / "run")
    (out_dir / "best.pt").unlink()  # --init_from reads best.pt first: both read ckpt.pt here
    spoil(out_dir / "ckpt.pt", kind, tmp_path / "ran")
    before = files(tmp_path)
    flags = (
        [f"--out_dir={out_dir}", "--resume"]
        if how == "--resume"
        else [f"--init_from={out_dir}", f"--out_dir={tmp_path / 'new'}"]
    )
    status = 2 if how == "--init_from" and kind == "malicious" else 1  # read with the flags: a flag's value
    err = train_error_line(capsys, [*TINY, *flags], status=status)
    assert words in err and "weights_only=False" not in err, err
    assert files(tmp_path) == before and not (tmp_path / "ran").exists() and not (tmp_path / "new").exists()


@pytest.fixture
def dataset():
    """A dataset folder data/<name> written by hand (train.bin, val.bin, meta.json of the char vocabulary),
    for the test to spoil; removed after it."""
    name = f"test_run_folder_{os.getpid()}"
    folder = DATA_ROOT / name
    folder.mkdir()
    meta = load_meta(DATA_ROOT / "shakespeare_char")
    ids = (np.arange(200) % meta["vocab_size"]).astype(np.uint16)
    for split in ("train", "val"):
        ids.tofile(folder / f"{split}.bin")
    (folder / "meta.json").write_text(json.dumps({**meta, "train_tokens": 200, "val_tokens": 200}))
    yield name, folder
    shutil.rmtree(folder)


@pytest.mark.parametrize(
    "kind, status, words",
    [
        ("empty out_dir", 2, "--out_dir is empty (an unset shell variable?): give a folder"),
        ("checkpoint for out_dir", 2, "is a file: give the folder that holds the run, --out_dir="),
        ("resume and overwrite", 2, "--resume continues the run in out_dir and --overwrite replaces it"),
        ("split shorter than block_size", 1, "block_size"),  # data/common.py's words, checked there
        ("bin file disagreeing with meta.json", 1, "meta.json"),
        ("token id beyond the vocabulary", 1, "token id 300"),
    ],
)
def test_a_bad_flag_or_dataset_is_one_line(tmp_path, capsys, finished, dataset, kind, status, words):
    """An empty --out_dir (an unset shell variable), a checkpoint file as --out_dir, --resume with
    --overwrite, a split shorter than block_size, a .bin file that disagrees with meta.json, a token id past
    the vocabulary: one line, before any training, and the run folder and the dataset as they were."""
    name, data_dir = dataset
    out_dir = copy_of(finished, tmp_path / "run")
    flags = {
        "empty out_dir": ["--out_dir="],
        "checkpoint for out_dir": [f"--out_dir={out_dir / 'ckpt.pt'}", "--resume"],
        "resume and overwrite": [f"--out_dir={out_dir}", "--resume", "--overwrite"],
    }.get(kind)
    if flags is None:  # a dataset spoiled, a new folder
        flags = [f"--dataset={name}", f"--out_dir={tmp_path / 'new'}"]
        if kind == "split shorter than block_size":
            np.arange(10, dtype=np.uint16).tofile(data_dir / "val.bin")
            meta = json.loads((data_dir / "meta.json").read_text())
            (data_dir / "meta.json").write_text(json.dumps(meta | {"val_tokens": 10}))
        elif kind == "bin file disagreeing with meta.json":
            np.arange(50, dtype=np.uint16).tofile(data_dir / "train.bin")
        else:  # the vocabulary has 65 ids
            ids = np.fromfile(data_dir / "train.bin", dtype=np.uint16)
            ids[100] = 300
            ids.tofile(data_dir / "train.bin")
    before, data_before = files(tmp_path), files(data_dir)
    err = train_error_line(capsys, [*TINY, *flags], status=status)
    assert words in err, err
    assert files(tmp_path) == before and files(data_dir) == data_before and not (tmp_path / "new").exists()


@pytest.mark.parametrize("name", ["ckpt.pt", "best.pt"])
@pytest.mark.parametrize("how", ["new run", "--resume", "--overwrite"])
def test_a_folder_named_like_a_checkpoint_is_refused_before_training(tmp_path, capsys, name, how):
    """A folder called ckpt.pt or best.pt in out_dir, which no checkpoint write could replace: every run there
    (a new one, --resume, --overwrite) is refused in one line naming it, exit 1, before any step, and the
    folder is left as it was (no lock, no checkpoint beside it)."""
    out_dir = tmp_path / "run"
    (out_dir / name).mkdir(parents=True)
    (out_dir / name / "mine.txt").write_text("mine")
    flags = {"new run": [], "--resume": ["--resume"], "--overwrite": ["--overwrite"]}[how]
    err = train_error_line(capsys, [*TINY, f"--out_dir={out_dir}", *flags], status=1)
    assert err == (
        f"train.py: error: {out_dir / name} is a folder, not a checkpoint: move it away or give another "
        "--out_dir"
    )
    assert files(out_dir) == {f"{name}/mine.txt": b"mine"} and sorted(os.listdir(out_dir)) == [name]


@pytest.mark.parametrize("kind", ["/dev/null", "a named pipe"])
def test_an_out_dir_that_is_no_folder_is_one_line_naming_it_a_file(tmp_path, capsys, kind):
    """--out_dir naming something that exists and is not a folder (a device, a pipe) is refused as a file,
    exit 2, like a checkpoint file given for its folder, not as a folder train.py cannot write."""
    path = tmp_path / "pipe" if kind == "a named pipe" else Path(kind)
    if kind == "a named pipe":
        os.mkfifo(path)
    err = train_error_line(capsys, [*TINY, f"--out_dir={path}"], status=2)
    assert err == f"train.py: error: --out_dir={path} is a file: give a folder for the run"


def test_python_train_py_errors_are_one_line_without_a_traceback(tmp_path, finished):
    """The same through `python train.py`, as a user runs it: an empty --out_dir, a folder holding a finished
    run, and a malicious checkpoint are one line on stderr, a non-zero exit, no traceback; nothing is
    written."""
    out_dir = copy_of(finished, tmp_path / "run")
    malicious = copy_of(finished, tmp_path / "malicious")
    spoil(malicious / "ckpt.pt", "malicious", tmp_path / "ran")
    before = files(tmp_path)
    for flags, status in (
        (["--out_dir="], 2),
        ([f"--out_dir={out_dir}"], 1),
        ([f"--out_dir={malicious}", "--resume"], 1),
    ):
        done = subprocess.run(
            [sys.executable, "train.py", *TINY, *flags],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == status and done.stdout == "", (flags, done.stdout, done.stderr)
        assert done.stderr.startswith("train.py: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert files(tmp_path) == before and not (tmp_path / "ran").exists()

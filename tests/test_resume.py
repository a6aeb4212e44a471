"""Never lose work: exact resume, safe checkpoints, Ctrl-C / SIGTERM, NaN stops, refused resumes.

Tiny models on CPU through train.main or `python train.py` in a fresh process; no mocks.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import signalled_in_the_first_evaluation, train_error_line

import train
from data.common import DATA_ROOT, load_meta
from data.writing import write_dataset
from model import GPT
from plumbing import checkpoint as ckpt_io
from plumbing import distributed, resume
from plumbing.run_folder import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=16",
    "--batch_size=4",
    "--device=cpu",
    "--compile=false",
    "--eval_iters=2",
    "--log_interval=1",
]
# dropout > 0, so the resumed run must restore torch's RNG to draw the same masks; lr_decay_iters fixed, so
# that the schedule does not move with max_iters (a resumed run may be extended)
RESUMABLE = [
    *TINY,
    "--dropout=0.1",
    "--learning_rate=1e-2",
    "--min_lr=1e-3",
    "--warmup_iters=2",
    "--lr_decay_iters=40",
    "--eval_interval=2",
]
# a fresh process: one intra-op thread, as the suite's (conftest.py), so float sums run in the same order
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def train_in_fresh_process(*flags):
    """train.main(flags) in a new Python process -> its summary
    (losses and evals, floats exact through JSON)."""
    code = (
        "import json, sys, train; r = train.main(sys.argv[1:]); "
        "print('SUMMARY ' + json.dumps({'losses': list(r['losses'].items()), 'evals': r['evals']}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *flags], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.split("SUMMARY ", 1)[1])
    return {int(step): loss for step, loss in summary["losses"]}, summary["evals"], done.stdout


def training_until_step(step, *flags):
    """`python train.py flags` in a new process, once it has logged step `step`
    (its stdout read up to there)."""
    proc = subprocess.Popen(
        [sys.executable, "train.py", *flags],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:
        if line.startswith(f"step {step}/"):
            break
    return proc


def same(a, b):
    """Equal, tensors bit for bit, through nested dicts and lists."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def checkpoint(out_dir, name="ckpt.pt"):
    return ckpt_io.load_checkpoint(Path(out_dir) / name)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """8 steps in one go: the run that interrupted ones must reproduce."""
    out_dir = tmp_path_factory.mktemp("straight")
    return train.main([*RESUMABLE, "--max_iters=8", f"--out_dir={out_dir}"]), out_dir


# -----------------------------------------------------------------------------
# exact resume


def test_resumed_run_is_bit_identical_to_a_straight_run(tmp_path, straight):
    """4 steps, then a fresh process resuming for 4 more, give the 8 losses, evaluations and final weights and
    optimizer state of 8 steps in one go, bit for bit (dropout on: the RNG states are restored too)."""
    (whole, whole_dir), out_dir = straight, tmp_path / "halves"
    first = train.main([*RESUMABLE, "--max_iters=4", f"--out_dir={out_dir}"])
    losses, evals, log = train_in_fresh_process(
        *RESUMABLE, "--max_iters=8", f"--out_dir={out_dir}", "--resume"
    )
    assert "resuming" in log and "at step 4" in log
    assert {**first["losses"], **losses} == whole["losses"]  # every step's loss, as floats: bit-identical
    assert (
        first["evals"] + evals == whole["evals"]
    )  # the eval stream continues too (step 4 is not re-evaluated)
    resumed, reference = checkpoint(out_dir), checkpoint(whole_dir)
    for key in ("iter_num", "model", "optimizer", "best_val_loss", "best_iter", "sampler", "rng"):
        assert same(resumed[key], reference[key]), key


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    """python, numpy and torch generators, saved with the checkpoint and restored,
    draw the same numbers again."""
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.standard_normal()  # numpy keeps a cached gaussian: part of the state
    path = ckpt_io.save_checkpoint(
        {"model": {}, "model_config": {}, "rng": resume.rng_state("cpu")}, tmp_path / "c.pt"
    )
    draws = [random.random(), np.random.standard_normal(), torch.rand(3)]
    resume.set_rng_state(ckpt_io.load_checkpoint(path)["rng"], "cpu")
    assert same([random.random(), np.random.standard_normal(), torch.rand(3)], draws)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_finishes_the_step_saves_and_the_run_resumes_exactly(tmp_path, straight, sig):
    """SIGINT / SIGTERM: the step in progress ends, ckpt.pt is written at that step, recorded as unfinished,
    and the process prints the command that resumes and exits 128 + the signal's number (130, 143: what a
    shell reports, so a caller never takes a stopped run for a finished one); resuming gives the straight
    run's losses and weights."""
    out_dir = tmp_path / "stopped"
    flags = [*RESUMABLE, f"--out_dir={out_dir}"]
    proc = training_until_step(2, *flags, "--max_iters=100000")
    try:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err
    stopped = re.search(rf"stopped by {sig.name} after step (\d+): saved (\S+); to continue, run (.+)", out)
    assert stopped, out
    step = int(stopped.group(1))
    assert stopped.group(2) == str(out_dir / "ckpt.pt") and stopped.group(3).endswith(" --resume")
    assert stopped.group(3).startswith("python train.py ") and f"--out_dir={out_dir}" in stopped.group(3)
    assert checkpoint(out_dir)["iter_num"] == step >= 2 and checkpoint(out_dir)["finished"] is False
    assert not (out_dir / LOCK_NAME).exists()  # the folder is free again
    if step + 2 > 8:
        pytest.skip(f"the signal landed late (step {step}), past the straight run")
    whole, whole_dir = straight
    resumed = train.main([*flags, "--max_iters=8", "--resume"])
    assert resumed["losses"] == {s: whole["losses"][s] for s in range(step + 1, 9)}
    assert same(checkpoint(out_dir)["model"], checkpoint(whole_dir)["model"])
    assert ckpt_io.run_finished(checkpoint(out_dir)) and ckpt_io.run_finished(checkpoint(whole_dir))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_an_evaluation_stops_it_and_saves_the_step(tmp_path, sig):
    """An evaluation can take minutes (200 batches of each split on a CPU): a stop request during one ends
    it within a batch, writes the step's checkpoint and exits 128 + the signal, as a request between steps
    does. The evaluation here (step 0's) would take minutes whole; the timeout leaves it seconds."""
    out_dir = tmp_path / "stopped"
    flags = [*RESUMABLE, f"--out_dir={out_dir}", "--max_iters=100000", "--eval_iters=100000"]
    proc, out, err = signalled_in_the_first_evaluation([sys.executable, "train.py", *flags], sig, ENV, 60)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {sig.name} after step 0: saved {out_dir / 'ckpt.pt'}" in out, out
    assert checkpoint(out_dir)["iter_num"] == 0 and not (out_dir / LOCK_NAME).exists()


def test_a_step_whose_evaluation_a_signal_cut_is_evaluated_when_resumed(tmp_path):
    """A Ctrl-C in the last step's evaluation: the checkpoint is the last step's but not finished (its
    evaluation is missing), and --resume evaluates that step, then ends finished."""
    out_dir, steps, sent = tmp_path / "cut", [], []
    flags = [*RESUMABLE, f"--out_dir={out_dir}", "--max_iters=4"]

    def ctrl_c_in_the_fourth_steps_evaluation(module, args, output):
        if isinstance(module, GPT) and module.training:
            steps.append(1)
        elif isinstance(module, GPT) and len(steps) == 4 and not sent:
            sent.append(signal.raise_signal(signal.SIGINT))

    handle = torch.nn.modules.module.register_module_forward_hook(ctrl_c_in_the_fourth_steps_evaluation)
    try:
        stopped = train.main(flags)
    finally:
        handle.remove()
    assert stopped["stopped"] == "SIGINT" and [e["iter"] for e in stopped["evals"]] == [0, 2]
    saved = checkpoint(out_dir)
    assert saved["iter_num"] == 4 and not ckpt_io.run_finished(saved)
    resumed = train.main([*flags, "--resume"])
    assert [e["iter"] for e in resumed["evals"]] == [4] and resumed["stopped"] is None
    assert ckpt_io.run_finished(checkpoint(out_dir))


def test_a_second_ctrl_c_while_stopping_exits_130_without_a_traceback(tmp_path):
    """Two Ctrl-C in a row: the first asks for a checkpoint and a stop, the second (in the middle of that, or
    after) stops at once: exit status 130, at most one line on stderr, no traceback, no lock left behind."""
    out_dir = tmp_path / "twice"
    proc = training_until_step(2, *RESUMABLE, f"--out_dir={out_dir}", "--max_iters=100000")
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)  # not at once: two pending SIGINTs reach Python as one
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    assert err.startswith("train.py: interrupted: stopped at once") or err == "", err
    assert not (out_dir / LOCK_NAME).exists()
    ckpt_io.load_checkpoint(out_dir / "ckpt.pt")  # whole


# -----------------------------------------------------------------------------
# checkpoint files


WRITER = """
import itertools, sys, torch
from plumbing import checkpoint as ckpt_io
from plumbing.run_folder import LOCK_NAME
path = sys.argv[1]
ckpt_io.save_checkpoint({"model": {"w": torch.zeros(4)}, "model_config": {"version": 0}}, path)
for version in itertools.count(1):  # big files (32 MB), so that a kill lands in the middle of one
    weights = {"w": torch.full((1 << 23,), float(version))}
    ckpt_io.save_checkpoint({"model": weights, "model_config": {"version": version}}, path)
"""


@pytest.mark.parametrize("delay", [0.0, 0.05])
def test_kill_9_while_writing_leaves_the_previous_checkpoint_whole(tmp_path, delay):
    """A process killed with SIGKILL in the middle of save_checkpoint leaves a complete ckpt.pt (the previous
    version) and only a hidden temporary file, which the next run removes."""
    path = tmp_path / "ckpt.pt"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, env=ENV)
    try:
        deadline = time.monotonic() + 120
        # wait until one version exists and the next is being written
        while not (path.is_file() and list(tmp_path.glob(".ckpt.pt.*.tmp"))):
            assert time.monotonic() < deadline and writer.poll() is None, (
                "the writer never started a second file"
            )
            time.sleep(0.001)
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=60)
    finally:
        writer.kill()
    assert writer.returncode == -signal.SIGKILL
    ckpt = ckpt_io.load_checkpoint(path)
    version = ckpt["model_config"]["version"]
    assert torch.all(ckpt["model"]["w"] == float(version))  # whole: every value of one version
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["ckpt.pt"]
    ckpt_io.remove_unfinished_writes(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_ckpt_follows_the_latest_evaluation_and_best_keeps_the_best(tmp_path):
    """ckpt.pt is rewritten at every evaluation; best.pt only when val improves (here: step 0, before a
    learning rate of 1 wrecks the model); both have the same format."""
    result = train.main(
        [
            *TINY,
            f"--out_dir={tmp_path}",
            "--max_iters=4",
            "--eval_interval=2",
            "--learning_rate=1.0",
            "--min_lr=0",
            "--warmup_iters=0",
        ]
    )
    latest, best = checkpoint(tmp_path), checkpoint(tmp_path, "best.pt")
    assert [e["iter"] for e in result["evals"]] == [0, 2, 4] and result["evals"][-1]["val"] > result["evals"][
        0
    ]["val"]
    assert latest["iter_num"] == 4 and best["iter_num"] == 0 == result["best_iter"] == latest["best_iter"]
    assert best["best_val_loss"] == result["evals"][0]["val"] == latest["best_val_loss"]
    assert latest.keys() == best.keys()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "ckpt.pt"]


def test_nan_loss_stops_with_step_and_last_good_loss_and_keeps_the_checkpoint(tmp_path, capsys):
    """A learning rate of 1e30 turns the weights to inf after one step: the NaN loss of step 2 stops the run
    with one line naming the step, the last good loss and the kept checkpoint, before the evaluation at step 2
    would have overwritten ckpt.pt."""
    err = train_error_line(
        capsys,
        [
            *TINY,
            f"--out_dir={tmp_path}",
            "--max_iters=10",
            "--eval_interval=2",
            "--learning_rate=1e30",
            "--min_lr=0",
            "--warmup_iters=0",
        ],
        status=1,
    )
    assert re.search(
        r"loss is nan at step 2: training stopped \(last good loss \d\.\d{4} at step 1\)", err
    ), err
    assert f"{tmp_path / 'ckpt.pt'} (step 0) was kept" in err
    ckpt = checkpoint(tmp_path)
    assert ckpt["iter_num"] == 0 and all(torch.isfinite(w).all() for w in ckpt["model"].values())


# -----------------------------------------------------------------------------
# what a resume refuses, and what it allows


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A tiny run of 2 steps to resume from, with its flags."""
    out_dir = tmp_path_factory.mktemp("saved")
    flags = [*TINY, f"--out_dir={out_dir}", "--max_iters=2", "--eval_interval=2"]
    train.main(flags)
    return flags, out_dir


@pytest.mark.parametrize(
    "flag, words",
    [
        ("--pos=alibi", "--pos=alibi but the checkpoint has rope"),
        ("--n_layer=1", "--n_layer=1 but the checkpoint has 2"),
        ("--n_embd=64", "--n_embd=64 but the checkpoint has 32"),
        ("--block_size=32", "--block_size=32 but the checkpoint has 16"),
    ],
)
def test_resume_with_another_pos_or_shape_is_refused(capsys, saved_run, flag, words):
    """Another position scheme or model shape than the checkpoint's: a one-line refusal naming both values."""
    flags, out_dir = saved_run
    err = train_error_line(capsys, [*flags, "--resume", flag], status=1)
    assert f"refusing to resume {out_dir / 'ckpt.pt'}: {words}" in err, err


def test_resume_with_changed_training_settings_is_allowed_and_logged(tmp_path, saved_run, capsys):
    """max_iters, learning_rate (and dropout) may change on resume; the log lists each change."""
    flags, out_dir = saved_run
    resumed_dir = tmp_path / "copy"
    resumed_dir.mkdir()
    (resumed_dir / "ckpt.pt").write_bytes((out_dir / "ckpt.pt").read_bytes())
    result = train.main(
        [
            *flags,
            f"--out_dir={resumed_dir}",
            "--resume",
            "--max_iters=3",
            "--learning_rate=5e-4",
            "--dropout=0.1",
        ]
    )
    out = capsys.readouterr().out
    assert result["iter_num"] == 3 and list(result["losses"]) == [3]
    changed = re.search(r"resuming \S+ at step 2 .*; changed: (.+)", out).group(1)
    for change in ("dropout 0.0 -> 0.1", "max_iters 2 -> 3", "learning_rate 0.001 -> 0.0005"):
        assert change in changed, changed
    assert checkpoint(resumed_dir)["train_config"]["learning_rate"] == 5e-4


@pytest.fixture
def reversed_vocabulary_dataset():
    """data/<name>: Tiny Shakespeare's 65 characters in reverse id order (same vocab_size, other meaning)."""
    name = f"test_reversed_{os.getpid()}"
    meta = load_meta(DATA_ROOT / "shakespeare_char")
    ids = np.arange(200) % meta["vocab_size"]
    write_dataset(
        DATA_ROOT / name,
        ids,
        ids,
        {"tokenizer": "char", "vocab_size": meta["vocab_size"], "chars": meta["chars"][::-1]},
    )
    yield name
    for path in (DATA_ROOT / name).iterdir():
        path.unlink()
    (DATA_ROOT / name).rmdir()


def test_resume_on_a_dataset_with_another_vocabulary_is_refused(
    capsys, saved_run, reversed_vocabulary_dataset
):
    """The same vocab_size with other characters would silently change what every token means: refused."""
    flags, _ = saved_run
    err = train_error_line(capsys, [*flags, "--resume", f"--dataset={reversed_vocabulary_dataset}"], status=1)
    assert "trained on a char vocabulary of 65 tokens" in err and "(same size, other characters)" in err, err


def bad_checkpoint(out_dir, kind):
    """out_dir/ckpt.pt made unusable in one way."""
    path = out_dir / "ckpt.pt"
    ckpt = ckpt_io.load_checkpoint(path)
    if kind == "pickled object":
        torch.save(
            {**ckpt, "meta": distributed.Processes()}, path
        )  # a dataclass instance: unpickling runs its module
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif kind == "other shape weights":  # the config says one shape, the weights are another's
        ckpt["model"]["lm_head.weight"] = torch.zeros(65, 16)
        torch.save(ckpt, path)
    elif kind == "sampling only":  # the keys sample.py needs, but no training state
        torch.save({key: ckpt[key] for key in ("model", "model_config", "meta")}, path)
    return path


@pytest.mark.parametrize(
    "kind, words",
    [
        ("pickled object", "(UnpicklingError: Unsupported global: GLOBAL plumbing.distributed.Processes"),
        ("truncated", "ckpt.pt: not a usable checkpoint (RuntimeError: "),
        (
            "other shape weights",
            "its GPT state does not fit (mis-shaped lm_head.weight (65, 16) where the model has (65, 32))",
        ),
        ("sampling only", "can be sampled from but not resumed"),
    ],
)
def test_resume_from_a_bad_checkpoint_is_a_one_line_error(tmp_path, capsys, saved_run, kind, words):
    """A checkpoint carrying a pickled object, cut short, with weights of another shape, or without training
    state: resuming says what is wrong in one line, and runs no code from the file."""
    flags, out_dir = saved_run
    copy = tmp_path / "bad"
    copy.mkdir()
    (copy / "ckpt.pt").write_bytes((out_dir / "ckpt.pt").read_bytes())
    path = bad_checkpoint(copy, kind)
    err = train_error_line(capsys, [*flags, f"--out_dir={copy}", "--resume"], status=1)
    assert str(path) in err and words in err, err


def test_resume_without_a_checkpoint_is_a_one_line_error(tmp_path, capsys):
    """--resume on an empty out_dir says there is nothing to resume and how to start instead."""
    err = train_error_line(capsys, [*TINY, f"--out_dir={tmp_path}", "--resume"], status=1)
    assert f"{tmp_path / 'ckpt.pt'} does not exist; start without --resume" in err

"""Helpers shared by the test files (pytest puts this folder on sys.path)."""

import os
import resource
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest

import train
from plumbing.errors import UserError
from plumbing.tokenizers import get_tokenizer


def error_line(capsys, script, argv, status):
    """script.main(argv) exits with `status` (2: a bad flag or value, 1: a run that cannot start or go on) and
    one line on stderr, `NAME.py: error: ...` (or its PROG's), never argparse's usage block; -> that line."""
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    assert exit_info.value.code == status
    err = capsys.readouterr().err.strip()
    prog = getattr(script, "PROG", f"{script.__name__.rsplit('.', 1)[-1]}.py")  # a `python -m` one's PROG
    assert err.startswith(f"{prog}: error: ") and "\n" not in err and "usage:" not in err, err
    return err


def train_error_line(capsys, argv, status):
    return error_line(capsys, train, argv, status)


def finetune_error_line(capsys, argv, status):
    """error_line of python -m lab.finetune (train.py's run with S²-Attn and LoRA)."""
    from lab.finetune import __main__ as finetune  # here: the core's tests run without lab/

    return error_line(capsys, finetune, argv, status)


@cache
def gpt2_unavailable_reason():
    """Why tiktoken's GPT-2 BPE can't be loaded here (tried once), or None when it can."""
    try:
        get_tokenizer({"tokenizer": "gpt2"})
    except UserError as e:
        return f"GPT-2 BPE unavailable: {e}"
    return None


def skip_without_gpt2():
    reason = gpt2_unavailable_reason()
    if reason:
        pytest.skip(reason)


# A two-step run of a one-layer model (block_size TINY_BLOCK): the checkpoints several tests sample from
TINY_BLOCK = 16
TINY_RUN = [
    *("--n_layer=1", "--n_head=2", "--n_embd=16", f"--block_size={TINY_BLOCK}", "--batch_size=4"),
    *("--max_iters=2", "--eval_interval=2", "--eval_iters=1", "--log_interval=1", "--device=cpu"),
    "--compile=false",
]


def signalled_in_the_first_evaluation(command, sig, env, timeout):
    """command (a train.py run with an evaluation of minutes) from the repository root, sent sig once step 0's
    evaluation has begun. -> (the process, its stdout, its stderr), once it has ended (or been killed)."""
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[1], env=env, **pipes)
    try:
        for line in proc.stdout:
            if line.startswith("step 0: evaluating on"):
                break
        time.sleep(0.2)  # inside the evaluation
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc, out, err


def run_limited(limit, *args):
    """`python args...` from the repository root with at most `limit` bytes per file written (RLIMIT_FSIZE, a
    full disk as a script meets it: SIGXFSZ ignored, a write past it fails with EFBIG). -> CompletedProcess"""

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}
    root = Path(__file__).resolve().parents[1]
    pipes = dict(capture_output=True, text=True, timeout=120)
    return subprocess.run([sys.executable, *args], cwd=root, env=env, preexec_fn=limited, **pipes)

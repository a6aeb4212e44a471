"""Ctrl-C stops every entry point quietly: SIGINT to the process group (as a terminal sends it, to the script
and any child it runs) once the script shows it is working ends it with status 130 and no traceback. A
process that dies of the signal itself (Python's exit for a Ctrl-C while the interpreter shuts down) is
what a shell also reports as 130, and counts as quiet when it printed nothing."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import TINY_RUN

import train
from positions import POS_SCHEMES

ROOT = Path(__file__).resolve().parents[1]
CK = "{ck}"  # the folder of five tiny checkpoints, one per scheme
# (name, command, what shows it is working: a line it prints, or None: a child process it started); train.py
# and sample.py have their own (tests/test_resume.py, tests/test_user_errors.py)
CASES = [
    ("eval_length", ["-m", "lab.eval_length", f"{CK}/rope", f"{CK}/alibi", "--lengths=1,2,4,8,64t,512t,2000t",
                     "--max_windows=100000", "--device=cpu"], "window"),
    ("bench", ["-m", "lab.perf.bench", "--device=cpu", "--pos=rope", "--n_layer=1", "--n_embd=32",
               "--n_head=2", "--matmul_size=64", "--train_steps=1", "--warmup_steps=0", "--gen_multiples",
               "1", "1024"],
     "trained rope"),
    ("lab.perf.ab", ["-m", "lab.perf.ab", "--against=HEAD", "--pos=rope", "--rounds=100"], "torch"),
    ("lab.demo.probe", ["-m", "lab.demo.probe", f"--checkpoints={CK}", "--windows=100000"], "pos=learned"),
    ("lab.demo.permutation", ["-m", "lab.demo.permutation", f"--checkpoints={CK}"], "pos=learned"),
    ("lab.demo.figures", ["-m", "lab.demo.figures", f"--checkpoints={CK}", "--out={tmp}/figures",
                      "--only=attention"], "models ready"),
    ("course grade", ["-m", "lab.course", "grade"], None),
    # the study once its train.py child prints its header: a child still importing torch prints a traceback
    ("study", ["-m", "lab.experiments.extrapolation", "--quick", "--out_root={tmp}/study", "--device=cpu"],
     "| pos=learned |"),
]  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ctrl_c")
    for pos in POS_SCHEMES:
        train.main([*TINY_RUN, f"--pos={pos}", f"--out_dir={root / pos}"])
    return root


def has_child(pid):
    try:
        return bool(Path(f"/proc/{pid}/task/{pid}/children").read_text().strip())
    except OSError:
        return False


def interrupt_when_working(process, working, lines):
    """Read the process's output; SIGINT its group at the first line holding `working` (None: once it has
    a child process, polled), then keep reading to the end."""
    if working is None:
        while process.poll() is None and not has_child(process.pid):
            time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)
    sent = working is None
    for line in process.stdout:
        lines.append(line)
        if not sent and working in line:
            os.killpg(process.pid, signal.SIGINT)
            lines.append("<SIGINT>\n")
            sent = True


@pytest.mark.skipif(sys.platform != "linux", reason="process groups and /proc: Linux")
def test_ctrl_c_stops_every_entry_point_with_status_130_and_no_traceback(checkpoints, tmp_path):
    """Every case runs at once (the whole test takes about as long as the slowest start); each must end with
    status 130 within a minute of the signal, its output free of any traceback or KeyboardInterrupt."""
    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    runs = []
    for name, command, working in CASES:
        args = [arg.format(ck=checkpoints, tmp=tmp_path) for arg in command]
        process = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, text=True, errors="replace",
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        lines = []
        reader = threading.Thread(target=interrupt_when_working, args=(process, working, lines))
        reader.start()
        runs.append((name, process, reader, lines))
    failures = []
    for name, process, reader, lines in runs:
        reader.join(timeout=120)
        try:
            status = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            status = "still running"
        output = "".join(lines)
        if status not in (130, -signal.SIGINT) or "Traceback" in output or "KeyboardInterrupt" in output:
            failures.append(f"{name}: status {status}\n{output[-1500:]}")
    assert not failures, "\n\n".join(failures)

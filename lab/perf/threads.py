"""train.py's speed on this machine idle, beside one busy process and beside three (`python -c "while True:
pass"`, started here and stopped however the measurement ends), for --threads=auto, 1 and every core: two
runs of each, alternated, of the default model for 60 steps in a temporary out_dir; the threads each run says
it took and its ms/iter over steps 21-40 and 41-60. Writes perf_threads.csv under --results, and under docs/
the block perf_threads of docs/perf.md.

    python -m lab.perf.threads            # about 6 minutes on 2 cores
    python -m lab.perf.threads --tables   # only the block, from the CSV: nothing measured
"""

import sys

if not __package__:  # `python lab/perf/threads.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.perf.threads`")


import os
import re
import statistics
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass

from lab.experiments.runs import ROOT, read_rows, run_python
from lab.outputs import check_outputs, write_rows
from lab.tables import fill_generated, markdown_table
from plumbing.cli import parse_flags
from plumbing.errors import one_line_errors

PROG = "python -m lab.perf.threads"
STATES = {0: "idle", 1: "one busy process", 3: "three busy processes"}  # busy processes: the machine's state
TRAIN = ["train.py", "--max_iters=60", "--log_interval=20", "--eval_interval=1000", "--eval_iters=1"]
COLUMNS = ("busy", "threads_flag", "rep", "threads_used", "ms_steps_21_40", "ms_steps_41_60")
FIGURES = re.compile(r"^threads: (\d+) of|^step [46]0/60 \|.*\| ([\d.]+) ms/iter", re.M)  # train.py's lines


@dataclass
class ThreadsConfig:
    results: str = "docs"  # folder of perf_threads.csv; docs: docs/perf.md's block too
    tables: bool = False  # only the block, from perf_threads.csv: nothing measured


@contextmanager
def busy(n):
    """n processes spinning a core each while the block runs, killed however it ends."""
    loops, spin = [], [sys.executable, "-c", "while True: pass"]
    try:
        time.sleep(5)  # the previous state's processes gone from the cores
        for _ in range(n):  # stderr: no traceback of theirs when Ctrl-C reaches them too
            loops.append(subprocess.Popen(spin, stderr=subprocess.DEVNULL))
        time.sleep(2)
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def train(threads):
    """[threads taken, ms/iter of steps 21-40, of 41-60] of one train.py run; its auto reads the machine."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}  # auto would keep it
    with tempfile.TemporaryDirectory() as out:
        args = [*TRAIN, "--compile=false", f"--threads={threads}", f"--out_dir={out}"]
        printed = run_python(args, stdout=subprocess.PIPE, text=True, env=env).stdout
    (used, _), *steps = FIGURES.findall(printed)
    return [int(used), *(float(ms) for _, ms in steps)]


def measure(cores):
    """COLUMNS' rows: per machine state, two rounds of one run per --threads value."""
    rows, flags = [], dict.fromkeys(["auto", "1", str(cores)])  # on one core, 1 once
    for n in STATES:
        with busy(n):
            rows += [[n, flag, rep, *train(flag)] for rep in (1, 2) for flag in flags]
    return rows


def render(rows):
    """A row per machine state, a column per --threads: the median ms/iter of the runs' windows (range)."""
    flags = list(dict.fromkeys(r["threads_flag"] for r in rows))
    head = ["machine", *({"auto": "auto"}.get(flag, f"{flag} thread{'s' * (flag != '1')}") for flag in flags)]
    table = []
    for n, state in STATES.items():
        table.append([state])
        for flag in flags:
            runs = [r for r in rows if (r["busy"], r["threads_flag"]) == (str(n), flag)]
            ms = [float(r[column]) for r in runs for column in COLUMNS[4:]]
            took = f", takes {'/'.join(sorted({r['threads_used'] for r in runs}))}" * (flag == "auto")
            table[-1].append(f"{statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f}){took}")
    return "ms/iter, median (range) of steps 21-40 and 41-60 of two runs:\n\n" + markdown_table(head, table)


def main(argv=None):
    with one_line_errors(PROG):
        cfg = ThreadsConfig(**parse_flags(argv, PROG, __doc__, [("measurement", ThreadsConfig, None)]))
        path = ROOT / cfg.results / "perf_threads.csv"
        check_outputs({"results": path})
        if not cfg.tables:
            write_rows("results", path, COLUMNS, measure(os.cpu_count() or 1))
        table = render(read_rows(path, COLUMNS, PROG))
        print(table)
        fill_generated(ROOT / cfg.results, {"perf_threads": table})
        return table


if __name__ == "__main__":
    with one_line_errors(PROG, errors=()):  # Ctrl-C while measuring: the busy processes stopped, status 130
        main()

"""Trained models for the demos, the figures and the study, made as the README tells a user (`python train.py
--pos=X ...` from the repository root), so the runs a user already made are used, not trained again: a
finished run reused, a stopped one continued, another run refused (the study's --retrain replaces it). And
what the studies share: lab/eval_length.py run on their checkpoints, their tables' mean ± sd and verdict
cells."""

import csv
import dataclasses
import io
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

from data.common import DATA_ROOT, dataset_dir
from lab.measure.paired import paired_cell, paired_difference, welch_difference
from plumbing.checkpoint import checkpoint_path, open_checkpoint, run_finished
from plumbing.cli import read_text
from plumbing.errors import Stopped, UserError
from plumbing.hardware import resolve_device

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DURATION = "1-2.5 minutes on 2 CPU cores"  # the README's time for `python train.py`
# train.py's own reading of its flags, defaults and --config (entry points never import each other): the
# settings each command will train with, one JSON line per command. A command starting `-m NAME` runs that
# module, which runs train.py with a training method: its Config (a train.TrainConfig) reads its own flags too
PLAN_CODE = (
    "import dataclasses, importlib, json, sys, train\n"
    "from plumbing.errors import one_line_errors\n"
    "for args in json.loads(sys.argv[1]):\n"
    "    module = args[:1] == ['-m'] and importlib.import_module(args[1] + '.__main__')\n"
    "    Config = module.Config if module else train.TrainConfig\n"
    "    with one_line_errors(Config.prog):\n"
    "        cfg, model = train.parse_args(args[2:] if module else args, Config)\n"
    "    print(json.dumps([dataclasses.asdict(cfg), dataclasses.asdict(model)]))\n"
)
# Settings of where and how a run ran, not what it trained, or that train.py fills in as it starts
NOT_COMPARED = ("out_dir", "resume", "overwrite", "device", "dtype", "compile", "grad_accum", "log_interval")
NOT_COMPARED += ("threads", "wandb", "wandb_project", "wandb_run_name", "vocab_size")
EXTRA_FLAGS = {"train": [], "resume": ["--resume"], "overwrite": ["--overwrite"]}  # train.py's, per action


@dataclasses.dataclass
class Plan:
    """What `python train.py *args` will train, and where."""

    args: list
    train_config: dict
    model_config: dict

    @property
    def out_dir(self):  # train.py fills in the default folder's {dataset} and {pos}
        t = self.train_config
        return t["out_dir"].format(dataset=t["dataset"], pos=self.model_config["pos"])

    program = property(lambda self: self.args[:2] if self.args[:1] == ["-m"] else ["train.py"])
    flags = property(lambda self: self.args[2:] if self.args[:1] == ["-m"] else self.args)
    command = property(lambda self: shlex.join(["python", *self.program, *self.flags]))

    def describe(self):
        """'a pos=rope model (4 layers x 128 dims, T = 64, 2000 steps)'"""
        m, t = self.model_config, self.train_config
        layers = f"{m['n_layer']} layer{'s' if m['n_layer'] > 1 else ''}"
        shape = f"{layers} x {m['n_embd']} dims, T = {m['block_size']}, {t['max_iters']} steps"
        return f"a pos={m['pos']} model ({shape})" + (f" from {t['init_from']}" if t.get("init_from") else "")


RUNNING = set()  # the child processes running now
# each child in a process group of its own: a terminal's Ctrl-C reaches it once, passed on from here
OWN_GROUP = dict(process_group=0) if os.name == "posix" else {}


@contextmanager
def signals_passed_on():
    """While active in the main thread, a SIGINT or SIGTERM to this process (Ctrl-C, kill PID, an IDE's stop
    button, Jupyter's interrupt) goes on to every child in RUNNING, where train.py saves and stops on it, then
    stops this one as Stopped (status 130 or 143) once they have ended, instead of leaving them to train on
    unseen."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def pass_on(signum, frame):
        for process in list(RUNNING):
            process.send_signal(signum)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_python(args, said="see its output above", **kwargs):
    """`python args...` from the repository root, its output shown; a failure is a UserError. -> the
    CompletedProcess (its stdout with stdout=PIPE)."""
    sys.stdout.flush()  # what we printed comes before the command's output
    args = [str(arg) for arg in args]
    command = [sys.executable, *args]
    with signals_passed_on(), subprocess.Popen(command, cwd=ROOT, **OWN_GROUP, **kwargs) as process:
        RUNNING.add(process)
        try:
            stdout, stderr = process.communicate()  # on Stopped, Popen's exit waits for the child to end
        finally:
            RUNNING.discard(process)
    if status := process.returncode:
        raise UserError(f"`{shlex.join(['python', *args])}` failed (exit status {status}); {said}")
    return subprocess.CompletedProcess(process.args, status, stdout, stderr)


def read_rows(path, columns, made_by, numbers=None, blank=()):
    """A CSV file's rows, as dicts, each with `columns`: a file that is missing, unreadable, without those
    columns or without rows, or a value in a column of `numbers` ({column: int or float}) that is not a finite
    number of that kind (empty only in a column of `blank`), is a one-line UserError naming the file (and the
    line) and `made_by`, the command that writes it."""
    where, make = f"{path}", f"`{made_by}` writes it"
    if not Path(path).is_file():
        raise UserError(f"{where}: no such file; {make}", 2)
    try:
        reader = csv.DictReader(io.StringIO(read_text(path, where), newline=""))
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as e:
        raise UserError(f"{where}: not a CSV file ({e}); {make}", 2) from None
    if missing := [c for c in columns if c not in (reader.fieldnames or ())]:
        raise UserError(f"{where}: no column {', '.join(missing)}, so not this table; {make}", 2)
    if not rows:
        raise UserError(f"{where}: a header and no rows; {make}", 2)
    for line, row in rows:
        for column, kind in (numbers or {}).items():
            if not is_number(row.get(column), kind, column in blank):
                empty = "" if column in blank else ", or is empty"
                what = f"an integer{empty}" if kind is int else f"a finite number{empty}"
                raise UserError(
                    f"{where}, line {line}: {column} is {row.get(column)!r}, not {what}; {make}", 2
                )
    return [row for _, row in rows]


def is_number(text, kind, may_be_empty=False):
    """Whether a CSV cell holds a number of `kind` (int, or float: finite), or is empty where it may be."""
    if text == "" and may_be_empty:
        return True
    try:
        return math.isfinite(kind(text))
    except (TypeError, ValueError):  # None: a short row; "abc"; "1.5" as an int
        return False


class Values(dict):
    """{seed (or another key): value} of one setting, with where they come from: `where` (the file and the
    setting) and `made_by` (the command that writes the file). A key it lacks is a one-line UserError."""

    def __init__(self, values, where, made_by):
        super().__init__(values)
        self.where, self.made_by = where, made_by

    def __missing__(self, key):
        raise UserError(f"{self.where}: no row of {key!r}; `{self.made_by}` rebuilds it", 2)

    def measured(self):
        """[value]: none is a one-line UserError."""
        if not self:
            raise UserError(f"{self.where}: no rows; `{self.made_by}` rebuilds it", 2)
        return [*self.values()]

    def mean(self):
        return statistics.fmean(self.measured())


def paired_sides(a, b, welch=False):
    """The lists an interval of a - b takes from two Values: the values of the seeds both hold (paired), or
    all of each (welch). A side, or (paired) the seeds both hold, under 2 is a one-line UserError naming the
    settings and the command that rebuilds their file."""
    for side in (a, b):
        if len(side) < 2:
            rows = f"{len(side)} row{'' if len(side) == 1 else 's'}"
            message = f"{side.where}: {rows}, and an interval needs 2 or more; `{side.made_by}` rebuilds it"
            raise UserError(message, 2)
    if welch:
        return [*a.values()], [*b.values()]
    keys = sorted(a.keys() & b.keys())
    if len(keys) < 2:
        both = f"{a.where} and {b.where}: {len(keys)} seed{'' if len(keys) == 1 else 's'} in both"
        raise UserError(f"{both}, and a paired interval needs 2 or more; `{a.made_by}` rebuilds them", 2)
    return [a[k] for k in keys], [b[k] for k in keys]


# the columns of lab/eval_length.py's CSV that pooled_cells and the studies' tables read, per --task
EVAL_COLUMNS = {
    "loss": ("checkpoint", "scaling", "block_size", "length", "loss"),
    "passkey": ("checkpoint", "scaling", "block_size", "length", "trials", "correct"),
}
EVAL_NUMBERS = {  # read_rows's numbers and blank for those columns: a loss is empty past a learned table
    "loss": ({"block_size": int, "length": int, "loss": float}, ("loss",)),
    "passkey": ({"block_size": int, "length": int, "trials": int, "correct": int}, ()),
}


def pooled_cells(rows, task, key):
    """lab/eval_length.py's CSV rows -> {key(row): the mean loss, or (correct, trials) pooled over depths}"""
    found = {}
    for r in rows:
        if task == "passkey" and int(r["trials"]):
            correct, trials = found.get(key(r), (0, 0))
            found[key(r)] = (correct + int(r["correct"]), trials + int(r["trials"]))
        elif task == "loss" and r["loss"]:
            found[key(r)] = float(r["loss"])
    return found


def eval_length(cfg, task, checkpoints, lengths, path, key, *flags):
    """`python -m lab.eval_length checkpoints --task=task --lengths lengths *flags --csv path`, printed first,
    with cfg's --trials (passkey) or --max_windows (loss) -> {key(row): the mean loss, or the exact match
    pooled over depths}"""
    amount = f"--trials={cfg.trials}" if task == "passkey" else f"--max_windows={cfg.max_windows}"
    command = ["-m", "lab.eval_length", *checkpoints, f"--task={task}", "--lengths", lengths, amount, *flags]
    print(f"\n$ python {' '.join(map(str, [*command, '--csv', path]))}")
    run_python([*command, "--csv", path])
    rows = read_rows(path, EVAL_COLUMNS[task], "python -m lab.eval_length", *EVAL_NUMBERS[task])
    found = pooled_cells(rows, task, key)
    return {k: (v[0] / v[1] if task == "passkey" else v) for k, v in found.items()}


def mean_sd(values, task, spread=True):
    """A table's cell over values: '56% ± 4' (passkey: rates, the sd in points) or '1.234 ± 0.012' (loss); the
    mean alone for one value or without spread."""
    mean = statistics.fmean(values)
    text = f"{mean:.0%}" if task == "passkey" else f"{mean:.3f}"
    if not spread or len(values) < 2:
        return text
    sd = statistics.stdev(values)
    return text + (f" ± {100 * sd:.0f}" if task == "passkey" else f" ± {sd:.3f}")


def paired_verdict(a, b, task, pairs="seeds", unit="", welch=False):
    """A verdict's cell: a - b ({key: value} each) paired over the keys both hold, as paired_cell writes it
    (retrieval: in points + unit, higher is better), or n/a under 2 pairs; welch: mean(a) - mean(b) over all
    the values of each, Welch's unpaired interval (for sides that share no data or model key by key)."""
    keys = sorted(a.keys() & b.keys())
    first, second = ([*a.values()], [*b.values()]) if welch else ([a[k] for k in keys], [b[k] for k in keys])
    if min(len(first), len(second)) < 2:
        return f"n/a (fewer than 2 {pairs})"
    passkey, interval = task == "passkey", welch_difference if welch else paired_difference
    return paired_cell(first, second, passkey, 100 if passkey else 1, unit if passkey else "", interval)


def plan(commands):
    """The Plan of each train.py command (a list of flags), as train.py reads it: one subprocess for all."""
    command = [sys.executable, "-c", PLAN_CODE, json.dumps(commands)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:  # a bad flag: train.py's own one-line error
        raise UserError(done.stderr.strip() or f"train.py could not read {commands}")
    return [Plan(args, *json.loads(line)) for args, line in zip(commands, done.stdout.splitlines())]


def differences(saved, wanted):
    """'name saved, not wanted' for each setting a checkpoint (saved) has otherwise than planned; init_from is
    compared as a path from out_dir, so that runs copied together (a study's out_root) are the same runs."""
    saved, wanted = relative_init_from(saved), relative_init_from(wanted)
    return [
        f"{name} {saved[name]}, not {value}"
        for name, value in wanted.items()
        if name not in NOT_COMPARED and name in saved and saved[name] != value
    ]


def flat(model_config):
    """A model_config's fields and its scheme's settings (nested under pos_settings) side by side."""
    settings = model_config.get("pos_settings")
    return {k: v for k, v in model_config.items() if k != "pos_settings"} | (
        settings if isinstance(settings, dict) else {}
    )


def relative_init_from(config):
    if not (config.get("init_from") and config.get("out_dir")):
        return config
    return config | {"init_from": os.path.relpath(config["init_from"], config["out_dir"])}


def decide(plan, elsewhere="move it away"):
    """("train", None) for no run in the command's out_dir, ("reuse", step) for its finished run, ("resume",
    step) for the same run stopped early; a run of other settings is a UserError."""
    path = ROOT / plan.out_dir / "ckpt.pt"  # the latest state: best.pt may be an earlier step
    if not path.is_file():
        return "train", None
    ckpt = open_checkpoint(path, mmap=True)
    changed = differences(flat(ckpt.get("model_config", {})), flat(plan.model_config))
    changed += differences(ckpt.get("train_config", {}), plan.train_config | {"out_dir": plan.out_dir})
    if changed:
        why = "; ".join(changed)
        raise UserError(f"{plan.out_dir} holds another run than `{plan.command}` ({why}): {elsewhere}")
    return ("reuse" if run_finished(ckpt) else "resume"), ckpt.get("iter_num", 0)


def ensure_trained(commands, duration=None, retrain=False, elsewhere="move it away", log=print, jobs=1):
    """Make each train.py command's out_dir hold its finished run: reuse, continue or train it
    (retrain: always, replacing it). Each run gets one thread count, OMP_NUM_THREADS if set, else the
    cores / jobs, so that its speed does not depend on what ran before it; jobs > 1 trains that many side by
    side, each one's output in {out_dir}.log -> the out_dirs, absolute"""
    plans = plan(commands)
    actions = [("overwrite", None) if retrain else decide(p, elsewhere) for p in plans]
    for p, (action, _) in zip(plans, actions):
        if action == "reuse":
            log(f"using {p.out_dir}: {p.describe()}, finished")
    todo = [(p, action, step) for p, (action, step) in zip(plans, actions) if action != "reuse"]
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // jobs))

    def train(i, p, action, step):
        command = " ".join([p.command, *EXTRA_FLAGS[action]])  # what is trained, where, how long, and how
        if action == "resume":
            took = f" (a whole run takes about {duration})" if duration else ""
            said = f"continuing {p.describe()} in {p.out_dir}, stopped at step {step}{took}"
        else:
            took = f", about {duration}" if duration else ""
            said = f"training {p.describe()} into {p.out_dir}{took}"
        log(f"[{i}/{len(todo)}] {said}: {command}")
        started, args = time.perf_counter(), [*p.program, *p.flags, *EXTRA_FLAGS[action]]
        env = os.environ | {"OMP_NUM_THREADS": threads}  # the same for every run, whatever ran before it
        if jobs == 1:
            run_python(args, env=env)
        else:
            output = ROOT / f"{p.out_dir}.log"
            output.parent.mkdir(parents=True, exist_ok=True)
            with open(output, "w") as f:
                run_python(args, stdout=f, stderr=subprocess.STDOUT, env=env, said=f"see {output}")
        log(f"[{i}/{len(todo)}] {p.out_dir}: trained in {time.perf_counter() - started:.0f} s")

    with signals_passed_on(), ThreadPoolExecutor(max(1, jobs)) as pool:  # the workers' runs signalled too
        list(pool.map(lambda job: train(job[0], *job[1]), enumerate(todo, 1)))  # raises a run's failure
    return [ROOT / p.out_dir for p in plans]


def check_jobs(jobs, device):
    """Every study's rule on --jobs, the runs it trains side by side: on a CPU at most its cores, as more take
    turns on them, each slowing the others (and the times a study reports); a GPU runs several at once, as
    its memory allows (a run past it stops in one line). A one-line UserError naming --jobs, a GPU preset's
    jobs on a CPU included."""
    if resolve_device(device).split(":")[0] != "cpu":
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if jobs > cores:
        raise UserError(
            f"--jobs={jobs}: give 1 to {cores}: the CPU (--device={device}) has {cores} cores, and more runs "
            "side by side than cores take turns on them",
            2,
        )


def find_checkpoint(pos, checkpoints):
    """checkpoints/<pos>, or checkpoints/shakespeare_char_<pos> (train.py's default out_dir under out/), the
    first holding best.pt or ckpt.pt; None where neither does."""
    folders = [Path(checkpoints) / name for name in (pos, f"shakespeare_char_{pos}")]
    return next((folder for folder in folders if checkpoint_path(folder).is_file()), None)


def study_inputs(*files):
    """What a study reads, which none of its outputs may be or lie in (lab.outputs.check_outputs, with
    --replace too): the datasets' folder (data/: every dataset a study trains or evaluates on is one there,
    and it prepares them there), the presets' (configs/), and files (its --config, the checkpoints it
    opens; None: none)."""
    return [DATA_ROOT, ROOT / "configs", *(Path(file) for file in files if file is not None)]


def inputs_of(schemes, checkpoints=None):
    """What a demo reads from --checkpoints (None: the README's runs, under out/): each scheme's checkpoint
    file and the folder of the dataset it trained on, the inputs an output may not replace
    (lab.outputs.check_outputs)."""
    folders = [find_checkpoint(pos, checkpoints or ROOT / "out") for pos in schemes]
    found = [checkpoint_path(folder) for folder in folders if folder is not None]
    datasets = set()
    for path in found:
        with suppress(UserError, OSError):  # a damaged checkpoint is refused when it is loaded
            datasets.add(
                dataset_dir(str(open_checkpoint(path, mmap=True).get("train_config", {})["dataset"]))
            )
    return [*found, *datasets]


def model_dirs(schemes, checkpoints=None, log=print, other="--checkpoints=DIR (a folder of runs)"):
    """{pos: checkpoint folder}: from `checkpoints` when given, else the README's runs, trained first; other:
    the flags a demo offers instead, named when an out_dir holds another run."""
    if checkpoints is not None:  # the schemes with a run there (a folder from before some schemes existed)
        found = {pos: folder for pos in schemes if (folder := find_checkpoint(pos, checkpoints))}
        missing = [pos for pos in schemes if pos not in found]
        expected = f"{checkpoints}/<pos>/ or {checkpoints}/shakespeare_char_<pos>/ holding best.pt or ckpt.pt"
        if not found:
            raise UserError(f"no checkpoint of pos={','.join(missing)} in {checkpoints}: expected {expected}")
        if missing:
            log(f"note: no checkpoint of pos={','.join(missing)} in {checkpoints} (expected {expected}): "
                f"showing {', '.join(found)}")  # fmt: skip
        return found
    commands, elsewhere = [[f"--pos={pos}"] for pos in schemes], f"move it away, or give {other}"
    return dict(zip(schemes, ensure_trained(commands, DEFAULT_DURATION, elsewhere=elsewhere, log=log)))

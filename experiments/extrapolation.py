"""
The length-extrapolation study of docs/extrapolation.md, in one command: train, fine-tune, evaluate, draw.

    python -m experiments.extrapolation             # about 20 minutes on 2 CPU cores, alone on the machine
    python -m experiments.extrapolation --quick     # every step once, tiny and meaningless: a smoke run

It runs `python train.py` and `python eval_length.py` as subprocesses, exactly as a user would type them (each
command is printed first), on char-level Tiny Shakespeare:
  1. the five schemes with train.py's default config (context T = 64): {out_root}/shakespeare_char_{pos}
  2. four context extensions to 4 x T = 256, each a short fine-tune of a trained run (train.py --init_from):
     rope with position interpolation (--rope_scaling=linear --rope_factor=4), rope with YaRN
     (--rope_scaling=yarn --rope_factor=4), learned with its table interpolated to 256 rows (--block_size=256
     alone: train.py resizes it), and rope with nothing but the longer context (--block_size=256), the control
  3. eval_length.py on all nine at 0.5, 1, 2, 4 and 8 x 64 tokens (the same token counts for every checkpoint),
     which also runs each RoPE extension without fine-tuning (s = L / T) and learned's sliding window
  4. {results}/extrapolation.csv, extrapolation.png and extrapolation_table.md, and the wall time.
A finished run of the same command is reused, one stopped early is continued (train.py --resume), and a folder
holding a run of other settings stops the study with one line (plumbing/runs.py; --retrain trains them all
again). So the README's own `python train.py --pos=X` runs serve as step 1, and an interrupted study continues
where it was.
"""

import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from model import POS_SCHEMES
from plumbing.checkpoint import CheckpointError, fine_tune_dir, saved_model_config
from plumbing.cli import RunError, one_line_errors, parse_flags
from plumbing.runs import DEFAULT_DURATION, ROOT, ensure_trained, run_python

DATASET = "shakespeare_char"
EXTENSION = 4  # the fine-tunes' context: 4 x T
# The fine-tunes: (source scheme, rope_scaling or None). train.py names their folders as here.
FINE_TUNES = (("rope", "linear"), ("rope", "yarn"), ("learned", None), ("rope", None))
# --quick: a few steps of everything, to check the pipeline end to end (the numbers mean nothing)
QUICK_TRAIN = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--max_iters=20", "--eval_interval=20", "--eval_iters=2",
               "--log_interval=10"]
QUICK_FINE_TUNE = ["--max_iters=4", "--warmup_iters=1", "--eval_interval=4", "--eval_iters=1", "--log_interval=2",
                   "--batch_size=4"]
QUICK_WINDOWS = 2


@dataclass
class StudyConfig:
    out_root: str | None = None  # checkpoint folder; None: out (out/extrapolation_quick with --quick)
    results: str | None = None  # folder for extrapolation.csv/.png/_table.md; None: docs (out_root with --quick)
    retrain: bool = False  # train and fine-tune again even where a checkpoint exists
    max_iters: int = 200  # fine-tuning steps at 4 x T (Peng et al. 2023 fine-tune YaRN for 400 steps)
    learning_rate: float = 3e-4  # fine-tuning peak learning rate, under pretraining's 1e-3 as in Chen et al. 2023
    batch_size: int = 8  # fine-tuning sequences per step, each 4 x T tokens long
    lengths: str = "0.5,1,2,4,8"  # evaluation lengths, multiples of the base T (every checkpoint at these tokens)
    max_windows: int = 64  # evaluation windows per length and row, spread evenly over the validation split
    device: str = "auto"  # passed to train.py and eval_length.py
    quick: bool = False  # smoke run: a 1-layer model, 20 training and 4 fine-tuning steps, 2 windows per length

    def __post_init__(self):
        for name in ("max_iters", "batch_size", "max_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        try:
            multiples = multiples_of(self.lengths)
        except ValueError:
            multiples = []
        if not multiples or min(multiples) <= 0:
            raise ValueError(f"lengths must be positive multiples of T such as 0.5,1,2x, got {self.lengths!r}")
        self.out_root = self.out_root or ("out/extrapolation_quick" if self.quick else "out")
        self.results = self.results or (self.out_root if self.quick else "docs")


def multiples_of(lengths):
    """'0.5,1,2x' -> [0.5, 1.0, 2.0]"""
    return [float(x.strip().lower().removesuffix("x")) for x in lengths.split(",")]


def parse_args(argv=None):
    values = parse_flags(argv, "experiments/extrapolation.py", __doc__, [("study", StudyConfig, None)])
    with one_line_errors("experiments/extrapolation.py"):
        return StudyConfig(**values)


# -----------------------------------------------------------------------------
# The commands


def base_dir(cfg, pos):
    return f"{cfg.out_root}/{DATASET}_{pos}"


def train_runs(cfg, commands, duration=None):
    """The runs of these train.py commands: reused, continued or trained (plumbing/runs.py)."""
    ensure_trained(commands, None if cfg.quick else duration, cfg.retrain,
                   elsewhere="move it away, or pass another --out_root (--retrain trains it again, replacing it)")


def train_base(cfg):
    """The five schemes, train.py's defaults (QUICK_TRAIN's few steps with --quick)."""
    train_runs(cfg, [[f"--pos={pos}", f"--out_dir={base_dir(cfg, pos)}", f"--device={cfg.device}",
                      *(QUICK_TRAIN if cfg.quick else [])] for pos in POS_SCHEMES], DEFAULT_DURATION)


def fine_tune(cfg, block_size):
    """The four context extensions to EXTENSION x block_size, each from its base run's weights. -> their folders"""
    long = EXTENSION * block_size
    steps = cfg.max_iters
    schedule = QUICK_FINE_TUNE if cfg.quick else [
        f"--max_iters={steps}", f"--warmup_iters={max(1, steps // 10)}", f"--eval_interval={max(1, steps // 2)}",
        "--eval_iters=20", f"--log_interval={max(1, steps // 10)}", f"--batch_size={cfg.batch_size}"]
    out_dirs = [fine_tune_dir(base_dir(cfg, pos), long, scaling) for pos, scaling in FINE_TUNES]  # train.py's names
    train_runs(cfg, [[f"--init_from={base_dir(cfg, pos)}", f"--block_size={long}",
                      *([f"--rope_scaling={scaling}", f"--rope_factor={EXTENSION}"] if scaling else []), *schedule,
                      f"--learning_rate={cfg.learning_rate}", f"--min_lr={cfg.learning_rate / 10:g}",
                      f"--device={cfg.device}", f"--out_dir={out_dir}"]
                     for (pos, scaling), out_dir in zip(FINE_TUNES, out_dirs)])
    return out_dirs


def evaluate(cfg, block_size, out_dirs):
    """eval_length.py on every checkpoint at the same token counts; writes the CSV and the figure. -> the table"""
    lengths = ",".join(f"{round(m * block_size)}t" for m in multiples_of(cfg.lengths))
    results = Path(cfg.results)
    figure = ["--plot", results / "extrapolation.png", "--bucket=8"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("note: matplotlib is not installed: no figure (pip install matplotlib)")
        figure = []
    command = ["eval_length.py", *out_dirs, "--lengths", lengths,
               f"--max_windows={QUICK_WINDOWS if cfg.quick else cfg.max_windows}", "--batch_size=8",
               f"--device={cfg.device}", "--csv", results / "extrapolation.csv", *figure]
    print("\n$ " + " ".join(["python", *map(str, command)]))
    return run_python(command, stdout=subprocess.PIPE, text=True).stdout


def main(argv=None):
    cfg = parse_args(argv)
    start = time.perf_counter()
    with one_line_errors("experiments/extrapolation.py", status=1, errors=(RunError, CheckpointError)):
        train_base(cfg)
        block_size = saved_model_config(ROOT / base_dir(cfg, "rope"), ["block_size"])["block_size"]
        fine_tuned = fine_tune(cfg, block_size)
        table = evaluate(cfg, block_size, [base_dir(cfg, pos) for pos in POS_SCHEMES] + fine_tuned)
    seconds = time.perf_counter() - start
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    footer = (f"Measured {when} by `python {' '.join(['-m experiments.extrapolation', *(argv or sys.argv[1:])])}`: "
              f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()} with "
              f"{torch.get_num_threads()} threads; wall time {seconds / 60:.1f} min"
              + (" (--quick: the numbers mean nothing)" if cfg.quick else "") + ".")
    table_path = ROOT / cfg.results / "extrapolation_table.md"
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(f"{table.rstrip()}\n\n{footer}\n", encoding="utf-8")
    print(f"\n{table.rstrip()}\n\n{footer}\nwrote {cfg.results}/extrapolation.csv, extrapolation.png (if matplotlib) "
          f"and extrapolation_table.md")
    return seconds


if __name__ == "__main__":
    main()

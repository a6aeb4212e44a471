"""What a training run reports (its header, a line per log_interval steps with speed and time left, the same
figures to Weights & Biases when asked) and sample.py's line on its model."""

import importlib.util
import netrc
import os
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlparse

import torch

ROOT = Path(__file__).resolve().parents[1]
SLOWDOWN = 2.5  # log windows this many times slower per step than the fastest step get one note in the log


class StepClock:
    """Wall time of the steps between two log lines (evaluations left out), the time the run has left, and one
    note when steps run far slower than this run's fastest: the machine's rate with the cores to itself."""

    def __init__(self, cfg, start_iter, clock=time.perf_counter):
        self.cfg, self.start_iter, self.clock = cfg, start_iter, clock
        self.train_seconds, self.eval_seconds = 0.0, 0.0  # in steps so far, and in the last evaluation
        self.window_start = self.last_step = clock()  # the first window's start, the end of the last step
        self.window_steps, self.fastest, self.noted = 0, None, False

    @contextmanager
    def evaluation(self):
        start = self.clock()
        self.train_seconds += start - self.window_start
        yield
        self.window_start = self.last_step = self.clock()  # keep evaluation out of ms/iter
        self.eval_seconds, self.window_steps = self.window_start - start, 0

    def step(self):
        now = self.clock()
        self.fastest = min(self.fastest or now - self.last_step, now - self.last_step)
        self.window_steps, self.last_step = self.window_steps + 1, now

    def lap(self, steps_done):
        """(seconds per step since the last lap, seconds left). Call it after the device was waited for."""
        now, end, every = self.clock(), self.cfg.max_iters, self.cfg.eval_interval
        step_seconds = (now - self.window_start) / self.window_steps
        self.train_seconds += now - self.window_start
        self.window_start, self.window_steps = now, 0
        per_step = self.train_seconds / (steps_done - self.start_iter)
        # the evaluations left: at the multiples of eval_interval, and the final one
        evals = end // every - steps_done // every + (1 if end % every and steps_done < end else 0)
        return step_seconds, (end - steps_done) * per_step + evals * self.eval_seconds

    def slowdown(self, step_seconds):
        """The note, once per run, when a window's seconds per step exceed SLOWDOWN x the fastest step."""
        if self.noted or not self.fastest or step_seconds < SLOWDOWN * self.fastest:
            return None
        self.noted, threads, cores = True, torch.get_num_threads(), os.cpu_count()
        load = f"load average {os.getloadavg()[0]:.1f} on {cores} cores" if hasattr(os, "getloadavg") else ""
        fix = "; --threads=1 keeps this run's threads off the others' cores" if threads > 1 else ""
        return (
            f"note: steps take {step_seconds * 1e3:.0f} ms, {step_seconds / self.fastest:.1f}x this run's "
            f"fastest step ({self.fastest * 1e3:.0f} ms): likely other processes share the CPU ({load}, "
            f"threads={threads} here){fix}"
        )


def format_seconds(seconds):
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def step_line(step, cfg, loss, lr, speed, seconds_left):
    """`step 50/2000 | loss 2.1 | lr 5.0e-04 | 35.6 ms/iter | 21,500 tok/s | mfu 40.0% | 1m30s left`"""
    mfu = f" | mfu {speed['mfu']:.1%}" if "mfu" in speed else ""
    return (
        f"step {step}/{cfg.max_iters} | loss {loss:.4f} | lr {lr:.2e} | {speed['ms_per_iter']:.1f} ms/iter | "
        f"{speed['tokens_per_sec']:,.0f} tok/s{mfu} | {format_seconds(seconds_left)} left"
    )


def schedule_notes(cfg, final_lr):
    """The warnings on a schedule the run does not follow (its last step at final_lr): --max_iters cuts its
    warmup or its decay short, or its decay ends before its warmup does (train.get_lr)."""
    notes, run = [], f"max_iters={cfg.max_iters}"
    if cfg.max_iters == 0:  # no step: no learning rate
        return notes
    if cfg.warmup_iters > cfg.max_iters:
        end = f"the run ends at lr {final_lr:.3g}, never reaching learning_rate={cfg.learning_rate:g}"
        notes.append(
            f"note: warmup_iters={cfg.warmup_iters} > {run}: {end}; "
            f"--warmup_iters={cfg.max_iters // 10} (a tenth of the run) warms up within it"
        )
    elif 0 < cfg.warmup_iters < cfg.max_iters and cfg.lr_decay_iters <= cfg.warmup_iters:
        jump = f"the rate jumps from its warmup to min_lr={cfg.min_lr:g} at step {cfg.warmup_iters}, no decay"
        notes.append(
            f"note: lr_decay_iters={cfg.lr_decay_iters} <= warmup_iters={cfg.warmup_iters}: {jump}; "
            f"--lr_decay_iters={cfg.max_iters} decays over the rest of the run"
        )
    if cfg.lr_decay_iters > cfg.max_iters:
        end = f"the run ends at lr {final_lr:.3g}, before its decay to min_lr={cfg.min_lr:g}"
        notes.append(
            f"note: lr_decay_iters={cfg.lr_decay_iters} > {run}: {end}; "
            f"--lr_decay_iters={cfg.max_iters} decays within the run"
        )
    return notes


def describe_model(model):
    """sample.py's line on the model it generates with: its scheme (RoPE: its rotated share, layers and
    scaling), trained length and size."""
    c, params, rope = model.config, f"{model.num_params():,} parameters", model.transformer.wpe
    pos, scaled = c.pos, []
    if rope.rotates:  # RoPE's settings apply
        s = c.pos_settings
        scaling = "none" if s.rope_scaling is None else f"{s.rope_scaling} x{s.rope_factor:g}"
        if s.rope_scaling == "llama3":
            scaling += f" (frequency factors {s.rope_low_freq_factor:g} and {s.rope_high_freq_factor:g})"
        if rope.dim < c.head_dim:
            pos += f" on {rope.dim} of each head's {c.head_dim} dims"
        if nope := [str(i) for i, rotates in enumerate(model.rope_layers) if not rotates]:
            pos += f" (none in layer{'s' * (len(nope) > 1)} {', '.join(nope)})"
        scaled = [f"rope scaling {scaling}"]
    return ", ".join([f"pos={pos}", f"trained length {c.block_size} tokens", *scaled, params])


def done_line(run, seconds):
    """'done in 1m19s: best val loss 1.7588 at step 2000, in out/.../best.pt', the last line of a run."""
    p = run.progress
    best = f"best val loss {p.best_val_loss:.4f} at step {p.best_iter}, in {run.best_path}"
    return f"done in {format_seconds(seconds)}: {best if p.best_iter is not None else 'no evaluation'}"


def header_line(run, one_per_process):
    """What is trained, on what, how (run: plumbing.resume.Run): the first line of every run's log."""
    cfg, procs = run.cfg, run.procs
    split = f" | {cfg.grad_accum} micro-batches" if cfg.grad_accum > 1 else ""
    if procs.launched:
        given = " (one per process: --grad_accum not given)" if one_per_process else ""
        split = f" | {procs.world_size} processes x {cfg.grad_accum // procs.world_size} micro-batches{given}"
    compiled = " compiled" if cfg.compile else ""
    return (
        f"{cfg.dataset} ({run.meta['vocab_size']} tokens) | pos={run.model_config.pos} | "
        f"{run.model.num_params() / 1e6:.2f}M parameters | {cfg.device} {cfg.dtype}{compiled} | "
        f"{run.tokens_per_step:,} tokens/step{split} | {cfg.max_iters} steps"
    )


def wandb_problem():
    """Why --wandb cannot log (not installed, or not logged in: wandb.init would fail or prompt mid-run), or
    None. Logged in: an API key in WANDB_API_KEY or ~/.netrc (`wandb login` writes it); offline needs none."""
    if importlib.util.find_spec("wandb") is None:
        return "--wandb needs the wandb package: pip install wandb"
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return None
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    with suppress(OSError, netrc.NetrcParseError):
        if netrc.netrc().authenticators(host):
            return None
    return "--wandb: not logged in to Weights & Biases: run `wandb login` once, or set WANDB_MODE=offline"


@contextmanager
def wandb_logging(run):
    """A Weights & Biases run on rank 0 while the block runs (else None), finished with exit code 0, or 1 if
    the block raised; a resumed run continues its id."""
    cfg, p = run.cfg, run.progress
    if not (cfg.wandb and run.procs.master):
        yield None
        return
    import wandb  # only when asked for: optional, and slow to import

    config = asdict(cfg) | asdict(run.model_config)
    config |= {"world_size": run.procs.world_size, "parameters": run.model.num_params()}
    resumed = dict(id=p.wandb_run_id, resume="allow") if p.wandb_run_id else {}
    name = cfg.wandb_run_name or Path(cfg.out_dir).name
    wandb_run = wandb.init(project=cfg.wandb_project, name=name, config=config, **resumed)
    p.wandb_run_id = wandb_run.id
    try:
        yield wandb_run
    except BaseException:
        wandb_run.finish(exit_code=1)
        raise
    wandb_run.finish(exit_code=0)
